/**
 * The runtime's error model. Every error the runtime raises is a {@link FlujoError} with a literal
 * `name`, a string `code` and a `retryable` flag decided once, where the error is created. Errors
 * survive a round trip through JSON (`toJSON` / {@link reviveError}) with those fields intact, so a
 * failure recorded in Redis by one process reads the same in another.
 *
 * This module is a leaf: it imports nothing from the rest of the runtime.
 */

/** Every error code the runtime uses. Match on codes, not on classes: they cross process borders. */
export const ErrorCode = {
  PlanInvalid: 'plan_invalid',
  InputInvalid: 'input_invalid',
  EventInvalid: 'event_invalid',
  SnapshotConflict: 'snapshot_conflict',
  RunNotFound: 'run_not_found',
  RunAlreadyExists: 'run_already_exists',
  SnapshotUnsupported: 'snapshot_unsupported',
  SnapshotCorrupt: 'snapshot_corrupt',
  HistoryConflict: 'history_conflict',
  RedisUnavailable: 'redis_unavailable',
  Invariant: 'invariant',
  Unknown: 'unknown',
  ToolOutcomeUnknown: 'tool_outcome_unknown',
  ToolInputInvalid: 'tool_input_invalid',
  NonDeterminism: 'non_determinism',
  ToolCallBusy: 'tool_call_busy',
  ConfigurationInvalid: 'configuration_invalid',
  ToolUnknown: 'tool_unknown',
  LedgerStateInvalid: 'ledger_state_invalid',
  BudgetExceeded: 'budget_exceeded',
  MaxTurnsExceeded: 'max_turns_exceeded',
  StepNotWaiting: 'step_not_waiting',
  RunNotResumable: 'run_not_resumable',
  ModelError: 'model_error',
  ResumeError: 'resume_error',
  UsageLimitExceeded: 'usage_limit_exceeded',
  ReservationNotFound: 'reservation_not_found',
  BlobCapExceeded: 'blob_cap_exceeded',
  BlobMissing: 'blob_missing',
  PricingNotConfigured: 'pricing_not_configured',
  /** A policy (a `policy_check` step, or one bound to a step's `policyTags`) denied the work. Final. */
  PolicyDenied: 'policy_denied',
  /** User code (an operator, a tool, a service it called) refused its input (HTTP 400, 422). Final. */
  InvalidInput: 'invalid_input',
  /** A step's dependency produced nothing the step needs. Final. */
  MissingContext: 'missing_context',
  /** User code was refused access (HTTP 401, 403). Final. */
  AuthForbidden: 'auth_forbidden',
  /** One attempt of a step (a turn of a granular step) outlived the step's `timeoutMs`. Retryable. */
  StepTimeout: 'timeout',
  /** User code got HTTP 404 from a service it called. Final. */
  NotFound: 'not_found',
  /** User code met a transient failure: HTTP 408, 429 or 5xx, a reset connection, a timeout. Retryable. */
  ServiceUnavailable: 'service_unavailable',
  ApprovalNotAllowed: 'approval_not_allowed',
  StepNotSkippable: 'step_not_skippable',
  ToolCallRejected: 'tool_call_rejected',
  /** A step's primary failed finally, and so did its fallback. Final. */
  FallbackFailed: 'fallback_failed',
  /** A signal was sent to a run that has ended (succeeded or cancelled). Nothing was written. */
  RunEnded: 'run_ended',
  /** A signal's `id` was used before with another name or payload. Nothing was written. */
  SignalIdConflict: 'signal_id_conflict',
  /** A wait step's signal did not arrive within its `timeoutMs`. Final. */
  WaitTimeout: 'wait_timeout',
  /** An item of a map step failed finally (its retries spent), and the map does not collect failures. Final. */
  ItemFailed: 'item_failed',
  /** A map step's `over` does not hold an array (or holds more than 10,000 elements). Final. */
  MapOverInvalid: 'map_over_invalid',
  /** A run step's child run failed or was cancelled. Retryable when it failed. */
  ChildFailed: 'child_failed',
} as const;
/** A value of {@link ErrorCode}. */
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

/** The JSON form of a {@link FlujoError}. Stacks are never serialized: they may carry user data. */
export interface SerializedError {
  name: string;
  code: string;
  message: string;
  retryable: boolean;
  retryAfterMs?: number | undefined;
  details?: unknown;
  /** What user code threw, as thrown: its class, message, stack and causes (see `describeThrown`). */
  thrown?: ThrownError | undefined;
}

/** A thrown error as stored with a failed attempt: bounded, JSON-safe. */
export interface ThrownError {
  /** Its class name, e.g. `TypeError`. */
  name: string;
  message: string;
  /** The first frames of its stack (at most 20 frames, 4 KB). */
  stack?: string | undefined;
  /** Its `cause` chain, outermost first (at most 5). */
  causes?: { name: string; message: string }[] | undefined;
}

const MAX_FRAMES = 20;
const MAX_STACK_CHARS = 4096;
const MAX_MESSAGE_CHARS = 2000;
const MAX_CAUSES = 5;

function textOf(value: unknown): string {
  try {
    return JSON.stringify(value) ?? typeof value;
  } catch {
    return typeof value;
  }
}

const clip = (text: string, max: number) =>
  text.length > max ? `${text.slice(0, max - 1)}…` : text;

/**
 * Describes what user code threw, for a failed attempt: the class name (`TypeError`, not the
 * `UnknownError` it is classified as), message, the first 20 frames of its stack (4 KB at most)
 * and its `cause` chain (unless `causes: false`). Undefined for a value that is not an Error.
 */
export function describeThrown(
  thrown: unknown,
  { causes: withCauses = true }: { causes?: boolean } = {},
): ThrownError | undefined {
  if (!(thrown instanceof Error)) return undefined;
  const out: ThrownError = {
    name: thrown.name || thrown.constructor.name || 'Error',
    message: clip(thrown.message, MAX_MESSAGE_CHARS),
  };
  if (typeof thrown.stack === 'string') {
    const frames = thrown.stack
      .split('\n')
      .filter((line) => /^\s+at /.test(line))
      .slice(0, MAX_FRAMES)
      .map((line) => line.trim());
    if (frames.length > 0) out.stack = clip(frames.join('\n'), MAX_STACK_CHARS);
  }
  const causes: { name: string; message: string }[] = [];
  const seen = new Set<unknown>([thrown]);
  const first: unknown = withCauses ? thrown.cause : undefined;
  for (let c: unknown = first; c !== undefined && causes.length < MAX_CAUSES;) {
    if (seen.has(c)) break;
    seen.add(c);
    causes.push(
      c instanceof Error
        ? { name: c.name || 'Error', message: clip(c.message, MAX_MESSAGE_CHARS) }
        : { name: typeof c, message: clip(textOf(c), MAX_MESSAGE_CHARS) },
    );
    c = c instanceof Error ? c.cause : undefined;
  }
  if (causes.length > 0) out.causes = causes;
  return out;
}

