/**
 * A run's trace as JSON, built from what is stored about it: the event stream (attempts, turns,
 * approval waits, and, when a worker records them, tool and model calls and the worker's
 * identity), the tool-call ledger and the usage reservations (one per model call). Pure: the
 * caller reads the records.
 */
import { CONDITION_FALSE } from '../plan/condition.js';
import type { LedgerEntry } from '../persistence/ledger.js';
import type { Reservation } from '../persistence/quota-store.js';

/** How an attempt ended, or that it has not. */
export type AttemptOutcome =
  'succeeded' | 'failed' | 'skipped' | 'cancelled' | 'running' | 'waiting';

/** A wait for a person: a step's gate, or one tool call of an attempt. */
export interface TraceWait {
  kind: 'gate' | 'tool';
  start: number;
  /** When the decision came; null while it waits. */
  end: number | null;
  decision: 'approved' | 'rejected' | null;
  by: string | null;
  comment: string | null;
  /** The tool and the ledger call id, for a tool call's wait. */
  tool: string | null;
  callId: string | null;
}

/** One model call: its usage reservation, or the event a worker recorded for it. */
export interface TraceModelCall {
  turn: number;
  model: string | null;
  start: number;
  end: number | null;
  inputTokens: number | null;
  outputTokens: number | null;
  costUsd: number | null;
  /** How its usage was settled (`usage`, `baseline`, `none`), `recorded` (from an event), or `open`. */
  outcome: string;
}

/** One recorded execution of a tool call: ran, or its receipt replayed. */
export interface TraceToolExecution {
  at: number;
  verdict: string;
  durationMs: number | null;
  /** The agent turn the worker recorded it in (null: an operator's call, or not recorded). */
  turn: number | null;
}

/** One tool call as the ledger holds it. */
export interface TraceToolCall {
  callId: string;
  tool: string;
  /** The ledger state: SUCCEEDED, FAILED, IN_DOUBT, RUNNING, PREPARED. */
  state: string;
  /**
   * What came of the call, from the ledger: `executed` (it ran and has its receipt), `failed`,
   * `in_doubt`, `running`, `prepared` (not run: e.g. waiting for approval), or `receipt_replayed`
   * (recorded before this step ran: an action's call another run made).
   */
  verdict: string;
  /**
   * Each time a worker recorded the call (`tool.called`: `executed`, `receipt_replayed`, `held`,
   * `failed`), oldest first; empty when the event stream does not record tool calls.
   */
  executions: TraceToolExecution[];
  /** How many times the tool was run for this call. */
  runs: number;
  start: number;
  end: number | null;
  /** The agent turn it belongs to; null for an operator's call. */
  turn: number | null;
  error: string | null;
}

/** A unit (the attempt, or one turn) run again by `worker` after `previousWorker` stopped. */
export interface TraceTakeover {
  at: number;
  turn: number | null;
  previousWorker: string | null;
  /** When the stopped worker had started the unit. */
  previousStartedAt: number | null;
  worker: string | null;
}

/** One agent turn of an attempt. */
export interface TraceTurn {
  turn: number;
  start: number;
  end: number | null;
  /** `committed` (granular), `done` (atomic, a later turn or the answer followed), or `open`. */
  outcome: 'committed' | 'done' | 'open';
}

/** One attempt of a step. */
export interface TraceAttempt {
  attempt: number;
  start: number;
  end: number | null;
  outcome: AttemptOutcome;
  error: { code: string; message: string; retryable: boolean } | null;
  /** The workers that ran it (when the stream records them), e.g. `host:pid`, in order. */
  workers: string[];
  /** Units of the attempt run again after the worker that started them stopped. */
  takeovers: TraceTakeover[];
  turns: TraceTurn[];
  modelCalls: TraceModelCall[];
  toolCalls: TraceToolCall[];
  waits: TraceWait[];
}

/** One step of the run. */
export interface TraceStep {
  stepId: string;
  kind: string;
  status: string;
  attempts: TraceAttempt[];
  /** The step's gate wait (human_gate steps). */
  waits: TraceWait[];
  /** A skip by request, outside any attempt. */
  skipped: { at: number; reason: string; by: string | null } | null;
}

