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
import type { LedgerEntry, LedgerRecordOp } from '../persistence/ledger.js';
import type { JournaledCall, ModelJournal, RecordedReply } from '../persistence/model-journal.js';
import { canonicalHash } from '../internal/canonical-hash.js';
import { MaxTurnsExceededError } from '../errors.js';
import {
  readOnlyEntries,
  runToolCalls,
  type ToolRunContext,
  type ToolRunDeps,
} from './agent-tools.js';
import type { ModelPrice } from '../llm/pricing.js';
import { traceModelCall, traceTurn } from '../observability/spans.js';
import type { ModelContext } from './model-context.js';
import type { ModelCallObservation, RunUsageBudget, UsageMeter } from './usage-meter.js';

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
  /** Told how each metered model call went. @defaultValue nobody */
  onModelCall?: (call: ModelCallObservation) => void;
  /** Reserves and reconciles the usage of each model call. @defaultValue calls are not metered */
  meter?: UsageMeter;
  /** Shapes what the model is sent (truncation, blobs). @defaultValue the conversation as is */
  context?: ModelContext;
  /**
   * The model calls of an atomic step's attempt as the journal holds them (see
   * {@link AttemptCallJournal}). @defaultValue nothing is journaled, every reply is asked for
   */
  callJournal?: AttemptCallJournal;
}

/**
 * The journal of one atomic attempt's model calls: each reply is recorded, with the digest of the
 * request it answered, before any tool call of its turn runs; an execution of the same attempt
 * that runs again (after a crash, or after a pause for a tool call's approval) takes a recorded
 * reply instead of asking the model, when its request is the one recorded.
 */
export interface AttemptCallJournal {
  /** What the journal holds for call `call` of the attempt (0-based), or null. */
  get(call: number): Promise<JournaledCall | null>;
  /** Records the reply of call `call`, answering the request `request` (see `recordCall`). */
  record(call: number, request: string, reply: ModelReply): Promise<RecordedReply>;
  /** Told each call whose reply was taken from the journal (the request was not sent again). */
  onReused?: (call: number, reply: ModelReply) => void;
}

/**
 * The digest of a model request: what the client sends for it, but the API key (the agent's
 * model, provider, system prompt, settings and tools, and the messages after the system prompt as
 * sent, after truncation). Two requests with the same digest are the same request.
 */
export function requestDigest(agent: AgentDefinition, messages: readonly ChatMessage[]): string {
  return canonicalHash(
    {
      model: agent.model,
      baseURL: agent.provider.baseURL,
      systemPrompt: agent.systemPrompt,
      settings: agent.settings,
      tools: agent.tools.map((t) => ({ name: t.name, identity: t.identity })),
      messages,
    },
    'model request',
  );
}

/** The conversation as the model is sent it: shaped (truncation, blobs) when the deps say so. */
function shaped(
  deps: AgentLoopDeps,
  args: AgentStepArgs,
  conversation: readonly ChatMessage[],
): Promise<readonly ChatMessage[]> | readonly ChatMessage[] {
  const { agent, step, runId } = args;
  return deps.context === undefined
    ? conversation
    : deps.context.prepare({ agent, step, runId, messages: conversation });
}

