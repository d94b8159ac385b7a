/**
 * Concurrency per key: a plan limited to one live run per `input.customer`, 40 runs over 4
 * customers on three `flujo worker` processes, one SIGKILLed mid-run (each step logs its
 * interval: no two runs of one customer overlap, runs of different customers do, all finish, no
 * slot is left); a run that waits says for which key in its status (`runtime.status` and `flujo
 * status`) and records its wait; a step limited across runs; a step's slot whose holder stopped
 * renewing it lapses within its lease; a run's lapsed slot is checked against the run (kept while
 * the run lives, freed when it is gone); bad limits refused, nothing written.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, runtimeCore, type Runtime } from '../../src/runtime.js';
import { SLOT_RECHECK_MS, STEP_LEASE, STEP_SLOT_LEASE_MS } from '../../src/actors/concurrency.js';
import { PlanValidationError } from '../../src/errors.js';
import type { PlanInput } from '../../src/plan/schema.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { runFlujo, startFlujo } from '../helpers/cli.js';
import {
  connect,
  deleteRuntimeKeys,
  readPrefix,
  redisUrl,
  scanKeys,
  testPrefix,
} from '../helpers/redis.js';
import { plan as perCustomer } from '../fixtures/jobs/per-customer.js';

const JOB = 'test/fixtures/jobs/per-customer.ts';

let redis: Redis;
let scratch: string;
const prefixes: string[] = [];
const runtimes: Runtime[] = [];
const workers: FlujoWorker[] = [];

function runtimeOn(
  prefix: string,
  options: Omit<Parameters<typeof createRuntime>[0], 'redis'> = {},
): Runtime {
  prefixes.push(prefix);
  const runtime = createRuntime({ ...options, redis: redisUrl(), prefix });
  runtimes.push(runtime);
  return runtime;
}

beforeAll(() => {
  redis = connect();
  scratch = mkdtempSync(join(tmpdir(), 'flujo-concurrency-'));
});
afterAll(async () => {
  for (const worker of workers) await worker.close();
  for (const runtime of runtimes) await runtime.close();
  for (const prefix of prefixes) await deleteRuntimeKeys(prefix);
  redis.disconnect();
  rmSync(scratch, { recursive: true, force: true });
});

interface Interval {
  runId: string;
  customer: string;
  start: number;
  end: number;
  starts: number;
}

/** Each run's interval from the log: its first step's first start to its last end. */
function intervals(log: string): Interval[] {
  const runs = new Map<string, Interval>();
  for (const line of log.split('\n').filter((l) => l !== '')) {
    const [runId, customer, , what, at] = line.split(' ') as [
      string,
      string,
      string,
      string,
      string,
    ];
    const r = runs.get(runId) ?? { runId, customer, start: Infinity, end: -Infinity, starts: 0 };
    if (what === 'start') {
      r.start = Math.min(r.start, Number(at));
      r.starts += 1;
    } else r.end = Math.max(r.end, Number(at));
    runs.set(runId, r);
  }
  return [...runs.values()];
}

const overlap = (a: Interval, b: Interval) => a.start < b.end && b.start < a.end;

/** The types of the records and events of a run's stream, with their data. */
async function eventsOf(runtime: Runtime, runId: string): Promise<Record<string, unknown>[]> {
  const out: Record<string, unknown>[] = [];
  for await (const e of runtime.events(runId)) out.push(e.data);
  return out;
}