/** Options shared by every runtime error. */
export interface FlujoErrorOptions {
  /** The error that caused this one. */
  cause?: unknown;
  /** Overrides the class's default retryability. */
  retryable?: boolean;
  /** Earliest time to retry, in milliseconds from now, when the cause says so (e.g. `retry-after`). */
  retryAfterMs?: number;
}

/** Base class of every error the runtime raises. */
export abstract class FlujoError extends Error {
  override name = 'FlujoError';
  abstract readonly code: ErrorCode;
  /** Whether the same work may succeed if tried again later. */
  readonly retryable: boolean;
  /** Earliest time to retry, in milliseconds, when known. */
  readonly retryAfterMs: number | undefined;

  protected constructor(
    message: string,
    defaultRetryable: boolean,
    options: FlujoErrorOptions = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.retryable = options.retryable ?? defaultRetryable;
    this.retryAfterMs = options.retryAfterMs;
  }

  /** Structured, JSON-safe details specific to the error class. */
  get details(): unknown {
    return undefined;
  }

  /** The JSON form: `{ name, code, message, retryable, retryAfterMs?, details? }`. */
  toJSON(): SerializedError {
    const out: SerializedError = {
      name: this.name,
      code: this.code,
      message: this.message,
      retryable: this.retryable,
    };
    if (this.retryAfterMs !== undefined) out.retryAfterMs = this.retryAfterMs;
    const details = this.details;
    if (details !== undefined) out.details = details;
    return out;
  }
}

/** One problem found in a plan or an input, with the path where it was found. */
export interface ValidationIssue {
  /** Dotted path with indexes, e.g. `steps[2].dependsOn[0]`; empty for the root. */
  path: string;
  message: string;
}

function listIssues(what: string, issues: readonly ValidationIssue[]): string {
  const lines = issues.map((i) => `  - ${i.path === '' ? '(root)' : i.path}: ${i.message}`);
  const noun = issues.length === 1 ? 'problem' : 'problems';
  return `${what} (${issues.length} ${noun}):\n${lines.join('\n')}`;
}

/** A plan was refused. Lists every problem with its path. Never retryable. */
export class PlanValidationError extends FlujoError {
  override name = 'PlanValidationError';
  readonly code = ErrorCode.PlanInvalid;
  readonly issues: readonly ValidationIssue[];
  constructor(issues: readonly ValidationIssue[], options?: FlujoErrorOptions) {
    super(listIssues('Invalid plan', issues), false, options);
    this.issues = issues;
  }
  override get details(): unknown {
    return { issues: this.issues };
  }
}

/** An input (a run input, a step output, an event payload) is not plain JSON or has the wrong shape. */
export class InputValidationError extends FlujoError {
  override name = 'InputValidationError';
  readonly code = ErrorCode.InputInvalid;
  readonly issues: readonly ValidationIssue[];
  constructor(what: string, issues: readonly ValidationIssue[], options?: FlujoErrorOptions) {
    super(listIssues(`Invalid ${what}`, issues), false, options);
    this.issues = issues;
  }
  override get details(): unknown {
    return { issues: this.issues };
  }
}

/** An event sent to a run does not match the event schema. Nothing is committed. */
export class EventValidationError extends FlujoError {
  override name = 'EventValidationError';
  readonly code = ErrorCode.EventInvalid;
  readonly issues: readonly ValidationIssue[];
  constructor(issues: readonly ValidationIssue[], options?: FlujoErrorOptions) {
    super(listIssues('Invalid run event', issues), false, options);
    this.issues = issues;
  }
  override get details(): unknown {
    return { issues: this.issues };
  }
}

/**
 * A compare-and-set commit lost the race: another writer committed version `actualVersion` while
 * this one expected `expectedVersion`. Retryable: reload, re-decide, commit again.
 */
export class SnapshotConflictError extends FlujoError {
  override name = 'SnapshotConflictError';
  readonly code = ErrorCode.SnapshotConflict;
  constructor(
    readonly runId: string,
    readonly expectedVersion: number,
    readonly actualVersion: number | null,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Snapshot conflict on run "${runId}": expected version ${expectedVersion}, found ${
        actualVersion === null ? 'no snapshot' : `version ${actualVersion}`
      }. Another writer committed first; reload the run and decide again.`,
      true,
      options,
    );
  }
  override get details(): unknown {
    return {
      runId: this.runId,
      expectedVersion: this.expectedVersion,
      actualVersion: this.actualVersion,
    };
  }
}

/** No run with this id exists. */
export class RunNotFoundError extends FlujoError {
  override name = 'RunNotFoundError';
  readonly code = ErrorCode.RunNotFound;
  constructor(
    readonly runId: string,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Run "${runId}" not found. Check the run id (and the Redis URL and key prefix).`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { runId: this.runId };
  }
}

/**
 * The run existed and finished (or failed), and its keys were removed by retention
 * (`createRuntime({ retention: { finishedRunsMs, failedRunsMs } })`). A {@link RunNotFoundError}
 * (same code), so code that handles "not found" handles it; its message says what happened.
 */
export class RunRemovedError extends RunNotFoundError {
  override name = 'RunRemovedError';
  /** Whether the run had failed (it was kept `retention.failedRunsMs`, not `finishedRunsMs`). */
  readonly failed: boolean;
  constructor(
    runId: string,
    readonly finishedAt: number,
    readonly retentionMs: number,
    options: FlujoErrorOptions & { failed?: boolean } = {},
  ) {
    const { failed = false, ...rest } = options;
    super(runId, rest);
    this.failed = failed;
    const [how, option] = failed
      ? ['failed', 'retention.failedRunsMs']
      : ['finished', 'retention.finishedRunsMs'];
    this.message = `Run "${runId}" was removed by retention: it ${how} at ${new Date(finishedAt).toISOString()} and ${how} runs are kept ${retentionMs} ms (${option}). Its state, events and outputs are gone.`;
  }
  override get details(): unknown {
    return {
      runId: this.runId,
      removed: true,
      finishedAt: this.finishedAt,
      retentionMs: this.retentionMs,
      failed: this.failed,
    };
  }
}

/** `create` was asked for a run id that already exists. */
export class RunAlreadyExistsError extends FlujoError {
  override name = 'RunAlreadyExistsError';
  readonly code = ErrorCode.RunAlreadyExists;
  constructor(
    readonly runId: string,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Run "${runId}" already exists. Load it to continue it, or choose another run id.`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { runId: this.runId };
  }
}

/** A stored snapshot has a schema version this build cannot read (written by a newer release). */
export class SnapshotUnsupportedError extends FlujoError {
  override name = 'SnapshotUnsupportedError';
  readonly code = ErrorCode.SnapshotUnsupported;
  constructor(
    readonly runId: string,
    readonly schemaVersion: number,
    readonly supportedVersion: number,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Run "${runId}" was written with snapshot schema version ${schemaVersion}; this release reads up to ${supportedVersion}. Upgrade flujo to read it.`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return {
      runId: this.runId,
      schemaVersion: this.schemaVersion,
      supportedVersion: this.supportedVersion,
    };
  }
}

