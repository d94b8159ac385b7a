/** How the CLI prints runs, events and ledgers: short human lines, or JSON with `--json`. */
import type { LedgerEntry } from '../persistence/ledger.js';
import type { StoredRunEvent } from '../persistence/snapshot-store.js';
import { countModelCalls, reconciliationText } from '../persistence/reservation-words.js';
import type { PendingApproval, RunReport, RunUsage } from '../runtime.js';
import type { PendingWait } from '../operations/reading.js';
import { mapText } from '../plan/map-words.js';
import { existsSync, realpathSync } from 'node:fs';
import { delimiter, isAbsolute, join, relative, resolve } from 'node:path';
import type { SerializedError } from '../errors.js';
import type { RunListEntry } from '../worker/run-list.js';
import type { WorkerStatus } from '../worker/registry.js';
import { hasMaskedPassword, MASKED_PASSWORD, MASKED_PASSWORD_HINT } from './context.js';
import { ExitCode } from './exit-codes.js';

type CacheSource = NonNullable<RunReport['steps'][number]['cachedFrom']>;

/** The exit code a run's state stands for: 0 succeeded (or still running), 1 failed, 3 waiting, 4 budget, 5 cancelled. */
export function exitCodeOf(report: Pick<RunReport, 'status' | 'summary'>): ExitCode {
  switch (report.status) {
    case 'failed':
      return report.summary.reason === 'budget_exceeded'
        ? ExitCode.budgetExceeded
        : ExitCode.failed;
    case 'waiting':
      return ExitCode.waiting;
    case 'cancelled':
      return ExitCode.cancelled;
    default:
      return ExitCode.ok;
  }
}

/** Quotes `word` for a POSIX shell when it needs it. */
export function shellQuote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

let invocation: string | undefined;

/**
 * How to invoke this command in a printed command: `flujo` when the shell finds this very `flujo`
 * on PATH, else `npx flujo` (also under npm and npx, which put the project's bin on PATH only
 * for their own child).
 */
export function flujoInvocation(env: NodeJS.ProcessEnv = process.env): string {
  if (invocation !== undefined) return invocation;
  invocation = 'npx flujo';
  const self = process.argv[1];
  if (env['npm_command'] !== undefined || self === undefined) return invocation;
  try {
    const mine = realpathSync(self);
    for (const dir of (env['PATH'] ?? '').split(delimiter)) {
      const candidate = join(dir, 'flujo');
      if (dir !== '' && existsSync(candidate) && realpathSync(candidate) === mine) {
        invocation = 'flujo';
        break;
      }
    }
  } catch {
    // unreadable PATH entry: keep npx
  }
  return invocation;
}

/** A module path as the user would type it: relative to `cwd` when inside it, else absolute. */
export function displayPath(file: string, cwd: string = process.cwd()): string {
  const rel = relative(cwd, resolve(cwd, file));
  return rel !== '' && !rel.startsWith('..') && !isAbsolute(rel) ? rel : resolve(cwd, file);
}

/** `flujo resume <runId> <job-module>`, ready to paste. */
export function resumeCommand(runId: string, modulePath: string, extra: readonly string[] = []) {
  const words = ['resume', runId, displayPath(modulePath), ...extra].map(shellQuote);
  return [flujoInvocation(), ...words].join(' ');
}

/** The flags of `extra` that `flujo worker` takes (it has no --redis-outage-limit: it waits). */
function workerFlags(extra: readonly string[]): string[] {
  const flags: string[] = [];
  for (let i = 0; i < extra.length; i += 2) {
    if (extra[i] !== '--redis-outage-limit') flags.push(...extra.slice(i, i + 2));
  }
  return flags;
}

/** `flujo worker <job-module>`, ready to paste (with the flags of `extra` a worker takes). */
export function workerCommand(modulePath: string, extra: readonly string[] = []): string {
  const words = ['worker', displayPath(modulePath), ...workerFlags(extra)].map(shellQuote);
  return [flujoInvocation(), ...words].join(' ');
}

/** The placeholder of a job module that a run does not record, in printed commands. */
const UNKNOWN_MODULE = '<job-module>';

/**
 * The commands that take up a run's work: a worker, and the run's resume command. With the job
 * module that started the run when it is known; else with the placeholder `<job-module>`, and a
 * note that says it is one.
 */
