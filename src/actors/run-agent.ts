import { ResumeError } from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import {
  agentFingerprint,
  compareFingerprints,
  type AgentFingerprint,
} from '../agents/fingerprint.js';
import { createModelClient, type ModelClient } from '../llm/openai-client.js';
import {
  toolCallsOf,
  type ChatMessage,
  type ModelReply,
  type ModelUsage,
} from '../llm/messages.js';
import type { AgentStep } from '../plan/schema.js';
import type { FingerprintStore } from '../persistence/fingerprint-store.js';
import type { LedgerEntry } from '../persistence/ledger.js';
import type { ModelJournal } from '../persistence/model-journal.js';
import { MaxTurnsExceededError } from '../errors.js';
import {
  readOnlyEntries,
  runToolCalls,
  type ToolRunContext,
  type ToolRunDeps,
} from './agent-tools.js';
import type { ModelContext } from './model-context.js';
import type { RunUsageBudget, UsageMeter } from './usage-meter.js';

/** What an agent step returns: the final answer and what it took. */
export interface AgentResult {
  answer: string | null;
  turns: number;
  toolCalls: number;
  usage: { promptTokens: number; completionTokens: number };
}

/** What an agent loop needs from the worker. */
export interface AgentLoopDeps extends ToolRunDeps {
  /** One client per agent, reused across steps (the openai client keeps its connections). */
  clientFor: (agent: AgentDefinition) => ModelClient;
  /** Receives reply text of turn `turn` as it streams in (agents that stream). */
  onChunk?: (delta: string, turn: number) => void;
  /** Reserves and reconciles the usage of each model call. @defaultValue calls are not metered */
  meter?: UsageMeter;
  /** Shapes what the model is sent (truncation, blobs). @defaultValue the conversation as is */
  context?: ModelContext;
}

/** Asks the model for the reply of `turn`, metered and shaped when the deps say so. */
async function askModel(
  deps: AgentLoopDeps,
  args: AgentStepArgs,
  turn: number,
  conversation: readonly ChatMessage[],
): Promise<ModelReply> {
  const { agent, step, runId, tenantId, signal } = args;
  const messages =
    deps.context === undefined
      ? conversation
      : await deps.context.prepare({ agent, step, runId, messages: conversation });
  const onChunk = deps.onChunk;
  const complete = (onSend?: () => Promise<void>) =>
    deps.clientFor(agent).complete({
      messages,
      signal,
      ...(onChunk === undefined ? {} : { onChunk: (d: string) => onChunk(d, turn) }),
      ...(onSend === undefined ? {} : { onSend }),
    });
  if (deps.meter === undefined) return complete();
  return deps.meter.call(
    { agent, tenantId, runId, stepId: step.id, turn, messages, budget: args.budget },
    complete,
  );
}

/** Caches one model client per agent definition. */
export function modelClients(): (agent: AgentDefinition) => ModelClient {
  const clients = new WeakMap<AgentDefinition, ModelClient>();
  return (agent) => {
    let client = clients.get(agent);
    if (client === undefined) {
      client = createModelClient(agent);
      clients.set(agent, client);
    }
    return client;
  };
}

/** The step's input as the conversation's first user message. */
export function userMessage(input: JsonValue): ChatMessage {
  return { role: 'user', content: typeof input === 'string' ? input : JSON.stringify(input) };
}

/** Where an agent step runs. */
export interface AgentStepArgs {
  agent: AgentDefinition;
  step: AgentStep;
  input: JsonValue;
  runId: string;
  tenantId: string;
  attempt: number;
  signal: AbortSignal;
  /** The run's usage budget (`maxTokens`, `maxCostUsd`). */
  budget?: RunUsageBudget;
}

/**
 * Atomic mode: the whole agent loop in one unit of work; the step's commit at the end is its only
 * commit. The loop ends only on a final answer (a reply without tool calls); `maxTurns` ends it
 * with `MaxTurnsExceededError`. Every tool call goes through the ledger keyed by run, step, tool
 * and normalized arguments, so a restarted step (a crash, a retry) gets the recorded receipt
 * instead of repeating an identical effect. A model error aborts the loop and changes nothing
 * committed; its retryability decides whether the step is retried.
 */