/** A stored snapshot cannot be decoded (not JSON, or not an envelope). */
export class SnapshotCorruptError extends FlujoError {
  override name = 'SnapshotCorruptError';
  readonly code = ErrorCode.SnapshotCorrupt;
  constructor(
    readonly runId: string,
    reason: string,
    options?: FlujoErrorOptions,
  ) {
    super(`Snapshot of run "${runId}" is unreadable: ${reason}`, false, options);
  }
  override get details(): unknown {
    return { runId: this.runId };
  }
}

/**
 * An append to a step's history expected another length: another writer appended first (or the
 * caller's cursor is stale). Nothing was written. Retryable: reload the run and decide again.
 */
export class HistoryConflictError extends FlujoError {
  override name = 'HistoryConflictError';
  readonly code = ErrorCode.HistoryConflict;
  constructor(
    readonly runId: string,
    readonly stepId: string,
    readonly expectedLength: number,
    readonly actualLength: number,
    options?: FlujoErrorOptions,
  ) {
    super(
      `History conflict on step "${stepId}" of run "${runId}": expected ${expectedLength} messages, found ${actualLength}. Another writer appended first; reload the run and decide again.`,
      true,
      options,
    );
  }
  override get details(): unknown {
    return {
      runId: this.runId,
      stepId: this.stepId,
      expectedLength: this.expectedLength,
      actualLength: this.actualLength,
    };
  }
}

/**
 * Redis could not be reached or answered with a connection-level failure. Retryable in place:
 * infrastructure trouble is never counted as an attempt of the user's work.
 */
export class RedisUnavailableError extends FlujoError {
  override name = 'RedisUnavailableError';
  readonly code = ErrorCode.RedisUnavailable;
  constructor(message: string, options?: FlujoErrorOptions) {
    super(message, true, options);
  }
}

/**
 * Fewer replicas than `durability.replicas` acknowledged a write within `durability.timeoutMs`,
 * tried three times. The write is on the master, and the runtime did not act on it (no effect, no
 * next unit): retryable like any Redis trouble (code `redis_unavailable`).
 */
export class ReplicasBehindError extends RedisUnavailableError {
  override name = 'ReplicasBehindError';
  constructor(
    readonly wanted: number,
    readonly acknowledged: number,
    readonly timeoutMs: number,
    readonly key: string,
    tries: number,
  ) {
    super(
      `${acknowledged} of ${wanted} replica(s) acknowledged the write of "${key}" within ${timeoutMs} ms (${tries} tries). ` +
        `The runtime does not act on a write its replicas lack, and tries again. Check that the master has ${wanted} replica(s) connected and keeping up (INFO replication), or lower durability.replicas.`,
    );
  }

  override get details(): unknown {
    return {
      wanted: this.wanted,
      acknowledged: this.acknowledged,
      timeoutMs: this.timeoutMs,
      key: this.key,
    };
  }
}

/** A bug: an internal invariant does not hold. The message starts with `INVARIANT:`. */
export class InvariantError extends FlujoError {
  override name = 'InvariantError';
  readonly code = ErrorCode.Invariant;
  constructor(message: string, options?: FlujoErrorOptions) {
    super(`INVARIANT: ${message}`, false, options);
  }
}

/** Anything thrown that was not a runtime error, normalized by `toFlujoError`. */
export class UnknownError extends FlujoError {
  override name = 'UnknownError';
  readonly code = ErrorCode.Unknown;
  constructor(message: string, options?: FlujoErrorOptions) {
    super(message, false, options);
  }
}

/** Where a tool call sits: its run, step, ledger call id and tool identity (`name@version`). */
export interface ToolCallRef {
  runId: string;
  stepId: string;
  callId: string;
  tool: string;
  tenantId?: string;
}

/**
 * A non-idempotent tool call started but its worker stopped before recording a receipt, so whether
 * its side effect happened is unknown. It is never re-run blindly: a person checks and resolves it.
 */
export class ToolOutcomeUnknownError extends FlujoError {
  override name = 'ToolOutcomeUnknownError';
  readonly code = ErrorCode.ToolOutcomeUnknown;
  readonly runId: string;
  readonly stepId: string;
  readonly callId: string;
  readonly tool: string;
  readonly tenantId: string | undefined;
  constructor(call: ToolCallRef, options?: FlujoErrorOptions) {
    const { runId, stepId, callId, tool } = call;
    super(
      `Tool "${tool}" call ${callId} of step "${stepId}" started but its outcome is unknown (its worker stopped before recording a receipt) and the tool is not idempotent, so it was not run again. Check the tool's side effect, then resolve it: flujo ledger resolve ${runId} ${callId} --succeeded '<receipt json>'  or  flujo ledger resolve ${runId} ${callId} --retry (then flujo resume ${runId})`,
      false,
      options,
    );
    this.runId = runId;
    this.stepId = stepId;
    this.callId = callId;
    this.tool = tool;
    this.tenantId = call.tenantId;
  }
  override get details(): unknown {
    const { runId, stepId, callId, tool, tenantId } = this;
    return tenantId === undefined
      ? { runId, stepId, callId, tool }
      : { runId, stepId, callId, tool, tenantId };
  }
}

/** A tool's arguments failed its input schema. Lists every problem with its path (`args.to`). */
export class ToolInputError extends FlujoError {
  override name = 'ToolInputError';
  readonly code = ErrorCode.ToolInputInvalid;
  readonly issues: readonly ValidationIssue[];
  constructor(
    readonly tool: string,
    issues: readonly ValidationIssue[],
    options?: FlujoErrorOptions,
  ) {
    super(listIssues(`Invalid arguments for tool "${tool}"`, issues), false, options);
    this.issues = issues;
  }
  override get details(): unknown {
    return { tool: this.tool, issues: this.issues };
  }
}

/** What a ledger entry was recorded for, or what a call asks for: tool identity and args hash. */
export interface ToolCallShape {
  tool: string;
  argsHash: string;
}

/**
 * The ledger holds an entry for this call id with another tool or other arguments: the run's code or
 * inputs changed since the call was recorded. Never retryable.
 */
