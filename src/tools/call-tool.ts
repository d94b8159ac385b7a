/**
 * The ledger-guarded tool gateway: every tool call is checked against the ledger before it runs and
 * its outcome is recorded after, so a recorded call is never run again and a call whose outcome is
 * unknown is re-run only when the tool can take it (same idempotency key), never blindly. A
 * read-only call takes no lease: it has no effect that a second run could repeat, so it is never
 * in doubt and costs one write (its receipt) instead of two.
 */
import {
  NonDeterminismError,
  reviveError,
  type SerializedError,
  toFlujoError,
  ToolCallBusyError,
  ToolOutcomeUnknownError,
} from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import type { Ledger, LedgerEntry, PrepareCall } from '../persistence/ledger.js';
import { argsHash, ledgerCallId } from '../persistence/ledger-ids.js';
import { ToolClass } from './classify.js';
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
   * Called once the call will really run (not for a recorded receipt), before the lease is taken:
   * e.g. to count it against a budget. Throwing here leaves the call PREPARED, with nothing run.
   */
  beforeRun?: () => Promise<void> | void;
  /**
   * The form a fresh result is recorded in (e.g. a large one as a blob reference); what it returns
   * is the receipt, recorded and returned. When it throws, the result itself is recorded (the
   * effect happened: the receipt must not be lost to a failed conversion).
   * @defaultValue the result itself
   */
  recordAs?: (result: JsonValue) => Promise<JsonValue>;
  /**
   * For a read-only tool: the call's ledger entry as read beforehand (e.g. in the same round trip
   * as the turn's journal), so it need not be read again. @defaultValue read here
   */
  known?: Promise<LedgerEntry | null>;
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
 * Calls a tool through the ledger: parses the arguments (`ToolInputError`), returns the recorded
 * receipt of a call that already succeeded (`replayed: true`), refuses to re-run a call in doubt
 * unless the tool is idempotent (`ToolOutcomeUnknownError`), takes the call's lease
 * (`ToolCallBusyError` while another worker holds it), runs the tool with
 * `ctx.idempotencyKey = callId`, and records its receipt or its error.
 */
export async function callTool(options: CallToolOptions): Promise<CallToolResult> {
  const { ledger, tool, ctx, leaseMs = 5000 } = options;
  const { runId, stepId, tenantId } = ctx;
  const args = await parseToolArgs(tool, options.args);
  options.checkArgs?.(args);
  const callId =
    options.callId ?? ledgerCallId({ tenantId, runId, stepId, tool: tool.identity, args });

  const call = { runId, stepId, tenantId, callId, tool: tool.identity, args };
  if (tool.class === ToolClass.ReadOnly) return runReadOnly(options, call);
  const rerun = canRerunInDoubt(tool);
  if (options.beforeRun === undefined) {
    // Nothing to check between recording the call and taking its lease: one atomic step.
    ctx.signal?.throwIfAborted();
    const entry = await ledger.begin(call, leaseMs, { rerunInDoubt: rerun });
    return recordedOutcome(entry) ?? runOwned(options, args, entry, leaseMs, rerun);
  }
  const prepared = await ledger.prepare(call);
  const recorded = recordedOutcome(prepared);
  if (recorded !== undefined) return recorded;
  if (prepared.state === 'IN_DOUBT' && !rerun) {
    throw new ToolOutcomeUnknownError({ runId, stepId, callId, tool: tool.identity, tenantId });
  }
  ctx.signal?.throwIfAborted();
  await options.beforeRun?.();
  const entry = await ledger.markRunning(runId, tenantId, callId, leaseMs, { rerunInDoubt: rerun });
  return recordedOutcome(entry) ?? runOwned(options, args, entry, leaseMs, rerun);
}

const NEVER = new AbortController().signal;

/** What a tool is given with its arguments: the call's identity and the signal it runs under. */
function toolContextOf(
  call: Pick<PrepareCall, 'runId' | 'stepId' | 'tenantId' | 'callId'>,
  ctx: CallToolContext,
  signal: AbortSignal,
): ToolContext {
  const { runId, stepId, tenantId, callId } = call;
  return {
    idempotencyKey: callId,
    signal,
    runId,
    stepId,
    callId,
    attempt: ctx.attempt,
    tenantId,
    turnKey: ctx.turnKey,
  };
}

/**
 * The receipt of what a tool returned: parsed by the tool's output schema, then put in the form
 * `recordAs` gives it. A result the schema refuses is final (the call ran: it is never re-run):
 * recorded with `fail`, then thrown.
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
  if (options.recordAs !== undefined) {
    try {
      receipt = await options.recordAs(receipt);
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
  await options.beforeRun?.();
  let value: unknown;
  try {
    value = await tool.run(args, toolContextOf(call, ctx, ctx.signal ?? NEVER));
  } catch (thrown) {
    const error = toFlujoError(thrown, true);
    // Cut off mid-call: nothing to record (a read-only call can always run again).
    if (!ctx.signal?.aborted) await ledger.record(call, { error: error.toJSON() });
    throw error;
  }
  debugPoint(DebugPoint.afterToolEffect, tool.name);
  const receipt = await receiptOf(options, value, (error) => ledger.record(call, { error }));
  const { entry, applied } = await ledger.record(call, { receipt });
  debugPoint(DebugPoint.afterReceipt, tool.name);
  return applied
    ? { receipt, replayed: false, entry }
    : { receipt: entry.receipt, replayed: true, entry };
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
  const { runId, stepId, tenantId } = ctx;
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

  let value: unknown;
  try {
    value = await tool.run(args, toolContextOf({ runId, stepId, tenantId, callId }, ctx, signal));
  } catch (thrown) {
    clearInterval(timer);
    const error = toFlujoError(thrown, true);
    if (signal.aborted) {
      // Cut off mid-call: the effect may or may not have happened. A keyed tool may run again
      // (retryable); for any other tool the lease lapses into IN_DOUBT, for a person to check.
      if (!rerun) throw error;
      await ledger.markFailed(
        runId,
        tenantId,
        callId,
        { ...error.toJSON(), retryable: true },
        runs,
      );
      throw error;
    }
    await ledger.markFailed(runId, tenantId, callId, error.toJSON(), runs);
    throw error;
  } finally {
    clearInterval(timer);
  }
  debugPoint(DebugPoint.afterToolEffect, tool.name);

  const receipt = await receiptOf(options, value, (error) =>
    ledger.markFailed(runId, tenantId, callId, error, runs),
  );
  const { entry: after, applied } = await ledger.markSucceeded(
    runId,
    tenantId,
    callId,
    receipt,
    runs,
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
