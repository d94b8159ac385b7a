/**
 * examples/scripted-agent.ts, the agents guide's recipe of an agent on the scripted model server in
 * a job module: its code is the guide's (docs/guides/agents.md), and one long-lived `flujo worker` runs two of its runs in
 * a row, both to success (the server's `defaultReply` answers every request; a queue would have
 * run out on the second). The real binary (dist).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createRuntime } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { root, startFlujo } from '../helpers/cli.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const MODULE = 'examples/scripted-agent.ts';
const squash = (s: string) => s.replace(/\s+/g, '');

describe('examples/scripted-agent.ts', { timeout: 60_000 }, () => {
  const prefix = testPrefix();
  afterAll(() => deleteRuntimeKeys(prefix));

  it("is the agents guide's recipe, code for code", () => {
    const guide = readFileSync(join(root, 'docs/guides/agents.md'), 'utf8');
    const block =
      /## An agent on a scripted model, in a job module\n[\s\S]*?```ts\n([\s\S]*?)```/.exec(
        guide,
      )?.[1];
    const file = readFileSync(join(root, MODULE), 'utf8');
    const code = file.slice(file.indexOf('*/\n') + 3);
    expect(block).toBeDefined();
    expect(squash(block!)).toBe(squash(code));
  });

  it('one flujo worker runs two runs in a row, both to success', async () => {
    const worker = startFlujo(['worker', MODULE], { prefix, timeoutMs: 50_000 });
    const runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
    try {
      await expect
        .poll(() => worker.out(), { timeout: 20_000 })
        .toContain('flujo worker: processing runs');
      const { plan } = (await import('../../examples/scripted-agent.js')) as {
        plan: Parameters<typeof runtime.start>[0];
      };
      const answers: unknown[] = [];
      for (const text of ['one two three', 'a durable run survives a crash']) {
        const run = await runtime.start(plan, { text });
        const report = await run.settled({ timeoutMs: 20_000 });
        expect(report.status, JSON.stringify(report.summary)).toBe('succeeded');
        answers.push(report.summary.produced['count']);
      }
      expect(answers).toEqual([
        expect.objectContaining({ answer: '3 words.', turns: 2, toolCalls: 1 }),
        expect.objectContaining({ answer: '6 words.', turns: 2, toolCalls: 1 }),
      ]);
    } finally {
      await runtime.close();
      worker.child.kill('SIGTERM');
    }
    const ended = await worker.done;
    expect(ended.code, ended.err).toBe(0);
    expect(ended.err).not.toContain('no scripted reply left');
  });
});
