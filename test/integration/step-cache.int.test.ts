/**
 * Cache classes of steps (`cachePolicy`) on a real Redis: what runs, what hits, what is stored and
 * shown, across runs of one tenant.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  createRuntime,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
  type RuntimeOptions,
  type StoredRunEvent,
} from '../../src/index.js';
import { statusLines } from '../../src/cli/render.js';
import { deleteRuntimeKeys, readPrefix, redisUrl } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';

let runtime: Runtime;
let worker: FlujoWorker | undefined;
let prefix: string;

type CachePolicyInput = NonNullable<PlanInput['steps'][number]['cachePolicy']>;

const quiet = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

const planOf = (cachePolicy: CachePolicyInput, extra: object = {}): PlanInput => ({
  name: 'cached',
  steps: [
    { id: 'parse', kind: 'operator', operator: 'source' },
    {
      id: 'work',
      kind: 'operator',
      operator: 'work',
      dependsOn: ['parse'],
      cachePolicy,
      retry: { maxAttempts: 1 },
      ...extra,
    },
  ],
});

async function open(options: Partial<RuntimeOptions> = {}): Promise<void> {
  runtime = createRuntime({ redis: redisUrl(), prefix, logger: quiet, ...options });
  runtime.operator('source', ({ input }) => ({ doc: input }));
  worker = runtime.createWorker({ concurrency: 2 });
  await worker.ready();
}

async function runOnce(
  plan: PlanInput,
  input: unknown,
  options: Parameters<Runtime['start']>[2] = {},
) {
  const run = await runtime.start(plan, input, options);
  const report = await run.settled({ timeoutMs: 10_000 });
  const events: StoredRunEvent[] = [];
  for await (const e of runtime.events(run.runId)) events.push(e);
  return { runId: run.runId, report, events };
}

/** The tenant's cache entries (JSON), found with SCAN. */
async function cacheEntries(): Promise<Record<string, unknown>[]> {
  const found = await readPrefix(runtimeCore(runtime).redis, `${prefix}:{t:default}:cache:`);
  return Object.values(found).map(
    (v) => JSON.parse((v as { string: string }).string) as Record<string, unknown>,
  );
}

const hitsOf = (events: readonly StoredRunEvent[]) =>
  events.filter((e) => e.type === 'step.cacheHit').map((e) => e.data as Record<string, unknown>);

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
});
afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('deterministic steps', () => {
  it('execute once across two runs: the second run gets the stored output, with a cacheHit event', async () => {
    await open();
    let runs = 0;
    runtime.operator(
      'work',
      ({ deps }) => {
        runs++;
        return { length: JSON.stringify(deps['parse']).length };
      },
      { version: '1' },
    );
    const plan = planOf({ class: 'deterministic' });
    const first = await runOnce(plan, 'hello');
    const second = await runOnce(plan, 'hello');

    expect(runs).toBe(1);
    expect(first.report.status).toBe('succeeded');
    expect(second.report.status).toBe('succeeded');
    expect(second.report.steps[1]!.output).toEqual(first.report.steps[1]!.output);
    expect(hitsOf(first.events)).toEqual([]);
    const [hit] = hitsOf(second.events);
    expect(hit).toMatchObject({
      stepId: 'work',
      sourceRunId: first.runId,
      cacheClass: 'deterministic',
    });
    expect(second.report.steps[1]!.cachedFrom).toMatchObject({ runId: first.runId });
    const line = statusLines(second.report).find((l) => l.includes('work'))!;
    expect(line).toContain(`cached from run ${first.runId} at `);

    // Another input, another version: each misses.
    await runOnce(plan, 'other');
    expect(runs).toBe(2);
    runtime.operator(
      'work',
      () => {
        runs++;
        return { length: 7 };
      },
      { version: '2' },
    );
    await runOnce(plan, 'hello');
    expect(runs).toBe(3);
  });

  it('a hit still passes the policies bound to the step tags first', async () => {
    await open();
    let runs = 0;
    let allow = true;
    let checks = 0;
    runtime
      .operator('work', () => ({ n: ++runs }))
      .policy(
        'office-hours',
        () => {
          checks++;
          return allow ? { allow: true } : { allow: false, reason: 'closed' };
        },
        { appliesTo: { tags: ['pay'] } },
      );
    const plan = planOf({ class: 'deterministic' }, { policyTags: ['pay'] });
    await runOnce(plan, 'x');
    allow = false;
    const denied = await runOnce(plan, 'x');
    expect(runs).toBe(1);
    expect(checks).toBe(2);
    expect(denied.report.status).toBe('failed');
    expect(denied.report.steps[1]!.error).toMatchObject({ code: 'policy_denied' });
    expect(hitsOf(denied.events)).toEqual([]);
  });

  it('a re-run with another output fails with NonDeterminismError, once the entry expired or when forced', async () => {
    await open({ cache: { retentionMs: 150 } });
    let n = 0;
    runtime.operator('work', () => ({ n: n++ }));
    const plan = planOf({ class: 'deterministic' });
    const first = await runOnce(plan, 'x');
    expect(first.report.status).toBe('succeeded');

    // Forced while the entry is there: the step runs, and its output differs.
    const forced = await runOnce(plan, 'x', { refreshCache: true });
    expect(n).toBe(2);
    expect(forced.report.status).toBe('failed');
    expect(forced.report.steps[1]!.error).toMatchObject({
      name: 'NonDeterminismError',
      code: 'non_determinism',
      retryable: false,
    });
    expect(forced.report.steps[1]!.error!.message).toContain('step "work"');
    expect(forced.report.steps[1]!.error!.message).toContain(first.runId);

    // The entry expires (its retention); its output hash outlives it and still catches the change.
    await new Promise((ok) => setTimeout(ok, 300));
    expect(await cacheEntries()).toEqual([]);
    const expired = await runOnce(plan, 'x');
    expect(n).toBe(3);
    expect(expired.report.steps[1]!.error).toMatchObject({ name: 'NonDeterminismError' });
  });

  it('a deterministic re-run with the same output passes and stores the entry again', async () => {
    await open({ cache: { retentionMs: 100 } });
    let runs = 0;
    runtime.operator('work', () => {
      runs++;
      return { same: true };
    });
    const plan = planOf({ class: 'deterministic' });
    await runOnce(plan, 'x');
    await new Promise((ok) => setTimeout(ok, 250));
    const again = await runOnce(plan, 'x');
    expect(runs).toBe(2);
    expect(again.report.status).toBe('succeeded');
    expect(hitsOf(again.events)).toEqual([]);
  });

  it('an output over the size cap is not stored: the next run executes again', async () => {
    await open({ cache: { maxEntryBytes: 200 } });
    let runs = 0;
    runtime.operator('work', () => {
      runs++;
      return { text: 'y'.repeat(500) };
    });
    const plan = planOf({ class: 'deterministic' });
    await runOnce(plan, 'x');
    const second = await runOnce(plan, 'x');
    expect(runs).toBe(2);
    expect(second.report.status).toBe('succeeded');
  });
});

