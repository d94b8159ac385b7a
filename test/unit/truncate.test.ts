import { describe, expect, it } from 'vitest';
import {
  TRUNCATION_PLACEHOLDER_PATTERN,
  truncateMiddleOut,
  truncationPlaceholder,
} from '../../src/agents/truncate.js';
import type { AssistantMessage, ChatMessage, ToolMessage } from '../../src/llm/messages.js';
import { createTokenCounter } from '../../src/llm/tokens.js';

const sys: ChatMessage = { role: 'system', content: 'S' };
const u = (n: number): ChatMessage => ({ role: 'user', content: `u${n}` });
const a = (n: number): ChatMessage => ({ role: 'assistant', content: `a${n}` });
const calls = (...ids: string[]): AssistantMessage => ({
  role: 'assistant',
  content: null,
  tool_calls: ids.map((id) => ({ id, name: 'search', arguments: `{"q":"${id}"}` })),
});
const t = (id: string): ToolMessage => ({ role: 'tool', tool_call_id: id, content: `r${id}` });

const isPlaceholder = (m: ChatMessage): boolean =>
  m.role === 'system' && TRUNCATION_PLACEHOLDER_PATTERN.test(m.content);
// Every message costs 10, the placeholder 2: budgets read as head + 2 + 10 per kept message.
const ten = (m: ChatMessage): number => (isPlaceholder(m) ? 2 : 10);
const ph = truncationPlaceholder;

describe('truncationPlaceholder', () => {
  it('has fixed text, recognised by the pattern with the exact number', () => {
    expect(ph(3)).toEqual({
      role: 'system',
      content: '... [Context Truncated: 3 messages omitted] ...',
    });
    expect(ph(1).content).toBe('... [Context Truncated: 1 messages omitted] ...');
    expect(TRUNCATION_PLACEHOLDER_PATTERN.exec(ph(1234).content)?.[1]).toBe('1234');
    expect(
      TRUNCATION_PLACEHOLDER_PATTERN.test('x ... [Context Truncated: 3 messages omitted] ...'),
    ).toBe(false);
    expect(
      TRUNCATION_PLACEHOLDER_PATTERN.test('... [Context Truncated: three messages omitted] ...'),
    ).toBe(false);
    expect(TRUNCATION_PLACEHOLDER_PATTERN.test('... [Context Truncated: 3 messages omitted]')).toBe(
      false,
    );
  });
});

