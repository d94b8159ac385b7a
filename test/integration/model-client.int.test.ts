import { APIUserAbortError } from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineAgent, type AgentSpec } from '../../src/agents/define-agent.js';
import { ConfigurationError, ModelError } from '../../src/errors.js';
import { createModelClient } from '../../src/llm/openai-client.js';
import type { ChatMessage } from '../../src/llm/messages.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { defineTool } from '../../src/tools/define-tool.js';

const KEY = 'sk-test-very-secret-key';
const search = defineTool({
  name: 'search',
  description: 'Searches the corpus',
  input: z.object({ q: z.string(), limit: z.number().int().optional() }),
  class: 'read_only',
  run: () => [],
});
const question: ChatMessage[] = [{ role: 'user', content: 'What is Redis?' }];

let server: ScriptedModelServer;
beforeAll(async () => {
  server = await startScriptedModelServer();
});
afterEach(() => server.reset());
afterAll(() => server.close());

const agent = (over: Partial<AgentSpec> = {}) =>
  defineAgent({
    name: 'researcher',
    model: 'gpt-scripted',
    provider: { baseURL: server.url, apiKey: KEY },
    systemPrompt: 'You research.',
    tools: [search],
    settings: { temperature: 0, maxTokens: 100, seed: 3 },
    ...over,
  });

async function failure(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error('expected the call to fail');
}

async function modelError(promise: Promise<unknown>): Promise<ModelError> {
  const error = await failure(promise);
  expect(error).toBeInstanceOf(ModelError);
  expect(JSON.stringify(error) + String((error as Error).message)).not.toContain(KEY);
  return error as ModelError;
}

describe.each([false, true])('model client (stream: %s)', (stream) => {
  it('a text reply, with the request the SDK sent', async () => {
    server.enqueue({
      text: 'Redis is an in-memory store. ✓',
      usage: { prompt_tokens: 11, completion_tokens: 7 },
    });
    const reply = await createModelClient(agent({ stream })).complete({ messages: question });
    expect(reply).toMatchObject({
      message: { role: 'assistant', content: 'Redis is an in-memory store. ✓' },
      finishReason: 'stop',
      usage: { promptTokens: 11, completionTokens: 7 },
      model: 'gpt-scripted',
    });
    expect(reply.message.tool_calls).toBeUndefined();
    const [sent] = server.requests;
    expect(sent?.headers['authorization']).toBe(`Bearer ${KEY}`);
    expect(sent?.body).toMatchObject({
      model: 'gpt-scripted',
      messages: [
        { role: 'system', content: 'You research.' },
        { role: 'user', content: 'What is Redis?' },
      ],
      temperature: 0,
      max_completion_tokens: 100,
      seed: 3,
      tools: [
        {
          type: 'function',
          function: {
            name: 'search',
            description: 'Searches the corpus',
            parameters: { type: 'object', required: ['q'] },
          },
        },
      ],
      ...(stream ? { stream: true, stream_options: { include_usage: true } } : {}),
    });
  });

  it('parallel tool calls whose arguments parse, then a round trip of the history', async () => {
    server.enqueue({
      toolCalls: [
        { id: 'call_a', name: 'search', arguments: { q: 'redis', limit: 2 } },
        { id: 'call_b', name: 'search', arguments: { q: '東京 😀' } },
      ],
    });
    const client = createModelClient(agent({ stream }));
    const first = await client.complete({ messages: question });
    expect(first.finishReason).toBe('tool_calls');
    const calls = first.message.tool_calls ?? [];
    expect(calls.map((c) => [c.id, c.name])).toEqual([
      ['call_a', 'search'],
      ['call_b', 'search'],
    ]);
    expect(calls.map((c) => search.input.parse(JSON.parse(c.arguments)))).toEqual([
      { q: 'redis', limit: 2 },
      { q: '東京 😀' },
    ]);
    // The journaled reply, read back from JSON, is what the next call sends.
    const history: ChatMessage[] = [
      ...question,
      JSON.parse(JSON.stringify(first.message)) as ChatMessage,
      { role: 'tool', tool_call_id: 'call_a', content: '["r1"]' },
      { role: 'tool', tool_call_id: 'call_b', content: '[]' },
    ];
    server.enqueue({ text: 'Done.' });
    const second = await client.complete({ messages: history });
    expect(second.message).toEqual({ role: 'assistant', content: 'Done.' });
    expect(server.requests[1]?.messages.slice(2)).toEqual([
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          {
            id: 'call_a',
            type: 'function',
            function: { name: 'search', arguments: '{"q":"redis","limit":2}' },
          },
          {
            id: 'call_b',
            type: 'function',
            function: { name: 'search', arguments: '{"q":"東京 😀"}' },
          },
        ],
      },
      { role: 'tool', tool_call_id: 'call_a', content: '["r1"]' },
      { role: 'tool', tool_call_id: 'call_b', content: '[]' },
    ]);
  });

  it('429 with retry-after → retryable rate_limit with retryAfterMs', async () => {
    server.enqueue({ fault: 'status', status: 429, retryAfter: 2 });
    const e = await modelError(
      createModelClient(agent({ stream })).complete({ messages: question }),
    );
    expect([e.kind, e.status, e.retryable, e.retryAfterMs]).toEqual([
      'rate_limit',
      429,
      true,
      2000,
    ]);
  });

  it('500 → retryable server error', async () => {
    server.enqueue({ fault: 'status', status: 500 });
    const e = await modelError(
      createModelClient(agent({ stream })).complete({ messages: question }),
    );
    expect([e.kind, e.status, e.retryable]).toEqual(['server', 500, true]);
  });

  it('401 → final auth error with the fix, without the key', async () => {
    server.enqueue({ fault: 'status', status: 401, message: `Incorrect API key provided: ${KEY}` });
    const e = await modelError(
      createModelClient(agent({ stream })).complete({ messages: question }),
    );
    expect([e.kind, e.status, e.retryable]).toEqual(['auth', 401, false]);
    expect(e.message).toContain("set OPENAI_API_KEY (or the agent's provider.apiKey)");
  });

  it('404 → final, names the model', async () => {
    server.enqueue({ fault: 'status', status: 404, message: 'The model does not exist' });
    const e = await modelError(
      createModelClient(agent({ stream })).complete({ messages: question }),
    );
    expect([e.kind, e.retryable]).toEqual(['not_found', false]);
    expect(e.message).toContain(`model "gpt-scripted" not found at ${server.url}`);
  });

  it('a hang → retryable timeout', async () => {
    server.enqueue({ fault: 'hang' });
    const started = Date.now();
    const e = await modelError(
      createModelClient(agent({ stream, timeoutMs: 150 })).complete({ messages: question }),
    );
    expect([e.kind, e.retryable]).toEqual(['timeout', true]);
    expect(Date.now() - started).toBeLessThan(5000);
  });

  it('a dropped connection → retryable connection error', async () => {
    server.enqueue({ fault: 'drop' });
    const e = await modelError(
      createModelClient(agent({ stream })).complete({ messages: question }),
    );
    expect([e.kind, e.retryable]).toEqual(['connection', true]);
  });

  it('an abort through the signal → the abort error, not a ModelError', async () => {
    server.enqueue({ fault: 'hang' });
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 50);
    const error = await failure(
      createModelClient(agent({ stream })).complete({
        messages: question,
        signal: controller.signal,
      }),
    );
    expect(error).toBeInstanceOf(APIUserAbortError);
    expect(error).not.toBeInstanceOf(ModelError);
  });
});

