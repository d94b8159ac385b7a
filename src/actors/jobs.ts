import { InputValidationError } from '../errors.js';
import { runSteps, stepEntry, type RunSnapshot } from '../machines/kernel.js';
import { isFinalStepStatus, type PlannedAction } from '../machines/types.js';

/** The kinds of BullMQ job that drive runs: one unit of work each. */
export const JobName = {
  /**
   * Start a run: the one job a producer outside the runtime adds (see `start-job.ts`); its data is
   * a `StartJobData`, not a {@link JobData}.
   */
  start: 'start',
  /** Execute attempt `attempt` of step `stepId`. */
  step: 'step',
  /** Take turn `turn` of attempt `attempt` of granular agent step `stepId`. */
  turn: 'turn',
  /** The backoff of a failed attempt elapsed: feed `retry.due`. */
  retry: 'retry',
  /** The run's wall-clock budget ran out: stop it if it is still going. */
  deadline: 'deadline',
  /**
   * Wake wait step `stepId` (attempt `attempt`): a signal it waits for arrived, or its time (a
   * timer, a signal wait's timeout) came (see `wait.ts`); or run step `stepId`'s child run ended
   * (see `child.ts`).
   */
  wake: 'wake',
  /**
   * A schedule fired (added by its BullMQ job scheduler), or a fire that waits for the previous
   * run to end (`buffer_one`); its data is a `ScheduleJobData`, not a {@link JobData}.
   */
  schedule: 'schedule',
  /**
   * Run item `index` (its attempt `itemAttempt`) of attempt `attempt` of map step `stepId`; with no
   * `index`, finish the map: its items are all committed (or one failed), so its output is
   * assembled and committed. See `map-item.ts`.
   */
  item: 'item',
  /**
   * A debounce burst's time came: start its run with the burst's last input (see
   * `worker/debounce-job.ts`); its data is a `DebounceJobData`, not a {@link JobData}.
   */
  debounce: 'debounce',
} as const;
/** A value of {@link JobName}. */
export type JobName = (typeof JobName)[keyof typeof JobName];

/** The data of every job: which run, for step and retry jobs which step attempt, for turn jobs which turn. */
export interface JobData {
  runId: string;
  stepId?: string;
  attempt?: number;
  turn?: number;
  /**
   * For an attempt that paused for a tool call's approval: the execution it resumes as (the step's
   * `pauses`). Absent for the attempt's first execution.
   */
  pause?: number;
  /** For an item job: the item's index in its map's list. */
  index?: number;
  /** For an item job: the item's attempt (1 for the first). */
  itemAttempt?: number;
}

/** A job to add, with its deterministic id (its BullMQ priority is set from its run's meta). */
export interface JobSpec {
  name: JobName;
  data: JobData;
  opts: { jobId: string; delay?: number; priority?: number };
}

/** The lowest run priority a start may give (see {@link bullPriority}). */
export const PRIORITY_MIN = -1000;
/** The highest run priority a start may give. */
export const PRIORITY_MAX = 1000;

/** Throws {@link InputValidationError} naming `field` unless `priority` is an integer in range. */
export function assertPriority(priority: unknown, field = 'priority'): asserts priority is number {
  if (
    typeof priority !== 'number' ||
    !Number.isInteger(priority) ||
    priority < PRIORITY_MIN ||
    priority > PRIORITY_MAX
  ) {
    throw new InputValidationError('start options', [
      {
        path: field,
        message: `must be an integer from ${PRIORITY_MIN} to ${PRIORITY_MAX} (higher goes first, 0 by default), got ${JSON.stringify(priority) ?? String(priority)}`,
      },
    ]);
  }
}

/**
 * The BullMQ priority of a unit job of a run of priority `priority` (higher goes first, 0 by
 * default). BullMQ takes a job with no priority before any prioritized one, and a lower number
 * first among these: so every unit job gets one, from 1 (priority 1000) to 2001 (priority -1000),
 * a run started without a priority included (1001), and a higher run priority goes first.
 */
export function bullPriority(priority: number): number {
  return PRIORITY_MAX + 1 - priority;
}

// Step ids never contain '|' (see STEP_ID_PATTERN) and run ids are URI-encoded, so ids cannot
// collide; BullMQ job ids must not contain ':'.
const enc = (runId: string) => encodeURIComponent(runId);

// An execution resumed after a tool call's approval is a unit of its own: its id says which.
const pauseSuffix = (pause: number | undefined) =>
  pause === undefined || pause === 0 ? '' : `|p${pause}`;