describe('truncateMiddleOut', () => {
  it('returns a conversation that fits as it is, in a new array', () => {
    const input = [sys, u(1), a(1), u(2), a(2)];
    for (const maxTokens of [50, 51, Infinity]) {
      const out = truncateMiddleOut(input, { maxTokens, count: ten });
      expect(out).toEqual({ messages: input, omitted: 0, tokens: 50 });
      expect(out.messages).not.toBe(input);
    }
    expect(truncateMiddleOut([], { maxTokens: 0, count: ten })).toEqual({
      messages: [],
      omitted: 0,
      tokens: 0,
    });
  });

  it('keeps the head, a placeholder and the newest that fit, up to the exact budget', () => {
    const input = [sys, u(1), a(1), u(2), a(2), u(3), a(3)];
    const at = (maxTokens: number) => truncateMiddleOut(input, { maxTokens, count: ten });
    expect(at(42)).toEqual({ messages: [sys, u(1), ph(3), u(3), a(3)], omitted: 3, tokens: 42 });
    expect(at(41)).toEqual({ messages: [sys, u(1), ph(4), a(3)], omitted: 4, tokens: 32 });
    expect(at(52)).toEqual({
      messages: [sys, u(1), ph(2), a(2), u(3), a(3)],
      omitted: 2,
      tokens: 52,
    });
    expect(at(62)).toEqual({
      messages: [sys, u(1), ph(1), u(2), a(2), u(3), a(3)],
      omitted: 1,
      tokens: 62,
    });
    // One short of the whole conversation: dropping one message and adding the placeholder fits.
    expect(at(69)).toEqual(at(62));
    expect(at(70).omitted).toBe(0);
  });

  it('without a system message, the head is the first user message', () => {
    const input = [u(1), a(1), u(2), a(2), u(3)];
    expect(truncateMiddleOut(input, { maxTokens: 35, count: ten })).toEqual({
      messages: [u(1), ph(2), a(2), u(3)],
      omitted: 2,
      tokens: 32,
    });
  });

  it('drops what lies between the system message and the first user message, and counts it', () => {
    const input = [
      sys,
      a(0),
      { role: 'system', content: 'extra' } as ChatMessage,
      u(1),
      a(1),
      u(2),
      a(2),
    ];
    expect(truncateMiddleOut(input, { maxTokens: 42, count: ten })).toEqual({
      messages: [sys, u(1), ph(3), u(2), a(2)],
      omitted: 3,
      tokens: 42,
    });
  });

  it('a system message that is not first is part of the middle', () => {
    const note: ChatMessage = { role: 'system', content: 'note' };
    const input = [u(1), note, a(1), a(2)];
    expect(truncateMiddleOut(input, { maxTokens: 22, count: ten })).toEqual({
      messages: [u(1), ph(2), a(2)],
      omitted: 2,
      tokens: 22,
    });
    expect(truncateMiddleOut(input, { maxTokens: 39, count: ten }).messages).toEqual([
      u(1),
      ph(1),
      a(1),
      a(2),
    ]);
  });

  it('without any user message, the head is the system message alone, or nothing', () => {
    expect(truncateMiddleOut([sys, a(1), a(2), a(3)], { maxTokens: 32, count: ten })).toEqual({
      messages: [sys, ph(1), a(2), a(3)],
      omitted: 1,
      tokens: 32,
    });
    expect(truncateMiddleOut([a(1), a(2), a(3), a(4)], { maxTokens: 25, count: ten })).toEqual({
      messages: [ph(2), a(3), a(4)],
      omitted: 2,
      tokens: 22,
    });
  });

  it('keeps parallel tool calls and their results together, or drops them together', () => {
    const input = [sys, u(1), calls('c1', 'c2'), t('c1'), t('c2'), a(1)];
    // The unit [calls, t1, t2] costs 30: at 52 the tail could hold [t1, t2, a1], but not the unit.
    for (const maxTokens of [32, 42, 52, 59]) {
      expect(truncateMiddleOut(input, { maxTokens, count: ten })).toEqual({
        messages: [sys, u(1), ph(3), a(1)],
        omitted: 3,
        tokens: 32,
      });
    }
    expect(truncateMiddleOut(input, { maxTokens: 31, count: ten })).toEqual({
      messages: [sys, u(1), ph(4)],
      omitted: 4,
      tokens: 22,
    });
    expect(truncateMiddleOut([...input, u(2)], { maxTokens: 62, count: ten })).toEqual({
      messages: [sys, u(1), ph(3), a(1), u(2)],
      omitted: 3,
      tokens: 42,
    });
  });

  it('a kept unit brings all its results; the tail never starts with a tool message', () => {
    const input = [u(1), a(1), calls('c1'), t('c1'), calls('c2', 'c3'), t('c2'), t('c3'), a(2)];
    const at = (maxTokens: number) => truncateMiddleOut(input, { maxTokens, count: ten });
    expect(at(22).messages).toEqual([u(1), ph(6), a(2)]);
    expect(at(51).messages).toEqual([u(1), ph(6), a(2)]);
    expect(at(52)).toEqual({
      messages: [u(1), ph(3), calls('c2', 'c3'), t('c2'), t('c3'), a(2)],
      omitted: 3,
      tokens: 52,
    });
    expect(at(71).messages).toEqual(at(52).messages);
    expect(at(72)).toEqual({
      messages: [u(1), ph(1), calls('c1'), t('c1'), calls('c2', 'c3'), t('c2'), t('c3'), a(2)],
      omitted: 1,
      tokens: 72,
    });
  });

  it('never keeps a tool message that has no call before it in the tail', () => {
    // Malformed: a result right after the first user message. It can only be dropped.
    const input = [u(1), t('x'), a(1)];
    expect(truncateMiddleOut(input, { maxTokens: 29, count: ten })).toEqual({
      messages: [u(1), ph(1), a(1)],
      omitted: 1,
      tokens: 22,
    });
  });

  it('keeps the head and the placeholder alone when nothing else fits, even over budget', () => {
    const input = [sys, u(1), a(1), u(2)];
    for (const maxTokens of [0, 5, 22, 31]) {
      expect(truncateMiddleOut(input, { maxTokens, count: ten })).toEqual({
        messages: [sys, u(1), ph(2)],
        omitted: 2,
        tokens: 22,
      });
    }
  });

  it('returns a conversation that is only its head as it is, even over budget', () => {
    expect(truncateMiddleOut([sys, u(1)], { maxTokens: 5, count: ten })).toEqual({
      messages: [sys, u(1)],
      omitted: 0,
      tokens: 20,
    });
    expect(truncateMiddleOut([u(1)], { maxTokens: 0, count: ten })).toEqual({
      messages: [u(1)],
      omitted: 0,
      tokens: 10,
    });
  });

  it('budgets the placeholder for the number it will carry', () => {
    // The placeholder costs one token per digit of N: 10 omitted cost 2, 9 omitted cost 1.
    const digits = (m: ChatMessage): number =>
      isPlaceholder(m)
        ? String(TRUNCATION_PLACEHOLDER_PATTERN.exec(m.content ?? '')?.[1]).length
        : 10;
    const input = [u(0), ...Array.from({ length: 11 }, (_, i) => a(i + 1))];
    expect(truncateMiddleOut(input, { maxTokens: 31, count: digits })).toEqual({
      messages: [u(0), ph(9), a(10), a(11)],
      omitted: 9,
      tokens: 10 + 1 + 20,
    });
    expect(truncateMiddleOut(input, { maxTokens: 30, count: digits })).toEqual({
      messages: [u(0), ph(10), a(11)],
      omitted: 10,
      tokens: 10 + 2 + 10,
    });
  });

  it('holds its invariants at every budget', () => {
    const input = [
      sys,
      a(0),
      u(1),
      calls('c1', 'c2'),
      t('c1'),
      t('c2'),
      a(1),
      u(2),
      calls('c3'),
      t('c3'),
      a(2),
      u(3),
    ];
    const count = (m: ChatMessage): number =>
      isPlaceholder(m)
        ? 4
        : 1 +
          (m.content?.length ?? 0) +
          (m.role === 'assistant' ? (m.tool_calls?.length ?? 0) * 5 : 0);
    const total = input.reduce((s, m) => s + count(m), 0);
    for (let maxTokens = 0; maxTokens <= total + 1; maxTokens++) {
      const out = truncateMiddleOut(input, { maxTokens, count });
      expect(out.tokens).toBe(out.messages.reduce((s, m) => s + count(m), 0));
      if (out.omitted === 0) {
        expect(out.messages).toEqual(input);
        expect(maxTokens).toBeGreaterThanOrEqual(total);
        continue;
      }
      const [first, second, placeholder, ...tail] = out.messages;
      expect([first, second]).toEqual([sys, u(1)]);
      expect(placeholder).toEqual(ph(out.omitted));
      expect(out.omitted).toBe(input.length - 2 - tail.length);
      expect(tail).toEqual(input.slice(input.length - tail.length));
      expect(tail[0]?.role).not.toBe('tool');
      if (tail.length > 0) expect(out.tokens).toBeLessThanOrEqual(maxTokens);
      // The next older unit would not have fit.
      const start = input.length - tail.length;
      let unitStart = start - 1;
      while (input[unitStart]?.role === 'tool') unitStart--;
      if (unitStart > 2) {
        const grown = input.slice(unitStart, start).reduce((s, m) => s + count(m), 0);
        const omitted = out.omitted - (start - unitStart);
        expect(out.tokens - count(ph(out.omitted)) + count(ph(omitted)) + grown).toBeGreaterThan(
          maxTokens,
        );
      }
    }
  });

  it('is deterministic and leaves its input alone', () => {
    const input = [sys, u(1), calls('c1'), t('c1'), a(1), u(2), a(2)];
    const frozen = Object.freeze(input.map((m) => Object.freeze(structuredClone(m))));
    const before = structuredClone(frozen);
    const counter = createTokenCounter('gpt-4o');
    const run = () => truncateMiddleOut(frozen, { maxTokens: 40, count: counter.countMessage });
    const first = run();
    expect(run()).toEqual(first);
    expect(frozen).toEqual(before);
    // With gpt-4o's counts: head 5 + 6, placeholder 16, u2 and a2 6 each; a1 would make 45.
    expect(first).toEqual({
      messages: [frozen[0], frozen[1], ph(3), frozen[5], frozen[6]],
      omitted: 3,
      tokens: 39,
    });
    expect(first.messages[0]).toBe(frozen[0]);
  });
});
