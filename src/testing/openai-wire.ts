/**
 * The OpenAI chat-completions wire format, as the scripted model server writes it: completions,
 * stream chunks, error bodies, and the deterministic usage estimates. Internal to the test helpers:
 * `flujo/testing` exports only `RequestMessage` from here.
 */
import type { MessageReply } from './script.js';

/** A message of a recorded request, as the client sent it. */
export interface RequestMessage {
  role: string;
  content?: unknown;
  [key: string]: unknown;
}

/** A tool call with its id and arguments resolved. */
export interface WireToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** What a completion is built from: a reply with its tool-call ids assigned. */
export interface ResolvedReply {
  content: string | null;
  toolCalls: WireToolCall[];
  finishReason: string;
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  chunkDelayMs: number;
}

/** Where a completion belongs: its id, creation second and the model to echo. */
export interface CompletionMeta {
  id: string;
  created: number;
  model: string;
}

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((part: unknown) =>
      typeof part === 'object' && part !== null && 'text' in part && typeof part.text === 'string'
        ? part.text
        : '',
    )
    .join('');
}

function toolCallChars(toolCalls: unknown): number {
  if (!Array.isArray(toolCalls)) return 0;
  let n = 0;
  for (const call of toolCalls as unknown[]) {
    const fn = (call as { function?: { name?: unknown; arguments?: unknown } } | null)?.function;
    if (typeof fn?.name === 'string') n += fn.name.length;
    if (typeof fn?.arguments === 'string') n += fn.arguments.length;
  }
  return n;
}

/**
 * The estimated prompt tokens: the characters of every message's text and tool calls, divided by
 * 4 and rounded up. A stand-in that is stable across runs, not a real token count.
 */
export function estimatePromptTokens(messages: readonly RequestMessage[]): number {
  let chars = 0;
  for (const m of messages) chars += textOf(m.content).length + toolCallChars(m['tool_calls']);
  return Math.ceil(chars / 4);
}

/** The last user message's text, for error messages (cut to 80 characters). */
export function lastUserText(messages: readonly RequestMessage[]): string | undefined {
  const last = messages.findLast((m) => m.role === 'user');
  if (last === undefined) return undefined;
  const text = textOf(last.content);
  return text.length > 80 ? `${text.slice(0, 79)}…` : text;
}

/** Resolves a reply: tool-call ids (from `nextCallId`), argument strings, finish reason, usage. */
export function resolveReply(
  reply: MessageReply,
  messages: readonly RequestMessage[],
  nextCallId: () => string,
): ResolvedReply {
  const toolCalls: WireToolCall[] = (
    ('toolCalls' in reply ? reply.toolCalls : undefined) ?? []
  ).map((call) => ({
    id: call.id ?? nextCallId(),
    type: 'function',
    function: {
      name: call.name,
      arguments:
        typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments),
    },
  }));
  const content = reply.text ?? null;
  const completionChars =
    (content ?? '').length +
    toolCalls.reduce((n, c) => n + c.function.name.length + c.function.arguments.length, 0);
  const prompt = reply.usage?.prompt_tokens ?? estimatePromptTokens(messages);
  const completion = reply.usage?.completion_tokens ?? Math.ceil(completionChars / 4);
  return {
    content,
    toolCalls,
    finishReason: reply.finishReason ?? (toolCalls.length > 0 ? 'tool_calls' : 'stop'),
    usage: {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
    },
    chunkDelayMs: reply.chunkDelayMs ?? 0,
  };
}

/** A non-streaming `chat.completion` body. */
export function completionBody(meta: CompletionMeta, reply: ResolvedReply): object {
  const message: Record<string, unknown> = {
    role: 'assistant',
    content: reply.content,
    refusal: null,
  };
  if (reply.toolCalls.length > 0) message['tool_calls'] = reply.toolCalls;
  return {
    id: meta.id,
    object: 'chat.completion',
    created: meta.created,
    model: meta.model,
    choices: [{ index: 0, message, logprobs: null, finish_reason: reply.finishReason }],
    usage: reply.usage,
  };
}

/** Splits text into word-sized deltas (leading whitespace kept, long words cut at 8 characters). */
export function contentDeltas(text: string): string[] {
  return text.match(/\s*\S{1,8}|\s+/g) ?? [];
}

/** Splits tool-call arguments into fragments of up to 12 characters, as OpenAI streams them. */
export function argumentFragments(args: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i += 12) out.push(args.slice(i, i + 12));
  return out;
}

/**
 * The `chat.completion.chunk` events of a streamed reply, in OpenAI's order: a role chunk, content
 * deltas, each tool call opened with its id and name then its argument fragments, a chunk with the
 * finish reason, and with `includeUsage` a last chunk with no choices and the usage (every earlier
 * chunk then carries `usage: null`).
 */
export function streamChunks(
  meta: CompletionMeta,
  reply: ResolvedReply,
  includeUsage: boolean,
): object[] {
  const chunk = (delta: object, finishReason: string | null = null): object => ({
    id: meta.id,
    object: 'chat.completion.chunk',
    created: meta.created,
    model: meta.model,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
    ...(includeUsage ? { usage: null } : {}),
  });
  const chunks: object[] = [
    chunk({ role: 'assistant', content: reply.content === null ? null : '', refusal: null }),
  ];
  for (const piece of contentDeltas(reply.content ?? '')) chunks.push(chunk({ content: piece }));
  reply.toolCalls.forEach((call, index) => {
    chunks.push(
      chunk({
        tool_calls: [
          {
            index,
            id: call.id,
            type: 'function',
            function: { name: call.function.name, arguments: '' },
          },
        ],
      }),
    );
    for (const fragment of argumentFragments(call.function.arguments))
      chunks.push(chunk({ tool_calls: [{ index, function: { arguments: fragment } }] }));
  });
  chunks.push(chunk({}, reply.finishReason));
  if (includeUsage)
    chunks.push({
      id: meta.id,
      object: 'chat.completion.chunk',
      created: meta.created,
      model: meta.model,
      choices: [],
      usage: reply.usage,
    });
  return chunks;
}

const ERROR_DEFAULTS: Record<number, { type: string; code: string | null; message: string }> = {
  400: { type: 'invalid_request_error', code: null, message: 'Bad request (scripted).' },
  401: {
    type: 'invalid_request_error',
    code: 'invalid_api_key',
    message: 'Incorrect API key provided (scripted).',
  },
  403: { type: 'permission_denied', code: null, message: 'Permission denied (scripted).' },
  404: { type: 'invalid_request_error', code: 'model_not_found', message: 'Not found (scripted).' },
  408: { type: 'timeout', code: null, message: 'Request timed out (scripted).' },
  409: { type: 'conflict', code: null, message: 'Conflict (scripted).' },
  429: {
    type: 'requests',
    code: 'rate_limit_exceeded',
    message: 'Rate limit reached for requests (scripted).',
  },
};

/** OpenAI's error body `{ error: { message, type, param, code } }`, with defaults for the status. */
export function errorBody(
  status: number,
  over: {
    message?: string | undefined;
    type?: string | undefined;
    code?: string | null | undefined;
  } = {},
): object {
  const base = ERROR_DEFAULTS[status] ?? {
    type: status >= 500 ? 'server_error' : 'invalid_request_error',
    code: null,
    message: `The scripted server answered with status ${status}.`,
  };
  return {
    error: {
      message: over.message ?? base.message,
      type: over.type ?? base.type,
      param: null,
      code: over.code === undefined ? base.code : over.code,
    },
  };
}