export async function runAtomicAgent(
  deps: AgentLoopDeps,
  args: AgentStepArgs,
): Promise<AgentResult> {
  const { step } = args;
  const messages: ChatMessage[] = [userMessage(args.input)];
  const usage = { promptTokens: 0, completionTokens: 0 };
  let toolCalls = 0;
  for (let turn = 0; turn < step.maxTurns; turn++) {
    const reply = await askModel(deps, args, turn, messages);
    add(usage, reply.usage);
    messages.push(reply.message);
    const calls = toolCallsOf(reply.message);
    if (calls.length === 0) {
      return { answer: reply.message.content, turns: turn + 1, toolCalls, usage };
    }
    const results = await runToolCalls(deps, toolContext(args, turn, 'atomic'), calls);
    toolCalls += calls.length;
    messages.push(...results);
  }
  throw new MaxTurnsExceededError(step.id, step.maxTurns);
}

/** The fingerprint a granular step's turns run under (DESIGN §5). */
export function stepFingerprint(
  agent: AgentDefinition,
  step: AgentStep,
  input: JsonValue,
): AgentFingerprint {
  let known = fingerprints.get(step);
  const hit = known?.find((k) => k.agent === agent && k.input === input);
  if (hit !== undefined) return hit.fp;
  const fp = computeFingerprint(agent, step, input);
  if (known === undefined) fingerprints.set(step, (known = []));
  // A handful per step at most (runs of one plan share its parsed steps); keep the newest.
  if (known.length >= 64) known.shift();
  known.push({ agent, input, fp });
  return fp;
}

// The fingerprint of a step is asked for on every turn; within a process an agent definition is
// frozen, and a run's step and input are the same objects from turn to turn.
const fingerprints = new WeakMap<
  AgentStep,
  { agent: AgentDefinition; input: JsonValue; fp: AgentFingerprint }[]
>();

function computeFingerprint(
  agent: AgentDefinition,
  step: AgentStep,
  input: JsonValue,
): AgentFingerprint {
  return agentFingerprint({
    input,
    systemPrompt: agent.systemPrompt,
    model: agent.model,
    provider: agent.provider,
    tools: agent.tools,
    settings: agent.settings,
    toggles: {
      enforceIdempotency: step.enforceIdempotency,
      blobThresholdBytes: step.blobThresholdBytes,
      historyMaxTokens: step.historyMaxTokens,
    },
    mode: step.mode,
  });
}

/** What a granular turn needs beyond an agent loop's needs. */
export interface TurnDeps extends AgentLoopDeps {
  journal: ModelJournal;
  fingerprints: FingerprintStore;
  /** The step's committed history, messages `[0, cursor)`. */
  readHistory: (runId: string, stepId: string, cursor: number) => Promise<ChatMessage[]>;
}

/** Where a granular turn runs: the step, and what its committed turns left behind. */
export interface TurnArgs extends AgentStepArgs {
  /** The turn to take (0-based): the number of turns committed so far. */
  turn: number;
  /** Messages the committed history holds. */
  cursor: number;
  /** The fingerprint hash the first turn stored, or null before the first commit. */
  fingerprint: string | null;
  /** The turn's journaled reply, when the caller already asked for it. @defaultValue read here */
  journaled?: Promise<ModelReply | null>;
}

/** What a granular turn came to; the caller commits it. */
export interface TurnResult {
  /** The messages this turn adds to the history, in order. */
  messages: ChatMessage[];
  /** The fingerprint hash the turn ran under. */
  fingerprint: string;
  /** The step's result when the reply was a final answer; null when the loop goes on. */
  final: AgentResult | null;
}

/**
 * One turn of a granular agent step (DESIGN §3 steps 3, 5 and 6): checks the fingerprint (a
 * mismatch is an irrecoverable `ResumeError` and nothing runs), takes the model's reply from the
 * journal or asks the model and journals the reply before any tool runs, then runs the reply's
 * tool calls through the ledger keyed by `sha256(runId:stepId:turn:toolCallId)`. Nothing here
 * commits: a failure leaves the committed history and turn as they were.
 */
