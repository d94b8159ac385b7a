/**
 * The ledger-guarded tool gateway: every tool call is checked against the ledger before it runs and
 * its outcome is recorded after, so a recorded call is never run again and a call whose outcome is
 * unknown is re-run only when the tool can take it (same idempotency key), never blindly. A
 * read-only call takes no lease: it has no effect that a second run could repeat, so it is never
 * in doubt and costs one write (its receipt) instead of two.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import {
  ConfigurationError,
  RedisUnavailableError,
  isFlujoError,
  NonDeterminismError,
  reviveError,
  type SerializedError,
  toFlujoError,
  ToolCallBusyError,
  ToolOutcomeUnknownError,
} from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import { isConnectionError } from '../persistence/redis-errors.js';
import type { JsonValue } from '../internal/json.js';
import type { Ledger, LedgerEntry, LedgerRecordOp, PrepareCall } from '../persistence/ledger.js';
import { argsHash, ledgerCallId } from '../persistence/ledger-ids.js';
import { blobReceipt } from '../persistence/blob-store.js';
import { traceToolCall } from '../observability/spans.js';
import { ToolClass } from './classify.js';
import { classifyFailure } from './classify-failure.js';
import {
  canRerunInDoubt,
  parseToolArgs,
  parseToolOutput,
  type ToolContext,
  type ToolDefinition,
} from './define-tool.js';

/** Where a tool call happens. */
export interface CallToolContext {
  runId: string;
  stepId: string;
  tenantId: string;
  /** The step's attempt number, passed on to the tool. */
  attempt: number;
  /** Cancels the call; passed on to the tool. */
  signal?: AbortSignal;
  /** In an agent step: the turn's idempotency key, passed on to the tool. */
  turnKey?: string;
  /**
   * The step's declared effects. When some are declared, a tool whose class is not among them is
   * refused before anything is recorded or run (a read-only tool is always allowed).
   */
  effects?: readonly string[];
  /**
   * Where the call is recorded, when not in the run's own ledger: an action's ledger, shared by the
   * tenant's runs (see `idempotency.keyInputs`). @defaultValue the run id
   */
  ledgerScope?: string;
}

/** Refuses a call of a tool whose class the step did not declare (`ConfigurationError`). */
function checkDeclaredEffects(tool: ToolDefinition, ctx: CallToolContext): void {
  const effects = ctx.effects;
  if (effects === undefined || effects.length === 0) return;
  if (tool.class === ToolClass.ReadOnly || effects.includes(tool.class)) return;
  throw new ConfigurationError(
    `step "${ctx.stepId}" declares effects [${effects.join(', ')}], but tool "${tool.name}" has class "${tool.class}": the call was refused before it ran; add "${tool.class}" to the step's effects, or call a tool of a declared class`,
    { field: 'effects' },
  );
}

