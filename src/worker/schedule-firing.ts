/**
 * What a fire does, and what a worker does with the schedules (their BullMQ job schedulers, their
 * fires due by now). Each fire of a schedule has a key (its fire time in ms, or `manual-<ms>`) and
 * a run id derived from it (`schedule:<id>:<key>`). Its outcome (started, skipped, buffered,
 * missed, failed) is decided once, by a script that records it beside the schedule's state and
 * refuses a decision taken from a state that moved on; the run is started after, by its derived
 * id, so a second worker, a retried job or one that runs again after its worker died finds the
 * outcome recorded and the run there, and starts nothing more.
 */
import { FlujoError, RunAlreadyExistsError } from '../errors.js';
import type { Queue } from 'bullmq';
import type { RuntimeCore } from '../actors/core.js';
import { JobName } from '../actors/jobs.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import { runStatus } from '../machines/kernel.js';
import { launchRun } from './start-run.js';
import {
  firesBetween,
  isFireTime,
  nextFire,
  type ScheduleDefinition,
} from './schedule-definition.js';
import {
  KEPT_FIRES,
  ScheduleStore,
  type ScheduleFire,
  type ScheduleState,
} from './schedule-store.js';

/** The data of a `schedule` job. */
export interface ScheduleJobData {
  scheduleId: string;
  /** For the job of a buffered fire: its key and time. */
  buffered?: string;
  fireAt?: number;
}

/** How often the job of a buffered fire looks whether the previous run ended, in ms. */
export const BUFFERED_POLL_MS = 250;

/**
 * A started fire whose run does not exist yet is taken as starting (its job will create it) for
 * this long; after that (its job gave up), as ended.
 */
const STARTING_GRACE_MS = 5 * 60_000;

/** The BullMQ job scheduler id of schedule `id`. */
export const schedulerId = (id: string): string => `schedule-${id}`;

/** The run id of a fire: derived from the schedule id and the fire's key. */
export const fireRunId = (id: string, key: string): string => `schedule:${id}:${key}`;

/** The schedules of the core's prefix. */
export function scheduleStore(core: RuntimeCore): ScheduleStore {
  return new ScheduleStore(core.redis, core.stores.keys);
}

/** Whether the run of a schedule's previous fire is still going. */
async function stillGoing(core: RuntimeCore, state: ScheduleState): Promise<boolean> {
  if (state.lastRun === '') return false;
  const env = await core.stores.store.tryLoad(state.lastRun, { outputs: false });
  if (env === null) {
    if ((await core.redis.exists(core.stores.keys.removed(state.lastRun))) !== 0) return false;
    return core.clock() - state.lastRunAt < STARTING_GRACE_MS;
  }
  const status = runStatus(env.snapshot);
  return status === 'running' || status === 'waiting';
}

/** The outcome of a fire from the schedule's state, before it is recorded. */
async function decide(
  core: RuntimeCore,
  def: ScheduleDefinition,
  state: ScheduleState,
  fire: Pick<ScheduleFire, 'key' | 'at' | 'manual'>,
): Promise<{ fire: ScheduleFire; lastRun?: string; buffered?: string }> {
  const base = { ...fire, decidedAt: core.clock() };
  const runId = fireRunId(def.id, fire.key);
  if (def.overlap === 'allow_all') {
    return { fire: { ...base, outcome: 'started', runId }, lastRun: runId };
  }
  if (state.buffered !== '') {
    const reason = `fire ${state.buffered} waits for the previous run to end`;
    return { fire: { ...base, outcome: 'skipped', reason } };
  }
  if (!(await stillGoing(core, state))) {
    return { fire: { ...base, outcome: 'started', runId }, lastRun: runId };
  }
  if (def.overlap === 'buffer_one') {
    return { fire: { ...base, outcome: 'buffered', runId }, buffered: fire.key };
  }
  const reason = `the previous run ${state.lastRun} is still going`;
  return { fire: { ...base, outcome: 'skipped', reason } };
}

/**
 * Starts the run of a fire recorded `started`, by its derived id (a run already there is the one).
 * A start the runtime refuses (the plan or input no longer valid) is recorded `failed`; returns
 * the fire as it ends up.
 */
async function launch(
  core: RuntimeCore,
  def: ScheduleDefinition,
  fire: ScheduleFire,
): Promise<ScheduleFire> {
  const runId = fire.runId!;
  try {
    const queue = def.queue === undefined ? {} : { queue: def.queue };
    await launchRun(core, def.plan, def.input, { runId, ...queue }, true);
    return fire;
  } catch (error) {
    // The fire's run exists, started from an earlier definition of the schedule: it is the one.
    if (error instanceof RunAlreadyExistsError) return fire;
    if (!(error instanceof FlujoError) || error.retryable) throw error;
    const failed: ScheduleFire = { ...fire, outcome: 'failed', reason: error.message };
    const how = { overwrite: true, clearRun: runId };
    await scheduleStore(core).record(def.id, failed, how, core.clock());
    return failed;
  }
}

