/**
 * The BullMQ driver across processes: worker children (test/fixtures/driver-child.ts) on one queue,
 * killed with SIGKILL at chosen moments. What is checked comes from the runs' event streams (what
 * was committed) and the children's effect file (what was executed).
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime, runtimeCore } from '../../src/runtime.js';
import { stepJobId } from '../../src/actors/jobs.js';
import { expectIntact } from '../helpers/integrity.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';
import { spawnWorkerChild, type WorkerChild } from '../helpers/worker-child.js';

const QUEUE = 'drv';

let redis: Redis;
let prefix: string;
let dir: string;
let effectFile: string;
let rt: Runtime;
const children = new Set<WorkerChild>();

interface ChildOptions {
  recoveryMs?: number;
  /** The worker's `chainMs`. @defaultValue the worker's default */
  chainMs?: number;
  concurrency?: number;
  recoverOnStart?: boolean;
  killAt?: string;
  /** Resolve once spawned, without waiting for `ready` (a child expected to die early). */
  noWait?: boolean;
}

/** Spawns a worker child and waits for its `ready` line (unless `noWait`). */
function spawnWorker(o: ChildOptions = {}): Promise<WorkerChild> {
  const env = {
    REDIS_URL: redisUrl(),
    FLUJO_PREFIX: prefix,
    QUEUE_NAME: QUEUE,
    EFFECT_FILE: effectFile,
    CONCURRENCY: String(o.concurrency ?? 8),
    RECOVERY_MS: String(o.recoveryMs ?? 2000),
    RECOVER_ON_START: o.recoverOnStart === false ? '0' : '1',
    CHAIN_MS: o.chainMs === undefined ? '' : String(o.chainMs),
    FLUJO_KILL_AT: o.killAt ?? '',
  };
  return spawnWorkerChild(env, children, { noWait: o.noWait === true });
}

interface Execution {
  runId: string;
  stepId: string;
  attempt: number;
  pid: number;
  at: number;
}

/** The executions the children recorded. */
function executions(): Execution[] {
  if (!existsSync(effectFile)) return [];
  return readFileSync(effectFile, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [runId, stepId, attempt, pid, at] = l.split(' ');
      return {
        runId: runId!,
        stepId: stepId!,
        attempt: Number(attempt),
        pid: Number(pid),
        at: Number(at),
      };
    });
}

/** Prints a measured figure into the test output. */
const say = (text: string) => process.stdout.write(`${text}\n`);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function waitFor<T>(
  what: string,
  probe: () => T | undefined | Promise<T | undefined>,
  timeoutMs = 10_000,
  everyMs = 10,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

/** Counts of committed events per type and per step, from the run's stream. */
async function committed(runId: string) {
  const events = await runtimeCore(rt).stores.store.readEvents(runId);
  const succeeded = new Map<string, number>();
  for (const e of events) {
    if (e.type === 'step.succeeded') {
      const id = String(e.data['stepId']);
      succeeded.set(id, (succeeded.get(id) ?? 0) + 1);
    }
  }
  return {
    events,
    succeeded,
    finished: events.filter((e) => e.type === 'run.finished'),
  };
}

const line = (ids: string[], operator: string, name = 'line'): PlanInput => ({
  name,
  defaults: { retry: { initialDelayMs: 20, jitter: 0 } },
  steps: ids.map((id, i) => ({
    id,
    kind: 'operator' as const,
    operator,
    ...(i === 0 ? {} : { dependsOn: [ids[i - 1]!] }),
  })),
});

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  await redis.quit();
});
beforeEach(async () => {
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-driver-'));
  effectFile = join(dir, 'effects.log');
  rt = createRuntime({ redis: redisUrl(), prefix, queueName: QUEUE });
});
afterEach(async () => {
  await Promise.all([...children].map((c) => c.kill()));
  await rt.close();
  await deletePrefix(redis, prefix);
  await rm(dir, { recursive: true, force: true });
});

