/**
 * `createRuntime({ onStepFailure })`: called once per failed attempt, right after its commit, with
 * the error's code, message and retryability and whether the step will retry; whatever the hook
 * throws is logged and changes nothing. Real Redis and a real worker.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  createRuntime,
  InputValidationError,
  type FlujoWorker,
  type Runtime,
  type RuntimeOptions,
  type StepFailureInfo,
} from '../../src/index.js';
import type { Logger } from '../../src/logging.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';

let runtime: Runtime | undefined;
let worker: FlujoWorker | undefined;
let prefix: string;
let warnings: { fields: Record<string, unknown>; message: string }[];

const logger: Logger = {
  debug: () => {},
  info: () => {},
  warn: (fields, message) => warnings.push({ fields: fields as Record<string, unknown>, message }),
  error: () => {},
};

const RETRY = { maxAttempts: 3, initialDelayMs: 20, maxDelayMs: 50, jitter: 0 };
const plan = {
  name: 'hooked',
  steps: [
    { id: 'flaky', kind: 'operator' as const, operator: 'flaky', retry: RETRY },
    { id: 'bad', kind: 'operator' as const, operator: 'bad', retry: RETRY },
  ],
};
const operators: NonNullable<RuntimeOptions['operators']> = {
  flaky: ({ attempt }) => {
    if (attempt <= 2) throw Object.assign(new Error(`flaky ${attempt}`), { retryable: true });
    return 'ok';
  },
  bad: () => {
    throw Object.assign(new Error('bad input'), { retryable: false });
  },
};

async function start(options: Partial<RuntimeOptions>): Promise<Runtime> {
  runtime = createRuntime({ redis: redisUrl(), prefix, logger, operators, ...options });
  worker = runtime.createWorker({ concurrency: 4 });
  await worker.ready();
  return runtime;
}

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  warnings = [];
});
afterEach(async () => {
  await worker?.close();
  await runtime?.close();
  worker = undefined;
  runtime = undefined;
  await deleteRuntimeKeys(prefix);
});

describe('onStepFailure', () => {
  it('is called once per failed attempt, after its commit, with the error and whether the step retries', async () => {
    const seen: StepFailureInfo[] = [];
    const committedAtCall: Promise<number>[] = [];
    const rt = await start({
      onStepFailure: (failure) => {
        seen.push(failure);
        // What the run's stream holds when the hook is called: the failure is already there.
        committedAtCall.push(
          runtimeCore(rt)
            .stores.store.readEvents(failure.runId)
            .then(
              (events) =>
                events.filter(
                  (e) =>
                    e.type === 'step.failed' &&
                    e.data['stepId'] === failure.stepId &&
                    e.data['attempt'] === failure.attempt,
                ).length,
            ),
        );
      },
    });
    const run = await rt.start(plan);
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    const brief = seen
      .map(({ stepId, attempt, code, retryable, willRetry, message }) => ({
        stepId,
        attempt,
        code,
        retryable,
        willRetry,
        message,
      }))
      .sort((a, b) => (a.stepId + a.attempt < b.stepId + b.attempt ? -1 : 1));
    expect(brief).toEqual([
      {
        stepId: 'bad',
        attempt: 1,
        code: 'unknown',
        retryable: false,
        willRetry: false,
        message: 'bad input',
      },
      {
        stepId: 'flaky',
        attempt: 1,
        code: 'unknown',
        retryable: true,
        willRetry: true,
        message: 'flaky 1',
      },
      {
        stepId: 'flaky',
        attempt: 2,
        code: 'unknown',
        retryable: true,
        willRetry: true,
        message: 'flaky 2',
      },
    ]);
    expect(seen.every((f) => f.runId === run.runId)).toBe(true);
    expect(await Promise.all(committedAtCall)).toEqual([1, 1, 1]);
  });

  it('names a failure the step will not retry because its attempts are used up', async () => {
    const seen: StepFailureInfo[] = [];
    const rt = await start({ onStepFailure: (f) => void seen.push(f) });
    const run = await rt.start({
      name: 'exhausted',
      steps: [
        {
          id: 'flaky',
          kind: 'operator',
          operator: 'flaky',
          retry: { ...RETRY, maxAttempts: 2 },
        },
      ],
    });
    expect((await run.settled({ timeoutMs: 20_000 })).status).toBe('failed');
    expect(seen.map((f) => [f.attempt, f.retryable, f.willRetry])).toEqual([
      [1, true, true],
      [2, true, false],
    ]);
  });

  it('a hook that throws, or rejects, is logged and changes nothing', async () => {
    let calls = 0;
    const rt = await start({
      onStepFailure: (failure) => {
        calls++;
        if (failure.attempt === 1) throw new Error('hook broke');
        return Promise.reject(new Error('hook rejected'));
      },
    });
    const run = await rt.start(plan);
    const done = await run.settled({ timeoutMs: 20_000 });
    // The same outcome as without a hook: flaky succeeded on attempt 3, bad failed once.
    expect(done.status).toBe('failed');
    expect(done.summary.produced).toEqual({ flaky: 'ok' });
    const byId = Object.fromEntries(done.steps.map((s) => [s.stepId, s]));
    expect(byId['flaky']).toMatchObject({ status: 'SUCCEEDED', attempt: 3 });
    expect(byId['bad']).toMatchObject({ status: 'FAILED_FINAL', attempt: 1 });
    expect(calls).toBe(3);
    for (let i = 0; i < 50 && warnings.length < 3; i++)
      await new Promise((ok) => setTimeout(ok, 10));
    const hookWarnings = warnings.filter((w) => w.message.includes('onStepFailure'));
    expect(hookWarnings.map((w) => w.fields['error']).sort()).toEqual([
      'hook broke',
      'hook broke',
      'hook rejected',
    ]);
  });

  it('refuses a hook that is not a function, naming the option', () => {
    expect(() =>
      createRuntime({
        redis: redisUrl(),
        prefix,
        onStepFailure: 'log' as unknown as NonNullable<RuntimeOptions['onStepFailure']>,
      }),
    ).toThrow(InputValidationError);
    expect(() =>
      createRuntime({
        redis: redisUrl(),
        prefix,
        onStepFailure: 'log' as unknown as NonNullable<RuntimeOptions['onStepFailure']>,
      }),
    ).toThrow(/onStepFailure: must be a function/);
  });
});

describe('runtime options of this kind are checked before anything is opened', () => {
  it.each([
    ['policyVersion', { policyVersion: '' }, /policyVersion: must be a non-empty string/],
    ['policyVersion', { policyVersion: 7 }, /policyVersion: must be a non-empty string/],
    ['onStepFailure', { onStepFailure: {} }, /onStepFailure: must be a function/],
  ])('refuses a bad %s, naming it', (_field, bad, message) => {
    const make = () =>
      createRuntime({ redis: redisUrl(), prefix, ...(bad as Partial<RuntimeOptions>) });
    expect(make).toThrow(InputValidationError);
    expect(make).toThrow(message);
  });
});