/** A run's trace: every step, attempt, agent turn, model call, tool call and approval wait. */
export interface RunTrace {
  version: 1;
  runId: string;
  planName: string;
  tenantId: string;
  status: string;
  /** The OpenTelemetry trace id of the run's spans; null for a run started without one. */
  traceId: string | null;
  start: number;
  /** When the run ended; null while it runs or waits. */
  end: number | null;
  steps: TraceStep[];
}

/** What a run's trace is built from. */
export interface RunTraceSources {
  runId: string;
  planName: string;
  tenantId: string;
  status: string;
  createdAt: number;
  traceparent: string | null;
  /** The plan's steps, in plan order. */
  plan: readonly { id: string; kind: string; dependsOn: readonly string[] }[];
  /** Each step's current status and attempt. */
  steps: readonly { stepId: string; status: string; attempt: number }[];
  /** The notes of started executions, by step id: `<attempt> <pauses> <at>`. */
  started: Readonly<Record<string, string>>;
  /** The run's event stream, in order. */
  events: readonly { readonly type: string; readonly [field: string]: unknown }[];
  ledger: readonly LedgerEntry[];
  reservations: readonly Reservation[];
}

const FINISHED = new Set(['succeeded', 'failed', 'cancelled']);

/** The events that belong to one attempt of a step (others name an attempt only in passing). */
const ATTEMPT_EVENTS = new Set([
  'step.started',
  'step.succeeded',
  'step.failed',
  'step.skipped',
  'turn.committed',
  'tool.approvalRequested',
  'tool.called',
  'model.called',
  'model.rate_limited',
  'step.ran',
  'turn.ran',
  'step.takenOver',
  'turn.takenOver',
]);

const str = (v: unknown): string | null => (typeof v === 'string' && v !== '' ? v : null);
const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);

/** A worker's identity as an event may record it: a string, or `{ host, pid }`. */
function workerOf(v: unknown): string | null {
  if (typeof v === 'string') return v === '' ? null : v;
  if (typeof v !== 'object' || v === null) return null;
  const { host, pid, id } = v as Record<string, unknown>;
  if (typeof id === 'string') return id;
  if (typeof host === 'string' || typeof pid === 'number') {
    return `${typeof host === 'string' ? host : '?'}:${typeof pid === 'number' ? pid : '?'}`;
  }
  return null;
}

function ledgerVerdict(state: string): string {
  switch (state) {
    case 'SUCCEEDED':
      return 'executed';
    case 'FAILED':
      return 'failed';
    case 'IN_DOUBT':
      return 'in_doubt';
    case 'RUNNING':
      return 'running';
    default:
      return 'prepared';
  }
}

/** The verdict a `tool.called` event records: ran, receipt replayed, held, or failed. */
function eventVerdict(e: Readonly<Record<string, unknown>>): string {
  const verdict = str(e['verdict']);
  if (verdict !== null) return verdict;
  const outcome = str(e['outcome']);
  if (outcome === 'failed' || outcome === 'held') return outcome;
  return e['replayed'] === true ? 'receipt_replayed' : 'executed';
}

function newAttempt(attempt: number, start: number): TraceAttempt {
  return {
    attempt,
    start,
    end: null,
    outcome: 'running',
    error: null,
    workers: [],
    takeovers: [],
    turns: [],
    modelCalls: [],
    toolCalls: [],
    waits: [],
  };
}

/** The attempt of `list` in whose interval `at` falls, else the last one started before it. */
function attemptAt(list: readonly TraceAttempt[], at: number): TraceAttempt | undefined {
  const inside = list.find((a) => a.start <= at && (a.end === null || at <= a.end));
  if (inside !== undefined) return inside;
  return [...list].reverse().find((a) => a.start <= at) ?? list[0];
}

/** Builds a run's trace from its stored records. */
export function buildRunTrace(src: RunTraceSources): RunTrace {
  const kinds = new Map(src.plan.map((s) => [s.id, s.kind]));
  const index = indexEvents(src);
  const steps = src.plan.map((p) => traceStep(src, index, p, kinds.get(p.id) === 'agent'));
  return {
    version: 1,
    runId: src.runId,
    planName: src.planName,
    tenantId: src.tenantId,
    status: src.status,
    traceId: src.traceparent?.split('-')[1] ?? null,
    start: src.createdAt,
    end: FINISHED.has(src.status) ? index.lastAt : null,
    steps,
  };
}

