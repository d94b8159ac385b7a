/**
 * The run page's detail parts, rendered alone: the prompt a granular turn answered, folding of
 * long texts, whole errors and escaping.
 */
import { describe, expect, it } from 'vitest';
import type { ChatMessage } from '../../src/schemas/messages.js';
import {
  block,
  errorHtml,
  eventsHtml,
  MAX_EVENTS_SHOWN,
  promptOf,
} from '../../src/ui/detail-html.js';
import type { StoredRunEvent } from '../../src/persistence/snapshot-store.js';

const history: ChatMessage[] = [
  { role: 'user', content: 'q3 numbers' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'c1', name: 'lookup', arguments: '{}' }] },
  { role: 'tool', tool_call_id: 'c1', content: '3 rows' },
  { role: 'assistant', content: 'Three rows.' },
];

describe('promptOf', () => {
  it('gives each turn the messages before its reply, and the whole history to an uncommitted turn', () => {
    expect(promptOf(history, 0)).toEqual(history.slice(0, 1));
    expect(promptOf(history, 1)).toEqual(history.slice(0, 3));
    expect(promptOf(history.slice(0, 3), 1)).toEqual(history.slice(0, 3));
    expect(promptOf([], 0)).toEqual([]);
  });
});

describe('block', () => {
  it('shows a short text as it is, escaped, and folds a long one closed', () => {
    expect(block('<b>hi</b>', 'x', 'k')).toBe('<pre class="text">&lt;b&gt;hi&lt;/b&gt;</pre>');
    const long = Array.from({ length: 30 }, (_, i) => `line ${i}`).join('\n');
    const folded = block(long, 'reply', 'k"1');
    expect(folded.startsWith('<details data-fold="k&quot;1"><summary>reply')).toBe(true);
    expect(folded).not.toContain(' open');
    expect(folded).toContain('30 lines');
    expect(folded).toContain('line 29');
  });
});

describe('errorHtml', () => {
  it('shows every line of the message, what was thrown, its stack and causes, escaped', () => {
    const html = errorHtml(
      {
        name: 'UnknownError',
        code: 'unknown',
        message: 'first <line>\nsecond line',
        retryable: true,
        thrown: {
          name: 'TypeError',
          message: 'first <line>\nsecond line',
          stack: 'at a (x.ts:1:1)\nat b (x.ts:2:2)',
          causes: [{ name: 'RangeError', message: 'out of range' }],
        },
      },
      'load#1',
    );
    expect(html).toContain('first &lt;line&gt;\nsecond line');
    expect(html).toContain('(thrown: TypeError)');
    expect(html).toContain('at a (x.ts:1:1)\nat b (x.ts:2:2)');
    expect(html).toContain('caused by RangeError');
    expect(html).toContain('out of range');
    expect(html).not.toContain('<line>');
  });
});

describe('eventsHtml', () => {
  it('lists the newest events only past its limit, saying how to read them all', () => {
    const events: StoredRunEvent[] = Array.from({ length: MAX_EVENTS_SHOWN + 5 }, (_, i) => ({
      id: `${i + 1}-0`,
      version: i,
      type: 'step.changed',
      data: { type: 'step.changed', stepId: '<s>', at: 0 },
    }));
    const html = eventsHtml('run-1', events);
    expect(html.match(/<tr data-event=/g)).toHaveLength(MAX_EVENTS_SHOWN);
    expect(html).toContain('data-event="6-0"');
    expect(html).not.toContain('data-event="5-0"');
    expect(html).toContain(`The newest ${MAX_EVENTS_SHOWN} of ${MAX_EVENTS_SHOWN + 5} events`);
    expect(html).toContain('flujo events run-1');
    expect(html).toContain('&lt;s&gt;');
    expect(html).not.toContain('<s>');
  });
});
