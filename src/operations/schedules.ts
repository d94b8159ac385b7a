/**
 * The runtime's schedule calls: define (or redefine) one, list them, pause, resume, remove and
 * trigger. A definition is stored in Redis (any process lists it); its fires come from a BullMQ job
 * scheduler on the runtime's queue, which workers take as `schedule` jobs (see
 * `worker/schedule-firing.ts`).
 */
import type { RuntimeCore } from '../actors/core.js';
import { InputValidationError } from '../errors.js';
import { keyInputIssues } from '../execution/action-keys.js';
import { assertPlainJson } from '../internal/json.js';
import {
  assertScheduleId,
  checkScheduleOptions,
  DEFAULT_CATCHUP_WINDOW_MS,
  type OverlapPolicy,
  type ScheduleDefinition,
  type ScheduleOptions,
} from '../worker/schedule-definition.js';
import {
  fireOnce,
  scheduleStore,
  scheduleQueue,
  schedulerId,
  upsertScheduler,
} from '../worker/schedule-firing.js';
import type { ScheduleFire } from '../worker/schedule-store.js';

/** A schedule as `runtime.schedules()` lists it. */
export interface ScheduleInfo {
  id: string;
  cron?: string;
  everyMs?: number;
  tz?: string;
  /** The name of the plan each fire starts. */
  plan: string;
  input: unknown;
  overlap: OverlapPolicy;
  catchupWindowMs: number;
  paused: boolean;
  createdAt: number;
  updatedAt: number;
  /** The next fire time BullMQ holds for it (epoch ms), or null (paused, or none yet). */
  nextFireAt: number | null;
  /** The run of its newest started fire, or null. */
  lastRunId: string | null;
  /** The key of the fire waiting for the previous run to end (`buffer_one`), or null. */
  bufferedFire: string | null;
  /** Its newest fires (at most 50), newest first, each with its outcome. */
  fires: ScheduleFire[];
}

/** Throws `InputValidationError` naming the id when there is no such schedule. */
async function existing(core: RuntimeCore, id: string): Promise<ScheduleDefinition> {
  assertScheduleId(id);
  const def = await scheduleStore(core).get(id);
  if (def !== null) return def;
  throw new InputValidationError('schedule', [
    {
      path: 'id',
      message: `no schedule "${id}"; list them with runtime.schedules() (flujo schedule list)`,
    },
  ]);
}

/**
 * `runtime.schedule`: checks every option (nothing is written when one is refused), stores the
 * definition (a redefinition keeps its creation time, its paused state and its fires; one with a
 * new rule handles fires from now on), and
 * creates or updates its BullMQ job scheduler unless it is paused.
 */
export async function defineSchedule(
  core: RuntimeCore,
  id: string,
  options: ScheduleOptions,
): Promise<ScheduleInfo> {
  assertScheduleId(id);
  checkScheduleOptions(options);
  const plan = core.meta.plans.parse(options.plan);
  const input = options.input ?? null;
  assertPlainJson(input, 'schedule input', 'input');
  const missing = keyInputIssues(plan, input);
  if (missing.length > 0) throw new InputValidationError('schedule input', missing);
  const store = scheduleStore(core);
  const before = await store.get(id);
  const now = core.clock();
  const def: ScheduleDefinition = {
    id,
    ...(options.cron === undefined ? {} : { cron: options.cron.trim() }),
    ...(options.everyMs === undefined ? {} : { everyMs: options.everyMs }),
    ...(options.tz === undefined ? {} : { tz: options.tz }),
    plan,
    input,
    overlap: options.overlap ?? 'skip',
    catchupWindowMs: options.catchupWindowMs ?? DEFAULT_CATCHUP_WINDOW_MS,
    paused: before?.paused ?? false,
    createdAt: before?.createdAt ?? now,
    updatedAt: now,
    queue: core.queues.queueName,
  };
  // A new rule starts from now: the fires of the old one are not caught up on the new one's times.
  const ruleChanged =
    before !== null &&
    (before.cron !== def.cron || before.everyMs !== def.everyMs || before.tz !== def.tz);
  await store.put(def, now, ruleChanged);
  // Defined again from a runtime on another queue: its job scheduler moves to that queue.
  if (before !== null && scheduleQueue(core, before).name !== scheduleQueue(core, def).name) {
    await scheduleQueue(core, before).removeJobScheduler(schedulerId(id));
  }
  if (!def.paused) await upsertScheduler(core, def);
  return info(core, def);
}

/** What `schedules()` shows of one schedule. */
async function info(core: RuntimeCore, def: ScheduleDefinition): Promise<ScheduleInfo> {
  const store = scheduleStore(core);
  const [state, fires, scheduler] = await Promise.all([
    store.state(def.id),
    store.fires(def.id),
    def.paused ? undefined : scheduleQueue(core, def).getJobScheduler(schedulerId(def.id)),
  ]);
  return {
    id: def.id,
    ...(def.cron === undefined ? {} : { cron: def.cron }),
    ...(def.everyMs === undefined ? {} : { everyMs: def.everyMs }),
    ...(def.tz === undefined ? {} : { tz: def.tz }),
    plan: def.plan.name,
    input: def.input,
    overlap: def.overlap,
    catchupWindowMs: def.catchupWindowMs,
    paused: def.paused,
    createdAt: def.createdAt,
    updatedAt: def.updatedAt,
    nextFireAt: typeof scheduler?.next === 'number' ? scheduler.next : null,
    lastRunId: state.lastRun === '' ? null : state.lastRun,
    bufferedFire: state.buffered === '' ? null : state.buffered,
    fires,
  };
}

/** `runtime.schedules()`: every schedule of the prefix, by id. */
export async function listSchedules(core: RuntimeCore): Promise<ScheduleInfo[]> {
  const defs = await scheduleStore(core).all();
  return Promise.all(defs.map((def) => info(core, def)));
}

/** `runtime.pauseSchedule`: no fire until resumed; its BullMQ job scheduler is removed. */
export async function pauseSchedule(core: RuntimeCore, id: string): Promise<ScheduleInfo> {
  const def = await existing(core, id);
  const paused = { ...def, paused: true, updatedAt: core.clock() };
  await scheduleStore(core).put(paused, core.clock());
  await scheduleQueue(core, def).removeJobScheduler(schedulerId(id));
  return info(core, paused);
}

/**
 * `runtime.resumeSchedule`: fires again from now on (the fires of the time it was paused are
 * neither run nor recorded).
 */
export async function resumeSchedule(core: RuntimeCore, id: string): Promise<ScheduleInfo> {
  const def = await existing(core, id);
  const now = core.clock();
  const resumed = { ...def, paused: false, updatedAt: now };
  await scheduleStore(core).put(resumed, now, def.paused);
  await upsertScheduler(core, resumed);
  return info(core, resumed);
}

/** `runtime.removeSchedule`: its definition, fires and job scheduler go; its runs go on. */
export async function removeSchedule(core: RuntimeCore, id: string): Promise<void> {
  const def = await existing(core, id);
  await scheduleQueue(core, def).removeJobScheduler(schedulerId(id));
  await scheduleStore(core).remove(id);
}

/**
 * `runtime.triggerSchedule`: one fire now (key `manual-<ms>`), under the schedule's overlap
 * policy, paused or not. Returns the fire with its outcome.
 */
export async function triggerSchedule(core: RuntimeCore, id: string): Promise<ScheduleFire> {
  const def = await existing(core, id);
  const at = core.clock();
  return fireOnce(core, def, { key: `manual-${at}`, at, manual: true });
}