/**
 * What the run's event stream says, gathered in one pass before any step is built: a step's
 * trace also needs what the run's later events say (a decision, a stop, the last event's time).
 */
interface EventIndex {
  /** The attempts the events name, by step and attempt number. */
  attempts: Map<string, Map<number, TraceAttempt>>;
  /** The decided gate waits of each step (outside any attempt). */
  stepWaits: Map<string, TraceWait[]>;
  skips: Map<string, TraceStep['skipped']>;
  /** When each step last succeeded or was skipped: where a gate after it starts waiting. */
  finishedAt: Map<string, number>;
  /** The recorded executions of each tool call, by call id. */
  executions: Map<string, TraceToolExecution[]>;
  /** When a turn's execution began, by step, attempt and turn: the worker's own record of it. */
  turnBegan: Map<string, number>;
  /** The recorded model calls of each step. */
  modelEvents: Map<string, TraceModelCall[]>;
  /** When each step's gate started waiting, when an event says so. */
  gateSince: Map<string, number>;
  /** When the run was cancelled or stopped: the end of an attempt it cut short. */
  stoppedAt: number | null;
  /** The time of the latest event (or the run's creation). */
  lastAt: number;
}

/** One event, read: its time, its step and the attempt it belongs to, if any. */
interface ReadEvent {
  e: RunTraceSources['events'][number];
  at: number;
  stepId: string;
  attempt: TraceAttempt | undefined;
  worker: string | null;
}

/** Reads the run's events in order into an {@link EventIndex}. */
function indexEvents(src: RunTraceSources): EventIndex {
  const index: EventIndex = {
    attempts: new Map(src.plan.map((s) => [s.id, new Map<number, TraceAttempt>()])),
    stepWaits: new Map(src.plan.map((s) => [s.id, [] as TraceWait[]])),
    skips: new Map(),
    finishedAt: new Map(),
    executions: new Map(),
    turnBegan: new Map(),
    modelEvents: new Map(),
    gateSince: new Map(),
    stoppedAt: null,
    lastAt: src.createdAt,
  };
  for (const e of src.events) {
    const at = num(e['at']) ?? index.lastAt;
    index.lastAt = Math.max(index.lastAt, at);
    const stepId = str(e['stepId']) ?? '';
    // A skip by a false condition names the attempt that would have run, which never began.
    const untaken = e.type === 'step.skipped' && e['reason'] === CONDITION_FALSE;
    const n = ATTEMPT_EVENTS.has(e.type) && !untaken ? num(e['attempt']) : null;
    const attempt = n === null || n < 1 ? undefined : attemptOf(index, stepId, n, at);
    const worker = workerOf(e['worker']);
    if (attempt !== undefined && worker !== null && !attempt.workers.includes(worker)) {
      attempt.workers.push(worker);
    }
    readEvent(src, index, { e, at, stepId, attempt, worker });
  }
  return index;
}

/** The attempt `n` of a step of the plan, created when first named (at `at`). */
function attemptOf(
  index: EventIndex,
  stepId: string,
  n: number,
  at: number,
): TraceAttempt | undefined {
  const byNumber = index.attempts.get(stepId);
  if (byNumber === undefined) return undefined;
  let a = byNumber.get(n);
  if (a === undefined) byNumber.set(n, (a = newAttempt(n, at)));
  return a;
}

