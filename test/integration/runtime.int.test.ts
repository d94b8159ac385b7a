import { randomUUID } from 'node:crypto';
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
});
