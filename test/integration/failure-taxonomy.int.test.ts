/**
 * The failure taxonomy at work: what operators and tools throw is classified once, and the code
 * and retryability decide what the step does next. Real Redis, a real worker, real sockets.
 */
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:net';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineTool,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
  type RuntimeOptions,
} from '../../src/index.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

let runtime: Runtime;
let worker: FlujoWorker;
let prefix: string;

const RETRY = { maxAttempts: 3, initialDelayMs: 20, maxDelayMs: 5000, jitter: 0 };
const one = (operator: string, extra: Record<string, unknown> = {}): PlanInput => ({
  name: 'taxonomy',
  steps: [{ id: 'work', kind: 'operator', operator, retry: RETRY, ...extra }],
});
const httpError = (status: number, extra: Record<string, unknown> = {}) =>
  Object.assign(new Error(`service answered ${status}`), { status, ...extra });

async function start(options: Partial<RuntimeOptions>): Promise<void> {
  runtime = createRuntime({ redis: redisUrl(), prefix, ...options });
  worker = runtime.createWorker({ concurrency: 4 });
  await worker.ready();
}

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
});
afterEach(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('failure taxonomy of operators and tools', () => {
  it('HTTP 422 from an operator is invalid_input: final after one attempt', async () => {
    let invocations = 0;
    await start({
      operators: {
        submit: () => {
          invocations++;
          throw httpError(422);
        },
      },
    });
    const done = await (await runtime.start(one('submit'))).settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(invocations).toBe(1);
    expect(done.summary).toMatchObject({
      blockedStep: 'work',
      reason: 'invalid_input',
      detail: { code: 'invalid_input', retryable: false, details: { status: 422 } },
    });
  });

  it('HTTP 503 is service_unavailable: retried until the attempts are used up', async () => {
    let invocations = 0;
    await start({
      operators: {
        submit: () => {
          invocations++;
          throw httpError(503);
        },
      },
    });
    const done = await (await runtime.start(one('submit'))).settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(invocations).toBe(3);
    expect(done.summary).toMatchObject({
      reason: 'retries_exhausted',
      detail: { code: 'service_unavailable', retryable: true },
    });
  });

  it("HTTP 429 waits for the service's retry-after before the next attempt", async () => {
    const at: number[] = [];
    await start({
      operators: {
        submit: ({ attempt }) => {
          at.push(Date.now());
          if (attempt === 1) throw httpError(429, { headers: { 'retry-after': '1' } });
          return 'sent';
        },
      },
    });
    const done = await (await runtime.start(one('submit'))).settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('succeeded');
    expect(at).toHaveLength(2);
    // The retry policy alone would wait 20 ms.
    expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(950);
  });

  it('HTTP 401 from a tool is auth_forbidden: recorded final in the ledger, the tool runs once, the step does not retry', async () => {
    let runs = 0;
    const send = defineTool({
      name: 'send',
      input: z.object({ to: z.string() }),
      requiresIdempotencyKey: true,
      run: () => {
        runs++;
        throw httpError(401);
      },
    });
    await start({
      tools: [send],
      operators: { notify: ({ tools }) => tools.call('send', { to: 'ana' }) },
    });
    const run = await runtime.start(one('notify'));
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(runs).toBe(1);
    expect(done.summary).toMatchObject({ reason: 'auth_forbidden', detail: { retryable: false } });
    const [entry] = await runtime.ledger(run.runId);
    expect(entry).toMatchObject({
      state: 'FAILED',
      error: { code: 'auth_forbidden', retryable: false, details: { status: 401 } },
    });
  });

  it('a refused connection (a real fetch to a closed port) is transient and retried', async () => {
    const server = createServer();
    await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
    const { port } = server.address() as { port: number };
    await new Promise<void>((ok) => server.close(() => ok()));
    let invocations = 0;
    await start({
      operators: {
        call: async () => {
          invocations++;
          return (await fetch(`http://127.0.0.1:${port}/`)).status;
        },
      },
    });
    const done = await (
      await runtime.start(one('call', { retry: { ...RETRY, maxAttempts: 2 } }))
    ).settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(invocations).toBe(2);
    expect(done.summary).toMatchObject({
      reason: 'retries_exhausted',
      detail: { code: 'service_unavailable', details: { networkCode: 'ECONNREFUSED' } },
    });
  });

  it('ctx.need(): a dependency that produced nothing the step needs is missing_context, final', async () => {
    let invocations = 0;
    await start({
      operators: {
        crawl: () => ({ pages: 3 }),
        report: ({ need }) => {
          invocations++;
          return { url: need('crawl', 'url') };
        },
        count: ({ need }) => need('crawl', 'pages'),
      },
    });
    const done = await (
      await runtime.start({
        name: 'context',
        steps: [
          { id: 'crawl', kind: 'operator', operator: 'crawl' },
          {
            id: 'report',
            kind: 'operator',
            operator: 'report',
            dependsOn: ['crawl'],
            retry: RETRY,
          },
          { id: 'count', kind: 'operator', operator: 'count', dependsOn: ['crawl'] },
        ],
      })
    ).settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(invocations).toBe(1);
    expect(done.summary).toMatchObject({
      blockedStep: 'report',
      reason: 'missing_context',
      produced: { crawl: { pages: 3 }, count: 3 },
      detail: {
        name: 'MissingContextError',
        retryable: false,
        details: { dependency: 'crawl', missing: 'output.url', stepId: 'report' },
      },
    });
  });
});