/** Adds what one event says to the index. */
function readEvent(src: RunTraceSources, index: EventIndex, read: ReadEvent): void {
  const { e, at, stepId, attempt: a, worker } = read;
  switch (e.type) {
    case 'step.succeeded':
    case 'step.failed':
    case 'step.skipped':
      readStepEnd(index, read);
      break;
    case 'turn.committed': {
      const turn = num(e['turn']);
      if (a === undefined || turn === null) break;
      const before = a.turns.at(-1);
      a.turns.push({ turn, start: before?.end ?? a.start, end: at, outcome: 'committed' });
      break;
    }
    case 'tool.approvalRequested':
      a?.waits.push({
        kind: 'tool',
        start: at,
        end: null,
        decision: null,
        by: null,
        comment: null,
        tool: str(e['tool']),
        callId: str(e['callId']),
      });
      break;
    case 'gate.approved':
    case 'gate.rejected':
      readDecision(src, index, read);
      break;
    case 'step.changed':
      // A gate starts waiting when its step goes to WAITING_APPROVAL outside any attempt.
      if (e['to'] === 'WAITING_APPROVAL' && num(e['attempt']) === 0) {
        index.gateSince.set(stepId, at);
      }
      // Skipped with no event of its own: every dependency was skipped by a false condition.
      if (e['from'] === 'PENDING' && e['to'] === 'SKIPPED' && !index.skips.has(stepId)) {
        index.skips.set(stepId, { at, reason: CONDITION_FALSE, by: null });
      }
      break;
    case 'run.cancelled':
    case 'run.stopped':
      index.stoppedAt = at;
      break;
    case 'tool.called': {
      const callId = str(e['callId']);
      if (callId === null) break;
      const list = index.executions.get(callId) ?? [];
      list.push({
        at,
        verdict: eventVerdict(e),
        durationMs: num(e['durationMs']),
        turn: num(e['turn']),
      });
      index.executions.set(callId, list);
      break;
    }
    case 'step.ran':
    case 'turn.ran':
      noteTurnBegan(index, read, num(e['startedAt']));
      break;
    case 'step.takenOver':
    case 'turn.takenOver': {
      const previousStartedAt = num(e['previousStartedAt']);
      noteTurnBegan(index, read, previousStartedAt);
      a?.takeovers.push({
        at,
        turn: num(e['turn']),
        previousWorker: workerOf(e['previousWorker']),
        previousStartedAt,
        worker,
      });
      break;
    }
    case 'model.called':
      readModelCall(index, read);
      break;
    default:
      break;
  }
}

/** A step's end: its attempt's outcome (and error), or a skip outside any attempt. */
function readStepEnd(index: EventIndex, { e, at, stepId, attempt: a }: ReadEvent): void {
  if (e.type !== 'step.failed') index.finishedAt.set(stepId, at);
  if (a === undefined) {
    if (e.type === 'step.skipped') {
      index.skips.set(stepId, { at, reason: str(e['reason']) ?? '', by: str(e['by']) });
    }
    return;
  }
  a.end = at;
  a.outcome =
    e.type === 'step.succeeded' ? 'succeeded' : e.type === 'step.failed' ? 'failed' : 'skipped';
  const error = e['error'] as Record<string, unknown> | undefined;
  if (e.type === 'step.failed' && error !== undefined) {
    a.error = {
      code: str(error['code']) ?? 'unknown',
      message: str(error['message']) ?? '',
      retryable: error['retryable'] === true,
    };
  }
}

/**
 * A decision: on a tool call, it closes that call's open wait in whichever attempt asked; on a
 * step's gate, it records the gate's whole wait, from when the gate started waiting.
 */
function readDecision(src: RunTraceSources, index: EventIndex, { e, at, stepId }: ReadEvent): void {
  const decision = e.type === 'gate.approved' ? 'approved' : 'rejected';
  const callId = str(e['callId']);
  const decided = {
    end: at,
    decision,
    by: str(e['by']),
    comment: str(e['comment']),
  } as const;
  if (callId !== null) {
    const open = [...(index.attempts.get(stepId)?.values() ?? [])]
      .flatMap((x) => x.waits)
      .find((w) => w.callId === callId && w.end === null);
    if (open !== undefined) Object.assign(open, decided);
  } else {
    index.stepWaits.get(stepId)?.push({
      kind: 'gate',
      start: index.gateSince.get(stepId) ?? gateStart(src, index.finishedAt, stepId),
      ...decided,
      tool: null,
      callId: null,
    });
  }
}

/**
 * When a worker began the event's turn (or took it over): the earliest such time is kept, to
 * place the turn's start after a crash left it untaken for a while.
 */
function noteTurnBegan(
  index: EventIndex,
  { e, stepId, attempt: a }: ReadEvent,
  t: number | null,
): void {
  const turn = num(e['turn']);
  if (a === undefined || turn === null || t === null) return;
  const key = `${stepId}\n${a.attempt}\n${turn}`;
  index.turnBegan.set(key, Math.min(index.turnBegan.get(key) ?? t, t));
}

