/**
 * Middle-out truncation of a conversation to a token budget. Pure and
 * deterministic: the same messages, budget and count function give the same result, so a resumed
 * turn sends the model what the first attempt sent.
 */
import type { ChatMessage, SystemMessage } from '../schemas/messages.js';

/** Recognises the content of a {@link truncationPlaceholder}; group 1 is the number omitted. */
export const TRUNCATION_PLACEHOLDER_PATTERN =
  /^\.\.\. \[Context Truncated: (\d+) messages omitted\] \.\.\.$/;

/** The system message that stands for `omitted` dropped messages. Its text is fixed, "1 messages" too. */
export function truncationPlaceholder(omitted: number): SystemMessage {
  return { role: 'system', content: `... [Context Truncated: ${omitted} messages omitted] ...` };
}

/** Options of {@link truncateMiddleOut}. */
export interface TruncateOptions {
  /** The budget for the returned messages, placeholder included. */
  maxTokens: number;
  /** Tokens of one message, e.g. a token counter's `countMessage`. */
  count: (message: ChatMessage) => number;
}

/** What {@link truncateMiddleOut} returns. */
export interface TruncateResult {
  /** The messages to send; the message objects are the input's own. */
  messages: ChatMessage[];
  /** How many input messages were dropped (the number in the placeholder); 0 when none. */
  omitted: number;
  /** The sum of `count` over `messages`. */
  tokens: number;
}

/**
 * Fits a conversation into `maxTokens`, middle-out. When it fits, it is returned as is. Otherwise:
 * - the head is kept: `messages[0]` when it is a system message, and the first user message;
 *   anything between them is dropped with the middle;
 * - then one placeholder naming the exact number of messages dropped;
 * - then the newest messages that fit in what is left, in units taken from the end, stopping at the
 *   first unit that does not fit. A unit is a message with the tool messages right after it, so an
 *   assistant's tool calls and their results are kept or dropped together, and the kept tail never
 *   starts with a tool message.
 * When not even the head and the placeholder fit, they are returned alone (over budget); when the
 * head is the whole conversation, it is returned as is. Never throws; never mutates `messages`.
 */
export function truncateMiddleOut(
  messages: readonly ChatMessage[],
  options: TruncateOptions,
): TruncateResult {
  const { maxTokens, count } = options;
  const costs = messages.map((m) => count(m));
  const total = costs.reduce((a, b) => a + b, 0);
  if (total <= maxTokens) return { messages: [...messages], omitted: 0, tokens: total };

  const head: number[] = [];
  if (messages[0]?.role === 'system') head.push(0);
  const firstUser = messages.findIndex((m) => m.role === 'user');
  if (firstUser !== -1) head.push(firstUser);
  const headEnd = (head.at(-1) ?? -1) + 1;
  const headTokens = head.reduce((sum, i) => sum + (costs[i] ?? 0), 0);
  const droppable = messages.length - head.length;
  if (droppable === 0) return { messages: [...messages], omitted: 0, tokens: total };

  let tailStart = messages.length;
  let tailTokens = 0;
  let placeholderTokens = count(truncationPlaceholder(droppable));
  let unitEnd = messages.length;
  for (let i = messages.length - 1; i >= headEnd; i--) {
    // A tool message belongs to the unit of the message before it.
    if (messages[i]?.role === 'tool') continue;
    let unitTokens = 0;
    for (let j = i; j < unitEnd; j++) unitTokens += costs[j] ?? 0;
    const omitted = droppable - (messages.length - i);
    // The placeholder's own cost depends on the number it carries.
    const withUnit = count(truncationPlaceholder(omitted));
    if (headTokens + withUnit + tailTokens + unitTokens > maxTokens) break;
    tailStart = i;
    tailTokens += unitTokens;
    placeholderTokens = withUnit;
    unitEnd = i;
  }

  const omitted = droppable - (messages.length - tailStart);
  return {
    messages: [
      ...head.map((i) => messages[i] as ChatMessage),
      truncationPlaceholder(omitted),
      ...messages.slice(tailStart),
    ],
    omitted,
    tokens: headTokens + placeholderTokens + tailTokens,
  };
}