/** Options of {@link callTool}. */
export interface CallToolOptions {
  ledger: Ledger;
  tool: ToolDefinition;
  /** The raw arguments; parsed with the tool's input schema. */
  args: unknown;
  ctx: CallToolContext;
  /**
   * How long a worker owns the call without renewing; renewed every third of it while the tool runs.
   * @defaultValue 5000
   */
  leaseMs?: number;
  /**
   * The ledger call id, e.g. derived from the model's tool call id in granular mode.
   * @defaultValue `ledgerCallId({ tenantId, runId, stepId, tool: tool.identity, args })`
   */
  callId?: string;
  /** Checks the parsed arguments before anything is recorded or run (throw to refuse the call). */
  checkArgs?: (args: JsonValue) => void;
  /**
   * Asked before a call of a tool with risk level high or critical really runs (not for a recorded
   * receipt), before its lease is taken and before `guard`: returns when a person approved
   * this call, throws to hold or refuse it (the call stays PREPARED, nothing ran). Required for
   * such tools: without it their calls are refused with `ConfigurationError`.
   */
  approve?: (call: { callId: string; tool: string; args: JsonValue }) => Promise<void> | void;
  /**
   * Asked once the call will really run (not for a recorded receipt), before the lease is taken:
   * e.g. to count it against a budget. When it throws, the call stays PREPARED, with nothing run.
   * @defaultValue nothing is asked
   */
  guard?: ToolRunGuard;
  /**
   * Stores a fresh result over `blobThresholdBytes` as a blob of the run (e.g. the run's
   * `BlobStore`); the receipt recorded and returned then stands for the blob. When it throws, the
   * result itself is recorded (the effect happened: the receipt must not be lost to a failed store).
   * @defaultValue results are recorded as they are
   */
  results?: ResultStore;
  /** The size (bytes) over which `results` stores a result. @defaultValue no limit */
  blobThresholdBytes?: number;
  /**
   * For a read-only tool: the call's ledger entry as read beforehand (e.g. in the same round trip
   * as the turn's journal), so it need not be read again. @defaultValue read here
   */
  known?: Promise<LedgerEntry | null>;
  /**
   * For a read-only tool: takes the receipt of a call that ran, to be written by the caller's
   * snapshot commit (see `Ledger.recordOp`) instead of a write of its own. Until that commit, a
   * crash only means the read-only call runs again. @defaultValue the receipt is written here
   */
  deferReceipt?: (op: LedgerRecordOp) => void;
  /**
   * In a run that replays another: where a call of a tool that is not read-only finds the
   * original run's receipt. A receipt found is recorded in this run's ledger and returned, and the
   * tool does not run; a call the original did not make (or made with other arguments) needs a
   * person's approval through `approve` before it runs, unless `allowEffects`.
   * @defaultValue not a replay
   */
  replay?: ReplayedCalls;
  /**
   * Told how each call that reached the ledger went (ran or replayed, how long, its outcome), e.g.
   * to record it in the run's event stream. @defaultValue nobody
   */
  observer?: ToolCallObserver;
}

/** Told how each tool call went, e.g. to record it in the run's event stream. */
export interface ToolCallObserver {
  /** One call that reached the ledger: ran or replayed, how long it took, its outcome. */
  toolCalled(call: ToolCallObservation): void;
}

/** Checks a tool call that will really run, before its lease is taken (e.g. a budget). */
export interface ToolRunGuard {
  /** Returns when the call may run; throws to refuse it (it stays PREPARED, nothing ran). */
  beforeRun(): Promise<void> | void;
}

/** Stores a large tool result of a run, e.g. as a blob of the run. */
export interface ResultStore {
  /** Returns what the history keeps: the content, or a reference to it over `thresholdBytes`. */
  offload(runId: string, content: string, thresholdBytes: number): Promise<string>;
}

/** The original run's receipts, as a replaying run's tool calls look them up. */
export interface ReplayedCalls {
  /**
   * The receipt the original run recorded for a call of the same step, tool identity and
   * arguments (the ledger's idempotency-key argument aside), or null when it made no such call.
   */
  receiptOf(tool: string, args: JsonValue): Promise<{ receipt: JsonValue } | null>;
  /** A call the original did not make runs without asking a person. */
  allowEffects: boolean;
}

/** How one tool call went, as {@link ToolCallObserver.toolCalled} is told. */
export interface ToolCallObservation {
  callId: string;
  /** The tool's identity (name and version). */
  tool: string;
  /** The tool's class: `read_only`, `local`, `memory` or `external`. */
  class: string;
  /** True when the receipt came from the ledger: the tool did not run for this call. */
  replayed: boolean;
  /** From the ledger check to the recorded outcome, in ms. */
  durationMs: number;
  /** `succeeded`; `failed`; `held` when it waits for a lease or a person's decision. */
  outcome: 'succeeded' | 'failed' | 'held';
  /** The error code of a call that did not succeed. */
  error?: string;
}