describe('driver: worker processes on one queue', () => {
  it('two worker processes, 200 runs: each run succeeds once and no step is committed twice', async () => {
    const RUNS = 200;
    const STEPS = ['s1', 's2', 's3'];
    const [a, b] = await Promise.all([
      spawnWorker({ concurrency: 16, recoveryMs: 2000 }),
      spawnWorker({ concurrency: 16, recoveryMs: 2000 }),
    ]);
    const plan = line(STEPS, 'count', 'line3');
    const t0 = Date.now();
    const runIds: string[] = [];
    for (let i = 0; i < RUNS; i += 20) {
      const batch = await Promise.all(
        Array.from({ length: Math.min(20, RUNS - i) }, () => rt.start(plan, { i })),
      );
      runIds.push(...batch.map((h) => h.runId));
    }
    const open = new Set(runIds);
    const statuses = new Map<string, string>();
    await waitFor(
      'all 200 runs to end',
      async () => {
        for (const id of [...open]) {
          const r = await rt.status(id);
          if (r.status !== 'running') {
            open.delete(id);
            statuses.set(id, r.status);
          }
        }
        return open.size === 0 ? true : undefined;
      },
      60_000,
      100,
    );
    const elapsed = Date.now() - t0;

    expect(new Set(runIds).size).toBe(RUNS);
    expect([...statuses.values()].every((s) => s === 'succeeded')).toBe(true);

    // Committed: from the event streams.
    let commits = 0;
    for (const id of runIds) {
      const c = await committed(id);
      expect(Object.fromEntries(c.succeeded), id).toEqual({ s1: 1, s2: 1, s3: 1 });
      expect(c.finished, id).toHaveLength(1);
      expect(c.finished[0]!.data).toMatchObject({
        status: 'succeeded',
        produced: { s1: { count: 1 }, s2: { count: 2 }, s3: { count: 3 } },
      });
      const toSucceeded = c.events.filter(
        (e) => e.type === 'step.changed' && e.data['to'] === 'SUCCEEDED',
      );
      expect(toSucceeded, id).toHaveLength(3);
      commits += c.succeeded.size;
    }
    expect(commits).toBe(RUNS * STEPS.length);

    // Executed: from the effect file. Redeliveries may execute a unit again, never commit it again.
    const execs = executions();
    const units = new Map<string, number>();
    for (const e of execs) {
      const k = `${e.runId} ${e.stepId} ${e.attempt}`;
      units.set(k, (units.get(k) ?? 0) + 1);
    }
    const ids = new Set(runIds);
    expect(execs.every((e) => ids.has(e.runId) && STEPS.includes(e.stepId))).toBe(true);
    expect(execs.every((e) => e.attempt === 1)).toBe(true);
    for (const id of runIds) for (const s of STEPS) expect(units.has(`${id} ${s} 1`)).toBe(true);
    expect(units.size).toBe(RUNS * STEPS.length);
    const duplicates = execs.length - units.size;
    // Both processes took part.
    const byPid = new Map<number, number>();
    for (const e of execs) byPid.set(e.pid, (byPid.get(e.pid) ?? 0) + 1);
    expect([...byPid.keys()].sort()).toEqual([a.pid, b.pid].sort());
    expect(await redis.scard(runtimeCore(rt).stores.keys.activeRuns())).toBe(0);

    say(
      `[driver] 200 runs × 3 steps on 2 worker processes: ${elapsed} ms, ` +
        `${execs.length} executions, ${duplicates} duplicate executions, ` +
        `per process ${JSON.stringify(Object.fromEntries(byPid))}`,
    );
    expect(elapsed).toBeLessThan(60_000);
  }, 90_000);

  it('a worker killed mid-step: the unit continues on another worker within the recovery window', async () => {
    const workers = await Promise.all([
      spawnWorker({ recoveryMs: 2000, concurrency: 2 }),
      spawnWorker({ recoveryMs: 2000, concurrency: 2 }),
    ]);
    const run = await rt.start(
      {
        name: 'slow-then-noop',
        steps: [
          { id: 'slow', kind: 'operator', operator: 'slow', input: { ms: 3000 } },
          { id: 'after', kind: 'operator', operator: 'noop', dependsOn: ['slow'] },
        ],
      },
      null,
    );
    const first = await waitFor('the slow step to start', () =>
      executions().find((e) => e.runId === run.runId && e.stepId === 'slow'),
    );
    // The worker notes the start with a write it does not wait for (the operator may record
    // its execution first): status shows RUNNING once that note lands, well inside 1 s.
    await waitFor(
      'status to show the slow step RUNNING',
      async () =>
        (await run.status()).steps.find((s) => s.stepId === 'slow')?.status === 'RUNNING'
          ? true
          : undefined,
      1000,
    );
    const victim = workers.find((w) => w.pid === first.pid)!;
    const survivor = workers.find((w) => w.pid !== first.pid)!;
    expect(victim).toBeDefined();
    await sleep(200); // well inside the 3 s step
    const killedAt = Date.now();
    const exit = await victim.kill();
    expect(exit.signal).toBe('SIGKILL');

    const second = await waitFor(
      'the slow step to start again',
      () =>
        executions().find(
          (e) => e.runId === run.runId && e.stepId === 'slow' && e.pid === survivor.pid,
        ),
      10_000,
    );
    const recoveryMs = second.at - killedAt;
    say(
      `[driver] killed mid-step: the step started again on the other worker after ${recoveryMs} ms`,
    );
    expect(second.attempt).toBe(1); // the same unit, redelivered
    expect(recoveryMs).toBeGreaterThan(0);
    expect(recoveryMs).toBeLessThanOrEqual(2500);

    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['slow']).toEqual({ slept: 3000, pid: survivor.pid });
    const c = await committed(run.runId);
    expect(Object.fromEntries(c.succeeded)).toEqual({ slow: 1, after: 1 });
    expect(c.finished).toHaveLength(1);
    const slowRuns = executions().filter((e) => e.stepId === 'slow');
    expect(slowRuns.map((e) => e.pid)).toEqual([victim.pid, survivor.pid]);
    await expectIntact(rt, run.runId);
  }, 30_000);
});