/** A model call a worker recorded, timed from its start (or its duration) to the event. */
function readModelCall(index: EventIndex, { e, at, stepId }: ReadEvent): void {
  // A reservation released with nothing sent (recorded by an earlier release) is no call.
  if (e['charged'] === 'none') return;
  const list = index.modelEvents.get(stepId) ?? [];
  const duration = num(e['durationMs']);
  const start = num(e['startedAt']) ?? (duration === null ? at : at - duration);
  list.push({
    turn: num(e['turn']) ?? 0,
    model: str(e['model']),
    start,
    end: at,
    inputTokens: num(e['inputTokens']),
    outputTokens: num(e['outputTokens']),
    costUsd: num(e['costUsd']),
    outcome: str(e['charged']) ?? str(e['outcome']) ?? 'recorded',
  });
  index.modelEvents.set(stepId, list);
}

/** One step's trace: its attempts as the events left them, completed from its current state. */
function traceStep(
  src: RunTraceSources,
  index: EventIndex,
  p: RunTraceSources['plan'][number],
  isAgent: boolean,
): TraceStep {
  const state = src.steps.find((s) => s.stepId === p.id);
  const status = state?.status ?? 'PENDING';
  const list = [...(index.attempts.get(p.id)?.values() ?? [])].sort(
    (x, y) => x.attempt - y.attempt,
  );
  openAttempt(src, p.id, status, state?.attempt ?? 0, list);
  settleAttempts(list, status, state?.attempt, index.stoppedAt);
  const waits = index.stepWaits.get(p.id) ?? [];
  if (status === 'WAITING_APPROVAL' && p.kind === 'human_gate' && list.length === 0) {
    waits.push({
      kind: 'gate',
      start: index.gateSince.get(p.id) ?? gateStart(src, index.finishedAt, p.id),
      end: null,
      decision: null,
      by: null,
      comment: null,
      tool: null,
      callId: null,
    });
  }
  addModelCalls(list, index.modelEvents.get(p.id), src.reservations, p.id);
  addTurns(list, isAgent, (a, turn) => index.turnBegan.get(`${p.id}\n${a.attempt}\n${turn}`));
  addToolCalls(list, src.ledger, p.id, index.executions);
  return {
    stepId: p.id,
    kind: p.kind,
    status,
    attempts: list,
    waits,
    skipped: index.skips.get(p.id) ?? null,
  };
}

/**
 * The outcome of each attempt no event ended: the step's current attempt is waiting or running as
 * its status says; any other was cut short, at the run's stop if it stopped.
 */
function settleAttempts(
  list: TraceAttempt[],
  status: string,
  current: number | undefined,
  stoppedAt: number | null,
): void {
  for (const a of list) {
    if (a.end !== null) continue;
    if (status === 'WAITING_APPROVAL' && a.attempt === current) a.outcome = 'waiting';
    else if (isLive(status) && a.attempt === current) a.outcome = 'running';
    else {
      a.outcome = 'cancelled';
      a.end = stoppedAt;
    }
  }
}

const isLive = (status: string): boolean => status === 'RUNNING' || status === 'READY';

/** A started execution not yet committed (no event): its attempt, from the worker's note. */
function openAttempt(
  src: RunTraceSources,
  stepId: string,
  status: string,
  attempt: number,
  list: TraceAttempt[],
): void {
  if (!isLive(status) || list.some((a) => a.attempt === attempt)) return;
  const note = src.started[stepId]?.split(' ');
  if (note?.[0] !== String(attempt)) return;
  const at = Number(note[2]);
  if (Number.isFinite(at)) list.push(newAttempt(attempt, at));
}

/** When a gate started waiting: when the last of its step's dependencies ended, or the run began. */
function gateStart(
  src: RunTraceSources,
  finishedAt: ReadonlyMap<string, number>,
  stepId: string,
): number {
  const deps = src.plan.find((s) => s.id === stepId)?.dependsOn ?? [];
  return Math.max(src.createdAt, ...deps.map((d) => finishedAt.get(d) ?? src.createdAt));
}

/**
 * The step's model calls, placed in the attempt they fall in: recorded events, else reservations;
 * a reservation released with nothing sent is not a call.
 */
