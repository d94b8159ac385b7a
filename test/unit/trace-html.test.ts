/**
 * `renderTraceHtml` as text: the trace travels as JSON inside a script element that nothing in the
 * data can close, and the page needs nothing from elsewhere.
 */
import { describe, expect, it } from 'vitest';
import type { RunTrace } from '../../src/observability/run-trace.js';
import { renderTraceHtml } from '../../src/observability/trace-html.js';

const hostile = '</script><script>window.pwned = 1</script><!--';

const trace: RunTrace = {
  version: 1,
  runId: 'r<1>',
  planName: `plan ${hostile}`,
  tenantId: 't&t',
  status: 'failed',
  traceId: null,
  start: 1_700_000_000_000,
  end: 1_700_000_000_050,
  steps: [
    {
      stepId: hostile,
      kind: 'operator',
      status: 'FAILED',
      attempts: [
        {
          attempt: 1,
          start: 1_700_000_000_000,
          end: 1_700_000_000_050,
          outcome: 'failed',
          error: { code: 'x', message: `\u2028${hostile}`, retryable: false },
          workers: [],
          takeovers: [],
          turns: [],
          modelCalls: [],
          toolCalls: [],
          waits: [],
        },
      ],
      waits: [],
      skipped: null,
    },
  ],
};

describe('renderTraceHtml', () => {
  const html = renderTraceHtml(trace);

  it('keeps the data inside its script element, escaped, and gives it back unchanged', () => {
    expect(html.match(/<\/script>/g)).toHaveLength(2);
    expect(html).not.toContain('window.pwned = 1</script>');
    const json = /<script type="application\/json" id="trace">([^<]*)<\/script>/.exec(html)?.[1];
    expect(JSON.parse(json!)).toEqual(trace);
  });

  it('escapes what it writes as HTML, and loads nothing from elsewhere', () => {
    expect(html).toContain('<title>Run r&lt;1&gt; · flujo trace</title>');
    expect(html).toContain('tenant <b>t&amp;t</b>');
    expect(html).not.toMatch(/<(script|link|img|iframe)[^>]+(src|href)=/i);
    expect(html).not.toMatch(/https?:\/\//);
  });
});