/** What {@link callTool} returns. */
export interface CallToolResult {
  /** What the tool returned (parsed by its output schema), as recorded in the ledger. */
  receipt: JsonValue;
  /** True when the receipt came from the ledger and the tool was not run by this call. */
  replayed: boolean;
  /** The ledger entry after the call. */
  entry: LedgerEntry;
}

/** Returns a recorded receipt, or throws a recorded final error; undefined when the call must run. */
function recordedOutcome(entry: LedgerEntry): CallToolResult | undefined {
  if (entry.state === 'SUCCEEDED') return { receipt: entry.receipt, replayed: true, entry };
  if (entry.state === 'FAILED' && entry.error !== null && !entry.error.retryable) {
    // A final failure is the call's outcome: replay it, like a receipt.
    throw reviveError(entry.error);
  }
  return undefined;
}

/**
 * Calls a tool through the ledger: refuses a tool whose class the step did not declare in its
 * effects (`ConfigurationError`), parses the arguments (`ToolInputError`), returns the recorded
 * receipt of a call that already succeeded (`replayed: true`), refuses to re-run a call in doubt
 * unless the tool is idempotent (`ToolOutcomeUnknownError`), takes the call's lease
 * (`ToolCallBusyError` while another worker holds it), runs the tool with
 * `ctx.idempotencyKey = callId`, and records its receipt or its error. With `ctx.ledgerScope` the
 * call lives in that ledger (an action's, shared by runs); errors still name the calling run.
 */
export function callTool(options: CallToolOptions): Promise<CallToolResult> {
  const { runId, stepId, attempt } = options.ctx;
  return traceToolCall(options.tool, { runId, stepId, attempt }, () => callLedgered(options));
}

async function callLedgered(options: CallToolOptions): Promise<CallToolResult> {
  const { ctx } = options;
  checkDeclaredEffects(options.tool, ctx);
  if (ctx.ledgerScope === undefined || ctx.ledgerScope === ctx.runId) return callInScope(options);
  try {
    return await callInScope(options);
  } catch (error) {
    // The ledger names its scope; a person resolves the call through the run.
    if (error instanceof ToolOutcomeUnknownError && error.runId === ctx.ledgerScope) {
      const { stepId, callId, tool } = error;
      throw new ToolOutcomeUnknownError({
        runId: ctx.runId,
        stepId,
        callId,
        tool,
        tenantId: ctx.tenantId,
      });
    }
    throw error;
  }
}

async function callInScope(options: CallToolOptions): Promise<CallToolResult> {
  const { tool, ctx } = options;
  const { stepId, tenantId } = ctx;
  const runId = ctx.ledgerScope ?? ctx.runId;
  const args = await parseToolArgs(tool, options.args);
  options.checkArgs?.(args);
  const callId =
    options.callId ?? ledgerCallId({ tenantId, runId, stepId, tool: tool.identity, args });

  const call = { runId, stepId, tenantId, callId, tool: tool.identity, args };
  const observer = options.observer;
  if (observer === undefined) return callRecorded(options, call, args);
  const started = performance.now();
  const tell = (outcome: ToolCallObservation['outcome'], replayed: boolean, error?: string) =>
    observer.toolCalled({
      callId,
      tool: tool.identity,
      class: tool.class,
      replayed,
      durationMs: Math.round((performance.now() - started) * 1000) / 1000,
      outcome,
      ...(error === undefined ? {} : { error }),
    });
  try {
    const result = await callRecorded(options, call, args);
    tell('succeeded', result.replayed);
    return result;
  } catch (error) {
    const code = isFlujoError(error) ? error.code : undefined;
    // A call held for a lease or a person has no outcome yet; it comes again.
    const held =
      code === 'tool_call_busy' || (error instanceof Error && error.name === 'ApprovalPending');
    tell(held ? 'held' : 'failed', false, held ? undefined : (code ?? 'error'));
    throw error;
  }
}