/**
 * The id of the job that runs attempt `attempt` of `stepId` (its execution after `pause` approved
 * tool calls): the same for every enqueuer.
 */
export function stepJobId(runId: string, stepId: string, attempt: number, pause?: number): string {
  return `s|${enc(runId)}|${stepId}|${attempt}${pauseSuffix(pause)}`;
}

/** The id of the job that takes turn `turn` (0-based) of attempt `attempt` of `stepId`. */
export function turnJobId(
  runId: string,
  stepId: string,
  attempt: number,
  turn: number,
  pause?: number,
): string {
  return `t|${enc(runId)}|${stepId}|${attempt}|${turn}${pauseSuffix(pause)}`;
}

/** The id of the job that runs attempt `itemAttempt` of item `index` of map step `stepId`. */
export function itemJobId(
  runId: string,
  stepId: string,
  attempt: number,
  index: number,
  itemAttempt: number,
): string {
  return `i|${enc(runId)}|${stepId}|${attempt}|${index}|${itemAttempt}`;
}

/** The id of the job that finishes attempt `attempt` of map step `stepId`. */
export function mapEndJobId(runId: string, stepId: string, attempt: number): string {
  return `i|${enc(runId)}|${stepId}|${attempt}|end`;
}

/** The job of attempt `itemAttempt` of item `index` of map step `stepId`, due after `delay` ms. */
export function itemJob(
  runId: string,
  stepId: string,
  attempt: number,
  index: number,
  itemAttempt: number,
  delay = 0,
): JobSpec {
  return {
    name: JobName.item,
    data: { runId, stepId, attempt, index, itemAttempt },
    opts: {
      jobId: itemJobId(runId, stepId, attempt, index, itemAttempt),
      ...(delay > 0 ? { delay } : {}),
    },
  };
}

/**
 * The job that takes the end of the child run of attempt `itemAttempt` of map item `itemId`
 * (`<map>.<index>`) of attempt `attempt` of its map: the item's job again, under an id of its
 * own (the item's job that started the child has finished, and BullMQ ignores an id it keeps).
 */
export function itemWakeJob(
  runId: string,
  itemId: string,
  attempt: number,
  itemAttempt: number,
): JobSpec {
  const at = itemId.lastIndexOf('.');
  const stepId = itemId.slice(0, at);
  const job = itemJob(runId, stepId, attempt, Number(itemId.slice(at + 1)), itemAttempt);
  return { ...job, opts: { jobId: `${job.opts.jobId}|w` } };
}

/** The job that finishes attempt `attempt` of map step `stepId`. */
export function mapEndJob(runId: string, stepId: string, attempt: number): JobSpec {
  return {
    name: JobName.item,
    data: { runId, stepId, attempt },
    opts: { jobId: mapEndJobId(runId, stepId, attempt) },
  };
}

/** The id of the delayed job that makes attempt `attempt` of `stepId` due. */
export function retryJobId(runId: string, stepId: string, attempt: number): string {
  return `r|${enc(runId)}|${stepId}|${attempt}`;
}

/**
 * A glob (Redis `MATCH`) that the ids of the run's unit jobs (step, turn, retry and wait jobs) match, and
 * some others: check each id with {@link isUnitJobOf}.
 */
export function unitJobsGlob(runId: string): string {
  return `?|${enc(runId).replace(/[*?[\]\\]/g, (c) => `\\${c}`)}|*`;
}

/** Whether `jobId` is the id of one of the run's unit jobs (a step, turn, retry or wait job). */
export function isUnitJobOf(jobId: string, runId: string): boolean {
  const [kind, run] = jobId.split('|');
  return (kind === 's' || kind === 't' || kind === 'r' || kind === 'w') && run === enc(runId);
}

/**
 * The id of the delayed job that fires attempt `attempt` of wait step `stepId` when its time comes
 * (a timer, or a signal wait's timeout): one per attempt, so it fires once.
 */
export function timerJobId(runId: string, stepId: string, attempt: number): string {
  return `w|${enc(runId)}|${stepId}|${attempt}|t`;
}

/**
 * The id of the job that wakes attempt `attempt` of wait step `stepId` for the signal number
 * `index` of its name: every sender and every sweep that sees that signal pending adds the same.
 */
