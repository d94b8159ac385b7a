import OpenAI, {
  APIConnectionError,
  APIConnectionTimeoutError,
  AuthenticationError,
  InternalServerError,
  RateLimitError,
} from 'openai';
import type { APIError } from 'openai';
import type { ChatCompletionMessageFunctionToolCall } from 'openai/resources/chat/completions';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ErrorCode, isFlujoError } from '../../src/errors.js';
import {
  startScriptedModelServer,
  type RecordedRequest,
  type ScriptedModelServer,
} from '../../src/testing/index.js';
import { caught } from '../helpers/caught.js';

let server: ScriptedModelServer;
let client: OpenAI;

const ask = (content = 'hello', extra: Record<string, unknown> = {}) =>
  client.chat.completions.create({
    model: 'gpt-test',
    messages: [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content },
    ],
    ...extra,
  });
const askStream = (content: string, includeUsage = false) =>
  client.chat.completions.create({
    model: 'gpt-test',
    messages: [{ role: 'user', content }],
    stream: true,
    ...(includeUsage ? { stream_options: { include_usage: true } } : {}),
  });
const fnCalls = (calls: readonly unknown[] | undefined) =>
  (calls ?? []) as ChatCompletionMessageFunctionToolCall[];

beforeEach(async () => {
  server = await startScriptedModelServer();
  client = new OpenAI({ baseURL: server.url, apiKey: 'test', maxRetries: 0, timeout: 5_000 });
});

afterEach(async () => {
  await server.close();
});

describe('scripted model server, plain replies', () => {
  it('answers a text reply in the chat.completion shape, echoing the model', async () => {
    server.enqueue({ text: 'Hi there.' });
    const completion = await ask();
    expect(server.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/v1$/);
    expect(completion.object).toBe('chat.completion');
    expect(completion.id).toBe('chatcmpl-scripted-1');
    expect(completion.model).toBe('gpt-test');
    expect(typeof completion.created).toBe('number');
    expect(completion.choices).toHaveLength(1);
    expect(completion.choices[0]).toMatchObject({
      index: 0,
      message: { role: 'assistant', content: 'Hi there.' },
      finish_reason: 'stop',
    });
    expect(completion.choices[0]?.message.tool_calls).toBeUndefined();
    // Estimates: "You are terse." + "hello" = 19 chars → 5; "Hi there." = 9 chars → 3.
    expect(completion.usage).toEqual({ prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 });
    expect(server.remaining).toBe(0);
  });

  it('answers a single tool call with a default deterministic id', async () => {
    server.enqueue({ toolCalls: [{ name: 'search', arguments: { q: 'redis cas' } }] });
    const completion = await ask();
    const choice = completion.choices[0];
    expect(choice?.finish_reason).toBe('tool_calls');
    expect(choice?.message.content).toBeNull();
    expect(choice?.message.tool_calls).toEqual([
      {
        id: 'call_1',
        type: 'function',
        function: { name: 'search', arguments: '{"q":"redis cas"}' },
      },
    ]);
  });

  it('answers three parallel tool calls with ids and arguments intact', async () => {
    server.enqueue({
      text: 'Looking three things up.',
      toolCalls: [
        { id: 'call_a', name: 'search', arguments: { q: 'one', n: 1 } },
        { name: 'write_note', arguments: { text: 'ünïcode "quoted" \n newline' } },
        { id: 'call_c', name: 'send', arguments: '{"to":"ann"}' },
      ],
    });
    const completion = await ask();
    const calls = fnCalls(completion.choices[0]?.message.tool_calls);
    expect(completion.choices[0]?.message.content).toBe('Looking three things up.');
    expect(calls.map((c) => c.id)).toEqual(['call_a', 'call_1', 'call_c']);
    expect(calls.map((c) => c.function.name)).toEqual(['search', 'write_note', 'send']);
    expect(calls.map((c) => JSON.parse(c.function.arguments) as unknown)).toEqual([
      { q: 'one', n: 1 },
      { text: 'ünïcode "quoted" \n newline' },
      { to: 'ann' },
    ]);
  });

  it('passes scripted usage figures through', async () => {
    server.enqueue({ text: 'ok', usage: { prompt_tokens: 1234, completion_tokens: 56 } });
    const completion = await ask();
    expect(completion.usage).toEqual({
      prompt_tokens: 1234,
      completion_tokens: 56,
      total_tokens: 1290,
    });
  });
});

