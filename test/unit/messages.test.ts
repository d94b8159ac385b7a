import { describe, expect, it } from 'vitest';
import {
  chatMessageSchema,
  modelReplySchema,
  toolCallsOf,
  type AssistantMessage,
  type ChatMessage,
  type ModelReply,
} from '../../src/llm/messages.js';

const conversation: ChatMessage[] = [
  { role: 'system', content: 'Be brief.' },
  { role: 'user', content: 'Résumé of 東京 in one line 😀, with "quotes", \\ and \u2028.' },
  {
    role: 'assistant',
    content: null,
    tool_calls: [
      { id: 'call_1', name: 'search', arguments: '{"q":"東京 😀"}' },
      { id: 'call_2', name: 'search', arguments: '' },
    ],
  },
  { role: 'tool', tool_call_id: 'call_1', content: '' },
  { role: 'tool', tool_call_id: 'call_2', content: '[1,2]' },
  { role: 'assistant', content: '' },
  { role: 'assistant', content: 'Tokyo: big. 🗼' },
];

describe('wire messages', () => {
  it.each(conversation)('round-trips through JSON to an equal message: %j', (message) => {
    const back = chatMessageSchema.parse(JSON.parse(JSON.stringify(message)));
    expect(back).toStrictEqual(message);
  });

  it('a reply round-trips, with and without usage and request id', () => {
    const replies: ModelReply[] = [
      {
        message: { role: 'assistant', content: 'hi ✓' },
        finishReason: 'stop',
        usage: { promptTokens: 3, completionTokens: 1 },
        model: 'gpt-x',
        requestId: 'req_1',
      },
      {
        message: conversation[2] as AssistantMessage,
        finishReason: 'tool_calls',
        usage: null,
        model: 'm',
      },
    ];
    for (const reply of replies) {
      expect(modelReplySchema.parse(JSON.parse(JSON.stringify(reply)))).toStrictEqual(reply);
    }
  });

  it('refuses what is not a message', () => {
    expect(chatMessageSchema.safeParse({ role: 'tool', content: 'x' }).success).toBe(false);
    expect(chatMessageSchema.safeParse({ role: 'developer', content: 'x' }).success).toBe(false);
    expect(chatMessageSchema.safeParse({ role: 'assistant', content: 1 }).success).toBe(false);
  });

  it('toolCallsOf: none for a final answer', () => {
    expect(toolCallsOf({ role: 'assistant', content: 'done' })).toEqual([]);
    expect(toolCallsOf(conversation[2] as AssistantMessage)).toHaveLength(2);
  });
});