export function signalWakeJobId(
  runId: string,
  stepId: string,
  attempt: number,
  index: number,
  name?: string,
): string {
  // A conversation's `end` signal wakes it under a name of its own (its index counts apart).
  return `w|${enc(runId)}|${stepId}|${attempt}|s${index}${name === undefined ? '' : `|${name}`}`;
}

/** The timer job of a WAITING step whose wait has a due time, due at `dueAt`. */
export function timerJob(
  runId: string,
  stepId: string,
  attempt: number,
  dueAt: number,
  now: number,
): JobSpec {
  return {
    name: JobName.wake,
    data: { runId, stepId, attempt },
    opts: { jobId: timerJobId(runId, stepId, attempt), delay: Math.max(0, dueAt - now) },
  };
}

/** The job that wakes a WAITING signal wait for the signal number `index` of its name. */
export function signalWakeJob(
  runId: string,
  stepId: string,
  attempt: number,
  index: number,
  name?: string,
): JobSpec {
  return {
    name: JobName.wake,
    data: { runId, stepId, attempt },
    opts: { jobId: signalWakeJobId(runId, stepId, attempt, index, name) },
  };
}

/**
 * The id of the job that wakes attempt `attempt` of run step `stepId` when its child run ended:
 * one per attempt (one child per attempt), added by the child's end and by any sweep or guard of
 * the parent that finds the child ended.
 */
export function childWakeJobId(runId: string, stepId: string, attempt: number): string {
  return `w|${enc(runId)}|${stepId}|${attempt}|c`;
}

/** The job that wakes a run step waiting for its child run (see {@link childWakeJobId}). */
export function childWakeJob(runId: string, stepId: string, attempt: number): JobSpec {
  return {
    name: JobName.wake,
    data: { runId, stepId, attempt },
    opts: { jobId: childWakeJobId(runId, stepId, attempt) },
  };
}

/** The id of the run's wall-clock deadline job. */
export function deadlineJobId(runId: string): string {
  return `d|${enc(runId)}`;
}

/**
 * The job of a READY or RUNNING step attempt: a step job, or for a granular agent step the job of
 * its next turn (the turns it has committed).
 */
function unitJob(
  runId: string,
  stepId: string,
  context: {
    attempt: number;
    granular: boolean;
    agent: { turns: number } | null;
    pauses?: number;
    fallback?: { active: boolean } | null;
  },
): JobSpec {
  const { attempt } = context;
  const pause = context.pauses ?? 0;
  const paused = pause === 0 ? {} : { pause };
  // A fallback runs as one step job, whatever its primary was.
  if (context.granular && context.fallback?.active !== true) {
    const turn = context.agent?.turns ?? 0;
    return {
      name: JobName.turn,
      data: { runId, stepId, attempt, turn, ...paused },
      opts: { jobId: turnJobId(runId, stepId, attempt, turn, pause) },
    };
  }
  return {
    name: JobName.step,
    data: { runId, stepId, attempt, ...paused },
    opts: { jobId: stepJobId(runId, stepId, attempt, pause) },
  };
}

/**
 * True for a step with a unit of work to do: READY (waiting for a worker), or RUNNING (a granular
 * step between turns; any step in a snapshot an earlier release wrote).
 */
export function isDue(status: string): boolean {
  return status === 'READY' || status === 'RUNNING';
}

/**
 * {@link isDue} of a step's state: a map step whose attempt started (RUNNING with its items) has
 * no unit of its own due: its items are units (see `map-item.ts`).
 */
export function isUnitDue(state: { status?: string; map?: unknown }, status?: string): boolean {
  const value = status ?? state.status ?? '';
  if (value === 'RUNNING' && state.map !== undefined && state.map !== null) return false;
  return isDue(value);
}

/**
 * Every unit of work the run's snapshot says is due: each READY or RUNNING step attempt (for a granular
 * agent step, its next turn), each scheduled retry, each WAITING step's timer. (A signal that a
 * WAITING step may take is in the inbox, not the snapshot: `enqueueDue` looks for it.) Derived from the snapshot rather than from
 * one transition's planned actions, so that enqueueing it again (a redelivered job, a restarted
 * worker) re-creates exactly what is missing and nothing else: the ids are deterministic and
 * BullMQ ignores an id it already holds.
 */