describe('scripted model server, streaming', () => {
  it('streams text as several deltas that add up to the full text', async () => {
    const text = 'The quick brown fox jumps over the extraordinarily lazy dog.';
    server.enqueue({ text, usage: { prompt_tokens: 10, completion_tokens: 12 } });
    const stream = await askStream('go', true);
    const deltas: string[] = [];
    const finishes: (string | null | undefined)[] = [];
    let usage: unknown;
    for await (const chunk of stream) {
      expect(chunk.object).toBe('chat.completion.chunk');
      expect(chunk.model).toBe('gpt-test');
      const choice = chunk.choices[0];
      if (choice?.delta.content) deltas.push(choice.delta.content);
      if (choice?.finish_reason) finishes.push(choice.finish_reason);
      if (chunk.usage) usage = chunk.usage;
    }
    expect(deltas.length).toBeGreaterThan(5);
    expect(deltas.join('')).toBe(text);
    expect(finishes).toEqual(['stop']);
    expect(usage).toEqual({ prompt_tokens: 10, completion_tokens: 12, total_tokens: 22 });
  });

  it('sends no usage chunk unless include_usage is set', async () => {
    server.enqueue({ text: 'short answer' });
    const stream = await askStream('go');
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.length).toBeGreaterThan(2);
    expect(chunks.every((c) => c.usage === undefined && c.choices.length === 1)).toBe(true);
  });

  it('streams parallel tool calls that the SDK accumulates into the right message', async () => {
    const args = { query: 'durable execution with redis', limit: 5, tags: ['a', 'b'] };
    server.enqueue({
      text: 'Let me check.',
      toolCalls: [
        { id: 'call_x', name: 'search', arguments: args },
        { name: 'note', arguments: { text: 'remember this long note for later' } },
      ],
    });
    const stream = client.chat.completions.stream({
      model: 'gpt-test',
      messages: [{ role: 'user', content: 'find it' }],
    });
    const argumentDeltas: string[] = [];
    stream.on('tool_calls.function.arguments.delta', (e) => argumentDeltas.push(e.arguments_delta));
    const completion = await stream.finalChatCompletion();
    const message = completion.choices[0]?.message;
    expect(completion.choices[0]?.finish_reason).toBe('tool_calls');
    expect(message?.content).toBe('Let me check.');
    const calls = fnCalls(message?.tool_calls);
    expect(calls.map((c) => [c.id, c.type, c.function.name])).toEqual([
      ['call_x', 'function', 'search'],
      ['call_1', 'function', 'note'],
    ]);
    expect(JSON.parse(calls[0]?.function.arguments ?? '') as unknown).toEqual(args);
    expect(JSON.parse(calls[1]?.function.arguments ?? '') as unknown).toEqual({
      text: 'remember this long note for later',
    });
    // Arguments arrive in fragments, as OpenAI sends them.
    expect(argumentDeltas.length).toBeGreaterThan(4);
  });

  it('streams tool calls the OpenAI way: id and name first, argument fragments after', async () => {
    server.enqueue({ toolCalls: [{ name: 'search', arguments: { q: 'a fairly long query' } }] });
    const stream = await askStream('go');
    const toolDeltas: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = [];
    for await (const chunk of stream)
      toolDeltas.push(...(chunk.choices[0]?.delta.tool_calls ?? []));
    expect(toolDeltas[0]).toEqual({
      index: 0,
      id: 'call_1',
      type: 'function',
      function: { name: 'search', arguments: '' },
    });
    const rest = toolDeltas.slice(1);
    expect(rest.length).toBeGreaterThan(1);
    expect(
      rest.every((d) => d.index === 0 && d.id === undefined && d.function?.name === undefined),
    ).toBe(true);
    expect(rest.map((d) => d.function?.arguments).join('')).toBe('{"q":"a fairly long query"}');
  });
});

