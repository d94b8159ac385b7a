/**
 * A schedule's definition: what `runtime.schedule` takes, how it is checked (every field, before
 * anything is written), and the fire times it gives. Cron expressions are read by the parser
 * BullMQ's job schedulers use, so the fire times computed here are the ones BullMQ fires at.
 */
import { getNextMillis } from 'bullmq';
import { InputValidationError, type ValidationIssue } from '../errors.js';
import { STEP_ID_PATTERN } from '../internal/ids.js';
import { findNonJson, type JsonValue } from '../internal/json.js';
import type { Plan, PlanInput } from '../plan/schema.js';

/** What a schedule does with a fire while its previous run is still going. */
export type OverlapPolicy = 'skip' | 'buffer_one' | 'allow_all';

/** The overlap policies, for messages. */
export const OVERLAP_POLICIES: readonly OverlapPolicy[] = ['skip', 'buffer_one', 'allow_all'];

/** The smallest `everyMs`. */
export const MIN_EVERY_MS = 100;
/** The smallest `catchupWindowMs`. */
export const MIN_CATCHUP_WINDOW_MS = 1000;
/** `catchupWindowMs` when none is given: one minute. */
export const DEFAULT_CATCHUP_WINDOW_MS = 60_000;

/** Options of `runtime.schedule`: when to fire (`cron` or `everyMs`) and what each fire starts. */
export interface ScheduleOptions {
  /**
   * A cron expression of 5 fields (minute hour day-of-month month day-of-week), or 6 with
   * seconds first, e.g. `"0 7 * * 1-5"`. Give `cron` or `everyMs`, not both.
   */
  cron?: string;
  /**
   * Fire every this many ms (at least 100), at the multiples of it since the Unix epoch. Give
   * `cron` or `everyMs`, not both.
   */
  everyMs?: number;
  /** The IANA time zone `cron` is read in, e.g. `"Europe/Paris"`. @defaultValue UTC */
  tz?: string;
  /** The plan each fire starts: an object or its JSON text, as `runtime.start` takes it. */
  plan: Plan | PlanInput | string;
  /** The input of each run, plain JSON. @defaultValue null */
  input?: unknown;
  /**
   * A fire while the schedule's previous run is still going: `skip` records it skipped;
   * `buffer_one` starts its run once the previous run ends (one fire waits at most, a fire while
   * one waits is skipped); `allow_all` starts it anyway. @defaultValue 'skip'
   */
  overlap?: OverlapPolicy;
  /**
   * A fire taken more than this many ms after its time (no worker was running) is recorded
   * `missed` and starts nothing; one taken within it starts its run (at least 1000).
   * @defaultValue 60000
   */
  catchupWindowMs?: number;
}

/** A schedule's definition as stored: its plan parsed, its defaults filled in. */
export interface ScheduleDefinition {
  id: string;
  cron?: string;
  everyMs?: number;
  tz?: string;
  plan: Plan;
  input: JsonValue;
  overlap: OverlapPolicy;
  catchupWindowMs: number;
  /** True while paused: no fire, no catch-up of the time it was paused. */
  paused: boolean;
  /** When it was first defined, and last defined, epoch ms. */
  createdAt: number;
  updatedAt: number;
  /**
   * The queue of its fires and of the runs they start: the `queueName` of the runtime that
   * defined it last. Absent for a schedule defined before schedules recorded one (then the queue
   * of the runtime that handles it).
   */
  queue?: string;
}

/** What decides a schedule's fire times. */
export type FireRule = Pick<ScheduleDefinition, 'cron' | 'everyMs' | 'tz'>;

/** Throws `InputValidationError` ("Invalid schedule") with `issues`, if any. */
export function refuse(issues: readonly ValidationIssue[]): void {
  if (issues.length > 0) throw new InputValidationError('schedule', issues);
}

/** Throws unless `id` is a schedule id: 1 to 128 letters, digits, `_`, `.` or `-`. */
export function assertScheduleId(id: unknown): asserts id is string {
  if (typeof id === 'string' && STEP_ID_PATTERN.test(id)) return;
  refuse([
    {
      path: 'id',
      message: `must be 1 to 128 letters, digits, "_", "." or "-", starting with a letter or digit, e.g. "daily-triage", got ${JSON.stringify(id) ?? typeof id}`,
    },
  ]);
}

/** Whether `tz` is a time zone this process knows. */
function knownTimeZone(tz: string): boolean {
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: tz });
    return true;
  } catch {
    return false;
  }
}

/** The issues of the fire rule: exactly one of cron and everyMs, each well formed. */
function ruleIssues(options: Record<string, unknown>): ValidationIssue[] {
  const { cron, everyMs, tz } = options;
  if (cron !== undefined && everyMs !== undefined) {
    return [{ path: 'cron', message: 'give cron or everyMs, not both; remove one of them' }];
  }
  if (cron === undefined && everyMs === undefined) {
    return [
      {
        path: 'cron',
        message: 'missing: give cron (e.g. cron: "0 7 * * *") or everyMs (e.g. everyMs: 60000)',
      },
    ];
  }
  const issues: ValidationIssue[] = [];
  if (tz !== undefined && (typeof tz !== 'string' || !knownTimeZone(tz))) {
    issues.push({
      path: 'tz',
      message: `unknown time zone ${JSON.stringify(tz)}; give an IANA zone, e.g. "Europe/Paris" or "UTC"`,
    });
  }
  if (everyMs !== undefined) {
    if (typeof everyMs !== 'number' || !Number.isInteger(everyMs) || everyMs < MIN_EVERY_MS) {
      issues.push({
        path: 'everyMs',
        message: `must be a whole number of milliseconds of at least ${MIN_EVERY_MS}, got ${JSON.stringify(everyMs)}`,
      });
    }
    if (tz !== undefined) {
      issues.push({ path: 'tz', message: 'applies to cron only; remove it or use cron' });
    }
    return issues;
  }
  const cronProblem = cronIssue(cron, issues.length === 0 ? (tz as string | undefined) : undefined);
  if (cronProblem !== undefined) issues.push({ path: 'cron', message: cronProblem });
  return issues;
}

