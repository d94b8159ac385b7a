/**
 * Tool calls of an agent's reply, run through the ledger: shared by atomic and granular steps. In a
 * granular step, a tool that must see the turn's idempotency key gets it as its `idempotency_key`
 * argument, filled in by the runtime and checked before the call can have any effect. Every
 * tool gets it in its context as `ctx.turnKey`, beside `ctx.idempotencyKey` (the call's
 * own ledger id).
 */
import { createHash } from 'node:crypto';
import { ConfigurationError, ToolCallRejectedError } from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { IDEMPOTENCY_KEY_ARG } from '../agents/tool-schema.js';
import type { ChatMessage, ToolCall } from '../llm/messages.js';
import type { Ledger, LedgerEntry, LedgerRecordOp } from '../persistence/ledger.js';
import { refOfReceipt } from '../persistence/blob-store.js';
import {
  callTool,
  type ReplayedCalls,
  type ResultStore,
  type ToolCallObserver,
  type ToolRunGuard,
} from '../tools/call-tool.js';
import { ToolClass } from '../tools/classify.js';
import type { ToolDefinition } from '../tools/define-tool.js';
import { rejectionMessage, type CallGate } from './call-approval.js';
import type { CallRecorder } from './ports.js';

const sha256 = (text: string): string => createHash('sha256').update(text, 'utf8').digest('hex');

/** The idempotency key of turn `turn` (0-based) of an agent step: `sha256(runId:stepId:turn)`. */
export function turnIdempotencyKey(runId: string, stepId: string, turn: number): string {
  return sha256(`${runId}:${stepId}:${turn}`);
}

/** The ledger call id of a granular turn's tool call: `sha256(runId:stepId:turn:toolCallId)`. */
export function turnCallId(
  runId: string,
  stepId: string,
  turn: number,
  toolCallId: string,
): string {
  return sha256(`${runId}:${stepId}:${turn}:${toolCallId}`);
}

/**
 * Reads, in one round trip, the ledger entries of a granular turn's calls of read-only tools (the
 * calls that take no lease, so reading them early changes nothing): by ledger call id. Sent beside
 * the journal write of the reply, the read costs no round trip of its own.
 */
export function readOnlyEntries(
  ledger: Ledger,
  where: { agent: AgentDefinition; runId: string; stepId: string; tenantId: string; turn: number },
  calls: readonly ToolCall[],
): Map<string, Promise<LedgerEntry | null>> {
  const { agent, runId, stepId, tenantId, turn } = where;
  const ids: string[] = [];
  for (const call of calls) {
    const tool = agent.tools.find((t) => t.name === call.name);
    if (tool?.class === ToolClass.ReadOnly) ids.push(turnCallId(runId, stepId, turn, call.id));
  }
  const known = new Map<string, Promise<LedgerEntry | null>>();
  if (ids.length === 0) return known;
  const entries = ledger.getMany(runId, tenantId, ids);
  ids.forEach((id, i) => {
    const entry = entries.then((e) => e[i] ?? null);
    entry.catch(() => {}); // met by whoever uses the entry, if anyone does
    known.set(id, entry);
  });
  return known;
}

/** What running a reply's tool calls needs. */
export interface ToolRunDeps {
  ledger: Ledger;
  leaseMs: number;
  /** Asked before each tool call that will really run (budgets). @defaultValue nothing is asked */
  guard?: ToolRunGuard;
  /**
   * Stores a large tool result as a blob (granular steps): the ledger's receipt and the history
   * then keep its reference. @defaultValue results are kept as they are
   */
  results?: ResultStore;
  /** Decides on calls of tools with risk level high or critical (see `callGate`). */
  gate?: CallGate;
  /** In a run that replays another: the original's receipts (see `callTool`). */
  replay?: ReplayedCalls;
  /** Records each tool call, with the turn it was made in, and each model call. @defaultValue nobody */
  recorder?: CallRecorder;
}

/** Where the calls happen. */
export interface ToolRunContext {
  agent: AgentDefinition;
  runId: string;
  stepId: string;
  tenantId: string;
  attempt: number;
  /** The turn (0-based) whose reply asked for the calls. */
  turn: number;
  /** Every tool must take the turn's idempotency key (the step's `enforceIdempotency`). */
  enforceIdempotency: boolean;
  /**
   * Granular steps key each call by the model's tool call id and hand keyed tools the turn's key
   * as an argument; atomic steps key each call by its arguments.
   */
  mode: 'atomic' | 'granular';
  /** The step's declared effects: a tool of another class (but read-only) is refused. */
  effects: readonly string[];
  signal: AbortSignal;
  /** The size (bytes) over which `results` stores a tool result (the step's setting). */
  blobThresholdBytes: number;
}

/** True when `tool` must be called with the turn's key in its `idempotency_key` argument. */
function needsTurnKey(tool: ToolDefinition, context: ToolRunContext): boolean {
  return context.mode === 'granular' && (context.enforceIdempotency || tool.requiresIdempotencyKey);
}

/**
 * The arguments with the turn's key filled in, when the tool must take it. Throws
 * `ConfigurationError` before any effect when the model sent another key.
 */
function withTurnKey(
  tool: ToolDefinition,
  args: unknown,
  key: string,
  context: ToolRunContext,
): unknown {
  if (!needsTurnKey(tool, context)) return args;
  if (typeof args !== 'object' || args === null || Array.isArray(args)) return args;
  const given = (args as Record<string, unknown>)[IDEMPOTENCY_KEY_ARG];
  if (given !== undefined && given !== key) {
    throw new ConfigurationError(
      `the call of tool "${tool.name}" in turn ${context.turn} of step "${context.stepId}" carries another ${IDEMPOTENCY_KEY_ARG} (${JSON.stringify(given).slice(0, 80)}) than the turn's key: the runtime fills it in; do not ask the model for it`,
      { field: IDEMPOTENCY_KEY_ARG },
    );
  }
  return { ...args, [IDEMPOTENCY_KEY_ARG]: key };
}