/** Asks the model for the reply of `turn` to `messages` (as shaped), metered when the deps say so. */
async function askModel(
  deps: AgentLoopDeps,
  args: AgentStepArgs,
  turn: number,
  messages: readonly ChatMessage[],
  alongside?: (reply: ModelReply) => void,
): Promise<ModelReply> {
  const { agent, step, runId, tenantId, signal } = args;
  const onChunk = deps.onChunk;
  const complete = (onSend?: () => Promise<void>) =>
    traceModelCall({ model: agent.model, agent: agent.name }, () =>
      deps.clientFor(agent).complete({
        messages,
        signal,
        ...(onChunk === undefined ? {} : { onChunk: (d: string) => onChunk(d, turn) }),
        ...(onSend === undefined ? {} : { onSend }),
      }),
    );
  if (deps.meter === undefined) return complete();
  return deps.meter.call(
    {
      agent,
      tenantId,
      runId,
      stepId: step.id,
      turn,
      attempt: args.attempt,
      ...(args.pause === undefined ? {} : { pause: args.pause }),
      messages,
      budget: args.budget,
      stepBudget: step.budgets,
      ...(deps.onModelCall === undefined ? {} : { observe: deps.onModelCall }),
      ...(alongside === undefined ? {} : { alongside }),
    },
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
  /** How many times the attempt paused for an approval before this execution. @defaultValue 0 */
  pause?: number;
  signal: AbortSignal;
  /** The run's usage budget (`maxTokens`, `maxCostUsd`). */
  budget?: RunUsageBudget;
  /** A user message sent after the input (a fallback agent is told the primary's error). */
  feedback?: string;
}

/**
 * Atomic mode: the whole agent loop in one unit of work; the step's commit at the end is its only
 * commit. The loop ends only on a final answer (a reply without tool calls); `maxTurns` ends it
 * with `MaxTurnsExceededError`. Every tool call goes through the ledger keyed by run, step, tool
 * and normalized arguments, so a restarted step (a crash, a retry) gets the recorded receipt
 * instead of repeating an identical effect. A model error aborts the loop and changes nothing
 * committed; its retryability decides whether the step is retried.
 *
 * With a `callJournal`, each reply is journaled (call index = turn: one call per turn) before its
 * tool calls run, and the attempt run again takes a journaled reply in place of a model call
 * when the request it would send is the one the reply answered (see {@link takeJournaled}).
 */
export async function runAtomicAgent(
  deps: AgentLoopDeps,
  args: AgentStepArgs,
): Promise<AgentResult> {
  const { step, agent } = args;
  const messages: ChatMessage[] = [userMessage(args.input)];
  if (args.feedback !== undefined) messages.push({ role: 'user', content: args.feedback });
  const usage = { promptTokens: 0, completionTokens: 0 };
  const journal = deps.callJournal;
  let toolCalls = 0;
  for (let turn = 0; turn < step.maxTurns; turn++) {
    const answer = await traceTurn(turn, async () => {
      const sent = await shaped(deps, args, messages);
      let reply: ModelReply;
      if (journal === undefined) reply = await askModel(deps, args, turn, sent);
      else {
        const request = requestDigest(agent, sent);
        const taken = takeJournaled(await journal.get(turn), request);
        if (taken !== null) {
          reply = taken;
          journal.onReused?.(turn, taken);
        } else {
          let recording: Promise<RecordedReply> | undefined;
          const record = (r: ModelReply) => {
            recording = journal.record(turn, request, r);
            recording.catch(() => {}); // met below
          };
          // A metered call journals its reply beside its reconcile, in the same round trip.
          const fresh = await askModel(deps, args, turn, sent, record);
          if (recording === undefined) record(fresh);
          // A racing execution of the attempt that recorded first: its reply stands (it asked
          // the same request), so both make the same tool calls.
          reply = (await recording!).reply;
          debugPoint(DebugPoint.afterJournal, `${step.id}:${turn}`);
        }
      }
      add(usage, reply.usage);
      messages.push(reply.message);
      const calls = toolCallsOf(reply.message);
      if (calls.length === 0) return { answer: reply.message.content };
      const results = await runToolCalls(deps, toolContext(args, turn, 'atomic'), calls);
      debugPoint(DebugPoint.afterTools, `${step.id}:${turn}`);
      toolCalls += calls.length;
      messages.push(...results);
      return null;
    });
    if (answer !== null) return { answer: answer.answer, turns: turn + 1, toolCalls, usage };
  }
  throw new MaxTurnsExceededError(step.id, step.maxTurns);
}

/**
 * The journaled reply an execution of an atomic attempt takes in place of asking the model for
 * call `i`, or null when it must ask. Taken only when the request this execution would send now
 * is the very request the reply answered (same digest: same agent settings, same system prompt,
 * same prior messages as sent). That is safe: the attempt's earlier execution sent that request
 * and got this reply, its usage was charged to that call's reservation, and a model call has no
 * other effect, so taking it is indistinguishable from the model answering the same again, except
 * that no second request is sent or paid for, and the execution makes the same tool calls, whose
 * receipts the ledger holds. With other prior messages (a read-only tool that ran again and
 * answered otherwise, a tool result shaped differently) the request is another one: its reply is
 * not known, and the model is asked. A reply recorded at a pause by an earlier release carries no
 * digest: it is taken as that release took it (the paused execution's reply to the same turn).
 */
export function takeJournaled(recorded: JournaledCall | null, request: string): ModelReply | null {
  if (recorded === null) return null;
  return recorded.request === null || recorded.request === request ? recorded.reply : null;
}

/** What shapes an agent step's model calls beyond its agent and step: the runtime's settings. */
export interface FingerprintSettings {
  /** The price the agent's model is charged at (null: none configured). */
  price?: ModelPrice | null;
  /** The runtime's `policyVersion`. */
  policyVersion?: string | undefined;
}

/** The fingerprint an agent step's turns (granular) or attempts (atomic) run under. */
export function stepFingerprint(
  agent: AgentDefinition,
  step: AgentStep,
  input: JsonValue,
  settings: FingerprintSettings = {},
): AgentFingerprint {
  const price = settings.price ?? null;
  const policyVersion = settings.policyVersion;
  let known = fingerprints.get(step);
  const hit = known?.find(
    (k) =>
      k.agent === agent &&
      k.input === input &&
      k.price === price &&
      k.policyVersion === policyVersion,
  );
  if (hit !== undefined) return hit.fp;
  const fp = computeFingerprint(agent, step, input, price, policyVersion);
  if (known === undefined) fingerprints.set(step, (known = []));
  // A handful per step at most (runs of one plan share its parsed steps); keep the newest.
  if (known.length >= 64) known.shift();
  known.push({ agent, input, price, policyVersion, fp });
  return fp;
}

// The fingerprint of a step is asked for on every turn; within a process an agent definition and
// a price are frozen, and a run's step and input are the same objects from turn to turn.
const fingerprints = new WeakMap<
  AgentStep,
  {
    agent: AgentDefinition;
    input: JsonValue;
    price: ModelPrice | null;
    policyVersion: string | undefined;
    fp: AgentFingerprint;
  }[]
>();

function computeFingerprint(
  agent: AgentDefinition,
  step: AgentStep,
  input: JsonValue,
  price: ModelPrice | null,
  policyVersion: string | undefined,
): AgentFingerprint {
  return agentFingerprint({
    input,
    systemPrompt: agent.systemPrompt,
    model: agent.model,
    provider: agent.provider,
    tools: agent.tools,
    settings: agent.settings,
    // The price the agent's calls are charged at: a change would charge a run's turns unevenly.
    pricingPlan:
      price === null
        ? null
        : { inputPerMillion: price.inputPerMillion, outputPerMillion: price.outputPerMillion },
    ...(policyVersion === undefined ? {} : { policyVersion }),
    toggles: {
      enforceIdempotency: step.enforceIdempotency,
      blobThresholdBytes: step.blobThresholdBytes,
      historyMaxTokens: step.historyMaxTokens,
    },
    mode: step.mode,
  });
}

/**
 * Claims the step's fingerprint (see `FingerprintStore.claim`): records `current` unless the step
 * has one, and throws the irrecoverable `ResumeError` naming the first changed field when the one
 * recorded first differs. Called before the step persists anything, so that from its first
 * reservation, journal entry or held tool call on, an execution under another configuration
 * (system prompt, model, tools, settings, input, price, `policyVersion`, …) runs nothing.
 */
export async function claimFingerprint(
  store: FingerprintStore,
  runId: string,
  stepId: string,
  current: AgentFingerprint,
  fallback = false,
): Promise<void> {
  const stored = await store.claim(runId, stepId, current, fallback);
  if (stored.hash === current.hash) return;
  const changed = compareFingerprints(stored, current);
  throw changed === null
    ? new ResumeError(
        `Cannot resume step "${stepId}" of run "${runId}": its fingerprint changed since the step started (what changed is not on record); start a new run, or restore the agent and step as they were.`,
        { recoverable: false, runId, stepId },
      )
    : ResumeError.fingerprintMismatch(changed.field, { runId, stepId });
}

/** What a granular turn needs beyond an agent loop's needs. */
export interface TurnDeps extends AgentLoopDeps {
  journal: ModelJournal;
  fingerprints: FingerprintStore;
  /** The step's committed history, messages `[0, cursor)`. */
  readHistory: (runId: string, stepId: string, cursor: number) => Promise<ChatMessage[]>;
  /** The runtime's `policyVersion`, part of the fingerprint. */
  policyVersion?: string | undefined;
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
  /**
   * The receipt of the turn's last tool call, when it is a read-only call that ran, is left for
   * the caller's commit to write (see {@link TurnResult.receipts}). @defaultValue written here
   */
  receiptsWithCommit?: boolean;
  /**
   * The caller may take the next turn itself, with its reservation sent beside this turn's commit
   * (see {@link TurnResult.ahead}). @defaultValue false: nothing is prepared
   */
  aheadOfNext?: boolean;
}

/** What a granular turn came to; the caller commits it. */
export interface TurnResult {
  /** The messages this turn adds to the history, in order. */
  messages: ChatMessage[];
  /** The fingerprint hash the turn ran under. */
  fingerprint: string;
  /** The step's result when the reply was a final answer; null when the loop goes on. */
  final: AgentResult | null;
  /** Ledger receipts the turn's commit must write (with `receiptsWithCommit`); else empty. */
  receipts: LedgerRecordOp[];
  /**
   * The usage reservation of the next turn's model call, prepared and not sent (see
   * `UsageMeter.prepare`): the caller sends it beside the turn's commit when the same process
   * takes the next turn. Absent for a final answer, a last allowed turn, an unmetered step, or
   * without `aheadOfNext`.
   */
  ahead?: { reserve(): void };
}

/**
 * One turn of a granular agent step: checks the fingerprint (a
 * mismatch is an irrecoverable `ResumeError` and nothing runs), takes the model's reply from the
 * journal or asks the model and journals the reply before any tool runs, then runs the reply's
 * tool calls through the ledger keyed by `sha256(runId:stepId:turn:toolCallId)`. Nothing here
 * commits: a failure leaves the committed history and turn as they were.
 */
export async function takeTurn(deps: TurnDeps, args: TurnArgs): Promise<TurnResult> {
  const { agent, step, runId, tenantId, turn, cursor } = args;
  const current = stepFingerprint(agent, step, args.input, {
    price: deps.meter?.priceOf(agent.model) ?? null,
    policyVersion: deps.policyVersion,
  });
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
  // Before the turn persists anything (its reservation, its journaled reply, a held call): the
  // first turn of the step claims the fingerprint, or finds the one an execution of it that did
  // not commit claimed (a crash, a pause for an approval), which it must match like later turns.
  if (args.fingerprint === null) await claimFingerprint(deps.fingerprints, runId, step.id, current);

  const history = cursor === 0 ? [] : await deps.readHistory(runId, step.id, cursor);
  const added: ChatMessage[] = turn === 0 ? [userMessage(args.input)] : [];
  let reply = await (args.journaled ?? deps.journal.get(runId, step.id, turn));
  let known: ReadonlyMap<string, Promise<LedgerEntry | null>> | undefined;
  if (reply === null) {
    const sent: {
      recording?: Promise<RecordedReply>;
      entries?: Map<string, Promise<LedgerEntry | null>>;
    } = {};
    const journal = (fresh: ModelReply): Promise<RecordedReply> => {
      debugPoint(DebugPoint.afterModelReply, `${step.id}:${turn}`);
      // The first reply recorded for the turn wins: a worker racing this one uses the same reply.
      const recording = deps.journal.record(runId, step.id, turn, fresh);
      recording.catch(() => {}); // met below
      // Sent with the journal write: what the ledger holds for the reply's read-only calls.
      const where = { agent, runId, stepId: step.id, tenantId, turn };
      sent.entries = readOnlyEntries(deps.ledger, where, toolCallsOf(fresh.message));
      return (sent.recording = recording);
    };
    // A metered call journals its reply beside its reconcile, in the same round trip.
    const messages = await shaped(deps, args, [...history, ...added]);
    const fresh = await askModel(deps, args, turn, messages, (r) => {
      void journal(r); // met below, through `sent`
    });
    const recorded = await (sent.recording ?? journal(fresh));
    reply = recorded.reply;
    if (recorded.recorded) known = sent.entries;
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
      receipts: [],
      final: {
        answer: reply.message.content,
        turns: turn + 1,
        toolCalls: conversation.filter((m) => m.role === 'tool').length,
        usage: totalUsage(replies),
      },
    };
  }
  const receipts: LedgerRecordOp[] = [];
  const context = toolContext(args, turn, 'granular');
  const deferred = args.receiptsWithCommit === true ? receipts : undefined;
  const results = await runToolCalls(deps, context, calls, known, deferred);
  debugPoint(DebugPoint.afterTools, `${step.id}:${turn}`);
  added.push(...results);
  const out: TurnResult = { messages: added, fingerprint: current.hash, final: null, receipts };
  if (args.aheadOfNext === true && deps.meter !== undefined && turn + 1 < step.maxTurns) {
    // What the next turn will send: this turn's history and messages, shaped as for the model.
    const conversation = [...history, ...added];
    const messages =
      deps.context === undefined
        ? conversation
        : await deps.context.prepare({ agent, step, runId, messages: conversation });
    out.ahead = deps.meter.prepare({
      agent,
      tenantId,
      runId,
      stepId: step.id,
      turn: turn + 1,
      attempt: args.attempt,
      pause: args.pause ?? 0,
      messages,
      budget: args.budget,
      stepBudget: step.budgets,
    });
  }
  return out;
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
    effects: step.effects,
    signal,
    blobThresholdBytes: step.blobThresholdBytes,
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
