/**
 * An OpenAI-compatible HTTP server that plays a script, for testing agents with the real `openai`
 * client: `POST /v1/chat/completions`, plain and streamed (SSE), with faults on demand.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  completionBody,
  errorBody,
  lastUserText,
  resolveReply,
  streamChunks,
  type CompletionMeta,
  type RequestMessage,
} from './openai-wire.js';
import { parseScriptedReply, type CheckedReply, type ScriptedReply } from './script.js';

/** Options of {@link startScriptedModelServer}. */
export interface ScriptedModelServerOptions {
  /** @defaultValue 0 (a free port) */
  port?: number;
  /** @defaultValue `'127.0.0.1'` */
  host?: string;
  /** A pause before every reply, e.g. to measure a runtime against a 50 ms model. @defaultValue 0 */
  latencyMs?: number;
  /**
   * The answer to every request that finds the queue empty: a reply (played again and again), or
   * a {@link ScriptedReplyFunction} of the request (called once per request; it may be async).
   * Queued replies still go first. With it the server never runs out, so a long-lived process (a
   * `flujo worker`, a `flujo dev`) answers any number of runs; without it a request that finds
   * the queue empty gets a 500 naming the request. Checked now: a bad reply throws a
   * `ConfigurationError`. Change it later with {@link ScriptedModelServer.setDefaultReply}.
   * @defaultValue none
   */
  defaultReply?: ScriptEntry;
}

/** A tool the request offered the model, as the client sent it (`{ type: 'function', function }`). */
export interface RequestTool {
  type: string;
  function?: { name: string; description?: string; parameters?: unknown; [key: string]: unknown };
  [key: string]: unknown;
}

/** One HTTP request the server received, in arrival order. */
export interface RecordedRequest {
  /** 1 for the first request since the server started or was reset. */
  index: number;
  method: string;
  /** The path without the query string, e.g. `/v1/chat/completions`. */
  path: string;
  /** Header names in lower case. */
  headers: Record<string, string>;
  /** The parsed JSON body; `undefined` when the body was empty or not JSON. */
  body: unknown;
  /** The body's `model`, when it is a string. */
  model: string | undefined;
  /** The body's `messages`, or `[]` when it has none. */
  messages: readonly RequestMessage[];
  /** The body's `tools` (the functions the model may call), or `[]` when it has none. */
  tools: readonly RequestTool[];
  /** Epoch milliseconds when the request arrived. */
  at: number;
  /** True once a whole completion (not an error, not a cut-off stream) was written back. */
  answered: boolean;
  /** The usage figures the answer reported (null until answered, or when it reported none). */
  usage: { prompt_tokens: number; completion_tokens: number } | null;
}

/**
 * A reply computed from the request: it gets the parsed request (`messages`, `tools`, `model`,
 * the whole `body`, its `index`) and returns a reply in the shapes `enqueue` takes (text, tool
 * calls or a fault), or a promise of one. The reply is checked when it is returned: a bad one, or
 * a function that throws, answers that request with a 500 (`x-should-retry: false`) whose message
 * says why.
 *
 * @example
 * ```ts
 * // Call the first tool offered once, then answer with what it returned.
 * const reply: ScriptedReplyFunction = ({ messages, tools }) => {
 *   const result = messages.findLast((m) => m.role === 'tool');
 *   if (result !== undefined) return { text: `Done: ${String(result.content)}` };
 *   const tool = tools[0]?.function?.name;
 *   return tool === undefined ? { text: 'No tools.' } : { toolCalls: [{ name: tool, arguments: {} }] };
 * };
 * ```
 */
export type ScriptedReplyFunction = (
  request: RecordedRequest,
) => ScriptedReply | Promise<ScriptedReply>;

/** What a script holds: a reply, or a function that returns one. */
export type ScriptEntry = ScriptedReply | ScriptedReplyFunction;