/** {@link callInScope} once the call is identified: the ledger's check, the run, the receipt. */
async function callRecorded(
  options: CallToolOptions,
  call: PrepareCall,
  args: JsonValue,
): Promise<CallToolResult> {
  const { ledger, tool, ctx, leaseMs = 5000 } = options;
  const { stepId, tenantId } = ctx;
  const { runId, callId } = call;
  if (tool.class === ToolClass.ReadOnly) return runReadOnly(options, call);
  if (options.replay !== undefined) {
    const reused = await replayedCall(options, options.replay, call);
    if (reused !== undefined) return reused;
  }
  const rerun = canRerunInDoubt(tool);
  if (options.guard === undefined && !isRisky(tool)) {
    // Nothing to check between recording the call and taking its lease: one atomic step.
    ctx.signal?.throwIfAborted();
    const entry = await ledger.begin(call, leaseMs, { rerunInDoubt: rerun });
    return recordedOutcome(entry) ?? runOwned(options, args, entry, leaseMs, rerun);
  }
  const prepared = await ledger.prepare(call);
  const recorded = recordedOutcome(prepared);
  if (recorded !== undefined) return recorded;
  if (prepared.state === 'IN_DOUBT' && !rerun) {
    throw new ToolOutcomeUnknownError({
      runId: ctx.runId,
      stepId,
      callId,
      tool: tool.identity,
      tenantId,
    });
  }
  ctx.signal?.throwIfAborted();
  await approved(options, call);
  await options.guard?.beforeRun();
  const entry = await ledger.markRunning(runId, tenantId, callId, leaseMs, { rerunInDoubt: rerun });
  return recordedOutcome(entry) ?? runOwned(options, args, entry, leaseMs, rerun);
}

const NEVER = new AbortController().signal;

/**
 * A call of a replaying run: this run's own receipt when it has one (a call it already made or
 * reused), else the original's receipt, recorded here; undefined when the call must run, which
 * a call the original did not make may only do once a person approved it (unless the replay
 * allows effects). Nothing runs here.
 */
async function replayedCall(
  options: CallToolOptions,
  replay: ReplayedCalls,
  call: PrepareCall,
): Promise<CallToolResult | undefined> {
  const { ledger } = options;
  const own = await ledger.get(call.runId, call.tenantId, call.callId);
  if (own?.state === 'SUCCEEDED') return { receipt: own.receipt, replayed: true, entry: own };
  const found = await replay.receiptOf(call.tool, call.args);
  if (found !== null) {
    const { entry, applied } = await ledger.record(call, { receipt: found.receipt });
    debugPoint(DebugPoint.afterReceipt, options.tool.name);
    return { receipt: applied ? found.receipt : entry.receipt, replayed: true, entry };
  }
  if (replay.allowEffects) return undefined;
  if (options.approve === undefined) {
    throw new ConfigurationError(
      `tool "${options.tool.name}" is called with arguments the replayed run never used: the call needs a person's approval, which only a step run by a worker can ask for; replay with allowEffects to let it run`,
      { field: 'allowEffects' },
    );
  }
  await options.approve({ callId: call.callId, tool: call.tool, args: call.args });
  return undefined;
}

/** A tool whose every call needs a person's approval: risk level high or critical. */
export function isRisky(tool: Pick<ToolDefinition, 'riskLevel'>): boolean {
  return tool.riskLevel === 'high' || tool.riskLevel === 'critical';
}

/**
 * Returns when the call may run: always for a tool that is not risky; for a risky one, when the
 * `approve` hook says this call was approved (it throws otherwise).
 */
async function approved(options: CallToolOptions, call: PrepareCall): Promise<void> {
  if (!isRisky(options.tool)) return;
  if (options.approve === undefined) {
    throw new ConfigurationError(
      `tool "${options.tool.name}" has risk level ${String(options.tool.riskLevel)}: each call needs a person's approval, which only a step run by a worker can ask for; call it from a step, or lower its riskLevel`,
      { field: 'riskLevel' },
    );
  }
  await options.approve({ callId: call.callId, tool: call.tool, args: call.args });
  debugPoint(DebugPoint.afterCallApproved, options.tool.name);
}