describe('concurrency per key', { timeout: 180_000 }, () => {
  it('40 runs over 4 customers, limit 1 per customer, three worker processes, one SIGKILLed mid-run', async () => {
    const prefix = testPrefix();
    const log = join(scratch, 'intervals');
    writeFileSync(log, '');
    const worker = (env: Record<string, string> = {}) =>
      startFlujo(['worker', JOB, '--concurrency', '3', '--redis-timeout', '15000'], {
        prefix,
        env: { CONCURRENCY_LOG: log, ...env },
      });
    // Worker a dies (SIGKILL) on its fifth unit, after the operator ran, before the commit.
    const a = worker({ FLUJO_KILL_AT: 'before-commit@5' });
    const b = worker();
    const c = worker();
    const ready = (w: typeof a) => w.out().includes('flujo worker: processing runs');
    await expect
      .poll(() => ready(a) && ready(b) && ready(c), { timeout: 90_000 })
      .toBe(true)
      .catch((error: unknown) => {
        throw new Error(
          `workers not ready: ${[a, b, c].map((w) => w.out() + w.err()).join('\n---\n')}`,
          {
            cause: error,
          },
        );
      });
    const runtime = runtimeOn(prefix);
    const handles = [];
    for (let i = 0; i < 40; i++) {
      handles.push(await runtime.start(perCustomer as PlanInput, { customer: `c${i % 4}`, n: i }));
    }
    const reports = await Promise.all(handles.map((h) => h.settled({ timeoutMs: 90_000 })));
    expect(reports.map((r) => r.status)).toEqual(Array(40).fill('succeeded'));
    const died = await a.done;
    expect(died.signal).toBe('SIGKILL');
    b.child.kill('SIGTERM');
    c.child.kill('SIGTERM');
    await Promise.all([b.done, c.done]);

    const runs = intervals(readFileSync(log, 'utf8'));
    expect(runs).toHaveLength(40);
    // Ten runs of about 200 ms per customer, side by side, and one worker's death: a slot freed
    // wakes the next run at once (a wake-up lost would cost 5 s per run).
    const span = Math.max(...runs.map((r) => r.end)) - Math.min(...runs.map((r) => r.start));
    expect(span).toBeLessThan(15_000);
    // No two runs of one customer overlap.
    for (const customer of ['c0', 'c1', 'c2', 'c3']) {
      const mine = runs.filter((r) => r.customer === customer).sort((x, y) => x.start - y.start);
      expect(mine).toHaveLength(10);
      for (let i = 1; i < mine.length; i++) {
        expect(mine[i]!.start).toBeGreaterThanOrEqual(mine[i - 1]!.end);
      }
    }
    // Runs of different customers do (no customer waits for another's, nor all for one).
    let crossing = 0;
    for (const x of runs)
      for (const y of runs) if (x.customer < y.customer && overlap(x, y)) crossing++;
    expect(crossing).toBeGreaterThan(10);
    // The killed worker's run ran its step again elsewhere, and finished.
    const again = runs.filter((r) => r.starts > 2);
    expect(again.length).toBeGreaterThanOrEqual(1);
    // Waits were recorded, and no slot is left behind.
    const waited = (await Promise.all(handles.map((h) => eventsOf(runtime, h.runId))))
      .flat()
      .filter((e) => e['type'] === 'concurrency.waited');
    expect(waited.length).toBeGreaterThan(0);
    expect(waited.every((e) => /^customer=c[0-3]$/.test(String(e['key'])))).toBe(true);
    // A slot is given back right after the commit that ends its unit or run.
    await expect.poll(() => scanKeys(redis, `{${prefix}:conc:*`)).toEqual([]);
  });

  it('a run over the limit says for which key in its status, and runs once the slot frees', async () => {
    const prefix = testPrefix();
    const releases = new Map<string, () => void>();
    const called: string[] = [];
    const runtime = runtimeOn(prefix, {
      operators: {
        hold: ({ runInput }) =>
          new Promise((resolve) => {
            const id = (runInput as { id: string }).id;
            called.push(id);
            releases.set(id, () => resolve({ id }));
          }),
      },
    });
    const w = runtime.createWorker({ concurrency: 4 });
    workers.push(w);
    await w.ready();
    const plan = {
      name: 'held',
      concurrency: { key: 'input.customer', limit: 1 },
      steps: [{ id: 'hold', kind: 'operator' as const, operator: 'hold' }],
    };
    const first = await runtime.start(plan, { customer: 'acme', id: 'first' });
    await expect.poll(() => called.includes('first')).toBe(true);
    const second = await runtime.start(plan, { customer: 'acme', id: 'second' });
    const other = await runtime.start(plan, { customer: 'zeta', id: 'other' });
    // Another customer's run is not held up by acme's.
    await expect.poll(() => called.includes('other')).toBe(true);
    const message = 'waiting for a concurrency slot of key customer=acme (limit 1)';
    await expect
      .poll(async () => (await second.status()).concurrency?.map((c) => c.message))
      .toEqual([message]);
    const [wait] = (await second.status()).concurrency!;
    expect(wait).toMatchObject({ stepId: null, key: 'customer=acme', limit: 1 });
    expect(called).not.toContain('second');
    const cli = await runFlujo(['status', second.runId], { prefix });
    expect(cli.out).toContain(`the run is ${message}`);
    releases.get('other')!();
    expect((await other.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    // Still waiting: the slot is acme's first run's.
    await sleep(300);
    expect(called).not.toContain('second');
    releases.get('first')!();
    await expect.poll(() => called.includes('second'), { timeout: 10_000 }).toBe(true);
    releases.get('second')!();
    expect((await second.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    expect((await first.settled()).status).toBe('succeeded');
    expect((await second.status()).concurrency).toEqual([]);
    const records = (await eventsOf(runtime, second.runId)).filter(
      (e) => e['type'] === 'concurrency.waited',
    );
    expect(records).toHaveLength(1);
    expect(records[0]).toMatchObject({
      scope: 'run',
      key: 'customer=acme',
      limit: 1,
      stepId: 'hold',
    });
    expect(records[0]!['waitedMs']).toBeGreaterThanOrEqual(300);
    // A slot is given back right after the commit that ends its unit or run.
    await expect.poll(() => scanKeys(redis, `{${prefix}:conc:*`)).toEqual([]);
  });

  it("a step's limit holds across runs: at most 2 attempts at once per tenant, the others wait", async () => {
    const prefix = testPrefix();
    let running = 0;
    let most = 0;
    const runtime = runtimeOn(prefix, {
      operators: {
        quick: () => ({ ok: true }),
        limited: async () => {
          running++;
          most = Math.max(most, running);
          await sleep(150);
          running--;
          return { ok: true };
        },
      },
    });
    const w = runtime.createWorker({ concurrency: 8 });
    workers.push(w);
    await w.ready();
    const plan = {
      name: 'step-limited',
      steps: [
        { id: 'prep', kind: 'operator' as const, operator: 'quick' },
        {
          id: 'call',
          kind: 'operator' as const,
          operator: 'limited',
          dependsOn: ['prep'],
          concurrency: { key: 'tenant', limit: 2 },
        },
      ],
    };
    const handles = await Promise.all(
      Array.from({ length: 8 }, (_, i) => runtime.start(plan, { i })),
    );
    const seen = new Set<string>();
    const watching = (async () => {
      for (let i = 0; i < 100; i++) {
        for (const h of handles) {
          for (const c of (await h.status()).concurrency ?? [])
            seen.add(`${c.stepId} ${c.message}`);
        }
        if (seen.size > 0) return;
      }
    })();
    const reports = await Promise.all(handles.map((h) => h.settled({ timeoutMs: 30_000 })));
    await watching;
    expect(reports.map((r) => r.status)).toEqual(Array(8).fill('succeeded'));
    expect(most).toBe(2);
    expect([...seen]).toEqual([
      `call waiting for a concurrency slot of key tenant=${reports[0]!.tenantId} (limit 2)`,
    ]);
    // A slot is given back right after the commit that ends its unit or run.
    await expect.poll(() => scanKeys(redis, `{${prefix}:conc:*`)).toEqual([]);
  });

  it("a step's slot whose holder stopped renewing it (its worker died) frees within its lease", async () => {
    const prefix = testPrefix();
    const ran: number[] = [];
    const runtime = runtimeOn(prefix, { operators: { once: () => (ran.push(Date.now()), {}) } });
    const plan = {
      name: 'leased',
      steps: [
        {
          id: 'call',
          kind: 'operator' as const,
          operator: 'once',
          concurrency: { key: 'input.account', limit: 1 },
        },
      ],
    };
    // A dead worker's holder: it took the slot and never renews or gives it back.
    const slot = { scope: 'run:leased', value: 'a1', limit: 1 };
    const stepSlot = { ...slot, scope: 'step:leased:call' };
    const taken = await runtimeCore(runtime).stores.slots.acquire(
      stepSlot,
      'gone-run/call',
      STEP_LEASE,
      '{}',
    );
    expect(taken.granted).toBe(true);
    const takenAt = Date.now();
    const w = runtime.createWorker({ concurrency: 2 });
    workers.push(w);
    await w.ready();
    const run = await runtime.start(plan, { account: 'a1' });
    await expect
      .poll(async () => (await run.status()).concurrency?.map((c) => c.stepId))
      .toEqual(['call']);
    expect((await run.settled({ timeoutMs: 20_000 })).status).toBe('succeeded');
    expect(ran).toHaveLength(1);
    // Not before the lease lapsed, and soon after (a parked unit looks again every 5 s).
    expect(ran[0]! - takenAt).toBeGreaterThanOrEqual(STEP_SLOT_LEASE_MS);
    expect(ran[0]! - takenAt).toBeLessThan(STEP_SLOT_LEASE_MS + SLOT_RECHECK_MS + 2000);
    await expect.poll(() => scanKeys(redis, `{${prefix}:conc:*`)).toEqual([]);
  });

  it("a run's lapsed slot is checked before it is freed: a live run keeps it, a gone one gives it back", async () => {
    const prefix = testPrefix();
    const releases = new Map<string, () => void>();
    const runtime = runtimeOn(prefix, {
      operators: {
        hold: ({ runInput }) =>
          new Promise((resolve) => {
            releases.set((runInput as { id: string }).id, () => resolve({}));
          }),
      },
    });
    const { slots } = runtimeCore(runtime).stores;
    const plan = {
      name: 'checked',
      concurrency: { key: 'input.customer', limit: 1 },
      steps: [{ id: 'hold', kind: 'operator' as const, operator: 'hold' }],
    };
    const slot = { scope: 'run:checked', value: 'acme', limit: 1 };
    // A run that is gone (its end's release lost) holds the slot, its lease lapsing at once.
    const short = { leaseMs: 50, handoverMs: 50, freeLapsed: false };
    expect((await slots.acquire(slot, 'gone-run', short, '{}')).granted).toBe(true);
    await sleep(100);
    const w = runtime.createWorker({ concurrency: 4 });
    workers.push(w);
    await w.ready();
    const live = await runtime.start(plan, { customer: 'acme', id: 'live' });
    // The lapsed holder was found gone: the live run took the slot.
    await expect.poll(() => releases.has('live'), { timeout: 10_000 }).toBe(true);
    expect(await slots.holds(slot, 'gone-run')).toBe(false);
    // The live run's lease lapses (shortened here): checked, it keeps its slot.
    await slots.renew(slot, live.runId, 50);
    await sleep(100);
    const next = await runtime.start(plan, { customer: 'acme', id: 'next' });
    await expect.poll(async () => (await next.status()).concurrency?.length).toBe(1);
    await sleep(300);
    expect(releases.has('next')).toBe(false);
    expect(await slots.holds(slot, live.runId)).toBe(true);
    releases.get('live')!();
    await expect.poll(() => releases.has('next'), { timeout: 10_000 }).toBe(true);
    releases.get('next')!();
    expect((await next.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await expect.poll(() => scanKeys(redis, `{${prefix}:conc:*`)).toEqual([]);
  });

  it('refuses a bad limit or key, naming the field, and writes nothing; flujo validate too', async () => {
    const prefix = testPrefix();
    const runtime = runtimeOn(prefix, { operators: { op: () => null } });
    const before = await readPrefix(redis, prefix);
    const step = { id: 'a', kind: 'operator' as const, operator: 'op' };
    const refused = async (plan: object) => {
      const error = await runtime.start(plan as never, {}).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(PlanValidationError);
      return (error as PlanValidationError).message;
    };
    expect(
      await refused({ name: 'p', concurrency: { key: 'input.customer', limit: 0 }, steps: [step] }),
    ).toContain('concurrency.limit');
    expect(
      await refused({
        name: 'p',
        steps: [{ ...step, concurrency: { key: 'customer', limit: 1 } }],
      }),
    ).toContain('steps[0].concurrency.key');
    expect(await readPrefix(redis, prefix)).toEqual(before);
    const file = join(scratch, 'bad-concurrency.json');
    writeFileSync(
      file,
      JSON.stringify({ name: 'p', concurrency: { key: 'tenant', limit: 1.5 }, steps: [step] }),
    );
    const r = await runFlujo(['validate', file], { prefix });
    expect(r.code).toBe(2);
    expect(r.out + r.err).toContain('concurrency.limit');
  });
});
