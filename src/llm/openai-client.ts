/**
 * The model client over the official openai SDK: chat completions with function tools, plain or
 * streamed. The SDK never retries (`maxRetries: 0`): the runtime owns retries, and every failure
 * leaves here classified once as a `ModelError` (aborts pass through as the SDK's abort error).
 * Requests and replies are converted to and from the JSON-safe wire types of `messages.ts`.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import OpenAI, {
  APIConnectionError,
  APIConnectionTimeoutError,
  APIError,
  APIUserAbortError,
} from 'openai';
import type {
  ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionCreateParamsBase,
  ChatCompletionMessageParam,
  ChatCompletionTool,
} from 'openai/resources/chat/completions';
import type { AgentDefinition } from '../agents/define-agent.js';
import { toolParametersSchema } from '../agents/tool-schema.js';
import { ConfigurationError, findCause, ModelError } from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import { classifyModelError, displayURL, type ModelCallContext } from './classify-error.js';
import { nodeHttpFetch } from './http-fetch.js';
import type { AssistantMessage, ChatMessage, ModelReply, ToolCall } from './messages.js';

/** One model call. */
export interface ModelRequest {
  /** The conversation after the agent's system prompt, which the client puts first. */
  messages: readonly ChatMessage[];
  /** Aborts the call; the promise then rejects with the SDK's `APIUserAbortError`. */
  signal?: AbortSignal;
  /** Receives each piece of reply text as it streams in (only when the agent streams). */
  onChunk?: (delta: string) => void;
  /**
   * Awaited right before the request goes out on the wire (after the key is read and the request
   * is built): where usage accounting records that the call was sent. A throw cancels the call.
   */
  onSend?: () => Promise<void>;
}

/** Calls an agent's model. */
export interface ModelClient {
  /** Asks the model for its next reply; rejects with a `ModelError` when the call fails. */
  complete(request: ModelRequest): Promise<ModelReply>;
}

/** Options for {@link createModelClient}. */
export interface ModelClientOptions {
  /**
   * The fetch implementation, used exactly as given. Without it, a streaming agent calls
   * `globalThis.fetch`; a plain one calls `nodeHttpFetch` (lighter per request than Node's
   * fetch) while `globalThis.fetch` is still the one Node started with, and `globalThis.fetch`
   * once something has replaced it, so whoever wraps the global fetch still sees every request.
   * Either is read when the SDK client is built: on the first call, and again when the key changes.
   * @defaultValue `nodeHttpFetch` or `globalThis.fetch`, as above
   */
  fetch?: typeof fetch;
  /** Where the default API key comes from. @defaultValue `process.env` */
  env?: Readonly<Record<string, string | undefined>>;
}

function readApiKey(agent: AgentDefinition, env: ModelClientOptions['env']): string {
  const source = agent.provider.apiKey;
  let key: unknown;
  try {
    key = typeof source === 'function' ? source() : (source ?? env?.['OPENAI_API_KEY']);
  } catch (error) {
    throw new ConfigurationError(
      `agent "${agent.name}": provider.apiKey() threw (${error instanceof Error ? error.name : 'a non-error'}): fix the function that supplies the key`,
      { field: 'provider.apiKey', cause: error },
    );
  }
  if (typeof key !== 'string' || key === '') {
    throw new ConfigurationError(
      `agent "${agent.name}" has no API key: set OPENAI_API_KEY (or the agent's provider.apiKey; any non-empty string for a local server that needs none)`,
      { field: 'provider.apiKey' },
    );
  }
  return key;
}

function toOpenAIMessage(message: ChatMessage): ChatCompletionMessageParam {
  switch (message.role) {
    case 'system':
    case 'user':
      return { role: message.role, content: message.content };
    case 'tool':
      return { role: 'tool', tool_call_id: message.tool_call_id, content: message.content };
    case 'assistant': {
      const calls = message.tool_calls ?? [];
      if (calls.length === 0) return { role: 'assistant', content: message.content };
      return {
        role: 'assistant',
        content: message.content,
        tool_calls: calls.map((call) => ({
          id: call.id,
          type: 'function',
          function: { name: call.name, arguments: call.arguments },
        })),
      };
    }
  }
}

function toOpenAITools(agent: AgentDefinition): ChatCompletionTool[] {
  return agent.tools.map((tool) => ({
    type: 'function',
    function: {
      name: tool.name,
      ...(tool.description === undefined ? {} : { description: tool.description }),
      parameters: toolParametersSchema(tool),
    },
  }));
}

function assistantMessage(content: string | null, calls: readonly ToolCall[]): AssistantMessage {
  return calls.length === 0
    ? { role: 'assistant', content }
    : { role: 'assistant', content, tool_calls: [...calls] };
}

function usageOf(usage: ChatCompletion['usage'] | null | undefined): ModelReply['usage'] {
  if (usage === undefined || usage === null) return null;
  return { promptTokens: usage.prompt_tokens, completionTokens: usage.completion_tokens };
}

