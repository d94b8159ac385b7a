import type { SerializedError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';

/** The ten states of a step. */
export const StepStatus = {
  PENDING: 'PENDING',
  READY: 'READY',
  RUNNING: 'RUNNING',
  SUCCEEDED: 'SUCCEEDED',
  FAILED_RETRYABLE: 'FAILED_RETRYABLE',
  FAILED_FINAL: 'FAILED_FINAL',
  WAITING_APPROVAL: 'WAITING_APPROVAL',
  /** A wait step waits for a signal or a timer; no worker holds it. */
  WAITING: 'WAITING',
  SKIPPED: 'SKIPPED',
  CANCELLED: 'CANCELLED',
} as const;
/** A value of {@link StepStatus}. */
export type StepStatus = (typeof StepStatus)[keyof typeof StepStatus];

/** Step states that never change again. */
export const FINAL_STEP_STATUSES: readonly StepStatus[] = [
  'SUCCEEDED',
  'FAILED_FINAL',
  'SKIPPED',
  'CANCELLED',
];

/** True for a state a step never leaves. */
export function isFinalStepStatus(status: StepStatus): boolean {
  return FINAL_STEP_STATUSES.includes(status);
}

/** The states a run is in, derived from its steps. */
export const RunStatus = {
  running: 'running',
  waiting: 'waiting',
  succeeded: 'succeeded',
  failed: 'failed',
  cancelled: 'cancelled',
} as const;
/** A value of {@link RunStatus}. */
export type RunStatus = (typeof RunStatus)[keyof typeof RunStatus];

/** Why a step ended where it did, when that is not plain success. */
export const StepReason = {
  /** A gate was rejected by a person. */
  approvalRejected: 'approval_rejected',
  /** The last allowed attempt failed with a retryable error. */
  retriesExhausted: 'retries_exhausted',
  /** An attempt failed with an error that is not retryable. */
  nonRetryableError: 'non_retryable_error',
  /** A step this one depends on failed finally, was rejected or was cancelled. */
  upstreamFailed: 'upstream_failed',
  /** The run was cancelled. */
  runCancelled: 'run_cancelled',
  /** The primary failed finally, and so did its fallback. */
  fallbackFailed: 'fallback_failed',
} as const;

/** Who decided on a gate, when, and why. */
export interface Decision {
  by: string;
  at: number;
  comment: string | null;
}

/**
 * A tool call that waits for a person's approval before it may run (its tool has risk level high
 * or critical), identified by its ledger call id. Plain JSON.
 */
export interface PendingCall {
  /** The call's ledger id: an approval covers this call and no other. */
  callId: string;
  /** The tool's identity (`name@version`). */
  tool: string;
  /** The parsed arguments the call would run with. */
  args: JsonValue;
  /** In an agent step: the model's tool call id and the turn whose reply asked for the call. */
  toolCallId: string | null;
  turn: number | null;
  at: number;
}

/** A person's decision on one tool call of one attempt. */
export interface CallDecision extends Decision {
  callId: string;
  attempt: number;
  approved: boolean;
}

/**
 * Something that must happen outside the machines. The machines only plan; the actor host carries
 * these out (enqueue a job, schedule a delayed job, notify an approver, abort a running attempt).
 */
export type PlannedAction =
  | {
      type: 'step.execute';
      stepId: string;
      attempt: number;
      /** Executions of this attempt paused for a tool call's approval so far (absent: none). */
      pause?: number;
    }
  | { type: 'step.scheduleRetry'; stepId: string; attempt: number; at: number; delayMs: number }
  | { type: 'step.requestApproval'; stepId: string }
  /** A wait step started waiting: a timer (or a signal wait's timeout) is due at `dueAt`. */
  | {
      type: 'step.wait';
      stepId: string;
      attempt: number;
      dueAt: number | null;
      /** A run step: the child run it waits for (its end wakes the step). */
      child?: string;
    }
  | { type: 'step.abort'; stepId: string; attempt: number };

/** What a step tells its run each time it enters a state. */
export interface StepReport {
  stepId: string;
  status: StepStatus;
  attempt: number;
  planned: PlannedAction | null;
  /** Time of the event that moved the step (epoch ms). */
  at: number;
}

/** The run's view of one step: enough to decide readiness and the run's status. */
export interface StepView {
  status: StepStatus;
  attempt: number;
  /** WAITING for a child run, which works meanwhile: the run counts as running. */
  child?: true;
}

/** The context of a step machine: plain JSON. */
export interface StepContext {
  stepId: string;
  needsApproval: boolean;
  /** A granular agent step: driven one turn per unit of work. */
  granular: boolean;
  retry: {
    maxAttempts: number;
    initialDelayMs: number;
    backoffCoefficient: number;
    maxDelayMs: number;
    jitter: number;
  };
  /** Attempts started so far; the running attempt's number while RUNNING. */
  attempt: number;
  approval: Decision | null;
  rejection: Decision | null;
  output: JsonValue | null;
  /** The last error of a failed attempt. */
  error: SerializedError | null;
  /** When the scheduled retry is due (epoch ms), while FAILED_RETRYABLE. */
  retryAt: number | null;
  /** A {@link StepReason} (or a skip reason given by the caller) for terminal states other than SUCCEEDED. */
  reason: string | null;
  /** The step the failure came from, when CANCELLED because of an upstream failure. */
  causeStepId: string | null;
  /** Set when a RUNNING attempt was cancelled, so the host aborts it. */
  abortedAttempt: number | null;
  /** A granular agent step's committed turns (null for every other step, and before turn 1). */
  agent: AgentProgress | null;
  /** The tool call this step waits on in WAITING_APPROVAL (null when it waits on its gate). */
  pendingCall: PendingCall | null;
  /** Decisions on the current attempt's tool calls (null: none yet). */
  callDecisions: CallDecision[] | null;
  /**
   * How many times the current attempt paused for a tool call's approval: each resumed execution
   * is a unit of its own (its own job id).
   */
  pauses: number;
  /** The step's fallback phase; null for a step without a fallback. */
  fallback: FallbackPhase | null;
  /** What a wait step waits for, from when it started waiting (null for every other step). */
  wait?: WaitState | null;
  /**
   * Where the step's output came from, when a cache entry gave it (no attempt ran); absent (or
   * null, in a snapshot of an earlier release) otherwise.
   */
  cachedFrom?: CacheSource | null;
  /** A map step's running attempt: how many items it runs (absent for every other step). */
  map?: MapProgress | null;
  updatedAt: number;
}

/**
 * A step with a fallback: whether the fallback is the attempt that runs now (the primary failed
 * finally), and the primary's last error, which the fallback is told.
 */
export interface FallbackPhase {
  active: boolean;
  primaryError: SerializedError | null;
}

/**
 * What a WAITING step waits for: the next signal `signal` (until `dueAt` when it has a timeout),
 * the time `dueAt` (a timer), or the end of the child run `child`, computed once when it started
 * waiting (`since`).
 */
export interface WaitState {
  signal: string | null;
  dueAt: number | null;
  since: number;
  /** A run step: the id of the child run it waits for. */
  child?: string;
}

/**
 * A map step whose attempt started: its items run as units of their own, their results kept
 * beside the run (not in its snapshot), so the step itself has no unit due while it is RUNNING.
 */
export interface MapProgress {
  /** Items the attempt runs. */
  total: number;
}

/** The cache entry a step's output came from. */
export interface CacheSource {
  /** The run that stored the entry. */
  runId: string;
  /** When it was stored (epoch ms). */
  storedAt: number;
  cacheClass: 'deterministic' | 'stable_nondeterministic' | 'external';
  /** An external entry's provenance. */
  provenance: string | null;
}

/** How far a granular agent step has come: what its committed turns left behind. */
export interface AgentProgress {
  /** Turns committed; the next turn to run has this index (0-based). */
  turns: number;
  /** Messages in the step's history after the last committed turn. */
  cursor: number;
  /** The fingerprint hash stored by the first turn; every later turn must match it. */
  fingerprint: string;
}

/** A step's report to its run: what its step actor sends its parent on entering a state. */
export type StepReportedEvent = { type: 'step.reported' } & StepReport;
