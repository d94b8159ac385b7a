import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { connect, deletePrefix, redisUrl } from '../helpers/redis.js';

const exec = promisify(execFile);
const root = new URL('../../', import.meta.url).pathname;

async function flujo(args: string[], env: Record<string, string>) {
  try {
    const { stdout, stderr } = await exec(
      `${root}node_modules/.bin/node`,
      [`${root}bin/flujo.js`, ...args],
      { cwd: root, env: { ...process.env, REDIS_URL: redisUrl(), ...env }, timeout: 30_000 },
    );
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('flujo run with an agent step', () => {
  let model: ScriptedModelServer;
  const prefix = `t-${randomUUID().slice(0, 8)}`;
  beforeAll(async () => {
    model = await startScriptedModelServer();
  });
  afterAll(async () => {
    await model.close();
    const redis = connect();
    await deletePrefix(redis, prefix);
    await deletePrefix(redis, `{${prefix}:q}`);
    redis.disconnect();
  });

  it('runs the agent to its answer and exits 0', async () => {
    model.enqueue({ text: 'Hello from the model.' });
    const r = await flujo(['run', 'test/fixtures/jobs/agent.ts', '--prefix', prefix, '--json'], {
      MODEL_URL: model.url,
    });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const result = r.stdout
      .trim()
      .split('\n')
      .map(
        (l) => JSON.parse(l) as { type: string; summary?: { produced: Record<string, unknown> } },
      )
      .find((l) => l.type === 'result');
    expect(result?.summary?.produced['ask']).toMatchObject({
      answer: 'Hello from the model.',
      turns: 1,
    });
    expect(model.requestCount).toBe(1);
  });

  it('refuses a module whose agent step names an agent it does not define, writing nothing', async () => {
    const r = await flujo(['run', 'test/fixtures/jobs/agent-unknown.ts', '--prefix', prefix], {});
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain('step "ask" uses agent "ghost"');
    expect(r.stderr).toContain('export const agents');
  });
});