describe('stable nondeterministic steps', () => {
  it('use a stored output only when the step or the run allows it', async () => {
    await open();
    let runs = 0;
    runtime.operator('work', () => ({ draft: ++runs }));
    const plan = planOf({ class: 'stable_nondeterministic' });
    const first = await runOnce(plan, 'brief');
    const notAllowed = await runOnce(plan, 'brief');
    expect(runs).toBe(2);
    expect(hitsOf(notAllowed.events)).toEqual([]);

    const allowedByRun = await runOnce(plan, 'brief', { allowCacheHit: true });
    expect(runs).toBe(2);
    expect(allowedByRun.report.steps[1]!.output).toEqual({ draft: 2 });
    expect(hitsOf(allowedByRun.events)[0]).toMatchObject({
      cacheClass: 'stable_nondeterministic',
      sourceRunId: notAllowed.runId,
    });

    const allowedByStep = await runOnce(
      planOf({ class: 'stable_nondeterministic', allowCacheHit: true }),
      'brief',
    );
    expect(runs).toBe(2);
    expect(hitsOf(allowedByStep.events)).toHaveLength(1);

    // Inputs and parameters are stored with the output.
    const [entry] = await cacheEntries();
    expect(entry).toMatchObject({
      cacheClass: 'stable_nondeterministic',
      inputs: { input: 'brief', deps: { parse: { doc: 'brief' } } },
      identity: { kind: 'operator', name: 'work' },
      runId: notAllowed.runId,
    });
    expect(first.runId).not.toBe(notAllowed.runId);
  });

  it('refuses a start option that is not a boolean, writing nothing', async () => {
    await open();
    runtime.operator('work', () => null);
    await expect(
      runtime.start(planOf({ class: 'stable_nondeterministic' }), null, {
        runId: 'r-bad',
        allowCacheHit: 'yes' as unknown as boolean,
      }),
    ).rejects.toThrow(/allowCacheHit: must be true or false/);
    expect(
      await runtimeCore(runtime).redis.exists(runtimeCore(runtime).stores.keys.snap('r-bad')),
    ).toBe(0);
  });
});

describe('external steps', () => {
  it('are cached for ttlMs with provenance and fetch time, then fetched again', async () => {
    await open();
    let fetches = 0;
    runtime.operator('work', () => ({ rate: 1.1 + fetches++ }));
    const plan = planOf({ class: 'external', ttlMs: 300, provenance: 'ecb.europa.eu' });
    const first = await runOnce(plan, 'EUR');
    const within = await runOnce(plan, 'EUR');
    expect(fetches).toBe(1);
    expect(within.report.steps[1]!.output).toEqual({ rate: 1.1 });
    expect(hitsOf(within.events)[0]).toMatchObject({
      cacheClass: 'external',
      provenance: 'ecb.europa.eu',
      sourceRunId: first.runId,
    });
    const line = statusLines(within.report).find((l) => l.includes('work'))!;
    expect(line).toMatch(/cached from run .* at .*\(ecb\.europa\.eu\)/);
    const [entry] = (await cacheEntries()) as Record<string, number>[];
    expect(entry!['expiresAt']! - entry!['fetchedAt']!).toBe(300);
    expect(entry!['provenance']).toBe('ecb.europa.eu');

    await new Promise((ok) => setTimeout(ok, 400));
    const after = await runOnce(plan, 'EUR');
    expect(fetches).toBe(2);
    expect(hitsOf(after.events)).toEqual([]);
    expect(after.report.steps[1]!.output).toEqual({ rate: 2.1 });
  });
});

describe('cache options and plans', () => {
  it('refuses a bad retention or cap at createRuntime', () => {
    expect(() => createRuntime({ redis: redisUrl(), prefix, cache: { retentionMs: 0 } })).toThrow(
      /cache\b.*retentionMs must be a positive integer/,
    );
    expect(() =>
      createRuntime({ redis: redisUrl(), prefix, cache: { maxEntryBytes: 1.5 } }),
    ).toThrow(/cache\.maxEntryBytes|maxEntryBytes must be a positive integer/);
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: quiet });
  });

  it('refuses an operator version that is not a non-empty string', async () => {
    await open();
    expect(() => runtime.operator('work', () => null, { version: '' })).toThrow(
      /version: must be a non-empty string/,
    );
  });
});
