/**
 * The "Embedding the machines" section of docs/guides/embedding.md is examples/embedding-machines.ts,
 * and it runs:
 * a plan driven in memory, restored from its persisted snapshot, and a stored run restored.
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

const run = promisify(execFile);
const root = new URL('../../', import.meta.url);
const tsx = new URL('node_modules/.bin/tsx', root).pathname;

afterAll(() => deleteRuntimeKeys('embedding-example'));

describe('embedding the machines, as documented', () => {
  it('the guide section is the example file, and the example runs', async () => {
    const guide = readFileSync(new URL('docs/guides/embedding.md', root), 'utf8');
    const block = /## Embedding the machines\n[\s\S]*?```ts\n([\s\S]*?)```/.exec(guide)?.[1];
    const file = readFileSync(new URL('examples/embedding-machines.ts', root), 'utf8');
    expect(block).toBeDefined();
    expect(block).toBe(
      file
        .replace("'../src/index.js'", "'flujo'")
        .replace("'../src/testing/index.js'", "'flujo/testing'"),
    );

    const { stdout } = await run(tsx, ['examples/embedding-machines.ts'], {
      cwd: root.pathname,
      env: { ...process.env, REDIS_URL: redisUrl() },
      timeout: 60_000,
    });
    const squash = stdout.replace(/\s+/g, ' ');
    expect(squash).toContain(
      "{ fetch: 'SUCCEEDED', summarize: 'READY', review: 'WAITING_APPROVAL', send: 'PENDING' }",
    );
    expect(squash).toContain("type: 'step.scheduleRetry', stepId: 'summarize', attempt: 2");
    expect(squash).toContain('READY succeeded SUCCEEDED');
    expect(squash).toContain(
      "{ fetch: 'READY', summarize: 'PENDING', review: 'PENDING', send: 'PENDING' }",
    );
  });
});