/** A running scripted model server. */
export interface ScriptedModelServer {
  /** The base URL for the `openai` client, e.g. `http://127.0.0.1:PORT/v1`. */
  readonly url: string;
  readonly port: number;
  /** Appends replies to the script. Each is checked now; a bad one throws a `ConfigurationError`. */
  enqueue(...replies: ScriptEntry[]): void;
  /** Replaces the script (the replies not yet played are dropped). */
  script(replies: readonly ScriptEntry[]): void;
  /**
   * Sets the answer to every request that finds the queue empty (see
   * {@link ScriptedModelServerOptions.defaultReply}), or removes it with `undefined`. Checked
   * now; a bad reply throws a `ConfigurationError` and leaves the old one.
   */
  setDefaultReply(reply: ScriptEntry | undefined): void;
  /** Every request received since the start or the last `reset()`. */
  readonly requests: readonly RecordedRequest[];
  /** `requests.length`: how many calls the model saw. */
  readonly requestCount: number;
  /** How many queued replies are left (the default reply is not counted). */
  readonly remaining: number;
  /**
   * Empties the script and the recorded requests, and restarts request and tool-call numbering.
   * The default reply stays.
   */
  reset(): void;
  /** Stops the server, cutting open connections (hanging ones too). Safe to call twice. */
  close(): Promise<void>;
}

type QueuedEntry = CheckedReply | ScriptedReplyFunction;

const CHAT_PATH = '/v1/chat/completions';

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    req.on('data', (part: Buffer) => parts.push(part));
    req.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
    req.on('error', reject);
  });
}

function sendJson(
  res: ServerResponse,
  status: number,
  body: object,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent || res.destroyed) return;
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

function write(res: ServerResponse, data: string): Promise<void> {
  return new Promise((resolve) => {
    if (res.destroyed) resolve();
    else res.write(data, () => resolve());
  });
}

/**
 * Starts an OpenAI-compatible scripted model server.
 *
 * @remarks
 * Each `POST /v1/chat/completions` takes the next scripted reply: text, single or parallel tool
 * calls, or a fault (`delay`, `status`, `drop`, `hang`). With `stream: true` the reply is sent as
 * SSE `chat.completion.chunk` events ending with `data: [DONE]`, with a usage chunk when
 * `stream_options.include_usage` is set. When the script is empty the request is answered with a
 * 500 (and `x-should-retry: false`) whose message names the request, its model and last user
 * message. Usage figures not given in the script are estimates (characters / 4, rounded up), not
 * real token counts. Other paths get a 404 in OpenAI's error shape. Every request is recorded.
 *
 * A queued reply plays once. To answer forever (a long-lived worker that runs job after job), give
 * a `defaultReply`: a fixed reply, or a function of each request (see
 * {@link ScriptedReplyFunction}); it answers whenever the queue is empty.
 *
 * @example
 * ```ts
 * const server = await startScriptedModelServer();
 * server.enqueue({ toolCalls: [{ name: 'search', arguments: { q: 'redis' } }] }, { text: 'Done.' });
 * const client = new OpenAI({ baseURL: server.url, apiKey: 'test', maxRetries: 0 });
 * // … run the agent, then:
 * expect(server.requestCount).toBe(2);
 * await server.close();
 *
 * // A server that never runs out: every request is answered from what it asks.
 * const forever = await startScriptedModelServer({
 *   defaultReply: ({ messages }) => ({ text: `You said: ${String(messages.at(-1)?.content)}` }),
 * });
 * ```
 */