/** What a tool is given with its arguments: the call's identity and the signal it runs under. */
function toolContextOf(
  call: Pick<PrepareCall, 'runId' | 'stepId' | 'tenantId' | 'callId'>,
  ctx: CallToolContext,
  signal: AbortSignal,
): ToolContext {
  const { stepId, tenantId, callId } = call;
  return {
    idempotencyKey: callId,
    signal,
    // The run that makes the call (the ledger may be an action's, shared by runs).
    runId: ctx.runId,
    stepId,
    callId,
    attempt: ctx.attempt,
    tenantId,
    turnKey: ctx.turnKey,
  };
}

/**
 * The receipt of what a tool returned: parsed by the tool's output schema, then, with
 * `results`, a large one stored and its receipt the blob's. A result the schema refuses is final
 * (the call ran: it is never re-run): recorded with `fail`, then thrown.
 */
async function receiptOf(
  options: CallToolOptions,
  value: unknown,
  fail: (error: SerializedError) => Promise<unknown>,
): Promise<JsonValue> {
  let receipt: JsonValue;
  try {
    receipt = await parseToolOutput(options.tool, value);
  } catch (thrown) {
    const error = toFlujoError(thrown);
    await fail({ ...error.toJSON(), retryable: false });
    throw error;
  }
  if (options.results !== undefined) {
    try {
      const content = JSON.stringify(receipt);
      const threshold = options.blobThresholdBytes ?? Number.POSITIVE_INFINITY;
      const stored = await options.results.offload(options.ctx.runId, content, threshold);
      if (stored !== content) receipt = blobReceipt(stored);
    } catch {
      // Recorded as it is; the caller meets the conversion's error again when it uses the receipt.
    }
  }
  return receipt;
}

/**
 * A read-only call: its recorded receipt (or final error) when the ledger has one; else the tool
 * runs, with no lease, and its outcome is recorded. When another run of the call recorded a
 * receipt meanwhile, that receipt stands and is returned.
 */
async function runReadOnly(options: CallToolOptions, call: PrepareCall): Promise<CallToolResult> {
  const { ledger, tool, ctx } = options;
  const { runId, tenantId, callId, args } = call;
  const known = await (options.known ?? ledger.get(runId, tenantId, callId));
  if (known !== null) {
    if (known.tool !== tool.identity || known.argsHash !== argsHash(args)) {
      throw new NonDeterminismError(
        runId,
        callId,
        { tool: known.tool, argsHash: known.argsHash },
        { tool: tool.identity, argsHash: argsHash(args) },
      );
    }
    const recorded = recordedOutcome(known);
    if (recorded !== undefined) return recorded;
  }
  ctx.signal?.throwIfAborted();
  await approved(options, call);
  await options.guard?.beforeRun();
  let value: unknown;
  try {
    value = await tool.run(args, toolContextOf(call, ctx, ctx.signal ?? NEVER));
  } catch (thrown) {
    const error = classifyFailure(thrown);
    // Cut off mid-call: nothing to record (a read-only call can always run again).
    if (!ctx.signal?.aborted) await ledger.record(call, { error: error.toJSON() });
    throw error;
  }
  debugPoint(DebugPoint.afterToolEffect, tool.name);
  const receipt = await receiptOf(options, value, (error) => ledger.record(call, { error }));
  if (options.deferReceipt !== undefined) {
    const { op, entry } = ledger.recordOp(call, receipt);
    options.deferReceipt(op);
    return { receipt, replayed: false, entry };
  }
  const { entry, applied } = await ledger.record(call, { receipt });
  debugPoint(DebugPoint.afterReceipt, tool.name);
  return applied
    ? { receipt, replayed: false, entry }
    : { receipt: entry.receipt, replayed: true, entry };
}

