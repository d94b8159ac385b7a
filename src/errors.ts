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
  RedisUnavailable: 'redis_unavailable',
  Invariant: 'invariant',
  Unknown: 'unknown',
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

/** A bug: an internal invariant does not hold. The message starts with `INVARIANT:`. */
export class InvariantError extends FlujoError {
  override name = 'InvariantError';
  readonly code = ErrorCode.Invariant;
  constructor(message: string, options?: FlujoErrorOptions) {
    super(`INVARIANT: ${message}`, false, options);
  }
}

/** Anything thrown that was not a runtime error, normalized by {@link toFlujoError}. */
export class UnknownError extends FlujoError {
  override name = 'UnknownError';
  readonly code = ErrorCode.Unknown;
  constructor(message: string, options?: FlujoErrorOptions) {
    super(message, false, options);
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

/** Normalizes anything thrown into a {@link FlujoError}, keeping the original as `cause`. */
export function toFlujoError(thrown: unknown): FlujoError {
  if (thrown instanceof FlujoError) return thrown;
  if (thrown instanceof Error) return new UnknownError(thrown.message, { cause: thrown });
  return new UnknownError(typeof thrown === 'string' ? thrown : 'Non-error value thrown', {
    cause: thrown,
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