export interface NextCommands {
  worker: string;
  resume: string;
  /**
   * Empty, or what to know before running them: `" (<job-module> is a placeholder …)"` when the
   * module is not known; that the password of `--redis` is masked, and to use REDIS_URL.
   */
  note: string;
}

/** {@link NextCommands} of `runId`; `modulePath` null when the run does not record its module. */
export function nextCommands(
  runId: string,
  modulePath: string | null,
  extra: readonly string[] = [],
): NextCommands {
  const masked = hasMaskedPassword(extra) ? ` (${MASKED_PASSWORD_HINT})` : '';
  if (modulePath !== null) {
    return {
      worker: workerCommand(modulePath, extra),
      resume: resumeCommand(runId, modulePath, extra),
      note: masked,
    };
  }
  const flujo = flujoInvocation();
  const flags = (words: readonly string[]) => words.map((w) => ` ${shellQuote(w)}`).join('');
  return {
    worker: `${flujo} worker ${UNKNOWN_MODULE}${flags(workerFlags(extra))}`,
    resume: `${flujo} resume ${shellQuote(runId)} ${UNKNOWN_MODULE}${flags(extra)}`,
    note: ` (${UNKNOWN_MODULE} is a placeholder for the path of the job module that started the run, which the run does not record)${masked}`,
  };
}

const time = (at: unknown): string =>
  typeof at === 'number' && at > 0 ? new Date(at).toISOString() : '-';
const clock = (at: unknown): string => time(at).slice(11, 23);

/** How much the views print. */
export interface RenderOptions {
  /** Nothing is cut: whole payloads and whole call ids (`--full`). */
  full?: boolean | undefined;
  /** Errors with their stack traces (`--verbose`). */
  verbose?: boolean | undefined;
}