describe('scripted model server, faults', () => {
  it('answers 429 with retry-after: a RateLimitError carrying the header', async () => {
    server.enqueue({ fault: 'status', status: 429, retryAfter: 7 }, { text: 'after the wait' });
    const error = await caught(ask());
    expect(error).toBeInstanceOf(RateLimitError);
    const apiError = error as RateLimitError;
    expect(apiError.status).toBe(429);
    expect(apiError.headers.get('retry-after')).toBe('7');
    expect(apiError.code).toBe('rate_limit_exceeded');
    // The next request gets the next reply.
    expect((await ask()).choices[0]?.message.content).toBe('after the wait');
    expect(server.requestCount).toBe(2);
  });

  it('answers 500 with the scripted message', async () => {
    server.enqueue({ fault: 'status', status: 500, message: 'upstream exploded' });
    const error = await caught(ask());
    expect(error).toBeInstanceOf(InternalServerError);
    expect((error as APIError).status).toBe(500);
    expect((error as APIError).message).toContain('upstream exploded');
    expect((error as APIError).type).toBe('server_error');
  });

  it('answers 401: an AuthenticationError', async () => {
    server.enqueue({ fault: 'status', status: 401 });
    const error = await caught(ask());
    expect(error).toBeInstanceOf(AuthenticationError);
    expect((error as APIError).status).toBe(401);
    expect((error as APIError).code).toBe('invalid_api_key');
  });

  it('answers a status fault to a streaming request before any chunk', async () => {
    server.enqueue({ fault: 'status', status: 503, headers: { 'x-should-retry': 'true' } });
    const error = await caught(askStream('go'));
    expect(error).toBeInstanceOf(InternalServerError);
    expect((error as APIError).status).toBe(503);
    expect((error as APIError).headers?.get('x-should-retry')).toBe('true');
  });

  it('delays a reply by the scripted time', async () => {
    server.enqueue({ fault: 'delay', ms: 150, then: { text: 'late' } });
    const started = performance.now();
    const completion = await ask();
    expect(performance.now() - started).toBeGreaterThanOrEqual(140);
    expect(completion.choices[0]?.message.content).toBe('late');
  });

  it('paces stream chunks with chunkDelayMs, and delays every reply with latencyMs', async () => {
    server.enqueue({ text: 'a b c d', chunkDelayMs: 40 });
    const arrivals: number[] = [];
    for await (const _chunk of await askStream('go')) arrivals.push(performance.now());
    // Role chunk, four deltas, finish chunk: five pauses between six chunks.
    expect(arrivals).toHaveLength(6);
    expect((arrivals.at(-1) ?? 0) - (arrivals[0] ?? 0)).toBeGreaterThanOrEqual(180);

    const slow = await startScriptedModelServer({ latencyMs: 120 });
    try {
      slow.enqueue({ text: 'slow' });
      const slowClient = new OpenAI({ baseURL: slow.url, apiKey: 'test', maxRetries: 0 });
      const started = performance.now();
      const completion = await slowClient.chat.completions.create({
        model: 'm',
        messages: [{ role: 'user', content: 'hi' }],
      });
      expect(performance.now() - started).toBeGreaterThanOrEqual(110);
      expect(completion.choices[0]?.message.content).toBe('slow');
    } finally {
      await slow.close();
    }
  });

  it('drops the connection mid-stream: the iterator throws after the first chunks', async () => {
    server.enqueue({
      fault: 'drop',
      afterChunks: 3,
      partial: { text: 'one two three four five six seven' },
    });
    const stream = await askStream('go');
    const deltas: string[] = [];
    const error = await caught(
      (async () => {
        for await (const chunk of stream) deltas.push(chunk.choices[0]?.delta.content ?? '');
      })(),
    );
    expect(error).toBeInstanceOf(Error);
    // The role chunk (empty content) and two content deltas arrived before the drop.
    expect(deltas).toEqual(['', 'one', ' two']);
  });

  it('drops a plain request before any byte: an APIConnectionError', async () => {
    server.enqueue({ fault: 'drop' }, { text: 'next' });
    const error = await caught(ask());
    expect(error).toBeInstanceOf(APIConnectionError);
    expect(error).not.toBeInstanceOf(APIConnectionTimeoutError);
    expect((await ask()).choices[0]?.message.content).toBe('next');
  });

  it("cuts a hang with the client's timeout, and close() still returns promptly", async () => {
    server.enqueue({ fault: 'hang' }, { fault: 'hang' });
    const impatient = new OpenAI({
      baseURL: server.url,
      apiKey: 'test',
      maxRetries: 0,
      timeout: 200,
    });
    const started = performance.now();
    const error = await caught(
      impatient.chat.completions.create({
        model: 'gpt-test',
        messages: [{ role: 'user', content: 'hi' }],
      }),
    );
    expect(error).toBeInstanceOf(APIConnectionTimeoutError);
    expect(performance.now() - started).toBeLessThan(2_000);
    // A second request hangs with no client timeout: close() cuts it.
    const pending = caught(ask());
    await expect.poll(() => server.requestCount).toBe(2);
    const closing = performance.now();
    await server.close();
    expect(performance.now() - closing).toBeLessThan(1_000);
    expect(await pending).toBeInstanceOf(APIConnectionError);
  });
});