/** Adds the job of a buffered fire (its id derived from the fire: added once). */
async function addBufferedJob(
  core: RuntimeCore,
  def: ScheduleDefinition,
  fire: ScheduleFire,
): Promise<void> {
  const id = def.id;
  const data: ScheduleJobData = { scheduleId: id, buffered: fire.key, fireAt: fire.at };
  await scheduleQueue(core, def).add(JobName.schedule, data, {
    jobId: `sb|${id}|${fire.key}`,
    delay: BUFFERED_POLL_MS,
  });
}

/**
 * Decides one fire (once: a fire decided already keeps its outcome) and does what it says:
 * starts its run, or adds the job that starts it once the previous run ends.
 */
export async function fireOnce(
  core: RuntimeCore,
  def: ScheduleDefinition,
  fire: Pick<ScheduleFire, 'key' | 'at' | 'manual'>,
): Promise<ScheduleFire> {
  const store = scheduleStore(core);
  for (;;) {
    const state = await store.state(def.id);
    const decided = await decide(core, def, state, fire);
    const result = await store.record(
      def.id,
      decided.fire,
      {
        ...(def.overlap === 'allow_all' ? {} : { expect: state }),
        ...(decided.lastRun === undefined ? {} : { lastRun: decided.lastRun }),
        ...(decided.buffered === undefined ? {} : { buffered: decided.buffered }),
      },
      core.clock(),
    );
    if (result.kind === 'stale') continue;
    if (result.kind === 'removed') {
      return { ...decided.fire, outcome: 'skipped', reason: 'the schedule was removed' };
    }
    const recorded = result.fire;
    if (result.kind === 'recorded' && recorded.outcome === 'started') {
      debugPoint(DebugPoint.afterFireRecorded, def.id);
    }
    if (recorded.outcome === 'started') return launch(core, def, recorded);
    if (recorded.outcome === 'buffered') await addBufferedJob(core, def, recorded);
    return recorded;
  }
}

/** Records a fire `missed` (unless it was decided already). */
async function recordMissed(core: RuntimeCore, id: string, at: number): Promise<void> {
  const fire: ScheduleFire = { key: String(at), at, outcome: 'missed', decidedAt: core.clock() };
  await scheduleStore(core).record(id, fire, {}, core.clock());
}

/**
 * Handles every fire of the schedule due by now that has no outcome yet: those after its state's
 * `last` up to now (and `fireAt`, the fire a job brings, when it is one of the rule's: BullMQ may
 * name a job by a time off the rule). A fire more than `catchupWindowMs` old
 * is recorded missed (the newest {@link KEPT_FIRES} of them: older ones would not be kept), the
 * others are fired in order. `last` moves on only once all are handled, so a worker that dies
 * midway leaves them to the next one (each fire is decided once, whoever comes).
 */
export async function catchUp(
  core: RuntimeCore,
  def: ScheduleDefinition,
  fireAt?: number,
): Promise<void> {
  const store = scheduleStore(core);
  const { last } = await store.state(def.id);
  const now = core.clock();
  const upTo = Math.max(now, fireAt ?? 0);
  const oldest = now - def.catchupWindowMs;
  const missed = firesBetween(def, last, Math.min(upTo, oldest - 1), KEPT_FIRES);
  const due = firesBetween(def, Math.max(last, oldest - 1), upTo, 100_000);
  const onRule = fireAt !== undefined && isFireTime(def, fireAt);
  if (onRule && fireAt > last && !missed.includes(fireAt) && !due.includes(fireAt)) {
    (fireAt < oldest ? missed : due).push(fireAt);
    due.sort((a, b) => a - b);
  }
  for (const at of missed) await recordMissed(core, def.id, at);
  for (const at of due) await fireOnce(core, def, { key: String(at), at });
  await store.advance(def.id, upTo);
}

/** What the worker does with a `schedule` job: a fire, or a buffered fire's check. */
export type ScheduleJobResult = string | { retryAt: number };

/**
 * The job of a buffered fire: once the schedule's previous run has ended, the fire is recorded
 * started and its run started; until then `{ retryAt }` (the worker delays the job).
 */