export class NonDeterminismError extends FlujoError {
  override name = 'NonDeterminismError';
  readonly code = ErrorCode.NonDeterminism;
  constructor(
    readonly runId: string,
    readonly callId: string,
    readonly recorded: ToolCallShape,
    readonly requested: ToolCallShape,
    options?: FlujoErrorOptions,
  ) {
    const what = (s: ToolCallShape): string =>
      `tool "${s.tool}" (args hash ${s.argsHash.slice(0, 12)})`;
    super(
      `Non-determinism in run "${runId}": ledger entry ${callId} was recorded for ${what(recorded)}, but this call is ${what(requested)}. The run's code or inputs changed since the call was recorded; resume it with the code that started it, or start a new run.`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return {
      runId: this.runId,
      callId: this.callId,
      recorded: this.recorded,
      requested: this.requested,
    };
  }
}

/** Another worker holds a live lease on this tool call. Retryable once the lease ends (`retryAfterMs`). */
export class ToolCallBusyError extends FlujoError {
  override name = 'ToolCallBusyError';
  readonly code = ErrorCode.ToolCallBusy;
  constructor(
    readonly runId: string,
    readonly callId: string,
    readonly tool: string,
    leaseRemainingMs: number,
    options?: Omit<FlujoErrorOptions, 'retryAfterMs'>,
  ) {
    super(
      `Tool "${tool}" call ${callId} of run "${runId}" is being run by another worker (its lease ends in ${leaseRemainingMs} ms). Retry after that: the call then returns its receipt, or is found in doubt if that worker died.`,
      true,
      { ...options, retryAfterMs: leaseRemainingMs },
    );
  }
  override get details(): unknown {
    return { runId: this.runId, callId: this.callId, tool: this.tool };
  }
}

/** The runtime was configured wrongly (e.g. a tool definition). The message names the field and the fix. */
export class ConfigurationError extends FlujoError {
  override name = 'ConfigurationError';
  readonly code = ErrorCode.ConfigurationInvalid;
  readonly field: string | undefined;
  constructor(message: string, options?: FlujoErrorOptions & { field?: string }) {
    super(message, false, options);
    this.field = options?.field;
  }
  override get details(): unknown {
    return this.field === undefined ? undefined : { field: this.field };
  }
}

/** No tool with this name is registered. Lists the registered ones. */
export class UnknownToolError extends FlujoError {
  override name = 'UnknownToolError';
  readonly code = ErrorCode.ToolUnknown;
  constructor(
    readonly tool: string,
    readonly registered: readonly string[],
    options?: FlujoErrorOptions,
  ) {
    super(
      registered.length === 0
        ? `Unknown tool "${tool}": no tools are registered. Add defineTool({ name: "${tool}", ... }) to the job module's \`export const tools\` (or runtime.tool(...)).`
        : `Unknown tool "${tool}". Registered tools: ${registered.join(', ')}. Fix the name, or add defineTool({ name: "${tool}", ... }) to the job module's \`export const tools\` (or runtime.tool(...)).`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { tool: this.tool, registered: this.registered };
  }
}

/** A ledger operation is not allowed in the entry's current state (e.g. resolving a call that is not in doubt). */
export class LedgerStateError extends FlujoError {
  override name = 'LedgerStateError';
  readonly code = ErrorCode.LedgerStateInvalid;
  constructor(
    readonly runId: string,
    readonly callId: string,
    /** The entry's state, or null when there is no entry. */
    readonly state: string | null,
    message: string,
    options?: FlujoErrorOptions,
  ) {
    super(message, false, options);
  }
  override get details(): unknown {
    return { runId: this.runId, callId: this.callId, state: this.state };
  }
}

/**
 * A budget was hit. Without `stepId`: one of the run's budgets (`maxSteps`, `maxToolCalls`,
 * `maxWallClockMs`, …), and the run stops. With `stepId`: one of that step's `budgets`, and the
 * step fails finally (the run then fails like after any final step failure).
 */
export class BudgetExceededError extends FlujoError {
  override name = 'BudgetExceededError';
  readonly code = ErrorCode.BudgetExceeded;
  /** The step whose own budget was hit; undefined for a budget of the run. */
  readonly stepId: string | undefined;
  constructor(
    readonly budget: string,
    readonly limit: number,
    readonly used: number,
    options?: FlujoErrorOptions & { stepId?: string },
  ) {
    const stepId = options?.stepId;
    super(
      stepId === undefined
        ? `Budget ${budget} exceeded: limit ${limit}, reached ${used}. Raise budgets.${budget} in the plan to allow more.`
        : `Budget ${budget} of step "${stepId}" exceeded: limit ${limit}, reached ${used}. Raise the step's budgets.${budget} in the plan to allow more.`,
      false,
      options,
    );
    this.stepId = stepId;
  }
  override get details(): unknown {
    const out: Record<string, unknown> = {
      budget: this.budget,
      limit: this.limit,
      used: this.used,
    };
    if (this.stepId !== undefined) out['stepId'] = this.stepId;
    return out;
  }
}

/**
 * One attempt of a step (one turn of a granular agent step) outlived the step's `timeoutMs`: its
 * signal was aborted and whatever it still produces is discarded. Retryable: the step's retry
 * policy decides whether another attempt follows.
 */
export class StepTimeoutError extends FlujoError {
  override name = 'StepTimeoutError';
  readonly code = ErrorCode.StepTimeout;
  constructor(
    readonly stepId: string,
    readonly attempt: number,
    readonly timeoutMs: number,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Attempt ${attempt} of step "${stepId}" timed out after ${timeoutMs} ms (the step's timeoutMs). Raise timeoutMs of the step if its work needs longer.`,
      true,
      options,
    );
  }
  override get details(): unknown {
    return { stepId: this.stepId, attempt: this.attempt, timeoutMs: this.timeoutMs };
  }
}

/**
 * A step cannot run because a step it depends on produced nothing it needs (no output, or not the
 * field it reads). Final: running it again changes nothing. Throw it from an operator.
 */
export class MissingContextError extends FlujoError {
  override name = 'MissingContextError';
  readonly code = ErrorCode.MissingContext;
  /** The step that needed the context, when known. */
  readonly stepId: string | undefined;
  constructor(
    /** The dependency that produced nothing usable. */
    readonly dependency: string,
    /** What was missing, e.g. `output.url`. */
    readonly missing: string,
    options?: FlujoErrorOptions & { stepId?: string },
  ) {
    const where = options?.stepId === undefined ? 'the step' : `step "${options.stepId}"`;
    super(
      `Missing context: ${where} needs ${missing} from step "${dependency}", which did not produce it. Fix "${dependency}" so it produces ${missing}, then resume the run.`,
      false,
      options,
    );
    this.stepId = options?.stepId;
  }
  override get details(): unknown {
    const out: Record<string, unknown> = { dependency: this.dependency, missing: this.missing };
    if (this.stepId !== undefined) out['stepId'] = this.stepId;
    return out;
  }
}

/**
 * Operator or tool code failed in a way its HTTP status or network error code explains (classified
 * once, where the failure is caught): `invalid_input` for 400 and 422, `auth_forbidden` for 401 and
 * 403, `not_found` for 404, all final; `service_unavailable` for 408, 429, 5xx, connection resets
 * and timeouts, retryable (a 429's or 503's `retry-after` sets `retryAfterMs`). The original error
 * is the `cause`.
 */
export class ServiceError extends FlujoError {
  override name = 'ServiceError';
  readonly code: ErrorCode;
  /** The HTTP status the error carried, if any. */
  readonly status: number | undefined;
  /** The network error code the error carried (e.g. `ECONNRESET`), if any. */
  readonly networkCode: string | undefined;
  constructor(
    message: string,
    init: { code: ErrorCode; retryable: boolean; status?: number; networkCode?: string },
    options?: Omit<FlujoErrorOptions, 'retryable'>,
  ) {
    super(message, init.retryable, options);
    this.code = init.code;
    this.status = init.status;
    this.networkCode = init.networkCode;
  }
  override get details(): unknown {
    const out: Record<string, unknown> = {};
    if (this.status !== undefined) out['status'] = this.status;
    if (this.networkCode !== undefined) out['networkCode'] = this.networkCode;
    return out;
  }
}

/** Approve or reject named a step that is not waiting for approval. Nothing was written. */
export class StepNotWaitingError extends FlujoError {
  override name = 'StepNotWaitingError';
  readonly code = ErrorCode.StepNotWaiting;
  constructor(
    readonly runId: string,
    readonly stepId: string,
    readonly status: string | null,
    steps: readonly string[],
    options?: FlujoErrorOptions,
  ) {
    super(
      status === null
        ? `Run "${runId}" has no step "${stepId}". Its steps: ${steps.join(', ')}.`
        : `Step "${stepId}" of run "${runId}" is ${status}, not waiting for approval; only a step in WAITING_APPROVAL can be approved or rejected (see \`flujo status ${runId}\`).`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { runId: this.runId, stepId: this.stepId, status: this.status };
  }
}

/**
 * An approve or reject came from someone the step does not let decide: not one of its gate's
 * `approvers`, or refused by the runtime's `authorizeDecision` hook. Nothing was written.
 */
export class ApprovalNotAllowedError extends FlujoError {
  override name = 'ApprovalNotAllowedError';
  readonly code = ErrorCode.ApprovalNotAllowed;
  constructor(
    readonly runId: string,
    readonly stepId: string,
    readonly by: string,
    /** Who may decide, when the gate lists them; null when a hook refused. */
    readonly approvers: readonly string[] | null,
    options?: FlujoErrorOptions & { why?: string },
  ) {
    super(
      approvers === null
        ? `${by} may not decide on step "${stepId}" of run "${runId}": ${options?.why ?? 'refused by authorizeDecision'}. Nothing was changed.`
        : `${by} may not decide on step "${stepId}" of run "${runId}": only ${approvers.join(', ')} may approve or reject it (its gate's approvers). Nothing was changed; ask one of them, e.g. --by ${approvers[0] ?? 'NAME'}.`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { runId: this.runId, stepId: this.stepId, by: this.by, approvers: this.approvers };
  }
}

/**
 * A person rejected a tool call that needed approval (a tool with risk level high or critical). In
 * an agent step the model is told so as the tool's result; an operator step fails finally.
 */
export class ToolCallRejectedError extends FlujoError {
  override name = 'ToolCallRejectedError';
  readonly code = ErrorCode.ToolCallRejected;
  constructor(
    readonly tool: string,
    readonly callId: string,
    readonly by: string,
    readonly comment: string | null,
    options?: FlujoErrorOptions,
  ) {
    super(
      `The call of tool "${tool}" (call ${callId}) was rejected by ${by}${comment === null ? '' : `: ${comment}`}`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { tool: this.tool, callId: this.callId, by: this.by, comment: this.comment };
  }
}

/**
 * Skip named a step that succeeded or was skipped, a step of a cancelled run, or no step. Nothing
 * was written.
 */
export class StepNotSkippableError extends FlujoError {
  override name = 'StepNotSkippableError';
  readonly code = ErrorCode.StepNotSkippable;
  constructor(
    readonly runId: string,
    readonly stepId: string,
    readonly status: string | null,
    steps: readonly string[],
    options?: FlujoErrorOptions,
  ) {
    super(
      status === null
        ? `Run "${runId}" has no step "${stepId}". Its steps: ${steps.join(', ')}.`
        : `Step "${stepId}" of run "${runId}" is ${status}; only a step that has not succeeded or been skipped, in a run that was not cancelled, can be skipped (see \`flujo status ${runId}\`).`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { runId: this.runId, stepId: this.stepId, status: this.status };
  }
}

/** Resume was asked of a run that has not failed. */
export class RunNotResumableError extends FlujoError {
  override name = 'RunNotResumableError';
  readonly code = ErrorCode.RunNotResumable;
  constructor(
    readonly runId: string,
    readonly status: string,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Run "${runId}" is ${status}; only a failed run can be resumed (a running or waiting run goes on by itself while a worker runs).`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { runId: this.runId, status: this.status };
  }
}

/** A signal was sent to a run that has ended: it can take no signal any more. */
export class RunEndedError extends FlujoError {
  override name = 'RunEndedError';
  readonly code = ErrorCode.RunEnded;
  constructor(
    readonly runId: string,
    readonly status: string,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Run "${runId}" is ${status}: it takes no more signals. Send the signal to a run that is still going (see \`flujo list\`).`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { runId: this.runId, status: this.status };
  }
}

/** A signal's id was used before, for another name or another payload: the send is refused. */
export class SignalIdConflictError extends FlujoError {
  override name = 'SignalIdConflictError';
  readonly code = ErrorCode.SignalIdConflict;
  constructor(
    readonly runId: string,
    readonly signalId: string,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Signal id "${signalId}" was already sent to run "${runId}" with another name or payload. Use a new id for a new message, or send the same name and payload to retry.`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { runId: this.runId, signalId: this.signalId };
  }
}

/** A wait step's signal did not arrive within the step's `timeoutMs`. Final. */
export class WaitTimeoutError extends FlujoError {
  override name = 'WaitTimeoutError';
  readonly code = ErrorCode.WaitTimeout;
  constructor(
    readonly stepId: string,
    readonly signal: string,
    readonly timeoutMs: number,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Step "${stepId}" waited ${timeoutMs} ms (its timeoutMs) for signal "${signal}", which did not come. Send it sooner, or raise the step's timeoutMs; skip the step to go on without it.`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { stepId: this.stepId, signal: this.signal, timeoutMs: this.timeoutMs };
  }
}

/**
 * Item `index` of map step `stepId` failed finally (after its retries), so the map failed: the
 * item's own error is `itemError` (its message is quoted). Final: a resume of the run runs the
 * map's items that failed or never ran (those that committed an output keep it).
 */
export class ItemFailedError extends FlujoError {
  override name = 'ItemFailedError';
  readonly code = ErrorCode.ItemFailed;
  constructor(
    readonly stepId: string,
    readonly index: number,
    readonly attempts: number,
    readonly itemError: SerializedError,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Item ${index} of map step "${stepId}" failed after ${attempts} attempt(s) with ${itemError.code}: ${itemError.message} (set itemFailures: "collect" on the step to go on with an error record in the item's place)`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return {
      stepId: this.stepId,
      index: this.index,
      attempts: this.attempts,
      itemError: { code: this.itemError.code, message: this.itemError.message },
    };
  }
}

/**
 * A map step's `over` does not hold an array, or holds more elements than a map takes: the
 * message names the step, what `over` names and the type found. Final.
 */
export class MapOverError extends FlujoError {
  override name = 'MapOverError';
  readonly code = ErrorCode.MapOverInvalid;
  constructor(
    readonly stepId: string,
    message: string,
    options?: FlujoErrorOptions,
  ) {
    super(message, false, options);
  }
  override get details(): unknown {
    return { stepId: this.stepId };
  }
}

/**
 * A run step's child run ended without success: it failed (retryable: the step's retry policy
 * decides, and each retry starts a new child) or was cancelled (final). `summary` is the child's
 * own account of why.
 */
export class ChildFailedError extends FlujoError {
  override name = 'ChildFailedError';
  readonly code = ErrorCode.ChildFailed;
  constructor(
    readonly stepId: string,
    readonly childRunId: string,
    readonly status: 'failed' | 'cancelled',
    readonly summary: string,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Step "${stepId}": its child run "${childRunId}" ${status === 'failed' ? 'failed' : 'was cancelled'}: ${summary}. See \`flujo status ${childRunId}\`; ${status === 'failed' ? "the step's retry policy decides whether a new child starts; a resume of this run starts one too" : 'a resume of this run starts a new child'}.`,
      status === 'failed',
      options,
    );
  }
  override get details(): unknown {
    return {
      stepId: this.stepId,
      childRunId: this.childRunId,
      status: this.status,
      summary: this.summary,
    };
  }
}

/** Why a model call failed, as decided once from the provider's answer (or its absence). */
export type ModelErrorKind =
  | 'rate_limit'
  | 'auth'
  | 'bad_request'
  | 'not_found'
  | 'timeout'
  | 'conflict'
  | 'server'
  | 'connection';

const RETRYABLE_MODEL_ERRORS: ReadonlySet<ModelErrorKind> = new Set<ModelErrorKind>([
  'rate_limit',
  'timeout',
  'conflict',
  'server',
  'connection',
]);

/** What {@link ModelError} is built from. Never put an API key in any of these. */
export interface ModelErrorInfo {
  kind: ModelErrorKind;
  /** The model the call asked for. */
  model: string;
  /** Where the call went (without credentials). */
  baseURL: string;
  /** The HTTP status, when the provider answered. */
  status?: number;
  /** What the provider said, when it said something worth repeating. */
  providerMessage?: string;
  /** The provider's request id (`x-request-id`), for its support. */
  requestId?: string;
}

function modelErrorMessage(info: ModelErrorInfo): string {
  const { kind, model, baseURL, status, providerMessage } = info;
  const said =
    providerMessage === undefined || providerMessage === '' ? '' : `: ${providerMessage}`;
  const code = status === undefined ? '' : ` (${status})`;
  switch (kind) {
    case 'auth':
      // The provider's own text for a refused key may quote part of the key: never repeat it.
      return status === 403
        ? `the provider refused access (403) to model "${model}" at ${baseURL}: check that the API key's project or organization may use this model`
        : `the provider refused the API key${code} at ${baseURL}: set OPENAI_API_KEY (or the agent's provider.apiKey)`;
    case 'not_found':
      return `model "${model}" not found at ${baseURL}${code}: check the agent's model name (and provider.baseURL, which usually ends in /v1)`;
    case 'bad_request':
      return `${providerMessage === undefined || providerMessage === '' ? `model "${model}" at ${baseURL} refused the request${code}` : `${providerMessage}${code}`}: the request was malformed: check the agent's settings and tools`;
    case 'rate_limit':
      return `model "${model}" at ${baseURL} is rate limited${code}${said}`;
    case 'timeout':
      return `model "${model}" at ${baseURL} did not answer in time${code}${said}; raise the agent's timeoutMs if its replies are slow`;
    case 'conflict':
      return `model "${model}" at ${baseURL} reported a conflict${code}${said}`;
    case 'server':
      return `model "${model}" at ${baseURL} failed with a server error${code}${said}`;
    case 'connection':
      return `the connection to model "${model}" at ${baseURL} failed${said}; check provider.baseURL and the network`;
  }
}

/**
 * A model call failed. `kind` says why; retryable for rate limits, timeouts, conflicts, server
 * errors and dropped connections, final for a refused key, a malformed request or an unknown model
 * (the message then says what to fix). `retryAfterMs` carries the provider's `retry-after`.
 */
export class ModelError extends FlujoError {
  override name = 'ModelError';
  readonly code = ErrorCode.ModelError;
  readonly kind: ModelErrorKind;
  readonly status: number | undefined;
  readonly model: string;
  readonly baseURL: string;
  readonly requestId: string | undefined;
  constructor(info: ModelErrorInfo, options?: FlujoErrorOptions) {
    super(modelErrorMessage(info), RETRYABLE_MODEL_ERRORS.has(info.kind), options);
    this.kind = info.kind;
    this.status = info.status;
    this.model = info.model;
    this.baseURL = info.baseURL;
    this.requestId = info.requestId;
  }
  override get details(): unknown {
    const out: Record<string, unknown> = {
      kind: this.kind,
      model: this.model,
      baseURL: this.baseURL,
    };
    if (this.status !== undefined) out['status'] = this.status;
    if (this.requestId !== undefined) out['requestId'] = this.requestId;
    return out;
  }
}

/** What a fingerprint covers; a mismatch names the first of these that changed. */
export type FingerprintField =
  | 'input'
  | 'systemPrompt'
  | 'model'
  | 'provider'
  | 'pricing'
  | 'tools'
  | 'settings'
  | 'policyVersion'
  | 'toggles'
  | 'mode';

const CHANGED: Record<FingerprintField, [what: string, restore: string]> = {
  input: ["the step's input changed", 'the previous input'],
  systemPrompt: ['the system prompt changed', 'the previous prompt'],
  model: ["the agent's model changed", 'the previous model'],
  provider: ["the agent's provider (provider.baseURL) changed", 'the previous provider.baseURL'],
  pricing: ['the pricing plan changed', 'the previous pricing plan'],
  tools: [
    "the agent's tools changed (a tool was added, removed or renamed, or its input schema changed)",
    'the previous tools',
  ],
  settings: [
    "the agent's settings (temperature, maxTokens, seed, topP) changed",
    'the previous settings',
  ],
  policyVersion: ['the policy version changed', 'the previous policy version'],
  toggles: [
    "the step's run-shaping options (enforceIdempotency, blobThresholdBytes, historyMaxTokens) changed",
    'the previous options',
  ],
  mode: ["the step's execution mode (atomic or granular) changed", 'the previous mode'],
};

/** Where a resume was refused. */
export interface ResumeErrorInit {
  /** True when resuming later (e.g. from the last committed turn) can succeed; sets `retryable`. */
  recoverable: boolean;
  /** For a fingerprint mismatch: what changed. */
  field?: FingerprintField;
  runId?: string;
  stepId?: string;
}

/**
 * A run cannot resume as asked. Recoverable (retryable) for a gap in the turns, which a resume from
 * the last committed turn heals; irrecoverable for a fingerprint mismatch, where `field` names what
 * changed since the run started and nothing runs.
 */
export class ResumeError extends FlujoError {
  override name = 'ResumeError';
  readonly code = ErrorCode.ResumeError;
  readonly recoverable: boolean;
  readonly field: FingerprintField | undefined;
  readonly runId: string | undefined;
  readonly stepId: string | undefined;
  constructor(
    message: string,
    init: ResumeErrorInit,
    options?: Omit<FlujoErrorOptions, 'retryable'>,
  ) {
    super(message, init.recoverable, options);
    this.recoverable = init.recoverable;
    this.field = init.field;
    this.runId = init.runId;
    this.stepId = init.stepId;
  }