describe('scripted model server, bookkeeping', () => {
  it('counts requests and records their method, path, headers and bodies', async () => {
    server.script([{ text: 'one' }, { text: 'two' }, { text: 'three' }]);
    await ask('first');
    await ask('second', { temperature: 0.5, tools: [] });
    expect(server.requestCount).toBe(2);
    expect(server.remaining).toBe(1);
    const [a, b] = server.requests;
    expect(a).toMatchObject({
      index: 1,
      method: 'POST',
      path: '/v1/chat/completions',
      model: 'gpt-test',
    });
    expect(a?.headers['authorization']).toBe('Bearer test');
    expect(a?.headers['content-type']).toContain('application/json');
    expect(a?.messages.map((m) => m.content)).toEqual(['You are terse.', 'first']);
    expect(b?.index).toBe(2);
    expect(b?.body).toMatchObject({ temperature: 0.5, tools: [] });
    expect(b?.at).toBeGreaterThanOrEqual(a?.at ?? Infinity);

    server.script([{ text: 'replaced' }]);
    expect(server.remaining).toBe(1);
    expect((await ask()).choices[0]?.message.content).toBe('replaced');

    server.reset();
    expect(server.requestCount).toBe(0);
    expect(server.remaining).toBe(0);
    server.enqueue({ toolCalls: [{ name: 't', arguments: {} }] });
    const again = await ask();
    expect(fnCalls(again.choices[0]?.message.tool_calls)[0]?.id).toBe('call_1');
    expect(server.requests[0]?.index).toBe(1);
  });

  it('answers an empty script with a 500 that names the request, and records it', async () => {
    server.enqueue({ text: 'only one' });
    await ask();
    const error = await caught(ask('what is the capital of France?'));
    expect(error).toBeInstanceOf(InternalServerError);
    expect((error as APIError).message).toContain(
      'scripted model server: no scripted reply left for request #2 (model "gpt-test", last user message "what is the capital of France?")',
    );
    expect((error as APIError).headers?.get('x-should-retry')).toBe('false');
    expect(server.requestCount).toBe(2);
    expect(server.requests[1]?.messages.at(-1)?.content).toBe('what is the capital of France?');
  });

  it('lets a function reply see the request', async () => {
    const seen: RecordedRequest[] = [];
    server.enqueue((request) => {
      seen.push(request);
      const last = request.messages.at(-1);
      return { text: `you said: ${String(last?.content)} (${request.messages.length} messages)` };
    });
    const completion = await ask('ping');
    expect(completion.choices[0]?.message.content).toBe('you said: ping (2 messages)');
    expect(seen).toHaveLength(1);
    expect(seen[0]?.index).toBe(1);
    expect(seen[0]?.model).toBe('gpt-test');
  });

  it('answers a function reply that returns nonsense with a 500 naming the problem', async () => {
    server.enqueue(() => ({ txt: 'typo' }) as never);
    const error = await caught(ask());
    expect(error).toBeInstanceOf(InternalServerError);
    expect((error as APIError).message).toContain('reply of the function for request #1');
    expect((error as APIError).message).toContain('expected `text`, `toolCalls` or `fault`');
  });

  it('answers other paths with a 404 in the OpenAI error shape', async () => {
    const response = await fetch(`${server.url}/models`);
    expect(response.status).toBe(404);
    expect(await response.json()).toEqual({
      error: {
        message:
          'scripted model server: no route for GET /v1/models; only POST /v1/chat/completions is served.',
        type: 'invalid_request_error',
        param: null,
        code: 'unknown_url',
      },
    });
    expect(server.requests[0]).toMatchObject({ method: 'GET', path: '/v1/models' });
  });

  it('refuses an invalid script entry when it is queued, naming the path', () => {
    const bad = (entry: unknown): unknown => {
      try {
        server.enqueue({ text: 'fine' }, entry as never);
        return undefined;
      } catch (e) {
        return e;
      }
    };
    const e1 = bad({ toolCalls: [{ name: '', arguments: 42 }] });
    expect(isFlujoError(e1, ErrorCode.ConfigurationInvalid)).toBe(true);
    expect((e1 as Error).message).toContain('invalid scripted reply #2');
    expect((e1 as Error).message).toContain('toolCalls[0].name');
    expect((e1 as Error).message).toContain(
      'toolCalls[0].arguments: expected an object or a string',
    );
    const e2 = bad({ fault: 'delay', ms: 10, then: { fault: 'status', status: 200 } });
    expect((e2 as Error).message).toContain('then.status');
    const e3 = bad({ fault: 'explode' });
    expect((e3 as Error).message).toContain("expected fault to be one of 'delay'");
    const e4 = bad({ text: 'x', usage: { prompt_tokens: 1 } });
    expect((e4 as Error).message).toContain('usage.completion_tokens');
    // Nothing of a refused call is queued.
    expect(server.remaining).toBe(0);
  });
});

