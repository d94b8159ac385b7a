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
import type { JournaledCall, RecordedReply } from '../persistence/model-journal.js';
import { canonicalHash } from '../internal/canonical-hash.js';
import { MaxTurnsExceededError } from '../errors.js';
import { runToolCalls, type ToolRunContext, type ToolRunDeps } from './agent-tools.js';
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
export function shaped(
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
export async function askModel(
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

/** Where the tool calls of turn `turn` of the step run. */
export function toolContext(
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

/** The usage of a step's replies, added up. */
export function totalUsage(replies: readonly (ModelReply | null)[]): AgentResult['usage'] {
  const usage = { promptTokens: 0, completionTokens: 0 };
  for (const reply of replies) add(usage, reply?.usage ?? null);
  return usage;
}

function add(total: AgentResult['usage'], u: ModelUsage | null): void {
  if (u === null) return;
  total.promptTokens += u.promptTokens;
  total.completionTokens += u.completionTokens;
}
