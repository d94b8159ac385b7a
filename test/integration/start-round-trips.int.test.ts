/**
 * What a start waits on. On one server the run's listing (its entry among the active runs and in
 * the run list) and its creation go out together on the runtime's connection, the listing first,
 * and come back in one round trip: Redis runs one connection's commands in the order sent, so the
 * run is still listed before it exists. On a cluster the two go to different nodes, so the listing
 * is awaited before the creation is sent. A listing that fails where the creation went through is
 * written again before the run's first job; on a cluster such a start fails before creating
 * anything. Every run ends driven, each step once.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, runtimeCore, type Runtime } from '../../src/runtime.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { caught } from '../helpers/caught.js';
import { deleteRuntimeKeys, redisMode, redisUrl, testPrefix } from '../helpers/redis.js';
import { countTrips } from '../helpers/round-trips.js';

const plan: PlanInput = {
  name: 'three',
  steps: [
    { id: 'a', kind: 'operator', operator: 'count' },
    { id: 'b', kind: 'operator', operator: 'count', dependsOn: ['a'] },
    { id: 'c', kind: 'operator', operator: 'count', dependsOn: ['b'] },
  ],
};

const prefix = testPrefix();
let runtime: Runtime;
let worker: FlujoWorker;
const calls = new Map<string, number>();

beforeAll(async () => {
  runtime = createRuntime({ redis: redisUrl(), prefix }).operator('count', ({ runId, stepId }) => {
    const key = `${runId}/${stepId}`;
    calls.set(key, (calls.get(key) ?? 0) + 1);
    return null;
  });
  worker = runtime.createWorker({ concurrency: 4, sweepEveryMs: 0 });
  await worker.ready();
});
afterAll(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

/** Whether the run is among the active runs and in the run list. */
async function listed(runId: string): Promise<[boolean, boolean]> {
  const core = runtimeCore(runtime);
  const active = await core.redis.sismember(core.stores.keys.activeRuns(), runId);
  return [active === 1, await core.stores.runs.has(runId)];
}

/** Each step of the run ran exactly once. */
function ranOnce(runId: string): void {
  expect(['a', 'b', 'c'].map((s) => calls.get(`${runId}/${s}`))).toEqual([1, 1, 1]);
}

describe('a start', () => {
  it('sends its listing before its creation, in one round trip on one server', async () => {
    const core = runtimeCore(runtime);
    const { keys } = core.stores;
    let counting = false;
    const counts = countTrips(core.redis, () => counting);
    counting = true;
    // No run id given: no check that it is new before the listing.
    const run = await runtime.start(plan, null);
    counting = false;
    const { runId } = run;
    const at = (key: string) => counts.sent.find((c) => c.first === key);
    const active = at(keys.activeRuns());
    const created = at(keys.snap(runId));
    expect(active?.name).toBe('sadd');
    // A script goes as EVAL the first time on a connection, as EVALSHA after.
    const script = (name: string | undefined) => name === 'evalsha' || name === 'eval';
    expect(script(created?.name)).toBe(true);
    // The run list's script names its index first.
    const index = counts.sent.find((c) => script(c.name) && c.first !== keys.snap(runId));
    expect(index).toBeDefined();
    const order = counts.sent.map((c) => c.first);
    expect(order.indexOf(keys.activeRuns())).toBeLessThan(order.indexOf(keys.snap(runId)));
    expect(order.indexOf(index!.first)).toBeLessThan(order.indexOf(keys.snap(runId)));
    if (redisMode() === 'single') {
      // One stretch: the listing and the creation answered together (the run's first job goes
      // on the queue's own connection, once the creation is in).
      expect(counts.trips).toBe(1);
      expect(created!.trip).toBe(active!.trip);
    } else {
      // The creation waits for the listing's replies.
      expect(created!.trip).toBeGreaterThan(active!.trip);
      expect(created!.trip).toBeGreaterThan(index!.trip);
    }
    expect((await run.settled({ timeoutMs: 20_000 })).status).toBe('succeeded');
    ranOnce(runId);
  });

  it('whose listing fails where its creation goes through lists the run again before its first job (one server); on a cluster it creates nothing', async () => {
    const core = runtimeCore(runtime);
    const { runs, activeRuns } = core.stores;
    const runId = `relist-${Date.now()}`;
    // The listing's replies are lost once (nothing written), as with a connection that drops
    // after the creation went out.
    const addRun = runs.add.bind(runs);
    const addActive = activeRuns.add.bind(activeRuns);
    runs.add = () => {
      runs.add = addRun;
      return Promise.reject(new Error('Connection is closed.'));
    };
    activeRuns.add = () => {
      activeRuns.add = addActive;
      return Promise.reject(new Error('Connection is closed.'));
    };
    // What the run's listing is when its first job is queued.
    const enqueueDue = core.queues.enqueueDue.bind(core.queues);
    const atFirstJob: [boolean, boolean][] = [];
    core.queues.enqueueDue = async (id, envelope) => {
      if (id === runId) atFirstJob.push(await listed(runId));
      return enqueueDue(id, envelope);
    };
    try {
      if (redisMode() === 'cluster') {
        const error = await caught(runtime.start(plan, null, { runId }));
        expect(String(error)).toContain('Connection is closed.');
        expect(await core.stores.store.tryLoad(runId)).toBeNull();
        expect(atFirstJob).toEqual([]);
        return;
      }
      const run = await runtime.start(plan, null, { runId });
      expect(atFirstJob).toEqual([[true, true]]);
      expect((await run.settled({ timeoutMs: 20_000 })).status).toBe('succeeded');
      ranOnce(runId);
    } finally {
      runs.add = addRun;
      activeRuns.add = addActive;
      core.queues.enqueueDue = enqueueDue;
    }
  });

  it('many at once from another runtime: each listed, created and run once', async () => {
    const caller = createRuntime({ redis: redisUrl(), prefix });
    try {
      const started = await Promise.all(
        Array.from({ length: 50 }, (_, i) => caller.start(plan, { i })),
      );
      const reports = await Promise.all(started.map((r) => r.settled({ timeoutMs: 30_000 })));
      expect(reports.map((r) => r.status)).toEqual(Array(50).fill('succeeded'));
      for (const r of started) ranOnce(r.runId);
      const index = await Promise.all(
        started.map((r) => runtimeCore(caller).stores.runs.has(r.runId)),
      );
      expect(index).toEqual(Array(50).fill(true));
    } finally {
      await caller.close();
    }
  });
});