  /** The irrecoverable error for a fingerprint mismatch on `field`, with the fix in its message. */
  static fingerprintMismatch(
    field: FingerprintField,
    where: { runId?: string; stepId?: string } = {},
    options?: Omit<FlujoErrorOptions, 'retryable'>,
  ): ResumeError {
    const [what, restore] = CHANGED[field];
    const step = where.stepId === undefined ? 'the step' : `step "${where.stepId}"`;
    const run = where.runId === undefined ? '' : ` of run "${where.runId}"`;
    return new ResumeError(
      `Cannot resume ${step}${run}: fingerprint mismatch: ${what} since the run started; start a new run, or restore ${restore} to resume.`,
      { recoverable: false, field, ...where },
      options,
    );
  }

  override get details(): unknown {
    const out: Record<string, unknown> = { recoverable: this.recoverable };
    if (this.field !== undefined) out['field'] = this.field;
    if (this.runId !== undefined) out['runId'] = this.runId;
    if (this.stepId !== undefined) out['stepId'] = this.stepId;
    return out;
  }
}

/** An agent step used all its turns without a final answer (a reply with no tool calls). */
export class MaxTurnsExceededError extends FlujoError {
  override name = 'MaxTurnsExceededError';
  readonly code = ErrorCode.MaxTurnsExceeded;
  constructor(
    readonly stepId: string,
    readonly maxTurns: number,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Agent step "${stepId}" reached maxTurns (${maxTurns}) without a final answer. Raise maxTurns for the step, or tell the agent to answer sooner.`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { stepId: this.stepId, maxTurns: this.maxTurns };
  }
}

/**
 * A step whose cache class is `deterministic` ran again on the same code, input and dependencies,
 * and its output differs from the one stored before. Final. Its name is `NonDeterminismError` and
 * its code `non_determinism`, as for a tool call that does not match its ledger entry.
 */
export class StepNonDeterminismError extends FlujoError {
  override name = 'NonDeterminismError';
  readonly code = ErrorCode.NonDeterminism;
  constructor(
    readonly stepId: string,
    readonly sourceRunId: string,
    readonly storedHash: string,
    readonly outputHash: string,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Non-determinism in step "${stepId}": its cache class is deterministic, but this output (hash ${outputHash.slice(0, 12)}) differs from the one run "${sourceRunId}" stored for the same code, input and dependencies (hash ${storedHash.slice(0, 12)}). Make the step deterministic, give its operator a new version, or set cachePolicy to stable_nondeterministic.`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return {
      stepId: this.stepId,
      sourceRunId: this.sourceRunId,
      storedHash: this.storedHash,
      outputHash: this.outputHash,
    };
  }
}

/** A step's primary failed finally and its fallback failed too; the message names both errors. */
export class FallbackFailedError extends FlujoError {
  override name = 'FallbackFailedError';
  readonly code = ErrorCode.FallbackFailed;
  constructor(
    readonly stepId: string,
    readonly primary: SerializedError,
    readonly fallback: SerializedError,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Step "${stepId}" failed: its primary failed with ${primary.code}: ${primary.message} — and its fallback failed with ${fallback.code}: ${fallback.message}`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { stepId: this.stepId, primary: this.primary, fallback: this.fallback };
  }
}

/** What {@link UsageLimitExceededError} reports. Money is in integer micro-USD (1 USD = 1,000,000). */
export interface UsageLimitInfo {
  /** Whose limit: the run's budget, the step's budget (both from the plan) or the tenant's quota. */
  scope: 'run' | 'step' | 'tenant';
  limit: 'maxTokens' | 'maxCostUsd';
  /** The limit, in tokens or micro-USD. */
  limitValue: number;
  /** Already spent (reconciled). */
  used: number;
  /** Reserved by calls not yet reconciled. */
  reserved: number;
  /** What the refused reservation asked for. */
  requested: number;
  runId: string;
  tenantId: string;
  /** For scope `step`: the step. */
  stepId?: string;
}

function formatMicroUsd(micro: number): string {
  return `$${(micro / 1_000_000).toFixed(6)}`;
}

/**
 * A usage reservation was refused: with it, the run's budget or the tenant's quota would be
 * exceeded. Nothing was reserved. Never retryable: the limit must be raised first.
 */
export class UsageLimitExceededError extends FlujoError {
  override name = 'UsageLimitExceededError';
  readonly code = ErrorCode.UsageLimitExceeded;
  readonly info: UsageLimitInfo;
  constructor(info: UsageLimitInfo, options?: FlujoErrorOptions) {
    const { scope, limit, limitValue, used, reserved, requested, runId, tenantId } = info;
    const fmt = limit === 'maxTokens' ? (n: number) => `${n} tokens` : formatMicroUsd;
    const who =
      scope === 'run'
        ? `Run "${runId}"`
        : scope === 'step'
          ? `Step "${info.stepId ?? '?'}" of run "${runId}"`
          : `Tenant "${tenantId}" (run "${runId}")`;
    const fix =
      scope === 'run'
        ? `Raise budgets.${limit} in the plan`
        : scope === 'step'
          ? `Raise the step's budgets.${limit} in the plan`
          : `Raise the tenant's quota (${limit === 'maxTokens' ? 'maxTokens' : 'maxMicroUsd'} of tenant "${tenantId}")`;
    super(
      `${who} would exceed its ${scope === 'tenant' ? 'quota' : 'budget'} ${limit}: limit ${fmt(limitValue)}, spent ${fmt(used)}, reserved ${fmt(reserved)}, this call needs ${fmt(requested)}. Nothing was reserved. ${fix} to allow more.`,
      false,
      options,
    );
    this.info = { ...info };
  }
  override get details(): unknown {
    return { ...this.info };
  }
}

/** A usage reservation id that was never reserved (or whose record was deleted). */
export class ReservationNotFoundError extends FlujoError {
  override name = 'ReservationNotFoundError';
  readonly code = ErrorCode.ReservationNotFound;
  constructor(
    readonly tenantId: string,
    readonly reservationId: string,
    options?: FlujoErrorOptions,
  ) {
    super(
      `No usage reservation "${reservationId}" for tenant "${tenantId}". Reserve it first; check the tenant id and reservation id (and the key prefix).`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { tenantId: this.tenantId, reservationId: this.reservationId };
  }
}

/** Storing a blob would take a run past the blob store's `maxBytesPerRun`. Nothing was stored. */
export class BlobCapExceededError extends FlujoError {
  override name = 'BlobCapExceededError';
  readonly code = ErrorCode.BlobCapExceeded;
  constructor(
    readonly runId: string,
    /** The cap, in bytes. */
    readonly maxBytesPerRun: number,
    /** The size of the refused blob, in bytes. */
    readonly size: number,
    /** What the run already stores, in bytes. */
    readonly storedBytes: number,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Cannot store a blob of ${size} bytes for run "${runId}": the run already stores ${storedBytes} bytes and the cap is ${maxBytesPerRun} bytes. Nothing was stored. Raise maxBytesPerRun of the blob store, or make the tool return less.`,
      false,
      options,
    );
  }
  override get details(): unknown {
    const { runId, maxBytesPerRun, size, storedBytes } = this;
    return { runId, maxBytesPerRun, size, storedBytes };
  }
}

/**
 * A blob that a step's history refers to is gone (its retention elapsed, or it was deleted), so the
 * step cannot be replayed faithfully. Never retryable.
 */
export class BlobMissingError extends FlujoError {
  override name = 'BlobMissingError';
  readonly code = ErrorCode.BlobMissing;
  constructor(
    readonly runId: string,
    readonly stepId: string,
    readonly blobId: string,
    options?: FlujoErrorOptions,
  ) {
    super(
      `Blob ${blobId} needed by step "${stepId}" of run "${runId}" is missing: its retention elapsed or the data was deleted. Raise retentionMs of the blob store to keep blobs longer, or, if the step's tool is idempotent, opt the step into degraded replay (the blob is then replaced by a marker).`,
      false,
      options,
    );
  }
  override get details(): unknown {
    return { runId: this.runId, stepId: this.stepId, blobId: this.blobId };
  }
}

/**
 * Strict pricing is on and the pricing table has no price for a model a call used. The message names
 * the model and the exact setting to add. Never retryable: the configuration must change.
 */
export class PricingNotConfiguredError extends FlujoError {
  override name = 'PricingNotConfiguredError';
  readonly code = ErrorCode.PricingNotConfigured;
  /** Where the price goes, e.g. `pricing.models["gpt-4o-mini"]`. */
  readonly setting: string;
  constructor(
    readonly model: string,
    options?: FlujoErrorOptions,
  ) {
    const setting = `pricing.models[${JSON.stringify(model)}]`;
    super(
      `No price for model ${JSON.stringify(model)}: add it to the pricing table (${setting} = { inputPerMillion, outputPerMillion } in createRuntime({ pricing }) or in the pricing file), or turn strictPricing off`,
      false,
      options,
    );
    this.setting = setting;
  }
  override get details(): unknown {
    return { model: this.model, setting: this.setting };
  }
}

/**
 * A policy denied a step: a `policy_check` step's policy, or a policy bound to one of the step's
 * `policyTags`. Final whatever the retry policy says: the same inputs meet the same policy.
 */
export class PolicyDeniedError extends FlujoError {
  override name = 'PolicyDeniedError';
  readonly code = ErrorCode.PolicyDenied;
  constructor(
    readonly policy: string,
    readonly stepId: string,
    readonly reason: string,
    options?: Omit<FlujoErrorOptions, 'retryable'>,
  ) {
    super(`Policy "${policy}" denied step "${stepId}": ${reason}`, false, {
      ...options,
      retryable: false,
    });
  }
  override get details(): unknown {
    return { policy: this.policy, stepId: this.stepId, reason: this.reason };
  }
}

/**
 * An error read back from JSON. It keeps the original `name`, `code`, `retryable`,
 * `retryAfterMs` and `details`, whatever class produced it (also classes of newer releases).
 */
export class RevivedError extends FlujoError {
  readonly code: ErrorCode;
  readonly #details: unknown;
  constructor(json: SerializedError) {
    super(json.message, json.retryable, {
      retryable: json.retryable,
      ...(json.retryAfterMs === undefined ? {} : { retryAfterMs: json.retryAfterMs }),
    });
    this.name = json.name;
    this.code = json.code as ErrorCode;
    this.#details = json.details;
  }
  override get details(): unknown {
    return this.#details;
  }
}

/** True when `value` is a runtime error, optionally with the given code. Checks the code, not the class. */
export function isFlujoError(value: unknown, code?: ErrorCode): value is FlujoError {
  if (value instanceof FlujoError) return code === undefined || value.code === code;
  if (typeof value !== 'object' || value === null) return false;
  const v = value as Partial<SerializedError>;
  return (
    typeof v.code === 'string' &&
    typeof v.name === 'string' &&
    typeof v.retryable === 'boolean' &&
    (code === undefined || v.code === code)
  );
}

/** Whether an error says it may succeed when retried. Unknown errors are not retryable. */
export function isRetryable(error: unknown): boolean {
  return isFlujoError(error) && error.retryable;
}

/**
 * Normalizes anything thrown into a {@link FlujoError}, keeping the original as `cause`. A foreign
 * error that carries a boolean `retryable` keeps it; otherwise it gets `defaultRetryable` (user
 * code such as operators and tools passes `true`: an unexplained failure is treated as transient).
 */
export function toFlujoError(thrown: unknown, defaultRetryable = false): FlujoError {
  if (thrown instanceof FlujoError) return thrown;
  const flag = (thrown as { retryable?: unknown } | null | undefined)?.retryable;
  const retryable = typeof flag === 'boolean' ? flag : defaultRetryable;
  if (thrown instanceof Error)
    return new UnknownError(thrown.message, { cause: thrown, retryable });
  return new UnknownError(typeof thrown === 'string' ? thrown : 'Non-error value thrown', {
    cause: thrown,
    retryable,
  });
}

/** Reads an error back from its JSON form. `reviveError(JSON.parse(JSON.stringify(e)))` keeps name, code and retryable. */
export function reviveError(json: SerializedError): RevivedError {
  return new RevivedError(json);
}

/** Walks `cause` chains and `AggregateError.errors` for the first error matching `predicate`. */
export function findCause(error: unknown, predicate: (e: unknown) => boolean): unknown {
  const seen = new Set<unknown>();
  const stack: unknown[] = [error];
  while (stack.length > 0) {
    const e = stack.pop();
    if (e === undefined || e === null || seen.has(e)) continue;
    seen.add(e);
    if (predicate(e)) return e;
    if (e instanceof AggregateError) stack.push(...(e.errors as unknown[]));
    if (e instanceof Error && e.cause !== undefined) stack.push(e.cause);
  }
  return undefined;
}