/** Throws `ConfigurationError` when the parsed arguments lost the turn's key (the schema drops it). */
function checkTurnKey(
  tool: ToolDefinition,
  parsed: JsonValue,
  key: string,
  context: ToolRunContext,
): void {
  if (!needsTurnKey(tool, context)) return;
  const value =
    typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)
      ? parsed[IDEMPOTENCY_KEY_ARG]
      : undefined;
  if (value !== key) {
    const why = context.enforceIdempotency
      ? `step "${context.stepId}" enforces idempotency`
      : `tool "${tool.name}" requires an idempotency key`;
    throw new ConfigurationError(
      `the call of tool "${tool.name}" lacks the turn's ${IDEMPOTENCY_KEY_ARG} (${why}): declare ${IDEMPOTENCY_KEY_ARG}: z.string() in the tool's input schema, so the runtime can fill it in and the tool can pass it on`,
      { field: IDEMPOTENCY_KEY_ARG },
    );
  }
}

/**
 * Runs the tool calls of one reply in order, each through the ledger (a recorded call returns its
 * receipt), and returns the tool messages answering them. A call whose arguments are not JSON is
 * answered with an error message the model can correct; a call of a tool the agent does not have
 * is a configuration error. Any failure of a tool aborts the turn. With `deferred` (granular
 * mode), the receipt of the last call, when it is a read-only call that ran, is not written but
 * pushed there, for the turn's commit to write: nothing runs after it, so the commit is its
 * first chance, and a crash before it only runs that read-only call again.
 */
export async function runToolCalls(
  deps: ToolRunDeps,
  context: ToolRunContext,
  calls: readonly ToolCall[],
  known: ReadonlyMap<string, Promise<LedgerEntry | null>> = new Map(),
  deferred?: LedgerRecordOp[],
): Promise<ChatMessage[]> {
  const { agent, runId, stepId, tenantId, attempt, turn, signal } = context;
  const tools = new Map(agent.tools.map((t) => [t.name, t]));
  const key = turnIdempotencyKey(runId, stepId, turn);
  const messages: ChatMessage[] = [];
  const { results, recorder } = deps;
  const observer = recorder === undefined ? undefined : turnObserver(recorder, turn);
  for (const [i, call] of calls.entries()) {
    if (i > 0) debugPoint(DebugPoint.betweenTools, `${stepId}:${turn}:${i}`);
    const tool = tools.get(call.name);
    if (tool === undefined) {
      throw new ConfigurationError(
        `the model called tool "${call.name}", which agent "${agent.name}" does not have (it has: ${[...tools.keys()].join(', ') || 'none'}); add it to the agent's tools or fix the system prompt`,
      );
    }
    let raw: unknown;
    try {
      raw = call.arguments === '' ? {} : JSON.parse(call.arguments);
    } catch {
      // The model's mistake, told back to the model like a tool result, so it can correct it.
      messages.push({
        role: 'tool',
        tool_call_id: call.id,
        content: `error: the arguments are not JSON: ${call.arguments.slice(0, 200)}`,
      });
      continue;
    }
    const callId =
      context.mode === 'granular' ? turnCallId(runId, stepId, turn, call.id) : undefined;
    const entry = callId === undefined ? undefined : known.get(callId);
    const defer =
      deferred !== undefined &&
      callId !== undefined &&
      i === calls.length - 1 &&
      tool.class === ToolClass.ReadOnly;
    const gate = deps.gate;
    let result;
    try {
      result = await callTool({
        ledger: deps.ledger,
        tool,
        args: withTurnKey(tool, raw, key, context),
        ctx: { runId, stepId, tenantId, attempt, signal, turnKey: key, effects: context.effects },
        leaseMs: deps.leaseMs,
        ...(callId === undefined ? {} : { callId }),
        ...(entry === undefined ? {} : { known: entry }),
        ...(defer ? { deferReceipt: (op: LedgerRecordOp) => deferred?.push(op) } : {}),
        checkArgs: (parsed) => checkTurnKey(tool, parsed, key, context),
        ...(gate === undefined
          ? {}
          : {
              approve: (c) =>
                gate.check({
                  ...c,
                  toolCallId: call.id,
                  ...(context.mode === 'granular' ? { turn } : {}),
                }),
            }),
        ...(deps.guard === undefined ? {} : { guard: deps.guard }),
        ...(observer === undefined ? {} : { observer }),
        ...(results === undefined
          ? {}
          : { results, blobThresholdBytes: context.blobThresholdBytes }),
        ...(deps.replay === undefined ? {} : { replay: deps.replay }),
      });
    } catch (thrown) {
      // A person rejected the call: the model is told, like a tool's error, and goes on.
      if (!(thrown instanceof ToolCallRejectedError)) throw thrown;
      messages.push({ role: 'tool', tool_call_id: call.id, content: rejectionMessage(thrown) });
      continue;
    }
    const ref = refOfReceipt(result.receipt);
    const content = ref ?? JSON.stringify(result.receipt);
    messages.push({
      role: 'tool',
      tool_call_id: call.id,
      content:
        results === undefined || ref !== undefined
          ? content
          : await results.offload(runId, content, context.blobThresholdBytes),
    });
  }
  return messages;
}

/** The observer of a turn's tool calls: records each with the turn it was made in. */
function turnObserver(recorder: CallRecorder, turn: number): ToolCallObserver {
  return { toolCalled: (call) => recorder.toolCalled({ ...call, turn }) };
}
