import { describe, expect, it, vi } from 'vitest';
import type { ChatMessage } from '../../src/llm/messages.js';
import { stripProviderPrefix } from '../../src/llm/model-name.js';
import {
  CHARS_PER_TOKEN,
  DEFAULT_OUTPUT_TOKENS,
  LONG_PIECE_CHARS,
  REPLY_PRIMING_TOKENS,
  TOKENS_PER_MESSAGE,
  TOKENS_PER_TOOL_CALL,
  createTokenCounter,
  encoderFor,
  encodingForModel,
  estimateRequest,
} from '../../src/llm/tokens.js';

const system: ChatMessage = { role: 'system', content: 'You are a helpful assistant.' };
const user: ChatMessage = { role: 'user', content: 'What is the weather in Paris?' };
const call: ChatMessage = {
  role: 'assistant',
  content: null,
  tool_calls: [{ id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' }],
};
const parallel: ChatMessage = {
  role: 'assistant',
  content: null,
  tool_calls: [
    { id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { id: 'call_2', name: 'get_weather', arguments: '{"city":"Tokyo","unit":"celsius"}' },
  ],
};
const result: ChatMessage = { role: 'tool', tool_call_id: 'call_1', content: '18°C, sunny' };
const answer: ChatMessage = { role: 'assistant', content: 'It is 18°C and sunny in Paris.' };
const toolsJson =
  '[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]';

describe('encodingForModel', () => {
  it.each([
    ['gpt-4o', 'o200k_base'],
    ['gpt-4o-mini', 'o200k_base'],
    ['gpt-4o-mini-2024-07-18', 'o200k_base'],
    ['chatgpt-4o-latest', 'o200k_base'],
    ['gpt-4.1', 'o200k_base'],
    ['gpt-4.1-nano-2025-04-14', 'o200k_base'],
    ['gpt-4.5-preview', 'o200k_base'],
    ['gpt-5', 'o200k_base'],
    ['gpt-5-mini', 'o200k_base'],
    ['gpt-5.1', 'o200k_base'],
    ['o1', 'o200k_base'],
    ['o1-mini', 'o200k_base'],
    ['o3-mini-2025-01-31', 'o200k_base'],
    ['o4-mini', 'o200k_base'],
    ['gpt-4', 'cl100k_base'],
    ['gpt-4-0613', 'cl100k_base'],
    ['gpt-4-32k', 'cl100k_base'],
    ['gpt-4-turbo', 'cl100k_base'],
    ['gpt-4-turbo-2024-04-09', 'cl100k_base'],
    ['gpt-3.5-turbo', 'cl100k_base'],
    ['gpt-3.5-turbo-0125', 'cl100k_base'],
    ['text-embedding-3-small', 'cl100k_base'],
    ['text-embedding-ada-002', 'cl100k_base'],
    ['openai/gpt-4o', 'o200k_base'],
    ['openai/gpt-4', 'cl100k_base'],
    ['openrouter/openai/o3', 'o200k_base'],
  ])('%s → %s', (model, encoding) => {
    expect(encodingForModel(model)).toBe(encoding);
  });

  it.each([
    'claude-3-5-sonnet-20241022',
    'llama-3.1-70b',
    'gpt-40',
    'gpt-4x',
    'gpt-3.5',
    'o1x',
    'o2',
    'davinci-002',
    'GPT-4o',
    'gpt-4o/custom',
    '',
  ])('%j has no bundled encoding', (model) => {
    expect(encodingForModel(model)).toBeNull();
  });

  it('strips everything up to the last slash as the provider prefix', () => {
    expect(stripProviderPrefix('openai/gpt-4o')).toBe('gpt-4o');
    expect(stripProviderPrefix('openrouter/openai/gpt-4o')).toBe('gpt-4o');
    expect(stripProviderPrefix('gpt-4o')).toBe('gpt-4o');
    expect(stripProviderPrefix('gpt-4o/')).toBe('');
  });
});

describe('createTokenCounter: bundled encodings', () => {
  const o200k = createTokenCounter('gpt-4o');
  const cl100k = createTokenCounter('gpt-4');

  it('describes itself', () => {
    expect([o200k.model, o200k.encoding, o200k.exact]).toEqual(['gpt-4o', 'o200k_base', true]);
    expect([cl100k.model, cl100k.encoding, cl100k.exact]).toEqual(['gpt-4', 'cl100k_base', true]);
    const routed = createTokenCounter('openai/gpt-4o-mini');
    expect([routed.model, routed.encoding]).toEqual(['openai/gpt-4o-mini', 'o200k_base']);
  });

  // Computed once with js-tiktoken's bundled ranks and pinned.
  it.each([
    ['', 0, 0],
    ['hello world', 2, 2],
    ['The quick brown fox jumps over the lazy dog.', 10, 10],
    ['Résumé of 東京 in one line 😀', 7, 11],
    ['{"q":"東京 😀","limit":3}', 10, 12],
    ['{"city":"Tokyo","unit":"celsius"}', 10, 11],
    ['You are a helpful assistant.', 6, 6],
    ['What is the weather in Paris?', 7, 7],
    ['get_weather', 2, 2],
    [toolsJson, 34, 34],
    ['assistant', 1, 1],
    ['tool', 1, 1],
  ])('countText(%j) is %i (o200k_base) and %i (cl100k_base)', (text, o, c) => {
    expect(o200k.countText(text)).toBe(o);
    expect(cl100k.countText(text)).toBe(c);
  });

  it('counts special-token spellings as plain text, without throwing', () => {
    expect(o200k.countText('<|endoftext|>')).toBe(7);
    expect(cl100k.countText('<|endoftext|>')).toBe(7);
  });

  it('counts messages in the chat format: framing, role, content, tool calls', () => {
    expect([TOKENS_PER_MESSAGE, TOKENS_PER_TOOL_CALL, REPLY_PRIMING_TOKENS]).toEqual([3, 3, 3]);
    expect(o200k.countMessage(system)).toBe(3 + 1 + 6);
    expect(o200k.countMessage(user)).toBe(3 + 1 + 7);
    expect(o200k.countMessage(call)).toBe(3 + 1 + (3 + 2 + 5));
    expect(o200k.countMessage(parallel)).toBe(3 + 1 + (3 + 2 + 5) + (3 + 2 + 10));
    expect(cl100k.countMessage(parallel)).toBe(3 + 1 + (3 + 2 + 5) + (3 + 2 + 11));
    expect(o200k.countMessage(result)).toBe(3 + 1 + 4);
    expect(o200k.countMessage(answer)).toBe(3 + 1 + 10);
    expect(o200k.countMessage({ role: 'assistant', content: '' })).toBe(4);
  });

  it('does not count tool call ids', () => {
    const longId: ChatMessage = { ...result, tool_call_id: 'call_' + 'x'.repeat(40) };
    expect(o200k.countMessage(longId)).toBe(o200k.countMessage(result));
  });

  it('adds the reply priming to a conversation, even an empty one', () => {
    expect(o200k.countMessages([])).toBe(3);
    expect(o200k.countMessages([system, user, call, result, answer])).toBe(
      10 + 11 + 14 + 8 + 14 + 3,
    );
    expect(cl100k.countMessages([system, user, call, result, answer])).toBe(60);
  });

  it('is deterministic across counters of one encoding', () => {
    const again = createTokenCounter('gpt-4o-2024-08-06');
    const text = 'Résumé of 東京 in one line 😀';
    expect(again.countText(text)).toBe(o200k.countText(text));
    expect(again.countMessages([system, parallel])).toBe(o200k.countMessages([system, parallel]));
  });

  it('builds one encoder per encoding and shares it between counters', () => {
    const encoder = encoderFor('o200k_base');
    expect(encoderFor('o200k_base')).toBe(encoder);
    expect(encoderFor('cl100k_base')).not.toBe(encoder);
    const spy = vi.spyOn(encoder, 'encode');
    try {
      createTokenCounter('o3').countText('hello world');
      createTokenCounter('gpt-5').countText('hello world');
      expect(spy).toHaveBeenCalledTimes(2);
    } finally {
      spy.mockRestore();
    }
  });

  it(`counts pieces longer than ${LONG_PIECE_CHARS} characters in slices`, () => {
    expect(LONG_PIECE_CHARS).toBe(64);
    // At the limit and just past it, and the same counts as one piece would give.
    expect(o200k.countText('東'.repeat(64))).toBe(64);
    expect(o200k.countText('東'.repeat(65))).toBe(65);
    expect(cl100k.countText('東'.repeat(65))).toBe(130);
    expect(o200k.countText('x'.repeat(200))).toBe(25);
    // A cut may shift the count: one piece of this text would be 29 tokens.
    const text = `ab ${'x'.repeat(200)} cd`;
    expect(encoderFor('o200k_base').encode(text, [], []).length).toBe(29);
    expect(o200k.countText(text)).toBe(30);
    expect(cl100k.countText(text)).toBe(29);
    // Never inside a surrogate pair: cut at 64 code units, this piece would count 42.
    expect(o200k.countText('-' + '😀'.repeat(40))).toBe(41);
  });

  it('counts a long piece in linear time', () => {
    // As one piece this takes tens of seconds in js-tiktoken.
    expect(o200k.countText('東'.repeat(5000))).toBe(5000);
  }, 10_000);
});

describe('createTokenCounter: character heuristic', () => {
  it('counts ceil(characters / 4) and reports it once, at creation', () => {
    const onHeuristic = vi.fn();
    const counter = createTokenCounter('llama-3.1-70b', { onHeuristic });
    expect(onHeuristic).toHaveBeenCalledTimes(1);
    expect(onHeuristic).toHaveBeenCalledWith({
      model: 'llama-3.1-70b',
      reason:
        'no bundled tokenizer for model "llama-3.1-70b": tokens are estimated as ceil(characters / 4)',
    });
    expect([counter.encoding, counter.exact, CHARS_PER_TOKEN]).toEqual([null, false, 4]);
    expect(['', 'a', 'abcd', 'abcde', 'hello world'].map(counter.countText)).toEqual([
      0, 1, 1, 2, 3,
    ]);
    expect(counter.countMessage({ role: 'user', content: 'hello world' })).toBe(3 + 1 + 3);
    expect(
      counter.countMessage({
        role: 'assistant',
        content: null,
        tool_calls: [{ id: 'c', name: 'search', arguments: '{"q":"x"}' }],
      }),
    ).toBe(3 + 3 + (3 + 2 + 3));
    expect(counter.countMessages([{ role: 'user', content: 'hello world' }])).toBe(10);
    expect(onHeuristic).toHaveBeenCalledTimes(1);
  });

  it('never reports for a known model, and each heuristic counter reports once', () => {
    const onHeuristic = vi.fn();
    createTokenCounter('gpt-4o', { onHeuristic }).countText('hello');
    expect(onHeuristic).not.toHaveBeenCalled();
    createTokenCounter('mistral-large', { onHeuristic });
    createTokenCounter('mistral-large', { onHeuristic });
    expect(onHeuristic).toHaveBeenCalledTimes(2);
    expect(createTokenCounter('mistral-large').countText('x'.repeat(401))).toBe(101);
  });
});

describe('estimateRequest', () => {
  const counter = createTokenCounter('gpt-4o');

  it('counts the system prompt, the messages with priming and the tools JSON', () => {
    expect(
      estimateRequest({
        counter,
        systemPrompt: 'You are a helpful assistant.',
        messages: [user],
        toolsJson,
      }),
    ).toEqual({ inputTokens: 10 + (11 + 3) + 34, outputTokens: 1024 });
    expect(DEFAULT_OUTPUT_TOKENS).toBe(1024);
  });

  it('skips an empty system prompt and absent tools', () => {
    expect(estimateRequest({ counter, systemPrompt: '', messages: [user] })).toEqual({
      inputTokens: 14,
      outputTokens: 1024,
    });
    expect(estimateRequest({ counter, systemPrompt: '', messages: [] }).inputTokens).toBe(3);
  });

  it('buffers maxOutputTokens when set, else defaultOutputTokens', () => {
    const base = { counter, systemPrompt: '', messages: [user] };
    expect(estimateRequest({ ...base, maxOutputTokens: 200 }).outputTokens).toBe(200);
    expect(estimateRequest({ ...base, defaultOutputTokens: 500 }).outputTokens).toBe(500);
    expect(
      estimateRequest({ ...base, maxOutputTokens: 200, defaultOutputTokens: 500 }).outputTokens,
    ).toBe(200);
    expect(estimateRequest({ ...base, maxOutputTokens: 0 }).outputTokens).toBe(0);
  });

  it('uses the counter it is given: the heuristic for unknown models', () => {
    const heuristic = createTokenCounter('local-model');
    expect(
      estimateRequest({ counter: heuristic, systemPrompt: 'abcd', messages: [], toolsJson: 'ab' }),
    ).toEqual({ inputTokens: 3 + 2 + 1 + 3 + 1, outputTokens: 1024 });
  });
});