function addModelCalls(
  list: TraceAttempt[],
  recorded: TraceModelCall[] | undefined,
  reservations: readonly Reservation[],
  stepId: string,
): void {
  const calls: TraceModelCall[] =
    recorded ??
    reservations
      // A reservation released with nothing sent is no model call.
      .filter((r) => r.stepId === stepId && r.outcome !== 'none')
      .sort((x, y) => x.seq - y.seq)
      .map((r) => ({
        turn: r.turn,
        model: null,
        start: r.createdAt,
        end: r.reconciledAt,
        inputTokens: r.charged?.inputTokens ?? null,
        outputTokens: r.charged?.outputTokens ?? null,
        costUsd: r.charged === null ? null : r.charged.microUsd / 1_000_000,
        outcome: r.outcome ?? 'open',
      }));
  for (const call of calls) attemptAt(list, call.start)?.modelCalls.push(call);
}

/**
 * The turns of an agent attempt. Atomic (no turn is committed on its own): each model call starts
 * one, which lasts until the next one starts or the attempt ends. Granular: from the commits.
 */
function addTurns(
  list: TraceAttempt[],
  isAgent: boolean,
  beganAt: (a: TraceAttempt, turn: number) => number | undefined,
): void {
  if (!isAgent) return;
  for (const a of list) {
    if (a.turns.length > 0) {
      // Granular: a turn under way after the last commit.
      const last = a.turns.at(-1)!;
      if (a.end === null && a.outcome === 'running') {
        a.turns.push({
          turn: last.turn + 1,
          start: last.end ?? a.start,
          end: null,
          outcome: 'open',
        });
      }
      // A turn began when a worker first took it (or first asked the model for it), if later
      // than the commit before it: after a crash, no worker may have taken it at once.
      for (const t of a.turns) {
        const asked = a.modelCalls.filter((m) => m.turn === t.turn).map((m) => m.start);
        const took = beganAt(a, t.turn);
        const first = Math.min(...asked, took ?? Number.POSITIVE_INFINITY);
        if (Number.isFinite(first)) t.start = Math.min(t.end ?? first, Math.max(t.start, first));
      }
      continue;
    }
    const starts = new Map<number, number>();
    for (const m of a.modelCalls) {
      if (!starts.has(m.turn)) starts.set(m.turn, m.start);
    }
    const ordered = [...starts.entries()].sort((x, y) => x[0] - y[0]);
    a.turns = ordered.map(([turn, start], i) => {
      const end = ordered[i + 1]?.[1] ?? a.end;
      return { turn, start, end, outcome: end === null ? 'open' : 'done' };
    });
  }
}

/** The step's ledger entries as tool calls of the attempt and turn their time falls in. */
function addToolCalls(
  list: TraceAttempt[],
  ledger: readonly LedgerEntry[],
  stepId: string,
  executions: ReadonlyMap<string, TraceToolExecution[]>,
): void {
  const entries = ledger.filter((e) => e.stepId === stepId).sort((x, y) => x.seq - y.seq);
  const first = list[0]?.start ?? Number.POSITIVE_INFINITY;
  for (const e of entries) {
    const a = attemptAt(list, e.createdAt);
    if (a === undefined) continue;
    const turn = a.turns.find(
      (t) => t.start <= e.createdAt && (t.end === null || e.createdAt <= t.end),
    );
    const settled = e.state === 'SUCCEEDED' || e.state === 'FAILED' || e.state === 'IN_DOUBT';
    const recorded = executions.get(e.callId) ?? [];
    a.toolCalls.push({
      callId: e.callId,
      tool: e.tool,
      state: e.state,
      // Recorded before the step first ran: an action's call another run made, its receipt reused.
      verdict:
        e.createdAt < first && e.state === 'SUCCEEDED'
          ? 'receipt_replayed'
          : ledgerVerdict(e.state),
      executions: recorded,
      runs: e.runs,
      start: e.createdAt,
      end: settled ? e.updatedAt : null,
      // The turn the worker recorded the call in, else the one its ledger time falls in (a receipt
      // written by the turn's commit is timed at the commit, just past the turn's end).
      turn: recorded.find((x) => x.turn !== null)?.turn ?? turn?.turn ?? null,
      error: e.error === null ? null : `${e.error.code}: ${e.error.message}`,
    });
  }
}