describe('driver: a crash between commit and enqueue heals', () => {
  const STEPS = ['s1', 's2', 's3'];

  /**
   * Starts a run on a child that dies right after committing s1; checks the crash window. The
   * child runs one job per unit (`chainMs: 0`): its commit of s1 is followed by an enqueue of s2.
   */
  async function crashAfterCommit(recoveryMs: number) {
    const victim = await spawnWorker({ recoveryMs, chainMs: 0, killAt: 'after-commit:s1' });
    const run = await rt.start(line(STEPS, 'count'), null);
    const exit = await waitFor('the child to die', async () => {
      const e = await Promise.race([victim.exited, sleep(20).then(() => undefined)]);
      return e;
    });
    expect(exit).toEqual({ code: null, signal: 'SIGKILL' });
    // s1 committed, s2 due, and no job for s2: exactly the window between commit and enqueue.
    const steps = (await run.status()).steps;
    expect(steps.map((s) => [s.stepId, s.status, s.attempt])).toEqual([
      ['s1', 'SUCCEEDED', 1],
      ['s2', 'READY', 1],
      ['s3', 'PENDING', 0],
    ]);
    expect(
      await runtimeCore(rt).queues.queue.getJob(stepJobId(run.runId, 's2', 1)),
    ).toBeUndefined();
    expect(await runtimeCore(rt).queues.queue.getJobState(stepJobId(run.runId, 's1', 1))).toBe(
      'active',
    );
    return { victim, run };
  }

  async function checkHealed(runId: string, victimPid: number, healerPid: number) {
    const done = await rt.status(runId);
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced).toEqual({
      s1: { count: 1 },
      s2: { count: 2 },
      s3: { count: 3 },
    });
    const c = await committed(runId);
    expect(Object.fromEntries(c.succeeded)).toEqual({ s1: 1, s2: 1, s3: 1 });
    expect(c.finished).toHaveLength(1);
    const execs = executions().filter((e) => e.runId === runId);
    expect(execs.map((e) => [e.stepId, e.attempt, e.pid])).toEqual([
      ['s1', 1, victimPid],
      ['s2', 1, healerPid],
      ['s3', 1, healerPid],
    ]);
  }

  it('a fresh worker (recoverOnStart) finds the run and enqueues its next unit', async () => {
    // A long lock (30 s): the dead child's job is not redelivered during the test, so only the
    // start-up recovery can heal the run.
    const { victim, run } = await crashAfterCommit(60_000);
    const healer = await spawnWorker({ recoveryMs: 60_000, recoverOnStart: true });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    await checkHealed(run.runId, victim.pid, healer.pid);
    // The crashed unit was not redelivered: recovery did it.
    expect(await runtimeCore(rt).queues.queue.getJobState(stepJobId(run.runId, 's1', 1))).toBe(
      'active',
    );
    await expectIntact(rt, run.runId);
  }, 30_000);

  it('the redelivered job heals it (a worker without start-up recovery)', async () => {
    const { victim, run } = await crashAfterCommit(400);
    const healer = await spawnWorker({ recoveryMs: 400, recoverOnStart: false });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    await checkHealed(run.runId, victim.pid, healer.pid);
    // The crashed s1 job came back, found s1 committed (the guard), and enqueued s2.
    const job = await runtimeCore(rt).queues.queue.getJob(stepJobId(run.runId, 's1', 1));
    expect(job?.returnvalue).toBe('already-done');
    expect(await job?.getState()).toBe('completed');
    await expectIntact(rt, run.runId);
  }, 30_000);
});

