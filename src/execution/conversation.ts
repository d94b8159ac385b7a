/**
 * What a granular agent step with an inbox reads at its turn boundaries: the signals of the
 * inbox's name not taken yet, as user messages, and, for a conversation, the built-in `end` tool
 * the model calls to end it and the `end` signal that ends it too. The run's per-name cursor says
 * which signals are taken; it moves with the commit of the turn that takes them.
 */
import { z } from 'zod';
import type { AgentDefinition } from '../agents/define-agent.js';
import type { ChatMessage } from '../llm/messages.js';
import type { StoredSignal } from '../persistence/inbox.js';
import { defineTool, type ToolDefinition } from '../tools/define-tool.js';

/** The signal that ends a conversation step, and the name of the tool that does. */
export const END = 'end';

/** Reads a run's inbox (see `InboxStore`). */
export interface InboxReader {
  read(runId: string, name: string, index: number): Promise<StoredSignal | null>;
}

/** The built-in `end` tool of a conversation step: calling it ends the step. */
export const endTool: ToolDefinition = defineTool({
  name: END,
  description:
    'End this conversation. Call it when the conversation is over; your last reply is its result.',
  input: z.object({}),
  class: 'read_only',
  run: () => ({ ended: true }),
});

const withEnd = new WeakMap<AgentDefinition, AgentDefinition>();

/**
 * The agent a conversation step runs: the agent with the built-in `end` tool, unless it has a
 * tool of that name itself (which then ends the step). The same object for the same agent.
 */
export function conversationAgent(agent: AgentDefinition): AgentDefinition {
  if (agent.tools.some((t) => t.name === END)) return agent;
  let derived = withEnd.get(agent);
  if (derived === undefined) {
    derived = Object.freeze({ ...agent, tools: [...agent.tools, endTool] });
    withEnd.set(agent, derived);
  }
  return derived;
}

/**
 * The signals `name` from index `from` on: `count` of them when given (a turn taken again takes
 * the ones it took before), else every one sent so far.
 */
export async function pendingSignals(
  inbox: InboxReader,
  runId: string,
  name: string,
  from: number,
  count?: number,
): Promise<StoredSignal[]> {
  const out: StoredSignal[] = [];
  for (let i = from; count === undefined || i < from + count; i++) {
    const signal = await inbox.read(runId, name, i);
    if (signal === null) {
      if (count !== undefined) throw new Error(`signal "${name}" #${i} of run ${runId} is gone`);
      break;
    }
    out.push(signal);
  }
  return out;
}

/** A signal's payload as the user message the history holds: a string as is, else its JSON. */
export function signalMessage(signal: StoredSignal): ChatMessage {
  const payload = signal.payload ?? null;
  return { role: 'user', content: typeof payload === 'string' ? payload : JSON.stringify(payload) };
}