export function dueJobs(runId: string, snapshot: RunSnapshot, now: number): JobSpec[] {
  if (snapshot.status !== 'active') return [];
  const jobs: JobSpec[] = [];
  for (const step of runSteps(snapshot)) {
    if (isUnitDue(step)) {
      jobs.push(unitJob(runId, step.stepId, step));
    } else if (step.status === 'WAITING' && (step.wait?.dueAt ?? null) !== null) {
      jobs.push(timerJob(runId, step.stepId, step.attempt, step.wait!.dueAt!, now));
    } else if (step.status === 'FAILED_RETRYABLE' && step.retryAt !== null) {
      const attempt = step.attempt + 1;
      jobs.push({
        name: JobName.retry,
        data: { runId, stepId: step.stepId, attempt },
        opts: {
          jobId: retryJobId(runId, step.stepId, attempt),
          delay: Math.max(0, step.retryAt - now),
        },
      });
    }
  }
  return jobs;
}

/**
 * The units of work a transition planned: what became due with one commit. After a commit whose
 * transition is known this is all that is new (a unit that was already due has its job, or heals
 * through the guard of a redelivered job), so the snapshot need not be walked again.
 */
export function plannedJobs(
  runId: string,
  snapshot: RunSnapshot,
  planned: readonly PlannedAction[],
  now: number,
): JobSpec[] {
  const jobs: JobSpec[] = [];
  for (const p of planned) {
    if (p.type === 'step.execute') {
      const context = stepEntry(snapshot, p.stepId)?.snapshot.context;
      jobs.push(
        unitJob(runId, p.stepId, {
          attempt: p.attempt,
          granular: context?.granular === true,
          agent: context?.agent ?? null,
          pauses: p.pause ?? 0,
          fallback: context?.fallback ?? null,
        }),
      );
    } else if (p.type === 'step.wait' && p.dueAt !== null) {
      jobs.push(timerJob(runId, p.stepId, p.attempt, p.dueAt, now));
    } else if (p.type === 'step.scheduleRetry') {
      jobs.push({
        name: JobName.retry,
        data: { runId, stepId: p.stepId, attempt: p.attempt },
        opts: { jobId: retryJobId(runId, p.stepId, p.attempt), delay: Math.max(0, p.at - now) },
      });
    }
  }
  return jobs;
}

/** The job of a step or turn unit, from its data (a turn when it names one). */
export function unitJobOf(data: JobData): JobSpec {
  const { runId, stepId, attempt, turn, pause } = data;
  return turn === undefined
    ? { name: JobName.step, data, opts: { jobId: stepJobId(runId, stepId!, attempt!, pause) } }
    : {
        name: JobName.turn,
        data,
        opts: { jobId: turnJobId(runId, stepId!, attempt!, turn, pause) },
      };
}

/**
 * The run's one unit of work in flight, when it has exactly one: its only READY or RUNNING step
 * attempt (or that granular step's next turn). Null when the run has ended, or has no such step, or
 * several.
 * A scheduled retry is not counted: it has a delayed job of its own and touches another attempt.
 */
export function soleUnit(runId: string, snapshot: RunSnapshot): JobSpec | null {
  if (snapshot.status !== 'active') return null;
  let sole: [string, RunSnapshot['children'][string]['snapshot']] | null = null;
  const views = snapshot.context.steps;
  for (const stepId of snapshot.context.order) {
    // A step the run saw end has ended (a step reopened is seen PENDING first).
    if (isFinalStepStatus(views[stepId]?.status ?? 'PENDING')) continue;
    const child = stepEntry(snapshot, stepId)?.snapshot;
    if (child === undefined) continue;
    if (!isUnitDue(child.context, child.value)) continue;
    if (sole !== null) return null;
    sole = [stepId, child];
  }
  return sole === null ? null : unitJob(runId, sole[0], sole[1].context);
}

/**
 * The carrier note a chained commit stores beside the snapshot: the job that goes on with the
 * run's next unit in place of that unit's own job, and the id that job would have had.
 */
export interface CarrierNote {
  /** The id of the BullMQ job carrying the unit. */
  job: string;
  /** The unit's own job id (see {@link stepJobId}, {@link turnJobId}). */
  unit: string;
}

/** The stored form of a {@link CarrierNote}: two job ids (which never hold a space). */
export function carrierNote(note: CarrierNote): string {
  return `${note.job} ${note.unit}`;
}

/** Reads a stored carrier note; null when there is none or it is not one. */
export function parseCarrierNote(stored: string | undefined): CarrierNote | null {
  if (stored === undefined) return null;
  const space = stored.indexOf(' ');
  if (space <= 0 || space === stored.length - 1) return null;
  return { job: stored.slice(0, space), unit: stored.slice(space + 1) };
}
