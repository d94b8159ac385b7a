import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, type Runtime, type FlujoWorker } from '../../src/index.js';
import { redisUrl } from '../helpers/redis.js';

describe('runtime and worker on real Redis', () => {
  let rt: Runtime;
  let worker: FlujoWorker;
  const calls: string[] = [];
  beforeAll(async () => {
    rt = createRuntime({
      redis: redisUrl(),
      prefix: `t-${randomUUID().slice(0, 8)}`,
      queueName: 'rt',
    });
    rt.operator('fetch', ({ input }) => {
      calls.push('fetch');
      return { got: input };
    });
    rt.operator('report', ({ deps, attempt }) => {
      calls.push(`report#${attempt}`);
      if (attempt === 1) throw Object.assign(new Error('flaky'), { retryable: true });
      return { summary: `pages: ${JSON.stringify(deps['fetch'])}` };
    });
    worker = rt.createWorker({ concurrency: 4 });
    await worker.ready();
  });
  afterAll(async () => {
    await worker.close();
    await rt.close();
  });

  it('runs a plan to success through a retry, and streams its outcomes', async () => {
    const run = await rt.start(
      {
        name: 'two',
        defaults: { retry: { initialDelayMs: 50, jitter: 0 } },
        steps: [
          { id: 'fetch', kind: 'operator', operator: 'fetch' },
          { id: 'report', kind: 'operator', operator: 'report', dependsOn: ['fetch'] },
        ],
      },
      { url: 'x' },
    );
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced).toEqual({
      fetch: { got: { url: 'x' } },
      report: { summary: 'pages: {"got":{"url":"x"}}' },
    });
    const outcomes = [];
    for await (const o of run.outcomes())
      outcomes.push(`${o.type}:${'stepId' in o ? o.stepId : ''}`);
    expect(outcomes).toEqual(['success:fetch', 'failure:report', 'success:report']);
  });

  it('wakes a settled() waiter on status changes only, not on every commit of the run', async () => {
    // Every read the watcher sends (it blocks on the streams of the runs waited for).
    const reads: unknown[][] = [];
    type Send = (
      this: Redis,
      command: { name: string; args: unknown[] },
      ...rest: unknown[]
    ) => unknown;
    const proto = Redis.prototype as unknown as { sendCommand: Send };
    const send = proto.sendCommand;
    proto.sendCommand = function (this: Redis, command, ...rest) {
      if (command.name === 'xread') reads.push(command.args);
      return send.call(this, command, ...rest);
    };
    try {
      const steps = Array.from({ length: 30 }, (_, i) => ({
        id: `s${i}`,
        kind: 'operator' as const,
        operator: 'fetch',
        dependsOn: i === 0 ? [] : [`s${i - 1}`],
      }));
      const run = await rt.start({ name: 'thirty', steps }, null);
      const done = await run.settled({ timeoutMs: 20_000 });
      expect(done.status).toBe('succeeded');
      const mine = reads.filter((args) => args.some((a) => String(a).includes(run.runId)));
      // The run's 30 commits (and its creation) wake nothing; its one change to a settled status
      // does (a read may also be restarted by another waiter coming or going).
      expect(mine.length).toBeGreaterThanOrEqual(1);
      expect(mine.length).toBeLessThanOrEqual(3);
      expect(mine.every((args) => args.some((a) => String(a).endsWith(':status')))).toBe(true);
    } finally {
      proto.sendCommand = send;
    }
  });
});