describe('scripted model server, answering forever', () => {
  const tools = [
    {
      type: 'function' as const,
      function: {
        name: 'lookup',
        description: 'Look a word up.',
        parameters: { type: 'object', properties: { word: { type: 'string' } } },
      },
    },
  ];

  it('a default reply function answers every request the queue does not, from the request', async () => {
    const seen: RecordedRequest[] = [];
    const forever = await startScriptedModelServer({
      defaultReply: async (request) => {
        seen.push(request);
        await new Promise((resolve) => setTimeout(resolve, 1));
        const tool = request.tools[0]?.function?.name;
        const answered = request.messages.some((m) => m.role === 'tool');
        if (tool !== undefined && !answered) {
          return { toolCalls: [{ name: tool, arguments: { word: 'durable' } }] };
        }
        return {
          text: `${request.model}: ${String(request.messages.at(-1)?.content)} (${request.messages.length} messages, ${request.tools.length} tools)`,
        };
      },
    });
    const c = new OpenAI({ baseURL: forever.url, apiKey: 'test', maxRetries: 0, timeout: 5_000 });
    try {
      forever.enqueue({ text: 'queued first' });
      const say = (content: string) =>
        c.chat.completions.create({ model: 'm-1', messages: [{ role: 'user', content }] });
      expect((await say('a')).choices[0]?.message.content).toBe('queued first');
      expect(seen).toHaveLength(0);
      // Many more requests than were ever queued: each answered by the function.
      for (let i = 1; i <= 5; i++) {
        expect((await say(`q${i}`)).choices[0]?.message.content).toBe(
          `m-1: q${i} (1 messages, 0 tools)`,
        );
      }
      expect(seen.map((r) => r.index)).toEqual([2, 3, 4, 5, 6]);
      expect(forever.remaining).toBe(0);

      // It sees the tools offered, and the conversation so far.
      const first = await c.chat.completions.create({
        model: 'm-2',
        messages: [{ role: 'user', content: 'define durable' }],
        tools,
      });
      const call = fnCalls(first.choices[0]?.message.tool_calls)[0];
      expect(call?.function).toEqual({ name: 'lookup', arguments: '{"word":"durable"}' });
      expect(seen.at(-1)?.tools).toEqual(tools);
      const second = await c.chat.completions.create({
        model: 'm-2',
        messages: [
          { role: 'user', content: 'define durable' },
          { role: 'assistant', content: null, tool_calls: [call!] },
          { role: 'tool', tool_call_id: call!.id, content: 'lasting' },
        ],
        tools,
      });
      expect(second.choices[0]?.message.content).toBe('m-2: lasting (3 messages, 1 tools)');
      expect(forever.requestCount).toBe(8);

      // reset() keeps it; setDefaultReply(undefined) removes it.
      forever.reset();
      expect((await say('after reset')).choices[0]?.message.content).toBe(
        'm-1: after reset (1 messages, 0 tools)',
      );
      forever.setDefaultReply(undefined);
      const error = await caught(say('nothing left'));
      expect(error).toBeInstanceOf(InternalServerError);
      expect((error as APIError).message).toContain(
        'no scripted reply left for request #2 (model "m-1", last user message "nothing left"); enqueue more replies, or start the server with a defaultReply',
      );
    } finally {
      await forever.close();
    }
  });

  it('a fixed default reply plays again and again, streamed or not', async () => {
    server.setDefaultReply({
      text: 'always this',
      usage: { prompt_tokens: 3, completion_tokens: 2 },
    });
    for (let i = 0; i < 3; i++) {
      const completion = await ask(`n${i}`);
      expect(completion.choices[0]?.message.content).toBe('always this');
      expect(completion.usage).toMatchObject({ prompt_tokens: 3, completion_tokens: 2 });
    }
    let text = '';
    for await (const chunk of await askStream('stream it')) {
      text += chunk.choices[0]?.delta.content ?? '';
    }
    expect(text).toBe('always this');
    expect(server.requestCount).toBe(4);
    expect(server.requests.every((r) => r.answered)).toBe(true);
  });

  it('checks a default reply when it is given, and answers a bad function reply with a 500', async () => {
    const refused = (() => {
      try {
        server.setDefaultReply({ txt: 'typo' } as never);
        return undefined;
      } catch (e) {
        return e;
      }
    })();
    expect(isFlujoError(refused, ErrorCode.ConfigurationInvalid)).toBe(true);
    expect((refused as Error).message).toContain('defaultReply');
    await expect(startScriptedModelServer({ defaultReply: { toolCalls: [] } })).rejects.toThrow(
      /defaultReply/,
    );
    // A function is checked per request: one that throws answers that request with a 500.
    server.setDefaultReply(() => {
      throw new Error('no answer for this');
    });
    const error = await caught(ask());
    expect(error).toBeInstanceOf(InternalServerError);
    expect((error as APIError).message).toContain(
      'the reply function for request #1 failed: no answer for this',
    );
  });
});