function reply(
  message: AssistantMessage,
  finishReason: string,
  usage: ModelReply['usage'],
  model: string,
  requestId: string | null | undefined,
): ModelReply {
  const out: ModelReply = { message, finishReason, usage, model };
  if (typeof requestId === 'string' && requestId !== '') out.requestId = requestId;
  return out;
}

/** A tool call being assembled from stream deltas. */
interface PartialCall {
  id: string;
  name: string;
  arguments: string;
}

/**
 * Creates the client for an agent. The API key is read on each call (a function key may rotate);
 * the SDK client is rebuilt only when the key changes.
 */
export function createModelClient(
  agent: AgentDefinition,
  options: ModelClientOptions = {},
): ModelClient {
  const env = options.env ?? process.env;
  const tools = toOpenAITools(agent);
  const system: ChatCompletionMessageParam[] =
    agent.systemPrompt === '' ? [] : [{ role: 'system', content: agent.systemPrompt }];
  const settings: Partial<
    Pick<ChatCompletionCreateParamsBase, 'temperature' | 'max_completion_tokens' | 'seed' | 'top_p'>
  > = {};
  const { temperature, maxTokens, seed, topP } = agent.settings;
  if (temperature !== undefined) settings.temperature = temperature;
  if (maxTokens !== undefined) settings.max_completion_tokens = maxTokens;
  // eslint-disable-next-line @typescript-eslint/no-deprecated -- the agent asks for it; providers without it ignore it
  if (seed !== undefined) settings.seed = seed;
  if (topP !== undefined) settings.top_p = topP;

  let cached: { key: string; client: OpenAI } | undefined;
  const sdk = (key: string): OpenAI => {
    if (cached?.key !== key) {
      const client = new OpenAI({
        baseURL: agent.provider.baseURL,
        apiKey: key,
        maxRetries: 0,
        timeout: agent.timeoutMs,
        fetch: sending(options.fetch ?? defaultFetch(agent.stream)),
      });
      cached = { key, client };
    }
    return cached.client;
  };

  const contextFor = (key: string): ModelCallContext => ({
    model: agent.model,
    baseURL: agent.provider.baseURL,
    secrets: [key],
  });

  /** A reply the provider sent but that cannot be used: its fault, so worth retrying. */
  const malformed = (what: string, requestId: string | null | undefined): ModelError =>
    new ModelError({
      kind: 'server',
      model: agent.model,
      baseURL: displayURL(agent.provider.baseURL),
      providerMessage: `malformed reply: ${what}`,
      ...(typeof requestId === 'string' ? { requestId } : {}),
    });

  async function completePlain(
    client: OpenAI,
    messages: ChatCompletionMessageParam[],
    signal: AbortSignal | undefined,
  ): Promise<ModelReply> {
    let data: ChatCompletion;
    let request_id: string | null | undefined;
    try {
      ({ data, request_id } = await client.chat.completions
        .create(
          { model: agent.model, messages, ...settings, ...(tools.length > 0 ? { tools } : {}) },
          signal === undefined ? {} : { signal },
        )
        .withResponse());
    } catch (error) {
      if (error instanceof SyntaxError) throw malformed(`not JSON (${error.message})`, undefined);
      throw error;
    }
    const choice = data.choices?.[0];
    if (choice === undefined) throw malformed('no choices', request_id);
    const calls: ToolCall[] = [];
    for (const call of choice.message.tool_calls ?? []) {
      if (call.type !== 'function') throw malformed(`a ${call.type} tool call`, request_id);
      calls.push({ id: call.id, name: call.function.name, arguments: call.function.arguments });
    }
    const content = choice.message.content ?? choice.message.refusal ?? null;
    return reply(
      assistantMessage(content, calls),
      choice.finish_reason ?? 'stop',
      usageOf(data.usage),
      data.model || agent.model,
      request_id,
    );
  }

  async function completeStreaming(
    client: OpenAI,
    messages: ChatCompletionMessageParam[],
    request: ModelRequest,
  ): Promise<ModelReply> {
    // The SDK's timeout ends when the headers arrive; a stream that stalls afterwards is caught
    // by an inactivity timer that restarts with every chunk.
    const stall = new AbortController();
    const signal =
      request.signal === undefined ? stall.signal : AbortSignal.any([request.signal, stall.signal]);
    let stalled = false;
    let timer: NodeJS.Timeout | undefined;
    const arm = (): void => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        stalled = true;
        stall.abort();
      }, agent.timeoutMs);
    };
    const { onChunk } = request;
    let text = '';
    const calls: PartialCall[] = [];
    let finishReason: string | null = null;
    let usage: ModelReply['usage'] = null;
    let model = '';
    let requestId: string | null | undefined;
    let finished = false;
    arm();
    try {
      const started = await client.chat.completions
        .create(
          {
            model: agent.model,
            messages,
            ...settings,
            ...(tools.length > 0 ? { tools } : {}),
            stream: true,
            stream_options: { include_usage: true },
          },
          { signal },
        )
        .withResponse();
      requestId = started.request_id;
      const chunks = started.data[Symbol.asyncIterator]();
      for (;;) {
        let next: IteratorResult<ChatCompletionChunk>;
        try {
          next = await chunks.next();
        } catch (error) {
          if (stalled) throw stallError(error);
          if (request.signal?.aborted === true) throw abortError(request.signal);
          if (error instanceof SyntaxError) throw malformed(error.message, requestId);
          throw streamFailure(error);
        }
        if (next.done === true) break;
        arm();
        const chunk = next.value;
        if (chunk.model) model = chunk.model;
        if (chunk.usage) usage = usageOf(chunk.usage);
        const choice = chunk.choices?.[0];
        if (choice === undefined) continue;
        const delta = choice.delta;
        const piece = delta.content ?? delta.refusal;
        if (typeof piece === 'string' && piece !== '') {
          text += piece;
          onChunk?.(piece);
        }
        for (const part of delta.tool_calls ?? []) {
          const call = (calls[part.index] ??= { id: '', name: '', arguments: '' });
          if (part.id) call.id = part.id;
          if (part.function?.name) call.name += part.function.name;
          if (part.function?.arguments) call.arguments += part.function.arguments;
        }
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
      finished = true;
    } catch (error) {
      if (stalled) throw stallError(error);
      throw error;
    } finally {
      clearTimeout(timer);
      // Left early (onChunk threw, or a failure): end the request rather than leave it open.
      if (!finished) stall.abort();
    }
    // An aborted stream ends quietly in the SDK: say why it ended.
    if (stalled) throw stallError(undefined);
    if (request.signal?.aborted === true) throw abortError(request.signal);
    if (finishReason === null) {
      throw new APIConnectionError({ message: 'the stream ended before the reply was complete' });
    }
    const toolCalls: ToolCall[] = [];
    for (const [index, call] of calls.entries()) {
      if (call === undefined || call.id === '' || call.name === '') {
        throw malformed(`tool call ${index} streamed without an id or a name`, requestId);
      }
      toolCalls.push({ id: call.id, name: call.name, arguments: call.arguments });
    }
    // Like a plain reply: no text beside tool calls is null, not the empty role chunk's ''.
    const content = text === '' && toolCalls.length > 0 ? null : text;
    return reply(
      assistantMessage(content, toolCalls),
      finishReason,
      usage,
      model || agent.model,
      requestId,
    );
  }

  return {
    async complete(request: ModelRequest): Promise<ModelReply> {
      const key = readApiKey(agent, env);
      const client = sdk(key);
      const messages = [...system, ...request.messages.map(toOpenAIMessage)];
      const run = () =>
        agent.stream
          ? completeStreaming(client, messages, request)
          : completePlain(client, messages, request.signal);
      try {
        return request.onSend === undefined
          ? await run()
          : await beforeSend.run(request.onSend, run);
      } catch (error) {
        // The SDK wraps what fetch throws: a failed hook is the hook's error, not the model's.
        const hook = findCause(error, (e) => e instanceof SendHookError);
        if (hook instanceof SendHookError) throw hook.cause;
        throw classifyModelError(error, contextFor(key));
      }
    },
  };
}

