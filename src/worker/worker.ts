import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { DelayedError, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import { runStepUnit } from '../actors/step.js';
import { runTurnUnit } from '../actors/turn.js';
import { runWakeUnit } from '../actors/wait.js';
import { runMapItemUnit, type ItemOutcomeWord } from '../actors/map-item.js';
import {
  abortUnit,
  createUnitHost,
  runDeadline,
  runRetryDue,
  type Admitted,
  type Chain,
  type UnitHost,
  type UnitOutcome,
} from '../actors/unit.js';
import { InputValidationError, RunNotFoundError } from '../errors.js';
import type { WorkerIdentity } from '../persistence/unit-notes.js';
import { coalesceWrites } from '../persistence/write-coalescing.js';
import { duplicateClient } from '../persistence/connection.js';
import type { RuntimeCore } from '../actors/core.js';
import { JobName, type JobData, type JobSpec } from '../actors/jobs.js';
import { processDebounceJob, type DebounceJobData } from './debounce-job.js';
import { processStartJob } from './start-job.js';
import { launchRun } from './start-run.js';
import { processScheduleJob, tendSchedules } from './schedule-firing.js';
import { reconcileEnded } from './reconcile.js';
import { createWorkerRegistry, type UnitEnd, type WorkerStatus } from './registry.js';
import { preloadTokenizers } from '../llm/tokens.js';
import { beat, endBeats } from './heartbeat.js';
import { missingFor, notePutBack, PUT_BACK_MS, type Missing } from './routing.js';
import { assertQueueName } from '../persistence/keys.js';

// The units each runtime is running in this process, by run, step, attempt, pause and turn.
const runningHere = new WeakMap<RuntimeCore, Set<string>>();

/**
 * Runs the unit a job (or a chain) names: a turn of a granular step, or a step attempt. A unit
 * this runtime is already running in this process is not run a second time: its job came back
 * while the first execution still runs (its lock lapsed while the event loop was busy, and the
 * stalled check handed it out again), and that execution commits it and enqueues what follows.
 */
export async function runUnit(
  host: UnitHost,
  name: string,
  data: JobData,
  chain: Chain,
  jobSignal?: AbortSignal,
  held?: Admitted,
): Promise<UnitOutcome> {
  let running = runningHere.get(host.core);
  if (running === undefined) runningHere.set(host.core, (running = new Set()));
  const key = `${data.runId}\n${data.stepId ?? ''}\n${data.attempt ?? ''}\n${data.pause ?? 0}\n${data.turn ?? ''}`;
  if (running.has(key)) return 'running-here';
  running.add(key);
  try {
    return await (name === JobName.turn
      ? runTurnUnit(host, data, chain, jobSignal, held)
      : runStepUnit(host, data, chain, jobSignal, held));
  } finally {
    running.delete(key);
  }
}

/** Options of a worker. */
export interface WorkerOptions {
  /** Units of work processed at once by this worker. @defaultValue 8 */
  concurrency?: number;
  /**
   * How soon a run whose worker died continues on another worker, in ms: the job lock lasts
   * half of it and the stalled check runs every quarter.
   * @defaultValue 2000
   */
  recoveryMs?: number;
  /** Lease of a running tool call in the ledger, renewed while it runs. @defaultValue 5000 */
  toolLeaseMs?: number;
  /** Re-enqueue the work of every unfinished run when the worker starts. @defaultValue true */
  recoverOnStart?: boolean;
  /**
   * How often, in ms, the worker sweeps the active runs: each active run's due work is enqueued
   * again under its unit's job id (a unit that has a job is not added twice), so a run left with
   * due work and no job (a start that could not queue it, a job lost) is driven again. The set of
   * active runs is walked in batches (`SSCAN`), and each run's snapshot is read without its
   * outputs. Each sweep also reads the status of the runs that ended within the runtime's
   * `endedRunsCheckMs` and drives again one whose snapshot no longer says it ended (a failover
   * that took back its last commits). 0: no periodic sweep (only the one at start, with
   * `recoverOnStart`).
   * @defaultValue 30000
   */
  sweepEveryMs?: number;
  /**
   * How long one job may go on with its run's next units, in ms, before it hands the next one to
   * the queue. After a commit that leaves the run exactly one unit to do (the next step of a
   * line, the next turn of an agent), the job runs that unit itself instead of enqueueing it and
   * waiting for the queue to hand it out again: a step or turn then costs one commit, not a
   * commit, a queue add and a queue fetch. The job stays locked meanwhile, so a worker that dies
   * mid-chain is recovered exactly as one that died in a single unit. 0: one job per unit.
   * @defaultValue 1000
   */
  chainMs?: number;
  /**
   * The BullMQ queues the worker takes units from, each with `concurrency` units at once.
   * @defaultValue the runtime's `queueName`
   */
  queues?: readonly string[];
  /**
   * How often, in ms, the worker writes its heartbeat (see `runtime.workers()`); it holds three
   * times as long. A whole number, at least 100. @defaultValue 5000
   */
  heartbeatMs?: number;
}

/** A running worker. */
export interface FlujoWorker {
  /** Resolves once the worker listens and its start-up recovery is done. */
  ready(): Promise<void>;
  /** Stops taking work, lets running units finish, and closes its connections. */
  close(): Promise<void>;
  /**
   * What the worker is doing, in this process: the units it is running (run, step, attempt,
   * turn, since when), and how many units it finished, saw fail or handed back since it started.
   * A plain snapshot: it does not change afterwards.
   */
  status(): WorkerStatus;
}

/** The sweep interval option, checked: 0 (no sweep) or a whole number of ms, at least 100. */
function checkSweepEvery(value: unknown): number {
  if (value === undefined) return 30_000;
  if (typeof value === 'number' && Number.isInteger(value) && (value === 0 || value >= 100)) {
    return value;
  }
  throw new InputValidationError('worker options', [
    {
      path: 'sweepEveryMs',
      message: `must be 0 (no periodic sweep) or a whole number of milliseconds of at least 100, got ${typeof value === 'number' ? String(value) : (JSON.stringify(value) ?? typeof value)}`,
    },
  ]);
}

/** The heartbeat interval option, checked: a whole number of ms, at least 100. */
function checkHeartbeat(value: unknown): number {
  if (value === undefined) return 5000;
  if (typeof value === 'number' && Number.isInteger(value) && value >= 100) return value;
  throw new InputValidationError('worker options', [
    {
      path: 'heartbeatMs',
      message: `must be a whole number of milliseconds of at least 100, got ${JSON.stringify(value) ?? typeof value}`,
    },
  ]);
}

/** Starts a BullMQ worker that drives the runtime's runs one unit of work at a time. */
export function startWorker(core: RuntimeCore, options: WorkerOptions = {}): FlujoWorker {
  const sweepEveryMs = checkSweepEvery(options.sweepEveryMs);
  const recoveryMs = options.recoveryMs ?? 2000;
  const chainMs = options.chainMs ?? 1000;
  const identity: WorkerIdentity = {
    host: hostname(),
    pid: process.pid,
    id: randomUUID().slice(0, 8),
  };
  const concurrency = options.concurrency ?? 8;
  const host = createUnitHost(core, {
    leaseMs: options.toolLeaseMs ?? 5000,
    identity,
    // A run step's child: started through the one start path, as a start tried again.
    startRun: (plan, input, o, links) =>
      launchRun(
        core,
        plan,
        input,
        { runId: o.runId, tenantId: o.tenantId, ...(o.queue === null ? {} : { queue: o.queue }) },
        true,
        { links },
      ),
  });
  const registry = createWorkerRegistry({ worker: identity, concurrency, startedAt: core.clock() });
  // BullMQ's blocking connection is duplicated from this one: no command timeout (BullMQ bounds
  // its blocking reads itself).
  const connection: Redis = coalesceWrites(
    duplicateClient(core.redis, { maxRetriesPerRequest: null, commandTimeout: undefined }),
  );
  connection.on('error', () => {});
  const subscriber: Redis = duplicateClient(core.redis);
  subscriber.on('error', () => {});
  subscriber.on('message', (_channel: string, message: string) => {
    abortUnit(host, message);
  });
  const closing = new AbortController();

  const processor = async (job: Job<JobData>, token?: string, signal?: AbortSignal) => {
    try {
      switch (job.name) {
        case JobName.step:
        case JobName.turn:
          return await processUnits(job, token, signal);
        case JobName.retry:
          return await runRetryDue(host, job.data);
        case JobName.deadline:
          return await runDeadline(host, job.data.runId);
        case JobName.wake: {
          const woke = await runWakeUnit(host, job.data);
          if (typeof woke === 'string') return woke;
          // A timer woken before its time (clocks apart): back to the queue until then.
          await job.moveToDelayed(core.clock() + woke.retryAfterMs, token);
          throw new DelayedError();
        }
        case JobName.item: {
          const outcome = await processItem(job);
          if (typeof outcome === 'string') return outcome;
          // A tool call another worker holds, or Redis trouble: back to the queue, no attempt spent.
          await job.moveToDelayed(core.clock() + outcome.retryAfterMs, token);
          throw new DelayedError();
        }
        case JobName.start:
          return await processStartJob(core, job);
        case JobName.schedule: {
          const result = await processScheduleJob(core, job);
          if (typeof result === 'string') return result;
          // A buffered fire whose previous run is still going: looked at again later.
          await job.moveToDelayed(result.retryAt, token);
          throw new DelayedError();
        }
        case JobName.debounce: {
          const result = await processDebounceJob(core, job.data as unknown as DebounceJobData);
          if (typeof result === 'string') return result;
          // Later starts of the burst pushed its run back: looked at again then.
          await job.moveToDelayed(result.retryAt, token);
          throw new DelayedError();
        }
        default:
          return 'unknown-job';
      }
    } catch (error) {
      // A job for a run that no longer exists has nothing to do.
      if (error instanceof RunNotFoundError) return 'run-not-found';
      throw error;
    }
  };

  /**
   * Runs the job's unit, then, while the chain may go on, the units its commits leave as the
   * run's only work (see `chainMs`), each admitted like a job of its own but without reading the
   * run again: the job's own commit is the latest.
   */
  async function processUnits(
    job: Job<JobData>,
    token: string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<string> {
    const chain: Chain = {
      self: job.id!,
      until: chainMs > 0 ? performance.now() + chainMs : -Infinity,
      closing: closing.signal,
      ...(token === undefined
        ? {}
        : {
            holdLock: (ms: number) =>
              job.extendLock(token, ms).then(
                () => {},
                () => {}, // best effort: a commit that Redis does not take fails on its own
              ),
          }),
    };
    let name = job.name;
    let data = job.data;
    let held: Admitted | undefined;
    let carried: JobSpec | undefined;
    const jobId = job.id!;
    const ended = (end: UnitEnd) => registry.trigger.unitEnded({ jobId, end });
    const endOf = (word: string): UnitEnd => (word === 'failed' ? 'attemptFailed' : 'done');
    for (;;) {
      const missing = await missingFor(core, name, data);
      if (missing !== null) return putBack(job, token, data.runId, carried, missing);
      registry.trigger.unitStarted({
        unit: {
          jobId,
          runId: data.runId,
          stepId: data.stepId!,
          attempt: data.attempt!,
          turn: data.turn ?? null,
          kind: name === JobName.turn ? 'turn' : 'step',
          since: core.clock(),
        },
      });
      let outcome;
      try {
        outcome = await runUnit(host, name, data, chain, signal, held);
      } catch (error) {
        ended(error instanceof RunNotFoundError ? 'done' : 'threw');
        throw error;
      }
      if (typeof outcome === 'string') {
        ended(endOf(outcome));
        return outcome;
      }
      if ('next' in outcome) {
        ended(endOf(outcome.ended));
        ({ name, data } = outcome.next);
        carried = outcome.next;
        held = outcome.admitted;
        continue;
      }
      ended('busy');
      // Another worker still holds a lease on one of the step's tool calls (it may be alive, or
      // its lease has not lapsed yet), or the unit waits for a concurrency slot: come back later,
      // without spending an attempt (a parked unit is woken sooner when a slot is handed to it).
      const at = core.clock() + outcome.retryAfterMs;
      if (held === undefined) {
        await job.moveToDelayed(at, token);
        await wakeIfHanded(outcome, data.runId, jobId);
        throw new DelayedError();
      }
      // A unit this job carried: it gets its own job, due then.
      await core.queues.add([
        { ...outcome.unit, opts: { ...outcome.unit.opts, delay: outcome.retryAfterMs } },
      ]);
      await wakeIfHanded(outcome, data.runId, outcome.unit.opts.jobId);
      return outcome.parked === undefined ? 'busy' : 'parked';
    }
  }

  /** Runs an item job's unit (see `map-item.ts`), noted in the registry like a step's. */
  async function processItem(job: Job<JobData>): Promise<ItemOutcomeWord> {
    const { data } = job;
    const jobId = job.id!;
    const missing = await missingFor(core, JobName.step, data);
    if (missing !== null) {
      await notePutBack(core, data.runId, missing, job.queueName, identity).catch(() => {});
      return { retryAfterMs: PUT_BACK_MS };
    }
    registry.trigger.unitStarted({
      unit: {
        jobId,
        runId: data.runId,
        stepId: data.stepId!,
        attempt: data.attempt!,
        turn: null,
        kind: 'step',
        since: core.clock(),
      },
    });
    try {
      const outcome = await runMapItemUnit(host, data, jobId);
      const failed = outcome === 'item-failed' || outcome === 'item-retry';
      registry.trigger.unitEnded({ jobId, end: failed ? 'attemptFailed' : 'done' });
      return outcome;
    } catch (error) {
      registry.trigger.unitEnded({ jobId, end: 'threw' });
      throw error;
    }
  }

  /**
   * A unit parked for a concurrency slot that was handed the slot before its job was delayed (the
   * wake-up found no delayed job to run): its job runs now.
   */
  async function wakeIfHanded(
    outcome: { parked?: () => Promise<boolean> },
    runId: string,
    jobId: string,
  ): Promise<void> {
    if (outcome.parked === undefined || !(await outcome.parked().catch(() => false))) return;
    await core.queues.wakeJob(runId, jobId).catch(() => {}); // else it comes back on its delay
  }

  /**
   * A unit this worker cannot run (see `routing.ts`): back to its queue untried, due again in a
   * while (a delay, not a failed attempt), and noted on its run. A unit this job carried gets a
   * job of its own, delayed alike.
   */
  async function putBack(
    job: Job<JobData>,
    token: string | undefined,
    runId: string,
    carried: JobSpec | undefined,
    missing: Missing,
  ): Promise<string> {
    await notePutBack(core, runId, missing, job.queueName, identity).catch(() => {});
    if (carried === undefined) {
      await job.moveToDelayed(core.clock() + PUT_BACK_MS, token);
      throw new DelayedError();
    }
    await core.queues.add([{ ...carried, opts: { ...carried.opts, delay: PUT_BACK_MS } }]);
    return 'put-back';
  }

  const queueNames = [...new Set(options.queues ?? [core.queues.queueName])];
  for (const q of queueNames) assertQueueName(q, 'queues');
  const workers = queueNames.map((q) => {
    const w = new Worker<JobData>(q, processor, {
      connection,
      prefix: core.stores.keys.queuePrefix(),
      concurrency,
      lockDuration: Math.max(200, Math.round(recoveryMs / 2)),
      stalledInterval: Math.max(100, Math.round(recoveryMs / 4)),
      // Redelivery is safe (the unit's guard); never give up on a unit because it stalled.
      maxStalledCount: 1_000_000,
      autorun: false,
    });
    w.on('error', () => {});
    return w;
  });

  // The first agent step would build its model's tokenizer (a second or more): built now, in
  // the background, while the worker gets ready and waits for work.
  const models = [...core.registry.agents.values()].map((agent) => agent.model);
  if (models.length > 0) void preloadTokenizers(models).catch(() => {});

  const heartbeatMs = checkHeartbeat(options.heartbeatMs);
  const startedAt = core.clock();
  /** Writes the worker's heartbeat (see `heartbeat.ts`); trouble with Redis skips one. */
  async function heartbeat(): Promise<void> {
    await beat(
      core.redis,
      core.stores.keys,
      {
        id: identity.id,
        host: identity.host,
        pid: identity.pid,
        queues: queueNames,
        operators: [...core.registry.operators.keys()].sort(),
        agents: [...core.registry.agents.keys()].sort(),
        inFlight: registry.getSnapshot().context.running.length,
        startedAt,
        beatAt: core.clock(),
      },
      heartbeatMs * 3,
    ).catch(() => {});
  }
  const ready = (async () => {
    await subscriber.subscribe(core.queues.abortChannel());
    await heartbeat();
    if (options.recoverOnStart ?? true) await recover();
    for (const w of workers) void w.run().catch(() => {});
    await Promise.all(workers.map((w) => w.waitUntilReady()));
    if (sweepEveryMs > 0 && !closing.signal.aborted) scheduleSweep();
  })();

  const beating = setInterval(() => void heartbeat(), heartbeatMs);
  beating.unref();

  let sweepTimer: NodeJS.Timeout | undefined;
  let sweeping: Promise<void> = Promise.resolve();
  /** Sweeps the active runs every `sweepEveryMs`, one sweep at a time, until the worker closes. */
  function scheduleSweep(): void {
    sweepTimer = setTimeout(() => {
      // Trouble with Redis ends this sweep; the next one tries again.
      sweeping = recover(false)
        .catch(() => {})
        .finally(() => {
          if (!closing.signal.aborted) scheduleSweep();
        });
    }, sweepEveryMs);
    sweepTimer.unref();
  }

  /**
   * Hands the due work of every unfinished run to the queue again (ids make repeats harmless; a
   * due unit whose job finished with no commit since has the run's finished jobs replaced), then
   * checks the runs that ended lately (`reconcileEnded`: one whose end was taken back is
   * driven again). At start (`relist`), a run missing from the run list is listed again.
   */
  async function recover(relist = true): Promise<void> {
    await core.stores.activeRuns.forEach(async (runId) => {
      if (closing.signal.aborted) return;
      const env = await core.stores.store.tryLoad(runId, { outputs: false });
      if (env === null) {
        await core.stores.activeRuns.remove(runId);
        return;
      }
      await core.stores.acknowledgeRead(runId);
      const finished = await core.queues.sweepDue(runId, env, (id) =>
        core.stores.store.version(id),
      );
      if (finished.length > 0) {
        core.log.warn(
          { runId, jobIds: finished },
          "a unit of an active run is due but its job has finished with no commit since (the commit was lost, as by a failover to a replica that lagged, or the job gave up): the run's finished jobs are replaced and it is driven on",
        );
      }
      // A run started before the run list existed (or whose entry was lost) is listed again.
      if (relist && !(await core.stores.runs.has(runId))) {
        const meta = await core.meta.read(runId);
        await core.stores.runs.add({
          runId,
          planName: meta.plan.name,
          tenantId: meta.tenantId,
          createdAt: meta.createdAt || env.snapshot.context.createdAt,
        });
      }
    });
    if (!closing.signal.aborted) await reconcileEnded(core, closing.signal);
    // What runs whose keys expired leave: list entries, completed jobs (each removed as later runs
    // end or complete, but not after the last ones).
    if (!closing.signal.aborted) await core.stores.runs.dropExpired();
    for (const name of queueNames) {
      if (!closing.signal.aborted) await core.queues.cleanCompleted(name);
    }
    if (!closing.signal.aborted) await tendSchedules(core, closing.signal);
  }

  return {
    ready: () => ready,
    status: () => registry.getSnapshot().context,
    async close() {
      closing.abort();
      clearTimeout(sweepTimer);
      registry.trigger.closing();
      await ready.catch(() => {});
      await sweeping;
      clearInterval(beating);
      await Promise.all(workers.map((w) => w.close()));
      await endBeats(core.redis, core.stores.keys, identity.id).catch(() => {});
      subscriber.disconnect();
      connection.disconnect();
    },
  };
}
