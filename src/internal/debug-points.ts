/**
 * Named points between an effect and its commit where a crash test can kill the process. A point
 * fires only when `FLUJO_KILL_AT` names it (optionally `name@N` to fire on its N-th pass); then the
 * process sends itself SIGKILL: no `finally`, no flush, exactly like a machine losing power.
 */
export const DebugPoint = {
  /** A risky tool call was found approved; it has not started (no lease, no effect). */
  afterCallApproved: 'after-call-approved',
  /** A tool's side effect happened; its receipt is not yet in the ledger. */
  afterToolEffect: 'after-tool-effect',
  /** The receipt is in the ledger; the step's result is not yet committed. */
  afterReceipt: 'after-receipt',
  /** The step's result is committed; the next unit of work is not yet enqueued. */
  afterCommit: 'after-commit',
  /** A model replied to an agent turn; the reply is not yet in the journal. */
  afterModelReply: 'after-model-reply',
  /** The turn's reply is journaled; no tool of the turn has run yet. */
  afterJournal: 'after-journal',
  /** One tool call of a turn is done (receipt recorded); the next has not started. */
  betweenTools: 'between-tools',
  /** Every tool call of the turn is done; the turn is not yet committed. */
  afterTools: 'after-tools',
  /** A model call is about to be metered: nothing of it is reserved yet. */
  beforeReserve: 'before-reserve',
  /** A model call's usage is reserved; its request has not gone out. */
  afterReserve: 'after-reserve',
  /** A model request went out and its answer's headers came back; the reply is not yet read. */
  afterRequestSent: 'after-request-sent',
  /** A step attempt's result is decided; its commit is not yet sent. */
  beforeCommit: 'before-commit',
  /** A signal is in the run's inbox; the wait step that may take it is not yet woken. */
  afterSignalAppend: 'after-signal-append',
  /** A run step's child run is created and queued; the step is not yet committed waiting for it. */
  afterChildStart: 'after-child-start',
  /** A run step is committed waiting for its child run; what became due is not yet enqueued. */
  afterChildWait: 'after-child-wait',
  /** A child run ended (its end committed); its parent's step is not yet woken. */
  afterChildEnd: 'after-child-end',
  /** A schedule's fire is recorded `started`; its run is not yet created. */
  afterFireRecorded: 'after-fire-recorded',
  /** A map step's items are stored and the first dispatched; its start is not yet committed. */
  afterMapStart: 'after-map-start',
  /** A map item's operator or agent returned; the item's result is not yet committed. */
  beforeItemCommit: 'before-item-commit',
  /** A map item is committed; the next item it dispatched is not yet enqueued. */
  afterItemCommit: 'after-item-commit',
} as const;
/** A value of {@link DebugPoint}. */
export type DebugPoint = (typeof DebugPoint)[keyof typeof DebugPoint];

const passes = new Map<string, number>();
// Read once: the points are on hot paths, and a process is told where to die when it starts.
const TARGET = process.env['FLUJO_KILL_AT'] ?? '';

/** Kills the process here if `FLUJO_KILL_AT` names this point (and pass). Otherwise does nothing. */
export function debugPoint(name: DebugPoint, scope?: string): void {
  const target = TARGET;
  if (target === '') return;
  const [wanted, nth] = target.split('@');
  const label = scope === undefined ? name : `${name}:${scope}`;
  if (wanted !== name && wanted !== label) return;
  const count = (passes.get(wanted) ?? 0) + 1;
  passes.set(wanted, count);
  if (nth !== undefined && Number(nth) !== count) return;
  process.kill(process.pid, 'SIGKILL');
}