/** A value as JSON, cut to `max` characters unless `full`. */
function preview(value: unknown, max = 80, full = false): string {
  const text = JSON.stringify(value) ?? 'null';
  return !full && text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** A call id as printed: its first 12 characters (enough to name it), or whole with `full`. */
const callIdText = (callId: string, full = false): string => (full ? callId : callId.slice(0, 12));

/**
 * An error as lines, never cut: `code: message` (with the thrown class, `code: Class: message`)
 * and every further line of its message, then its cause chain (`caused by Class: message`, every
 * line), then, with `verbose`, its stack frames. The lines after the first are indented by two.
 */
export function errorText(error: SerializedError, verbose = false): string[] {
  const thrown = error.thrown;
  const [first = '', ...rest] = (thrown?.message ?? error.message).split('\n');
  const lines = [`${error.code}: ${thrown === undefined ? '' : `${thrown.name}: `}${first}`];
  for (const line of rest) lines.push(`  ${line}`);
  if (verbose) {
    for (const frame of (thrown?.stack ?? '').split('\n').filter((f) => f.trim() !== '')) {
      lines.push(`  ${frame.trim()}`);
    }
  }
  for (const cause of thrown?.causes ?? []) {
    const [head = '', ...more] = cause.message.split('\n');
    lines.push(`  caused by ${cause.name}: ${head}`);
    for (const line of more) lines.push(`    ${line}`);
  }
  return lines;
}

/** Whether `value` looks like a stored error (code and message). */
function isSerializedError(value: unknown): value is SerializedError {
  if (typeof value !== 'object' || value === null) return false;
  const v = value as Record<string, unknown>;
  return typeof v['code'] === 'string' && typeof v['message'] === 'string';
}

/** The steps waiting for approval. */
export const waitingSteps = (report: RunReport): string[] =>
  report.steps.filter((s) => s.status === 'WAITING_APPROVAL').map((s) => s.stepId);

/** One progress line for a step state change, or null for other events. */
export function progressLine(e: StoredRunEvent): string | null {
  const d = e.data as Record<string, unknown>;
  if (e.type === 'turn.committed') {
    return `  ${clock(d['at'])}  ${String(d['stepId'])}: turn ${Number(d['turn']) + 1} committed (history ${String(d['cursor'])} messages)`;
  }
  if (e.type !== 'step.changed') return null;
  const attempt =
    d['to'] === 'RUNNING' || d['to'] === 'READY' ? ` (attempt ${String(d['attempt'])})` : '';
  return `  ${clock(d['at'])}  ${String(d['stepId'])}: ${String(d['from'])} → ${String(d['to'])}${attempt}`;
}

/** Where the detail of an event line starts (after its time and type). */
const DETAIL_INDENT = ' '.repeat(41);

/**
 * One line per event for `flujo events` (an error's further lines follow it, indented). Payloads
 * are cut to a preview unless `options.full`; errors are never cut, and carry their stack with
 * `options.verbose`.
 */
export function eventLine(e: StoredRunEvent, options: RenderOptions = {}): string {
  const d = e.data as Record<string, unknown>;
  const s = (k: string) => String(d[k]);
  const full = options.full === true;
  const more: string[] = [];
  let detail: string;
  switch (e.type) {
    case 'run.created':
      detail = `plan "${s('plan')}"`;
      break;
    case 'step.changed':
      detail = `${s('stepId')}: ${s('from')} → ${s('to')} (attempt ${s('attempt')})`;
      break;
    case 'run.status':
      detail = `${d['from'] === null ? '(new)' : s('from')} → ${s('to')}`;
      break;
    case 'gate.approved':
    case 'gate.rejected':
      detail = `${s('stepId')} by ${s('by')}${d['comment'] === undefined ? '' : `: ${preview(d['comment'], 80, full)}`}`;
      break;
    case 'step.succeeded':
      detail = `${s('stepId')} attempt ${s('attempt')}: ${preview(d['output'], 80, full)}`;
      break;
    case 'step.cacheHit':
      detail = `${s('stepId')} attempt ${s('attempt')}: ${cacheText({
        runId: s('sourceRunId'),
        storedAt: Number(d['storedAt']),
        cacheClass: s('cacheClass') as CacheSource['cacheClass'],
        provenance: typeof d['provenance'] === 'string' ? d['provenance'] : null,
      })}`;
      break;
    case 'turn.committed':
      detail = `${s('stepId')} attempt ${s('attempt')} turn ${s('turn')}: history ${s('cursor')} messages`;
      break;
    case 'step.failed': {
      const err = d['error'];
      const [first = '', ...rest] = isSerializedError(err)
        ? errorText(err, options.verbose === true)
        : [preview(err, 80, full)];
      detail = `${s('stepId')} attempt ${s('attempt')}: ${first}`;
      more.push(...rest);
      break;
    }
    case 'step.started':
      detail = `${s('stepId')} attempt ${s('attempt')}`;
      break;
    case 'wait.started':
      detail = `${s('stepId')} attempt ${s('attempt')}: ${d['signal'] === undefined ? 'timer' : `signal "${s('signal')}"`}${d['dueAt'] === undefined ? '' : ` until ${time(d['dueAt'])}`}`;
      break;
    case 'signal.received':
      detail = `"${s('name')}" #${Number(d['index']) + 1} (seq ${s('seq')}${d['id'] === null ? '' : `, id ${s('id')}`}): ${preview(d['payload'], 80, full)}`;
      break;
    case 'signal.taken':
      detail = `${s('stepId')} attempt ${s('attempt')}${d['turn'] === undefined ? '' : ` turn ${s('turn')}`}: "${s('name')}" #${Number(d['index']) + 1} (seq ${s('seq')})`;
      break;
    case 'wait.woken':
      detail = `${s('stepId')} attempt ${s('attempt')}: a message to take`;
      break;
    case 'tool.called':
      detail = `${unitOf(d)}: ${s('tool')} (${s('class')}) ${toolVerdict(d)}${d['error'] === undefined ? '' : ` ${s('error')}`}, ${duration(Number(d['durationMs']))}; call ${callIdText(s('callId'), full)}`;
      break;
    case 'model.called':
      detail = `${unitOf(d)}: ${s('model')} ${s('inputTokens')} in + ${s('outputTokens')} out tokens, $${Number(d['costUsd']).toFixed(6)}, ${duration(Number(d['durationMs']))} (${s('charged')}; reservation ${s('reservationId')})`;
      break;
    case 'model.rate_limited':
      detail = `${unitOf(d)}: ${s('model')} waited ${duration(Number(d['waitedMs']))} for its rate limits ${((d['limits'] as unknown[] | undefined) ?? []).join(', ')} (${s('reason')}; ${s('outcome')})`;
      break;
    case 'step.ran':
    case 'turn.ran':
      detail = `${unitOf(d)}: ran ${duration(Number(d['durationMs']))} on ${workerOf(d['worker'])}`;
      break;
    case 'step.takenOver':
    case 'turn.takenOver':
      detail = `${unitOf(d)}: run again by ${workerOf(d['worker'])}; ${workerOf(d['previousWorker'])} started it at ${clock(d['previousStartedAt'])} and never committed it (its worker stopped)`;
      break;
    case 'concurrency.waited':
      detail = `${unitOf(d)}: waited ${duration(Number(d['waitedMs']))} for a concurrency slot of key ${s('key')} (limit ${s('limit')}, ${s('scope')})`;
      break;
    case 'run.finished':
      detail = `${s('status')}; produced ${Object.keys(d['produced'] ?? {}).join(', ') || 'nothing'}${
        d['blockedStep'] == null ? '' : `; blocked at ${s('blockedStep')}`
      }${d['reason'] == null ? '' : ` (${s('reason')})`}`;
      break;
    default: {
      const rest = Object.fromEntries(
        Object.entries(d).filter(([k]) => k !== 'type' && k !== 'at'),
      );
      detail = Object.keys(rest).length === 0 ? '' : preview(rest, 160, full);
    }
  }
  const line = `${time(d['at'])}  ${e.type.padEnd(14)} ${detail}`.trimEnd();
  return [line, ...more.map((l) => `${DETAIL_INDENT}${l}`)].join('\n');
}

/**
 * What a tool call came to: `executed, succeeded`, `receipt replayed, succeeded`, `executed,
 * failed`, or `held (not executed: waits for approval)` for a call stopped before its effect.
 */
function toolVerdict(d: Record<string, unknown>): string {
  if (d['outcome'] === 'held') return 'held (not executed: waits for approval)';
  return `${d['replayed'] === true ? 'receipt replayed' : 'executed'}, ${String(d['outcome'])}`;
}

/**
 * A run's events in the order they happened: by their own time (`at`), events of the same time
 * in stream order. The stream is in commit order, and a unit commits its facts when it ends: the
 * start of a step that ran beside another, or its worker's report, is committed after later
 * facts of the other.
 */
export function inTimeOrder(events: readonly StoredRunEvent[]): StoredRunEvent[] {
  const at = (e: StoredRunEvent) => {
    const t = (e.data as Record<string, unknown>)['at'];
    return typeof t === 'number' ? t : -Infinity;
  };
  return events
    .map((e, i) => ({ e, i, at: at(e) }))
    .sort((a, b) => a.at - b.at || a.i - b.i)
    .map((x) => x.e);
}

/** `step attempt N[ turn T]` of an event. */
function unitOf(d: Record<string, unknown>): string {
  const turn = typeof d['turn'] === 'number' ? ` turn ${d['turn']}` : '';
  return `${String(d['stepId'])} attempt ${String(d['attempt'])}${turn}`;
}

/** `host pid N` of a recorded worker. */
function workerOf(w: unknown): string {
  if (typeof w !== 'object' || w === null) return 'an unknown worker';
  const { host, pid } = w as { host?: unknown; pid?: unknown };
  return `${String(host)} pid ${String(pid)}`;
}

/** A duration for people: `850 ms`, `12.3 s`, `4 min 05 s`, `2 h 03 min`. */
export function duration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return '-';
  if (ms < 1000) return `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
}

/** One attempt of a step as the event stream tells it. */
export interface AttemptTimeline {
  stepId: string;
  attempt: number;
  startedAt: number | null;
  endedAt: number | null;
  durationMs: number | null;
  /** `succeeded`, `failed`, `skipped`, or null while it runs. */
  outcome: string | null;
  /** The worker that ran it last (`host pid N`), when recorded. */
  worker: string | null;
  /** Times it was taken over after its worker stopped. */
  takenOver: number;
  /** The error it failed with, when it failed. */
  error: SerializedError | null;
}

/** Every attempt of every step, from a run's events, in the order they started. */
export function attemptsOf(events: readonly StoredRunEvent[]): AttemptTimeline[] {
  const byKey = new Map<string, AttemptTimeline>();
  const get = (d: Record<string, unknown>): AttemptTimeline | null => {
    if (typeof d['stepId'] !== 'string' || typeof d['attempt'] !== 'number') return null;
    const key = `${d['stepId']}\n${d['attempt']}`;
    let a = byKey.get(key);
    if (a === undefined) {
      a = {
        stepId: d['stepId'],
        attempt: d['attempt'],
        startedAt: null,
        endedAt: null,
        durationMs: null,
        outcome: null,
        worker: null,
        takenOver: 0,
        error: null,
      };
      byKey.set(key, a);
    }
    return a;
  };
  for (const e of events) {
    const d = e.data as Record<string, unknown>;
    const at = typeof d['at'] === 'number' ? d['at'] : null;
    switch (e.type) {
      case 'step.started': {
        const a = get(d);
        if (a !== null && a.startedAt === null) a.startedAt = at;
        break;
      }
      case 'step.ran':
      case 'turn.ran': {
        const a = get(d);
        if (a === null) break;
        a.worker = workerOf(d['worker']);
        if (a.startedAt === null && typeof d['startedAt'] === 'number')
          a.startedAt = d['startedAt'];
        break;
      }
      case 'step.takenOver':
      case 'turn.takenOver': {
        const a = get(d);
        if (a !== null) a.takenOver++;
        break;
      }
      case 'step.succeeded':
      case 'step.failed':
      case 'step.skipped': {
        const a = get(d);
        if (a === null) break;
        a.endedAt = at;
        a.outcome = e.type.slice('step.'.length);
        if (a.startedAt !== null && at !== null) a.durationMs = at - a.startedAt;
        if (e.type === 'step.failed' && isSerializedError(d['error'])) a.error = d['error'];
        break;
      }
      default:
        break;
    }
  }
  return [...byKey.values()].filter((a) => a.startedAt !== null || a.endedAt !== null);
}

/** `flujo list`: one row per run. */
export function listLines(runs: readonly RunListEntry[], now: number): string[] {
  if (runs.length === 0) return ['no runs'];
  // A PARENT column when a child run is listed.
  const family = runs.some((r) => r.parentRunId != null);
  const rows = [
    [
      'RUN',
      'PLAN',
      'TENANT',
      'STATUS',
      'STARTED',
      'DURATION',
      'STEP',
      ...(family ? ['PARENT'] : []),
    ],
    ...runs.map((r) => [
      r.runId,
      r.planName,
      r.tenantId,
      r.status,
      time(r.createdAt),
      duration(r.endedAt === null ? now - r.createdAt : r.durationMs),
      stepText(r),
      ...(family ? [r.parentRunId ?? ''] : []),
    ]),
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) =>
    r
      .map((c, i) => c.padEnd(widths[i]!))
      .join('  ')
      .trimEnd(),
  );
}

/** The STEP column of the list: the step that waits or works, or where and why a run failed. */
function stepText(r: RunListEntry): string {
  if (r.waitingStep !== null) return `${r.waitingStep} (waits for ${r.waitsFor ?? 'approval'})`;
  if (r.status === 'failed' && (r.blockedStep != null || r.reason != null)) {
    const why = r.reason == null ? 'failed' : `failed: ${r.reason}`;
    return r.blockedStep == null ? `(${why})` : `${r.blockedStep} (${why})`;
  }
  return r.currentStep ?? '';
}

/** The lines asking a person to decide: the step or its tool call, why, and who may decide. */
export function approvalLines(
  runId: string,
  a: PendingApproval,
  options: RenderOptions = {},
): string[] {
  const full = options.full === true;
  const who = a.approvers === null ? 'NAME' : a.approvers[0]!;
  // A pending tool call is named, so that the decision cannot land on another call.
  const call = a.call === null ? '' : ` --call ${callIdText(a.call.callId, full)}`;
  const lines = [
    `  waiting for approval: ${a.stepId} (${flujoInvocation()} approve ${shellQuote(runId)} ${a.stepId}${call} --by ${who}, or ${flujoInvocation()} reject …)`,
  ];
  if (a.call !== null) {
    lines.push(
      `    tool call ${callIdText(a.call.callId, full)}: ${a.call.tool} ${preview(a.call.args, 120, full)}`,
    );
  }
  if (a.reason !== null) lines.push(`    reason: ${a.reason}`);
  if (a.approvers !== null) lines.push(`    approvers: ${a.approvers.join(', ')}`);
  return lines;
}

/** What a wait step waits for: a signal (how many queued, how to send one), or a time. */
export function waitLine(runId: string, w: PendingWait): string {
  if (w.signal === null) {
    return `  waiting for a timer: ${w.stepId} fires at ${time(w.dueAt)} (a running worker fires it)`;
  }
  const timeout = w.dueAt === null ? '' : `, times out at ${time(w.dueAt)}`;
  return `  waiting for signal "${w.signal}": ${w.stepId} (${w.queued} queued${timeout}; send one with ${flujoInvocation()} signal ${shellQuote(runId)} ${w.signal} --data JSON)`;
}

/** What a run came to: status, produced outputs, blocked step and reason, and what to do next. */
export function summaryLines(
  report: RunReport,
  resume: string | undefined,
  options: RenderOptions = {},
): string[] {
  const { runId, summary } = report;
  const lines = [`run ${runId} ${report.status}`];
  const produced = Object.keys(summary.produced);
  lines.push(`  produced: ${produced.length === 0 ? 'nothing' : produced.join(', ')}`);
  if (summary.blockedStep !== null) lines.push(`  blocked at: ${summary.blockedStep}`);
  if (summary.reason !== null) lines.push(...reasonLines(summary.reason, summary.detail, options));
  const waiting = waitingSteps(report);
  for (const approval of report.approvals ?? []) {
    lines.push(...approvalLines(runId, approval, options));
  }
  for (const wait of report.waits ?? []) lines.push(waitLine(runId, wait));
  if (resume !== undefined && (waiting.length > 0 || report.status === 'failed')) {
    lines.push(`  then continue with: ${resume}`);
    if (resume.includes(`:${MASKED_PASSWORD}@`)) lines.push(`  note: ${MASKED_PASSWORD_HINT}`);
  }
  return lines;
}

/** `reason: <code>` and what the detail says: a budget's numbers, or the whole error. */
function reasonLines(reason: string, detail: unknown, options: RenderOptions): string[] {
  const head = `  reason: ${reason}`;
  if (detail === null || detail === undefined) return [head];
  if (typeof detail === 'object' && !Array.isArray(detail)) {
    const d = detail as Record<string, unknown>;
    if (typeof d['budget'] === 'string') {
      return [`${head} (${d['budget']}: limit ${String(d['limit'])}, used ${String(d['used'])})`];
    }
    if (isSerializedError(detail)) {
      const [first = '', ...rest] = errorText(detail, options.verbose === true);
      // The code is the reason already: not said twice.
      const said = first.startsWith(`${reason}: `) ? first.slice(reason.length + 2) : first;
      return [`${head}: ${said}`, ...rest.map((l) => `    ${l}`)];
    }
    if (typeof d['message'] === 'string') {
      const [first = '', ...rest] = d['message'].split('\n');
      return [`${head}: ${first}`, ...rest.map((l) => `      ${l}`)];
    }
  }
  return [`${head}: ${preview(detail, 80, options.full === true)}`];
}

/** Where a cached step's output came from: `cached from run R at T` (and an external provenance). */
export function cacheText(source: CacheSource | null): string {
  if (source === null) return '';
  const from = `cached from run ${source.runId} at ${new Date(source.storedAt).toISOString()}`;
  return source.provenance === null ? from : `${from} (${source.provenance})`;
}

/** An error as indented lines (see {@link errorText}): whole, with its stack when `verbose`. */
export function errorLines(error: SerializedError, verbose = false, pad = '      '): string[] {
  return errorText(error, verbose).map((l) => `${pad}${l}`);
}

/** `flujo status`: the run, its steps, and its summary. */
export function statusLines(
  report: RunReport,
  attempts: readonly AttemptTimeline[] = [],
  next: NextCommands = nextCommands(report.runId, null),
  options: RenderOptions = {},
): string[] {
  const verbose = options.verbose === true;
  const width = Math.max(...report.steps.map((s) => s.stepId.length), 4);
  const lines = [
    `run ${report.runId}  plan "${report.planName}"  ${report.status}  (version ${report.version}, updated ${time(report.updatedAt)})`,
  ];
  for (const s of report.steps) {
    const extra = [
      s.attempt > 0 ? `attempt ${s.attempt}` : '',
      s.reason === null ? '' : s.reason,
      s.approval === null ? '' : `approved by ${s.approval.by}`,
      s.rejection === null ? '' : `rejected by ${s.rejection.by}`,
      cacheText(s.cachedFrom ?? null),
      s.fallback?.active === true ? 'fallback ran' : '',
      report.lineage?.reusedSteps.includes(s.stepId) === true
        ? `reused from ${report.lineage.replayOf}`
        : '',
    ].filter((x) => x !== '');
    const mine = attempts.filter((a) => a.stepId === s.stepId);
    const first = mine.find((a) => a.startedAt !== null)?.startedAt ?? null;
    const last = mine.at(-1);
    if (first !== null) {
      const end = last?.endedAt ?? null;
      extra.push(
        end === null
          ? `started ${clock(first)}`
          : `${clock(first)} → ${clock(end)} (${duration(end - first)})`,
      );
    }
    lines.push(`  ${s.stepId.padEnd(width)}  ${s.status.padEnd(16)} ${extra.join(', ')}`.trimEnd());
    // Each attempt, when there was more than one or one was taken over, with the error of each
    // that failed.
    const each = mine.length > 1 || mine.some((a) => a.takenOver > 0);
    if (each) {
      for (const a of mine) {
        const span =
          a.endedAt === null
            ? `started ${clock(a.startedAt)}, running`
            : `${clock(a.startedAt)} → ${clock(a.endedAt)} (${duration(a.durationMs ?? NaN)}) ${a.outcome ?? ''}`;
        const taken = a.takenOver > 0 ? `, taken over ${a.takenOver}×` : '';
        lines.push(
          `  ${''.padEnd(width)}    attempt ${a.attempt}: ${span}${a.worker === null ? '' : ` on ${a.worker}`}${taken}`.trimEnd(),
        );
        if (a.error !== null) lines.push(...errorLines(a.error, verbose, ''.padEnd(width + 8)));
      }
    }
    // The step's last error, unless its attempt's lines above carry it.
    const shown = each && mine.some((a) => a.error !== null && a.attempt === s.attempt);
    if (s.error !== null && s.status !== 'SUCCEEDED' && !shown) {
      lines.push(...errorLines(s.error, verbose));
    }
  }
  for (const [stepId, p] of Object.entries(report.progress ?? {})) {
    lines.push(
      `  progress of ${stepId} (attempt ${p.attempt}, ${clock(p.at)}): ${preview(p.info, 120, options.full === true)}`,
    );
  }
  for (const [stepId, m] of Object.entries(report.maps ?? {})) {
    lines.push(`  items of ${stepId}: ${mapText(m)}`);
  }
  if (report.idle != null) lines.push(idleLine(report.idle, next));
  if (report.routing != null) lines.push(...routingLines(report.routing));
  for (const w of report.concurrency ?? []) {
    const who = w.stepId === null ? 'the run is' : `step ${w.stepId} is`;
    lines.push(`  ${who} ${w.message}, since ${clock(w.since)}`);
  }
  return lines.concat(
    lineageLines(report),
    familyLines(report),
    summaryLines(report, undefined, options).slice(1),
  );
}

/**
 * A run's place in its tree of runs for `flujo status`: the run and step that started it, and the
 * child runs its `run` steps started, each with its status (none: no lines).
 */
export function familyLines(report: Pick<RunReport, 'runId' | 'parent' | 'children'>): string[] {
  const lines: string[] = [];
  const p = report.parent ?? null;
  if (p !== null) {
    lines.push(`  parent: ${p.runId} (step ${p.stepId}, attempt ${p.attempt})`);
  }
  const children = report.children ?? [];
  if (children.length > 0) {
    lines.push(`  children of ${report.runId}:`);
    children.forEach((c, i) => {
      const branch = i === children.length - 1 ? '└─' : '├─';
      lines.push(
        `    ${branch} ${c.stepId} (attempt ${c.attempt}) → ${c.runId}  ${c.status ?? 'not found'}`,
      );
    });
  }
  return lines;
}

/**
 * Says why a run's due work is not taken: a worker put a unit back for want of its operator or
 * agent ("no worker knows operator …"), or no live worker takes units from the run's queue.
 */
export function routingLines(routing: NonNullable<RunReport['routing']>): string[] {
  const lines: string[] = [];
  const p = routing.putBack;
  if (p !== null) {
    lines.push(
      `  ${p.reason} on queue ${routing.queue}: worker ${p.host}/${p.pid} put a unit back at ${clock(p.at)}; it waits for a worker of the job module that defines it`,
    );
  }
  if (routing.liveWorkers === 0) {
    const seen =
      routing.lastSeen === null ? 'none seen yet' : `last seen ${clock(routing.lastSeen)}`;
    lines.push(`  no worker on queue ${routing.queue}; ${seen}`);
  }
  return lines;
}

/** Says that due work waits for a worker, and the commands that take it up. */
export function idleLine(idle: NonNullable<RunReport['idle']>, next: NextCommands): string {
  return `  no worker has taken step ${idle.stepId} for ${duration(idle.idleMs)}: start one with \`${next.worker}\`, or continue it with \`${next.resume}\`${next.note}`;
}