describe('driver: chained units', () => {
  const STEPS = ['s1', 's2', 's3'];

  it('one job carries a line of steps; the run is committed step by step as usual', async () => {
    const worker = await spawnWorker({ recoverOnStart: false });
    const run = await rt.start(line(STEPS, 'count'), null);
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced).toEqual({ s1: { count: 1 }, s2: { count: 2 }, s3: { count: 3 } });
    const c = await committed(run.runId);
    expect(Object.fromEntries(c.succeeded)).toEqual({ s1: 1, s2: 1, s3: 1 });
    // s1's job ran the whole line: s2 and s3 never had jobs of their own. settled() resolves on
    // the run's last commit, which the job makes a moment before it completes.
    const s1 = stepJobId(run.runId, 's1', 1);
    for (
      let i = 0;
      i < 100 && (await runtimeCore(rt).queues.queue.getJobState(s1)) === 'active';
      i++
    ) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(await runtimeCore(rt).queues.queue.getJobState(s1)).toBe('completed');
    expect(
      await runtimeCore(rt).queues.queue.getJob(stepJobId(run.runId, 's2', 1)),
    ).toBeUndefined();
    expect(
      await runtimeCore(rt).queues.queue.getJob(stepJobId(run.runId, 's3', 1)),
    ).toBeUndefined();
    const execs = executions().filter((e) => e.runId === run.runId);
    expect(execs.map((e) => [e.stepId, e.pid])).toEqual(STEPS.map((id) => [id, worker.pid]));
  }, 30_000);

  it('a worker that starts while another carries a run leaves the carried unit to it', async () => {
    const carrier = await spawnWorker({ recoverOnStart: false, chainMs: 60_000 });
    const run = await rt.start(
      {
        name: 'slow-line',
        steps: STEPS.map((id, i) => ({
          id,
          kind: 'operator' as const,
          operator: 'slow',
          input: { ms: 400 },
          dependsOn: i === 0 ? [] : [STEPS[i - 1]!],
        })),
      },
      null,
    );
    // s2 runs inside s1's job: the run has work and no job of its own for it.
    await waitFor('s2 to start', () =>
      executions().find((e) => e.runId === run.runId && e.stepId === 's2'),
    );
    expect(
      await runtimeCore(rt).queues.queue.getJob(stepJobId(run.runId, 's2', 1)),
    ).toBeUndefined();
    const late = await spawnWorker({ recoverOnStart: true });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    // The late worker's start-up recovery saw the carrier at work and added nothing.
    const execs = executions().filter((e) => e.runId === run.runId);
    expect(execs.map((e) => [e.stepId, e.pid])).toEqual(STEPS.map((id) => [id, carrier.pid]));
    expect(execs.some((e) => e.pid === late.pid)).toBe(false);
    const c = await committed(run.runId);
    expect(Object.fromEntries(c.succeeded)).toEqual({ s1: 1, s2: 1, s3: 1 });
  }, 30_000);

  it('a carrier killed after a commit mid-chain: its job comes back and the run goes on', async () => {
    const victim = await spawnWorker({ recoveryMs: 1000, killAt: 'after-commit:s1' });
    const run = await rt.start(line(STEPS, 'count'), null);
    const exit = await waitFor('the child to die', () =>
      Promise.race([victim.exited, sleep(20).then(() => undefined)]),
    );
    expect(exit).toEqual({ code: null, signal: 'SIGKILL' });
    // s1 committed with a note that its job carries s2: s2 has no job of its own.
    const env = await runtimeCore(rt).stores.store.load(run.runId);
    expect(env.carrier).toBe(`${stepJobId(run.runId, 's1', 1)} ${stepJobId(run.runId, 's2', 1)}`);
    expect(
      await runtimeCore(rt).queues.queue.getJob(stepJobId(run.runId, 's2', 1)),
    ).toBeUndefined();
    // A worker that starts now, while the dead carrier's lock still holds, adds nothing: the
    // carrier's job comes back once its lock lapses, and its guard gives s2 a job.
    const healer = await spawnWorker({ recoveryMs: 1000, recoverOnStart: true });
    expect(
      await runtimeCore(rt).queues.queue.getJob(stepJobId(run.runId, 's2', 1)),
    ).toBeUndefined();
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    const c = await committed(run.runId);
    expect(Object.fromEntries(c.succeeded)).toEqual({ s1: 1, s2: 1, s3: 1 });
    const execs = executions().filter((e) => e.runId === run.runId);
    expect(execs.map((e) => [e.stepId, e.pid])).toEqual([
      ['s1', victim.pid],
      ['s2', healer.pid],
      ['s3', healer.pid],
    ]);
    const job = await runtimeCore(rt).queues.queue.getJob(stepJobId(run.runId, 's1', 1));
    expect(job?.returnvalue).toBe('already-done');
    await expectIntact(rt, run.runId);
  }, 30_000);
});
