/**
 * Wire types of a conversation with a model: plain JSON, independent of any SDK, so a message
 * journaled in Redis by one release reads the same in another and a JSON round trip returns an
 * equal message. `llm/openai-client.ts` converts to and from the SDK's types at the edge.
 */
import { z } from 'zod';

/** One tool call the model asked for. `arguments` is the JSON text exactly as the model wrote it. */
export const toolCallSchema = z.object({
  id: z.string(),
  name: z.string(),
  arguments: z.string(),
});
/** One tool call the model asked for. */
export type ToolCall = z.infer<typeof toolCallSchema>;

/** Instructions: the agent's system prompt, or extra instructions from the caller. */
export const systemMessageSchema = z.object({
  role: z.literal('system'),
  content: z.string(),
});
export type SystemMessage = z.infer<typeof systemMessageSchema>;

/** What the user (or the step's input) says. */
export const userMessageSchema = z.object({
  role: z.literal('user'),
  content: z.string(),
});
export type UserMessage = z.infer<typeof userMessageSchema>;

/**
 * A model reply: text (null when the reply is only tool calls) and the tool calls, absent when there
 * are none. A reply without tool calls is a final answer.
 */
export const assistantMessageSchema = z.object({
  role: z.literal('assistant'),
  content: z.string().nullable(),
  tool_calls: z.array(toolCallSchema).optional(),
});
export type AssistantMessage = z.infer<typeof assistantMessageSchema>;

/** The result of one tool call, answering the call with the same id. */
export const toolMessageSchema = z.object({
  role: z.literal('tool'),
  tool_call_id: z.string(),
  content: z.string(),
});
export type ToolMessage = z.infer<typeof toolMessageSchema>;

/** Any message of a conversation. */
export const chatMessageSchema = z.discriminatedUnion('role', [
  systemMessageSchema,
  userMessageSchema,
  assistantMessageSchema,
  toolMessageSchema,
]);
/** Any message of a conversation: system, user, assistant or tool. */
export type ChatMessage = z.infer<typeof chatMessageSchema>;

/** Why the model stopped: `stop` (a final answer), `tool_calls`, `length`, `content_filter`, … */
export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter' | (string & {});

/** Tokens the provider counted for one call. */
export const modelUsageSchema = z.object({
  promptTokens: z.number().int().nonnegative(),
  completionTokens: z.number().int().nonnegative(),
});
export type ModelUsage = z.infer<typeof modelUsageSchema>;

/** One model call's result, as journaled before any tool runs. */
export const modelReplySchema = z.object({
  message: assistantMessageSchema,
  /** A `FinishReason`: `stop`, `length`, `tool_calls`, `content_filter` or what the provider sent. */
  finishReason: z.string(),
  /** Null when the provider did not report usage. */
  usage: modelUsageSchema.nullable(),
  /** The model that answered, as the provider names it. */
  model: z.string(),
  /** The provider's request id (`x-request-id`), when it sent one. */
  requestId: z.string().optional(),
  /** The usage reservation the call was charged to, when it was metered. */
  reservationId: z.string().optional(),
  /**
   * A granular turn of a step with an inbox: how many of its inbox's signals the turn took as user
   * messages before this call (so a turn taken again after a crash takes the same ones).
   */
  inboxTaken: z.number().int().nonnegative().optional(),
});
/** One model call's result, as journaled before any tool runs. */
export type ModelReply = z.infer<typeof modelReplySchema>;

/** The tool calls of a reply; empty for a final answer. */
export function toolCallsOf(message: AssistantMessage): readonly ToolCall[] {
  return message.tool_calls ?? [];
}