export async function takeTurn(deps: TurnDeps, args: TurnArgs): Promise<TurnResult> {
  const { agent, step, runId, tenantId, turn, cursor } = args;
  const current = stepFingerprint(agent, step, args.input);
  if (args.fingerprint !== null && args.fingerprint !== current.hash) {
    const stored = await deps.fingerprints.get(runId, step.id);
    const changed = stored === null ? null : compareFingerprints(stored, current);
    throw changed === null
      ? new ResumeError(
          `Cannot resume step "${step.id}" of run "${runId}": its fingerprint changed since the run started (what changed is not on record); start a new run, or restore the agent and step as they were.`,
          { recoverable: false, runId, stepId: step.id },
        )
      : ResumeError.fingerprintMismatch(changed.field, { runId, stepId: step.id });
  }
  if (args.fingerprint === null) await deps.fingerprints.save(runId, step.id, current);

  const history = cursor === 0 ? [] : await deps.readHistory(runId, step.id, cursor);
  const added: ChatMessage[] = turn === 0 ? [userMessage(args.input)] : [];
  let reply = await (args.journaled ?? deps.journal.get(runId, step.id, turn));
  let known: ReadonlyMap<string, Promise<LedgerEntry | null>> | undefined;
  if (reply === null) {
    const fresh = await askModel(deps, args, turn, [...history, ...added]);
    debugPoint(DebugPoint.afterModelReply, `${step.id}:${turn}`);
    // The first reply recorded for the turn wins: a worker racing this one uses the same reply.
    const recording = deps.journal.record(runId, step.id, turn, fresh);
    // Sent with the journal write: what the ledger holds for the reply's read-only calls.
    const where = { agent, runId, stepId: step.id, tenantId, turn };
    const entries = readOnlyEntries(deps.ledger, where, toolCallsOf(fresh.message));
    const recorded = await recording;
    reply = recorded.reply;
    if (recorded.recorded) known = entries;
    debugPoint(DebugPoint.afterJournal, `${step.id}:${turn}`);
  } else if (deps.meter !== undefined) {
    // The reply of a worker that stopped after journaling it: settle what that worker left open.
    const journaled = reply;
    await deps.meter.settle({ tenantId, runId, stepId: step.id, agent }, (r) =>
      r.turn === turn ? Promise.resolve(journaled) : deps.journal.get(runId, step.id, r.turn),
    );
  }
  added.push(reply.message);
  const calls = toolCallsOf(reply.message);
  if (calls.length === 0) {
    const conversation = [...history, ...added];
    const replies = await deps.journal.replies(runId, step.id, turn + 1);
    return {
      messages: added,
      fingerprint: current.hash,
      final: {
        answer: reply.message.content,
        turns: turn + 1,
        toolCalls: conversation.filter((m) => m.role === 'tool').length,
        usage: totalUsage(replies),
      },
    };
  }
  const results = await runToolCalls(deps, toolContext(args, turn, 'granular'), calls, known);
  debugPoint(DebugPoint.afterTools, `${step.id}:${turn}`);
  added.push(...results);
  return { messages: added, fingerprint: current.hash, final: null };
}

/** Where the tool calls of turn `turn` of the step run. */
function toolContext(
  args: AgentStepArgs,
  turn: number,
  mode: 'atomic' | 'granular',
): ToolRunContext {
  const { agent, runId, step, tenantId, attempt, signal } = args;
  const enforceIdempotency = step.enforceIdempotency;
  return {
    agent,
    runId,
    stepId: step.id,
    tenantId,
    attempt,
    turn,
    enforceIdempotency,
    mode,
    signal,
  };
}

function totalUsage(replies: readonly (ModelReply | null)[]): AgentResult['usage'] {
  const usage = { promptTokens: 0, completionTokens: 0 };
  for (const reply of replies) add(usage, reply?.usage ?? null);
  return usage;
}

function add(total: AgentResult['usage'], u: ModelUsage | null): void {
  if (u === null) return;
  total.promptTokens += u.promptTokens;
  total.completionTokens += u.completionTokens;
}