describe('streaming', () => {
  it('delivers deltas to onChunk; the final message is their concatenation', async () => {
    const text = 'Redis keeps data in memory, 東京 😀, and persists it with AOF.';
    server.enqueue({ text, chunkDelayMs: 5 });
    const chunks: string[] = [];
    const reply = await createModelClient(agent({ stream: true })).complete({
      messages: question,
      onChunk: (delta) => chunks.push(delta),
    });
    expect(chunks.length).toBeGreaterThan(1);
    expect(chunks.join('')).toBe(text);
    expect(reply.message).toEqual({ role: 'assistant', content: text });
    expect(reply.usage).not.toBeNull();
  });

  it('a connection dropped mid-stream → retryable connection error', async () => {
    server.enqueue({ fault: 'drop', afterChunks: 3 });
    const chunks: string[] = [];
    const e = await modelError(
      createModelClient(agent({ stream: true })).complete({
        messages: question,
        onChunk: (d) => chunks.push(d),
      }),
    );
    expect([e.kind, e.retryable]).toEqual(['connection', true]);
    expect(chunks.length).toBeGreaterThan(0);
  });

  it('a stream that stalls between chunks → retryable timeout', async () => {
    server.enqueue({ text: 'one two three four', chunkDelayMs: 1000 });
    const e = await modelError(
      createModelClient(agent({ stream: true, timeoutMs: 150 })).complete({ messages: question }),
    );
    expect([e.kind, e.retryable]).toEqual(['timeout', true]);
  });

  it('an abort in the middle of a stream → the abort error', async () => {
    server.enqueue({ text: 'one two three four five six', chunkDelayMs: 50 });
    const controller = new AbortController();
    const error = await failure(
      createModelClient(agent({ stream: true })).complete({
        messages: question,
        signal: controller.signal,
        onChunk: () => controller.abort(),
      }),
    );
    expect(error).toBeInstanceOf(APIUserAbortError);
  });
  it('an onChunk that throws ends the call with its own error', async () => {
    server.enqueue({ text: 'one two three four five six', chunkDelayMs: 20 });
    const boom = new Error('display gone');
    const error = await failure(
      createModelClient(agent({ stream: true })).complete({
        messages: question,
        onChunk: () => {
          throw boom;
        },
      }),
    );
    expect(error).toBe(boom);
  });
});