export async function startScriptedModelServer(
  options: ScriptedModelServerOptions = {},
): Promise<ScriptedModelServer> {
  const host = options.host ?? '127.0.0.1';
  const latencyMs = options.latencyMs ?? 0;
  let queue: QueuedEntry[] = [];
  let requests: RecordedRequest[] = [];
  let callCount = 0;
  /** Replies queued since the start, the last `script()` or `reset()`: numbers them in errors. */
  let queued = 0;
  let closing: Promise<void> | undefined;
  const stopped = new AbortController();
  /** The signals of the requests being answered, aborted when the server stops. */
  const live = new Set<AbortController>();
  const sockets = new Set<Socket>();

  const nextCallId = (): string => `call_${++callCount}`;

  const check = (entry: ScriptEntry, what: string): QueuedEntry =>
    typeof entry === 'function' ? entry : parseScriptedReply(entry, what);
  let defaultReply: QueuedEntry | undefined =
    options.defaultReply === undefined ? undefined : check(options.defaultReply, 'defaultReply');

  /** Waits `ms` unless the client leaves or the server stops; false when it should give up. */
  const pause = async (ms: number, signal: AbortSignal): Promise<boolean> => {
    if (ms <= 0) return !signal.aborted;
    try {
      await sleep(ms, undefined, { signal });
      return true;
    } catch {
      return false;
    }
  };

  const streamReply = async (
    res: ServerResponse,
    chunks: readonly object[],
    delayMs: number,
    signal: AbortSignal,
    dropAfter?: number,
  ): Promise<void> => {
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
    });
    res.flushHeaders();
    const limit = dropAfter === undefined ? chunks.length : Math.min(dropAfter, chunks.length);
    for (let i = 0; i < limit; i++) {
      if (i > 0 && !(await pause(delayMs, signal))) return;
      if (res.destroyed) return;
      await write(res, `data: ${JSON.stringify(chunks[i])}\n\n`);
    }
    if (dropAfter !== undefined) {
      // Let the written chunks reach the client before the connection goes.
      await new Promise((resolve) => setImmediate(resolve));
      res.socket?.destroy();
      res.destroy();
      return;
    }
    await write(res, 'data: [DONE]\n\n');
    res.end();
  };

  const play = async (
    reply: CheckedReply,
    request: RecordedRequest,
    res: ServerResponse,
    signal: AbortSignal,
  ): Promise<void> => {
    const body = isObject(request.body) ? request.body : {};
    const stream = body['stream'] === true;
    const streamOptions = body['stream_options'];
    const includeUsage = isObject(streamOptions) && streamOptions['include_usage'] === true;
    const meta: CompletionMeta = {
      id: `chatcmpl-scripted-${request.index}`,
      created: Math.floor(request.at / 1000),
      model: request.model ?? 'unknown',
    };
    if ('fault' in reply) {
      switch (reply.fault) {
        case 'delay':
          if (await pause(reply.ms, signal)) await play(reply.then, request, res, signal);
          return;
        case 'status': {
          const headers: Record<string, string> = { ...reply.headers };
          if (reply.retryAfter !== undefined) headers['retry-after'] = String(reply.retryAfter);
          sendJson(res, reply.status, errorBody(reply.status, reply), headers);
          return;
        }
        case 'drop': {
          if (!stream) {
            res.socket?.destroy();
            res.destroy();
            return;
          }
          const partial = reply.partial ?? {
            text: 'This reply is cut off by a dropped connection before it ends.',
          };
          const resolved = resolveReply(partial, request.messages, nextCallId);
          const chunks = streamChunks(meta, resolved, includeUsage);
          await streamReply(res, chunks, resolved.chunkDelayMs, signal, reply.afterChunks ?? 2);
          return;
        }
        case 'hang':
          // Answer nothing: the client's timeout, the client leaving or close() ends it.
          return;
      }
    }
    const resolved = resolveReply(reply, request.messages, nextCallId);
    if (stream)
      await streamReply(
        res,
        streamChunks(meta, resolved, includeUsage),
        resolved.chunkDelayMs,
        signal,
      );
    else sendJson(res, 200, completionBody(meta, resolved));
    if (!res.destroyed && res.writableEnded) {
      request.answered = true;
      const { prompt_tokens, completion_tokens } = resolved.usage;
      request.usage = stream && !includeUsage ? null : { prompt_tokens, completion_tokens };
    }
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    // Aborted when the client leaves before its reply is complete, or when the server stops. A
    // reply that went out whole aborts nothing (an abort builds an error: not worth it per call).
    const gone = new AbortController();
    if (stopped.signal.aborted) gone.abort();
    live.add(gone);
    res.on('close', () => {
      live.delete(gone);
      if (!res.writableFinished) gone.abort();
    });
    const signal = gone.signal;
    const raw = await readBody(req);
    let body: unknown;
    try {
      body = raw === '' ? undefined : JSON.parse(raw);
    } catch {
      body = undefined;
    }
    const fields = isObject(body) ? body : {};
    const messages = Array.isArray(fields['messages'])
      ? (fields['messages'] as unknown[]).filter(
          (m): m is RequestMessage => isObject(m) && typeof m['role'] === 'string',
        )
      : [];
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(req.headers))
      if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(', ') : value;
    const tools = Array.isArray(fields['tools'])
      ? (fields['tools'] as unknown[]).filter(
          (t): t is RequestTool => isObject(t) && typeof t['type'] === 'string',
        )
      : [];
    const request: RecordedRequest = {
      index: requests.length + 1,
      method: req.method ?? 'GET',
      path: (req.url ?? '/').split('?')[0] ?? '/',
      headers,
      body,
      model: typeof fields['model'] === 'string' ? fields['model'] : undefined,
      messages,
      tools,
      at: Date.now(),
      answered: false,
      usage: null,
    };
    requests.push(request);

    if (request.method !== 'POST' || request.path !== CHAT_PATH) {
      sendJson(
        res,
        404,
        errorBody(404, {
          message: `scripted model server: no route for ${request.method} ${request.path}; only POST ${CHAT_PATH} is served.`,
          code: 'unknown_url',
        }),
      );
      return;
    }
    if (!isObject(body) || request.model === undefined || !Array.isArray(fields['messages'])) {
      sendJson(
        res,
        400,
        errorBody(400, {
          message: `scripted model server: request #${request.index} is not a chat completion request: the body must be a JSON object with a string "model" and a "messages" array.`,
        }),
      );
      return;
    }
    const entry = queue.shift() ?? defaultReply;
    if (entry === undefined) {
      const last = lastUserText(messages);
      const message = `scripted model server: no scripted reply left for request #${request.index} (model "${request.model}", last user message ${last === undefined ? 'none' : `"${last}"`}); enqueue more replies, or start the server with a defaultReply (a reply, or a function of the request) to answer every request`;
      sendJson(res, 500, errorBody(500, { message, code: 'script_exhausted' }), {
        'x-should-retry': 'false',
      });
      return;
    }
    let reply: CheckedReply;
    try {
      reply =
        typeof entry === 'function'
          ? parseScriptedReply(
              await entry(request),
              `reply of the function for request #${request.index}`,
            )
          : entry;
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      sendJson(
        res,
        500,
        errorBody(500, {
          message: `scripted model server: the reply function for request #${request.index} failed: ${why}`,
          code: 'script_error',
        }),
        { 'x-should-retry': 'false' },
      );
      return;
    }
    if (!(await pause(latencyMs, signal))) return;
    await play(reply, request, res, signal);
  };

  const server = createServer((req, res) => {
    handle(req, res).catch(() => {
      // Only a socket error can land here; the client has gone, so there is no one to answer.
      res.destroy();
    });
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const urlHost = host.includes(':') ? `[${host}]` : host;

  return {
    url: `http://${urlHost}:${port}/v1`,
    port,
    enqueue(...replies) {
      const checked = replies.map((r, i) => check(r, `scripted reply #${queued + i + 1}`));
      queue.push(...checked);
      queued += checked.length;
    },
    script(replies) {
      queue = replies.map((r, i) => check(r, `scripted reply #${i + 1}`));
      queued = queue.length;
    },
    setDefaultReply(reply) {
      defaultReply = reply === undefined ? undefined : check(reply, 'defaultReply');
    },
    get requests() {
      return requests;
    },
    get requestCount() {
      return requests.length;
    },
    get remaining() {
      return queue.length;
    },
    reset() {
      queue = [];
      queued = 0;
      requests = [];
      callCount = 0;
    },
    close() {
      closing ??= new Promise<void>((resolve) => {
        stopped.abort();
        for (const request of live) request.abort();
        server.close(() => resolve());
        for (const socket of sockets) socket.destroy();
        server.closeAllConnections();
      });
      return closing;
    },
  };
}
