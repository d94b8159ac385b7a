/**
 * Asking the model, as every agent loop does (an atomic attempt's, a granular turn's): what an
 * agent loop needs from the worker, the conversation shaped as the model is sent it, the call
 * metered (reserved against the budgets, then reconciled), the digest of a request, and where a
 * reply's tool calls run.
 */
import type { JsonValue } from '../internal/json.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { createModelClient, type ModelClient } from '../llm/openai-client.js';
import { type ChatMessage, type ModelReply, type ModelUsage } from '../llm/messages.js';
import type { AgentStep } from '../plan/schema.js';
import type { JournaledCall, RecordedReply } from '../persistence/model-journal.js';
import { canonicalHash } from '../internal/canonical-hash.js';
import { type ToolRunContext, type ToolRunDeps } from './agent-tools.js';
import { traceModelCall } from '../observability/spans.js';
import type { ModelContext } from './model-context.js';
import type { RunUsageBudget, UsageMeter } from './usage-meter.js';
import type { ModelRateLimiter, RateLimitObserver } from './rate-limits.js';

/** What an agent step returns: the final answer and what it took. */
export interface AgentResult {
  answer: string | null;
  turns: number;
  toolCalls: number;
  usage: { promptTokens: number; completionTokens: number };
}

/** Fed an agent's reply text as it streams in. */
export interface ReplyStream {
  /** A piece `delta` of the reply of turn `turn`. */
  text(delta: string, turn: number): void;
}

/** The model client of each agent. */
export interface ModelClients {
  /** The client of `agent`: one per agent, reused across steps (it keeps its connections). */
  clientFor(agent: AgentDefinition): ModelClient;
}

/** What an agent loop needs from the worker. */
export interface AgentLoopDeps extends ToolRunDeps {
  /** The model client of each agent (the runtime's registry). */
  clients: ModelClients;
  /** Fed reply text as it streams in (agents that stream). @defaultValue nobody */
  stream?: ReplyStream;
  /** Reserves and reconciles the usage of each model call. @defaultValue calls are not metered */
  meter?: UsageMeter;
  /** Shapes what the model is sent (truncation, blobs). @defaultValue the conversation as is */
  context?: ModelContext;
  /** The runtime's model rate limits. @defaultValue none: every call is sent at once */
  rateLimits?: ModelRateLimiter;
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

/** How many times one model call is sent at most when the provider answers 429 under its rate limits. */
const RATE_LIMITED_TRIES = 3;

/**
 * Asks the model for the reply of `turn` to `messages` (as shaped), metered when the deps say so.
 * Under rate limits (see `rate-limits.ts`), the call first waits for capacity; a 429 blocks its
 * limits for every worker, and the call is asked again once the block ends (up to
 * {@link RATE_LIMITED_TRIES} requests in all, each metered on its own), then fails as it came.
 */
export async function askModel(
  deps: AgentLoopDeps,
  args: AgentStepArgs,
  turn: number,
  messages: readonly ChatMessage[],
  alongside?: (reply: ModelReply) => void,
): Promise<ModelReply> {
  const limits = deps.rateLimits?.forAgent(args.agent) ?? null;
  if (limits === null) return askOnce(deps, args, turn, messages, alongside);
  const recorder = deps.recorder;
  const observer: RateLimitObserver | undefined =
    recorder === undefined
      ? undefined
      : { modelRateLimited: (wait) => recorder.modelRateLimited({ ...wait, turn }) };
  for (let tries = 1; ; tries++) {
    const grant = await limits.acquire(messages, args.signal, observer);
    const sending = { started: false };
    let reply: ModelReply;
    try {
      reply = await askOnce(deps, args, turn, messages, alongside, sending);
    } catch (error) {
      // Refused before it was sent (a budget, a quota): its capacity is given back.
      if (!sending.started) await grant.release();
      const blocked = await limits.rejected(error);
      if (blocked && tries < RATE_LIMITED_TRIES && !args.signal.aborted) continue;
      throw error;
    }
    grant.used(reply);
    return reply;
  }
}

/** One model call, metered when the deps say so; `sending.started` is set as it is sent. */
function askOnce(
  deps: AgentLoopDeps,
  args: AgentStepArgs,
  turn: number,
  messages: readonly ChatMessage[],
  alongside?: (reply: ModelReply) => void,
  sending?: { started: boolean },
): Promise<ModelReply> {
  const { agent, step, runId, tenantId, signal } = args;
  const stream = deps.stream;
  const complete = (onSend?: () => Promise<void>) => {
    if (sending !== undefined) sending.started = true;
    return traceModelCall({ model: agent.model, agent: agent.name }, () =>
      deps.clients.clientFor(agent).complete({
        messages,
        signal,
        ...(stream === undefined ? {} : { onChunk: (d: string) => stream.text(d, turn) }),
        ...(onSend === undefined ? {} : { onSend }),
      }),
    );
  };
  if (deps.meter === undefined) return complete();
  const recorder = deps.recorder;
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
      ...(recorder === undefined ? {} : { observer: recorder }),
      ...(alongside === undefined ? {} : { alongside }),
    },
    complete,
  );
}

/** Model clients made on first use, one per agent definition. */
export function modelClients(): ModelClients {
  const clients = new WeakMap<AgentDefinition, ModelClient>();
  return {
    clientFor(agent) {
      let client = clients.get(agent);
      if (client === undefined) {
        client = createModelClient(agent);
        clients.set(agent, client);
      }
      return client;
    },
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

/** Adds the usage `u` of one reply to `total`. */
export function add(total: AgentResult['usage'], u: ModelUsage | null): void {
  if (u === null) return;
  total.promptTokens += u.promptTokens;
  total.completionTokens += u.completionTokens;
}