/** What is wrong with a cron expression, if anything. */
function cronIssue(cron: unknown, tz: string | undefined): string | undefined {
  const example = 'e.g. "0 7 * * 1-5" (07:00 on weekdays) or "*/30 * * * * *" (every 30 s)';
  if (typeof cron !== 'string') return `must be a cron expression, ${example}`;
  const fields = cron.trim().split(/\s+/).length;
  if (fields !== 5 && fields !== 6) {
    return `"${cron}" has ${fields} field(s); a cron expression has 5 (minute hour day-of-month month day-of-week) or 6 (seconds first), ${example}`;
  }
  try {
    const next = getNextMillis(Date.now(), { pattern: cron, ...(tz === undefined ? {} : { tz }) });
    if (typeof next !== 'number') return `"${cron}" never fires; ${example}`;
  } catch (error) {
    return `"${cron}" does not parse (${(error as Error).message}); ${example}`;
  }
  return undefined;
}

/** The issues of the options other than the rule and the plan. */
function otherIssues(options: Record<string, unknown>): ValidationIssue[] {
  const issues: ValidationIssue[] = [];
  const { overlap, catchupWindowMs } = options;
  if (overlap !== undefined && !OVERLAP_POLICIES.includes(overlap as OverlapPolicy)) {
    issues.push({
      path: 'overlap',
      message: `must be one of ${OVERLAP_POLICIES.map((p) => `"${p}"`).join(', ')}, got ${JSON.stringify(overlap)}`,
    });
  }
  if (
    catchupWindowMs !== undefined &&
    (typeof catchupWindowMs !== 'number' ||
      !Number.isInteger(catchupWindowMs) ||
      catchupWindowMs < MIN_CATCHUP_WINDOW_MS)
  ) {
    issues.push({
      path: 'catchupWindowMs',
      message: `must be a whole number of milliseconds of at least ${MIN_CATCHUP_WINDOW_MS}, got ${JSON.stringify(catchupWindowMs)}`,
    });
  }
  if (options['plan'] === undefined) {
    issues.push({
      path: 'plan',
      message:
        'missing: give the plan each fire starts, an object { name, steps: [...] } or its JSON text',
    });
  }
  issues.push(...findNonJson(options['input'] ?? null, 'input'));
  const known = ['cron', 'everyMs', 'tz', 'plan', 'input', 'overlap', 'catchupWindowMs'];
  for (const key of Object.keys(options)) {
    if (!known.includes(key)) {
      issues.push({ path: key, message: `unknown option; a schedule takes ${known.join(', ')}` });
    }
  }
  return issues;
}

/**
 * Checks the options of `runtime.schedule` (but the plan and the input against it, which the
 * start path checks): throws `InputValidationError` naming every field that is wrong.
 */
export function checkScheduleOptions(options: unknown): asserts options is ScheduleOptions {
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    refuse([
      {
        path: 'options',
        message: 'must be an object { cron | everyMs, plan, input?, overlap?, … }',
      },
    ]);
  }
  const record = options as Record<string, unknown>;
  refuse([...ruleIssues(record), ...otherIssues(record)]);
}

/** The first fire time of the rule strictly after `after` (epoch ms). */
export function nextFire(rule: FireRule, after: number): number {
  if (rule.everyMs !== undefined)
    return Math.floor(after / rule.everyMs) * rule.everyMs + rule.everyMs;
  const next = getNextMillis(after, {
    pattern: rule.cron!,
    ...(rule.tz === undefined ? {} : { tz: rule.tz }),
  });
  return typeof next === 'number' ? next : Number.POSITIVE_INFINITY;
}

/**
 * Whether `at` is one of the rule's fire times. A BullMQ job scheduler names its jobs by the time
 * it chose, which drifts off the rule when a worker that upserts it runs late (BullMQ then starts
 * from its own clock and keeps that offset): such a time is no fire of the schedule.
 */
export function isFireTime(rule: FireRule, at: number): boolean {
  if (rule.everyMs !== undefined) return at % rule.everyMs === 0;
  return nextFire(rule, at - 1) === at;
}

/**
 * The rule's fire times in `(after, upTo]`, oldest first, at most `max` of them: when there are
 * more, the newest `max` (for an `everyMs` rule computed directly; for cron, the first 100 000
 * after `after` are walked and the newest `max` of them kept).
 */
export function firesBetween(rule: FireRule, after: number, upTo: number, max: number): number[] {
  if (rule.everyMs !== undefined) {
    const every = rule.everyMs;
    const last = Math.floor(upTo / every) * every;
    const first = Math.max(Math.floor(after / every) * every + every, last - (max - 1) * every);
    const out: number[] = [];
    for (let t = first; t <= last; t += every) out.push(t);
    return out;
  }
  const out: number[] = [];
  let t = after;
  for (let walked = 0; walked < 100_000; walked++) {
    t = nextFire(rule, t);
    if (t > upTo) break;
    out.push(t);
    if (out.length > max) out.shift();
  }
  return out;
}
