import { ConfigurationError, MaxTurnsExceededError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { createModelClient, type ModelClient } from '../llm/openai-client.js';
import { toolCallsOf, type ChatMessage, type ModelUsage } from '../llm/messages.js';
import type { AgentStep } from '../plan/schema.js';
import type { Ledger } from '../persistence/ledger.js';
import { callTool } from '../tools/call-tool.js';

/** What an atomic agent step returns: the final answer and what it took. */
export interface AgentResult {
  answer: string | null;
  turns: number;
  toolCalls: number;
  usage: { promptTokens: number; completionTokens: number };
}

/** What an atomic agent loop needs from the worker. */
export interface AgentLoopDeps {
  ledger: Ledger;
  leaseMs: number;
  /** Called before each tool call that will really run (budgets). */
  beforeToolRun: () => Promise<void>;
  /** One client per agent, reused across steps (the openai client keeps its connections). */
  clientFor: (agent: AgentDefinition) => ModelClient;
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

function userMessage(input: JsonValue): ChatMessage {
  return { role: 'user', content: typeof input === 'string' ? input : JSON.stringify(input) };
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
  args: {
    agent: AgentDefinition;
    step: AgentStep;
    input: JsonValue;
    runId: string;
    tenantId: string;
    attempt: number;
    signal: AbortSignal;
  },
): Promise<AgentResult> {
  const { agent, step, runId, tenantId, attempt, signal } = args;
  const tools = new Map(agent.tools.map((t) => [t.name, t]));
  const client = deps.clientFor(agent);
  const messages: ChatMessage[] = [userMessage(args.input)];
  const usage = { promptTokens: 0, completionTokens: 0 };
  let toolCalls = 0;
  for (let turn = 1; turn <= step.maxTurns; turn++) {
    const reply = await client.complete({ messages, signal });
    add(usage, reply.usage);
    messages.push(reply.message);
    const calls = toolCallsOf(reply.message);
    if (calls.length === 0) {
      return { answer: reply.message.content, turns: turn, toolCalls, usage };
    }
    for (const call of calls) {
      const tool = tools.get(call.name);
      if (tool === undefined) {
        throw new ConfigurationError(
          `the model called tool "${call.name}", which agent "${agent.name}" does not have (it has: ${[...tools.keys()].join(', ') || 'none'}); add it to the agent's tools or fix the system prompt`,
        );
      }
      let parsed: unknown;
      try {
        parsed = call.arguments === '' ? {} : JSON.parse(call.arguments);
      } catch {
        // The model's mistake, told back to the model like a tool result, so it can correct it.
        messages.push({
          role: 'tool',
          tool_call_id: call.id,
          content: `error: the arguments are not JSON: ${call.arguments.slice(0, 200)}`,
        });
        continue;
      }
      const result = await callTool({
        ledger: deps.ledger,
        tool,
        args: parsed,
        ctx: { runId, stepId: step.id, tenantId, attempt, signal },
        leaseMs: deps.leaseMs,
        beforeRun: deps.beforeToolRun,
      });
      toolCalls++;
      messages.push({
        role: 'tool',
        tool_call_id: call.id,
        content: JSON.stringify(result.receipt),
      });
    }
  }
  throw new MaxTurnsExceededError(step.id, step.maxTurns);
}

function add(
  total: { promptTokens: number; completionTokens: number },
  u: ModelUsage | null,
): void {
  if (u === null) return;
  total.promptTokens += u.promptTokens;
  total.completionTokens += u.completionTokens;
}