async function startBuffered(
  core: RuntimeCore,
  id: string,
  key: string,
): Promise<ScheduleJobResult> {
  const store = scheduleStore(core);
  const def = await store.get(id);
  for (;;) {
    const fire = await store.fire(id, key);
    // Started already (its worker died before the run was created): start it, by its id.
    if (fire?.outcome === 'started' && def !== null) await launch(core, def, fire);
    if (fire?.outcome !== 'buffered') return fire?.outcome ?? 'no-fire';
    const state = await store.state(id);
    if (state.buffered !== key) return 'not-buffered';
    const now = core.clock();
    if (def === null || def.paused) {
      const reason = def === null ? 'the schedule was removed' : 'the schedule was paused';
      const skipped: ScheduleFire = { ...fire, outcome: 'skipped', reason, decidedAt: now };
      await store.record(id, skipped, { overwrite: true, buffered: null }, now);
      return 'skipped';
    }
    if (await stillGoing(core, state)) return { retryAt: now + BUFFERED_POLL_MS };
    const started: ScheduleFire = { ...fire, outcome: 'started', decidedAt: now };
    const result = await store.record(
      id,
      started,
      { overwrite: true, expect: state, lastRun: fire.runId!, buffered: null },
      now,
    );
    if (result.kind === 'stale') continue;
    if (result.kind === 'removed') return 'no-schedule';
    await launch(core, def, started);
    return 'started';
  }
}

/** The fire time of a job of a BullMQ job scheduler: its id is `repeat:<scheduler>:<ms>`. */
function fireTimeOf(job: { id?: string | undefined; opts?: { prevMillis?: number } }): number {
  const tail = Number(job.id?.slice(job.id.lastIndexOf(':') + 1));
  if (Number.isInteger(tail) && tail > 0) return tail;
  return job.opts?.prevMillis ?? Date.now();
}

/** Handles a `schedule` job. */
export async function processScheduleJob(
  core: RuntimeCore,
  job: { id?: string | undefined; data: unknown; opts?: { prevMillis?: number } },
): Promise<ScheduleJobResult> {
  const data = job.data as ScheduleJobData;
  if (data.buffered !== undefined) return startBuffered(core, data.scheduleId, data.buffered);
  const def = await scheduleStore(core).get(data.scheduleId);
  if (def === null) return 'no-schedule';
  if (def.paused) return 'paused';
  await catchUp(core, def, fireTimeOf(job));
  return 'fired';
}

/** The template of the jobs a schedule's BullMQ job scheduler adds. */
function template(id: string) {
  const data: ScheduleJobData = { scheduleId: id };
  return {
    name: JobName.schedule,
    data,
    opts: {
      removeOnComplete: { age: 24 * 3600, count: 1000 },
      removeOnFail: { age: 7 * 24 * 3600, count: 1000 },
      attempts: 25,
      backoff: { type: 'exponential', delay: 100 },
    },
  };
}

/**
 * Creates or updates the schedule's BullMQ job scheduler. An `everyMs` schedule fires at the
 * multiples of `everyMs` since the epoch: its first fire is the next one after now.
 */
export async function upsertScheduler(core: RuntimeCore, def: ScheduleDefinition): Promise<void> {
  const repeat =
    def.everyMs !== undefined
      ? { every: def.everyMs, startDate: nextFire(def, core.clock()) }
      : { pattern: def.cron!, ...(def.tz === undefined ? {} : { tz: def.tz }) };
  await scheduleQueue(core, def).upsertJobScheduler(schedulerId(def.id), repeat, template(def.id));
}

/** The queue of the schedule's job scheduler, fires and runs (see `ScheduleDefinition.queue`). */
export function scheduleQueue(core: RuntimeCore, def: Pick<ScheduleDefinition, 'queue'>): Queue {
  return core.queues.queueNamed(def.queue ?? core.queues.queueName);
}

/**
 * What a worker does with the schedules when it starts and at each sweep: gives a schedule that
 * is not paused a BullMQ job scheduler if it has none (its definition was stored but the
 * scheduler was not made), and handles its fires due by now (`catchUp`). Trouble with one
 * schedule is logged and leaves the others.
 */
export async function tendSchedules(core: RuntimeCore, signal: AbortSignal): Promise<void> {
  const defs = await scheduleStore(core).all();
  for (const def of defs) {
    if (signal.aborted) return;
    if (def.paused) continue;
    try {
      const scheduler = await scheduleQueue(core, def).getJobScheduler(schedulerId(def.id));
      if (scheduler === undefined) await upsertScheduler(core, def);
      await catchUp(core, def);
    } catch (error) {
      core.log.warn({ scheduleId: def.id, err: error }, 'a schedule could not be tended');
    }
  }
}