describe('API key', () => {
  it('a function key is read at call time', async () => {
    let key = 'first-key';
    const client = createModelClient(
      agent({ provider: { baseURL: server.url, apiKey: () => key } }),
    );
    server.enqueue({ text: 'a' }, { text: 'b' });
    await client.complete({ messages: question });
    key = 'second-key';
    await client.complete({ messages: question });
    expect(server.requests.map((r) => r.headers['authorization'])).toEqual([
      'Bearer first-key',
      'Bearer second-key',
    ]);
  });

  it('defaults to OPENAI_API_KEY; none at all is a ConfigurationError before any request', async () => {
    const keyless = agent({ provider: { baseURL: server.url } });
    server.enqueue({ text: 'a' });
    await createModelClient(keyless, { env: { OPENAI_API_KEY: 'env-key' } }).complete({
      messages: question,
    });
    expect(server.requests[0]?.headers['authorization']).toBe('Bearer env-key');
    const error = await failure(
      createModelClient(keyless, { env: {} }).complete({ messages: question }),
    );
    expect(error).toBeInstanceOf(ConfigurationError);
    expect((error as Error).message).toMatch(/set OPENAI_API_KEY/);
    expect(server.requestCount).toBe(1);
  });
});

describe('unreachable provider', () => {
  it('connection refused → retryable connection error naming the URL', async () => {
    const gone = await startScriptedModelServer();
    const url = gone.url;
    await gone.close();
    const e = await modelError(
      createModelClient(agent({ provider: { baseURL: url, apiKey: KEY } })).complete({
        messages: question,
      }),
    );
    expect([e.kind, e.retryable]).toEqual(['connection', true]);
    expect(e.message).toContain(url);
  });
});

describe('the fetch a client sends with', () => {
  // Node's fetch (undici) adds these to every request; the node:http fetch adds neither.
  const sentByNodeFetch = (index: number): boolean => {
    const headers = server.requests[index]?.headers ?? {};
    return headers['sec-fetch-mode'] === 'cors' && headers['accept-encoding'] !== undefined;
  };

  it('a plain call goes over node:http while globalThis.fetch is the one Node started with; a stream does not', async () => {
    server.enqueue({ text: 'plain' }, { text: 'streamed' });
    await createModelClient(agent()).complete({ messages: question });
    await createModelClient(agent({ stream: true })).complete({ messages: question });
    expect(server.requests).toHaveLength(2);
    expect(server.requests[0]?.headers['accept-encoding']).toBeUndefined();
    expect(server.requests[0]?.headers['connection']).toBe('keep-alive');
    expect(sentByNodeFetch(0)).toBe(false);
    expect(sentByNodeFetch(1)).toBe(true);
  });

  it('a replaced globalThis.fetch sees every request, plain or streamed', async () => {
    const realFetch = globalThis.fetch;
    const seen: string[] = [];
    globalThis.fetch = (input, init) => {
      seen.push(String(input instanceof Request ? input.url : input));
      return realFetch(input, init);
    };
    try {
      server.enqueue({ text: 'a' }, { text: 'b' }, { text: 'c' });
      const plain = createModelClient(agent());
      await plain.complete({ messages: question });
      await plain.complete({ messages: question });
      await createModelClient(agent({ stream: true })).complete({ messages: question });
    } finally {
      globalThis.fetch = realFetch;
    }
    expect(seen).toEqual(Array(3).fill(`${server.url}/chat/completions`));
    expect([0, 1, 2].map(sentByNodeFetch)).toEqual([true, true, true]);
  });

  it('a fetch given in the options is the one used, for plain calls and streams', async () => {
    let calls = 0;
    const fetch: typeof globalThis.fetch = (input, init) => {
      calls++;
      return globalThis.fetch(input, init);
    };
    server.enqueue({ text: 'a' }, { text: 'b' });
    await createModelClient(agent(), { fetch }).complete({ messages: question });
    await createModelClient(agent({ stream: true }), { fetch }).complete({ messages: question });
    expect(calls).toBe(2);
    expect([0, 1].map(sentByNodeFetch)).toEqual([true, true]);
  });
});