/** `flujo ledger`: one row per tool call. */
export function ledgerLines(entries: readonly LedgerEntry[]): string[] {
  if (entries.length === 0) return ['no tool calls recorded'];
  const rows = [
    ['CALL', 'TOOL', 'STATE', 'RUNS', 'UPDATED'],
    ...entries.map((e) => [
      e.callId.slice(0, 12),
      e.tool,
      e.state,
      String(e.runs),
      time(e.updatedAt),
    ]),
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) =>
    r
      .map((c, i) => c.padEnd(widths[i]!))
      .join('  ')
      .trimEnd(),
  );
}

const usd = (microUsd: number): string => `$${(microUsd / 1_000_000).toFixed(6)}`;

/** The lines of `flujo usage`: one per reservation (step, turn), then the run's totals. */
export function usageLines(usage: RunUsage): string[] {
  const { reservations, totals } = usage;
  const lines: string[] = [];
  if (reservations.length === 0) lines.push('no model calls recorded');
  else {
    const rows = [
      ['STEP', 'TURN', 'RESERVED', 'SPENT', 'COST', 'RECONCILED', 'AT'],
      ...reservations.map((r) => [
        r.stepId,
        String(r.turn),
        `${r.reservedTokens} tok ${usd(r.reservedMicroUsd)}`,
        r.charged === null ? '-' : `${r.charged.inputTokens}+${r.charged.outputTokens} tok`,
        r.charged === null ? '-' : usd(r.charged.microUsd),
        reconciliationText(r),
        time(r.reconciledAt ?? r.createdAt),
      ]),
    ];
    const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
    for (const r of rows)
      lines.push(
        r
          .map((c, i) => c.padEnd(widths[i]!))
          .join('  ')
          .trimEnd(),
      );
  }
  if (reservations.length > 0) {
    const { calls, released, open } = countModelCalls(reservations);
    lines.push(
      `model calls: ${calls}; released without a call: ${released}${open === 0 ? '' : `; open: ${open}`}`,
    );
  }
  const limit = (n: number | null, unit: (v: number) => string) => (n === null ? 'none' : unit(n));
  lines.push(
    `total: spent ${totals.spentTokens} tokens ${usd(totals.spentMicroUsd)}; reserved now ${totals.reservedTokens} tokens ${usd(totals.reservedMicroUsd)}; budgets maxTokens ${limit(totals.maxTokens, String)}, maxCostUsd ${limit(totals.maxMicroUsd, (v) => usd(v).slice(1))}`,
  );
  return lines;
}