/** The longest pause between two tries of recording a leased call's outcome, in ms. */
const RECORD_PAUSE_MAX_MS = 1000;

/**
 * Records the outcome of a call that ran under a lease, tried again (with backoff) for as long as
 * Redis cannot answer: the outcome is never dropped for want of Redis. Once Redis answers, the
 * ledger records it only if run number `runs` still owns the call, so a call another worker took
 * over meanwhile keeps that worker's outcome.
 */
async function recordHeld<T>(write: () => Promise<T>): Promise<T> {
  for (let pause = 50; ; pause = Math.min(pause * 2, RECORD_PAUSE_MAX_MS)) {
    try {
      return await write();
    } catch (error) {
      if (!(error instanceof RedisUnavailableError) && !isConnectionError(error)) throw error;
      await sleep(pause);
    }
  }
}

/** Runs the tool under the lease of run number `entry.runs` and records the outcome. */
async function runOwned(
  options: CallToolOptions,
  args: JsonValue,
  entry: LedgerEntry,
  leaseMs: number,
  rerun: boolean,
): Promise<CallToolResult> {
  const { ledger, tool, ctx } = options;
  const { stepId, tenantId } = ctx;
  const runId = ctx.ledgerScope ?? ctx.runId;
  const { callId, runs } = entry;
  const lost = new AbortController();
  const signal =
    ctx.signal === undefined ? lost.signal : AbortSignal.any([ctx.signal, lost.signal]);
  const timer = setInterval(
    () => {
      ledger.renewLease(runId, tenantId, callId, leaseMs, runs).then(
        ({ applied }) => {
          if (!applied) lost.abort(new ToolCallBusyError(runId, callId, tool.identity, leaseMs));
        },
        // Redis trouble: try again on the next tick; a lapsed lease only makes the call in doubt.
        () => undefined,
      );
    },
    Math.max(1, Math.floor(leaseMs / 3)),
  );
  timer.unref();
  // An aborted attempt (timed out, cancelled) is over: its lease is no longer renewed, so a tool
  // that goes on running lapses into doubt exactly like one whose worker died. An outcome it
  // still reports is recorded while no other run of the call took it over.
  const stopRenewing = () => clearInterval(timer);
  ctx.signal?.addEventListener('abort', stopRenewing, { once: true });

  let value: unknown;
  try {
    value = await tool.run(args, toolContextOf({ runId, stepId, tenantId, callId }, ctx, signal));
  } catch (thrown) {
    clearInterval(timer);
    const error = classifyFailure(thrown);
    if (signal.aborted) {
      // Cut off mid-call: the effect may or may not have happened. A keyed tool may run again
      // (retryable); for any other tool the lease lapses into IN_DOUBT, for a person to check.
      if (!rerun) throw error;
      await recordHeld(() =>
        ledger.markFailed(runId, tenantId, callId, { ...error.toJSON(), retryable: true }, runs),
      );
      throw error;
    }
    await recordHeld(() => ledger.markFailed(runId, tenantId, callId, error.toJSON(), runs));
    throw error;
  } finally {
    clearInterval(timer);
    ctx.signal?.removeEventListener('abort', stopRenewing);
  }
  debugPoint(DebugPoint.afterToolEffect, tool.name);

  const receipt = await receiptOf(options, value, (error) =>
    recordHeld(() => ledger.markFailed(runId, tenantId, callId, error, runs)),
  );
  const { entry: after, applied } = await recordHeld(() =>
    ledger.markSucceeded(runId, tenantId, callId, receipt, runs),
  );
  if (!applied) {
    // Another worker took the call over while this one ran (the lease lapsed).
    if (after.state === 'SUCCEEDED')
      return { receipt: after.receipt, replayed: true, entry: after };
    throw new ToolCallBusyError(runId, callId, tool.identity, leaseMs);
  }
  debugPoint(DebugPoint.afterReceipt, tool.name);
  return { receipt, replayed: false, entry: after };
}