// Node's own fetch, as it was when this module loaded: a different `globalThis.fetch` later means
// someone wrapped or replaced it, and then it gets every request.
const nodeFetch = globalThis.fetch;

/** The fetch of an SDK client when the options name none (see {@link ModelClientOptions.fetch}). */
function defaultFetch(stream: boolean): typeof globalThis.fetch {
  const current = globalThis.fetch;
  return stream || current !== nodeFetch ? current : nodeHttpFetch;
}

// The request's onSend hook, reached from inside the SDK's fetch call (one SDK client serves every
// request of an agent, so the hook travels with the call, not with the client).
const beforeSend = new AsyncLocalStorage<() => Promise<void>>();

/** A failure of the onSend hook, kept apart from the model's own errors. */
class SendHookError extends Error {
  constructor(override readonly cause: unknown) {
    super('the onSend hook failed');
  }
}

function sending(fetch: typeof globalThis.fetch): typeof globalThis.fetch {
  return async (input, init) => {
    const hook = beforeSend.getStore();
    if (hook !== undefined) {
      try {
        await hook();
      } catch (error) {
        throw new SendHookError(error);
      }
    }
    const response = await fetch(input, init);
    debugPoint(DebugPoint.afterRequestSent);
    return response;
  };
}

/** A failure while reading a stream: a dropped connection unless the SDK already classified it. */
function streamFailure(error: unknown): unknown {
  if (error instanceof APIError) return error;
  return new APIConnectionError({
    message: 'the connection dropped in the middle of the stream',
    ...(error instanceof Error ? { cause: error } : {}),
  });
}

function stallError(cause: unknown): APIConnectionTimeoutError {
  const error = new APIConnectionTimeoutError({ message: 'the stream stalled' });
  if (cause !== undefined) Object.defineProperty(error, 'cause', { value: cause });
  return error;
}

function abortError(signal: AbortSignal): APIUserAbortError {
  const error = new APIUserAbortError();
  Object.defineProperty(error, 'cause', { value: signal.reason as unknown, configurable: true });
  return error;
}