/** The run's lineage for `flujo status`: the run it replays, and its replays (none: no lines). */
export function lineageLines(report: RunReport): string[] {
  const l = report.lineage;
  if (l === undefined) return [];
  const lines: string[] = [];
  if (l.replayOf !== null) {
    const reused = l.reusedSteps.length === 0 ? '' : `, reused ${l.reusedSteps.join(', ')}`;
    const from = l.fromStep === null ? '' : `, from step ${l.fromStep}`;
    lines.push(
      `  lineage ${l.lineage}: ${l.replayOf} → ${report.runId} (${l.mode}${from}${reused})`,
    );
  }
  for (const r of l.replays)
    lines.push(`  replayed: ${report.runId} → ${r.runId} (${r.mode}, ${time(r.at)})`);
  return lines;
}

/**
 * One line of a worker's status for a person: what it runs (run, step, attempt or turn, since
 * when) and its counters. The same status gives the same line (no clock in it), so a caller can
 * print it only when it changes.
 */
export function workerStatusLine(status: WorkerStatus): string {
  const units = status.running.map((u) => {
    const which = u.turn === null ? `attempt ${u.attempt}` : `attempt ${u.attempt} turn ${u.turn}`;
    return `${u.runId} ${u.stepId} ${which} since ${clock(u.since)}`;
  });
  const { done, failed, busy } = status.counters;
  const running = `${status.running.length} of ${status.concurrency} running`;
  const what = units.length === 0 ? running : `${running}: ${units.join('; ')}`;
  return `flujo worker: ${what}; done ${done}, failed ${failed}, busy ${busy}${status.closing ? ' (closing)' : ''}`;
}

/** A worker's status as one JSON line (`type: "worker.status"`, `at` the time it was read). */
export function workerStatusJson(status: WorkerStatus, at: number): string {
  return JSON.stringify({ type: 'worker.status', at, ...status });
}
