/**
 * A run's trace as one self-contained HTML page (inline CSS and script, nothing fetched: it works
 * offline and from a file): a timeline with one lane per step, one bar per attempt and per agent
 * turn, model calls, tool calls and approval waits marked, coloured by outcome, details on hover.
 */
import type { RunTrace } from './run-trace.js';

/** JSON safe to put inside a `<script>` element: no `<` can close it. */
function scriptJson(value: unknown): string {
  return JSON.stringify(value)
    .replace(/</g, '\\u003c')
    .replace(/\u2028/g, '\\u2028')
    .replace(/\u2029/g, '\\u2029');
}

function escapeHtml(text: string): string {
  return text
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;');
}

const CSS = `
:root { --ok: #2e9d58; --fail: #d64541; --run: #3b7dd8; --wait: #e0a526; --skip: #9aa0a6;
  --cancel: #6b6f76; --bg: #fff; --fg: #1d2330; --grid: #e8eaee; --muted: #6b7280; }
* { box-sizing: border-box; }
body { margin: 0; padding: 20px 24px; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
h1 { font-size: 17px; margin: 0 0 4px; }
.meta { color: var(--muted); margin-bottom: 12px; }
.meta b { color: var(--fg); font-weight: 600; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; margin: 0 0 14px; color: var(--muted); }
.legend span::before { content: ""; display: inline-block; width: 12px; height: 10px;
  margin-right: 5px; vertical-align: -1px; border-radius: 2px; background: var(--c); }
.timeline { position: relative; border-top: 1px solid var(--grid); }
.axis { position: relative; height: 22px; margin-left: 180px; color: var(--muted); font-size: 11px; }
.tick { position: absolute; top: 4px; transform: translateX(-50%); white-space: nowrap; }
.tick:first-child { transform: none; }
.tick:last-child { transform: translateX(-100%); }
.lane { display: flex; border-bottom: 1px solid var(--grid); min-height: 58px; }
.label { width: 180px; flex: none; padding: 8px 10px 6px 0; overflow: hidden; }
.label .id { font-weight: 600; overflow-wrap: anywhere; }
.label .st { color: var(--muted); font-size: 11px; }
.track { position: relative; flex: 1; background-image: linear-gradient(to right, var(--grid) 1px,
  transparent 1px); background-size: 10% 100%; }
.bar { position: absolute; border-radius: 3px; min-width: 3px; cursor: default; }
.attempt { top: 8px; height: 18px; background: var(--c, var(--run)); color: #fff; font-size: 11px;
  line-height: 18px; padding: 0 4px; overflow: hidden; white-space: nowrap; }
.turn { top: 30px; height: 9px; background: var(--c, var(--run)); opacity: .55;
  border: 1px solid rgba(0,0,0,.25); }
.model { top: 42px; height: 5px; background: #7c5cd6; }
.wait { top: 8px; height: 18px; background: repeating-linear-gradient(45deg, var(--wait) 0 5px,
  #f6dc98 5px 10px); border: 1px solid #b7841a; }
.wait.gate { top: 12px; height: 30px; }
.mark { position: absolute; top: 41px; width: 9px; height: 9px; margin-left: -4px;
  transform: rotate(45deg); background: var(--c, var(--ok)); border: 1px solid rgba(0,0,0,.35); }
.takeover { position: absolute; top: 4px; width: 3px; height: 46px; margin-left: -1px;
  background: var(--fail); }
.skip { position: absolute; top: 12px; font-size: 11px; color: var(--muted); }
[data-outcome=succeeded], [data-verdict=executed] { --c: var(--ok); }
[data-outcome=failed], [data-verdict=failed], [data-verdict=in_doubt] { --c: var(--fail); }
[data-outcome=running], [data-verdict=running], [data-verdict=busy] { --c: var(--run); }
[data-outcome=waiting], [data-verdict=prepared], [data-verdict=awaiting_approval] { --c: var(--wait); }
[data-outcome=skipped] { --c: var(--skip); }
[data-outcome=cancelled] { --c: var(--cancel); }
[data-verdict=receipt_replayed] { --c: #fff; }
.bar:hover, .mark:hover, .takeover:hover { outline: 2px solid #111; z-index: 2; }
#tip { position: fixed; pointer-events: none; display: none; max-width: 420px; z-index: 10;
  background: #111827; color: #f9fafb; border-radius: 6px; padding: 8px 10px; font-size: 12px;
  box-shadow: 0 4px 14px rgba(0,0,0,.25); white-space: pre-wrap; overflow-wrap: anywhere; }
#tip b { color: #fff; }
.empty { color: var(--muted); padding: 16px 0; }
`;

// The page's own script: draws the timeline from the embedded trace; no library, no network.
const SCRIPT = `
(function () {
  var trace = JSON.parse(document.getElementById('trace').textContent);
  var now = Date.now();
  var t0 = trace.start, t1 = trace.end;
  function each(f) { trace.steps.forEach(function (s) { f(s); }); }
  function ends(x) { return [x.start, x.end]; }
  var times = [t0];
  each(function (s) {
    s.waits.forEach(function (w) { times.push.apply(times, ends(w)); });
    if (s.skipped) times.push(s.skipped.at);
    s.attempts.forEach(function (a) {
      times.push.apply(times, ends(a));
      a.turns.concat(a.modelCalls, a.toolCalls, a.waits).forEach(function (x) {
        times.push.apply(times, ends(x));
      });
    });
  });
  var finite = times.filter(function (t) { return typeof t === 'number'; });
  var last = Math.max.apply(null, finite);
  if (t1 === null) t1 = Math.max(last, Math.min(now, last + 1000));
  var span = Math.max(1, t1 - t0);
  function pct(t) { return ((t - t0) / span) * 100; }
  function fmt(ms) {
    if (ms === null || ms === undefined) return 'open';
    if (ms < 1000) return Math.round(ms) + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + ' s';
    return Math.floor(ms / 60000) + ' min ' + Math.round((ms % 60000) / 1000) + ' s';
  }
  function at(t) { return t === null ? 'open' : '+' + fmt(t - t0); }
  function el(tag, cls, parent) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (parent) parent.appendChild(e);
    return e;
  }
  function place(e, start, end) {
    var stop = end === null ? t1 : end;
    e.style.left = pct(start) + '%';
    e.style.width = 'max(3px, ' + (pct(stop) - pct(start)) + '%)';
  }
  function tip(e, title, rows) {
    var lines = rows.filter(function (r) { return r[1] !== null && r[1] !== undefined && r[1] !== ''; })
      .map(function (r) { return r[0] + ': ' + r[1]; });
    e.setAttribute('data-tip', title + '\\n' + lines.join('\\n'));
  }
  document.getElementById('duration').textContent =
    trace.end === null ? fmt(t1 - t0) + ' so far' : fmt(trace.end - t0);
  var axis = document.getElementById('axis');
  for (var i = 0; i <= 10; i++) {
    var tk = el('div', 'tick', axis);
    tk.style.left = i * 10 + '%';
    tk.textContent = '+' + fmt((span * i) / 10);
  }
  var lanes = document.getElementById('lanes');
  if (trace.steps.length === 0) el('div', 'empty', lanes).textContent = 'The plan has no steps.';
  each(function (s) {
    var lane = el('div', 'lane', lanes);
    lane.setAttribute('data-step', s.stepId);
    var label = el('div', 'label', lane);
    el('div', 'id', label).textContent = s.stepId;
    el('div', 'st', label).textContent = s.kind + ' · ' + s.status +
      (s.attempts.length > 1 ? ' · ' + s.attempts.length + ' attempts' : '');
    var track = el('div', 'track', lane);
    s.waits.forEach(function (w) {
      var b = el('div', 'bar wait gate', track);
      place(b, w.start, w.end);
      tip(b, 'Gate of ' + s.stepId, [['waited', fmt(w.end === null ? null : w.end - w.start)],
        ['from', at(w.start)], ['decision', w.decision || 'waiting'], ['by', w.by],
        ['comment', w.comment]]);
    });
    if (s.skipped) {
      var k = el('div', 'skip', track);
      k.style.left = pct(s.skipped.at) + '%';
      k.textContent = 'skipped';
      tip(k, 'Skipped ' + s.stepId, [['at', at(s.skipped.at)], ['reason', s.skipped.reason],
        ['by', s.skipped.by]]);
    }
    s.attempts.forEach(function (a) {
      var b = el('div', 'bar attempt', track);
      b.setAttribute('data-outcome', a.outcome);
      b.setAttribute('data-attempt', String(a.attempt));
      place(b, a.start, a.end);
      b.textContent = '#' + a.attempt;
      tip(b, s.stepId + ' · attempt ' + a.attempt, [['outcome', a.outcome],
        ['start', at(a.start)], ['end', at(a.end)],
        ['duration', a.end === null ? 'open' : fmt(a.end - a.start)],
        ['workers', a.workers.join(', ')],
        ['taken over', a.takeovers.length ? a.takeovers.length + '×' : null],
        ['turns', a.turns.length || null], ['model calls', a.modelCalls.length || null],
        ['tool calls', a.toolCalls.length || null],
        ['error', a.error && (a.error.code + ': ' + a.error.message +
          (a.error.retryable ? ' (retryable)' : ' (final)'))]]);
      a.waits.forEach(function (w) {
        var wb = el('div', 'bar wait tool', track);
        place(wb, w.start, w.end);
        tip(wb, 'Approval of ' + (w.tool || 'a tool call'), [['call', w.callId],
          ['waited', fmt(w.end === null ? null : w.end - w.start)],
          ['decision', w.decision || 'waiting'], ['by', w.by], ['comment', w.comment]]);
      });
      a.takeovers.forEach(function (o) {
        var tk = el('div', 'takeover', track);
        tk.style.left = pct(o.at) + '%';
        tip(tk, 'Taken over' + (o.turn === null ? '' : ', turn ' + o.turn), [
          ['by', o.worker], ['at', at(o.at)], ['stopped worker', o.previousWorker],
          ['it had started', o.previousStartedAt === null ? null : at(o.previousStartedAt)]]);
      });
      a.turns.forEach(function (t) {
        var tb = el('div', 'bar turn', track);
        tb.setAttribute('data-outcome', t.outcome === 'open' ? 'running' : a.outcome === 'failed' &&
          t === a.turns[a.turns.length - 1] ? 'failed' : 'succeeded');
        tb.setAttribute('data-turn', String(t.turn));
        place(tb, t.start, t.end);
        tip(tb, s.stepId + ' · attempt ' + a.attempt + ' · turn ' + t.turn, [['turn', t.outcome],
          ['start', at(t.start)], ['duration', t.end === null ? 'open' : fmt(t.end - t.start)]]);
      });
      a.modelCalls.forEach(function (m) {
        var mb = el('div', 'bar model', track);
        place(mb, m.start, m.end);
        tip(mb, 'Model call, turn ' + m.turn, [['model', m.model], ['start', at(m.start)],
          ['duration', m.end === null ? 'open' : fmt(m.end - m.start)],
          ['tokens in', m.inputTokens], ['tokens out', m.outputTokens],
          ['cost', m.costUsd === null ? null : '$' + m.costUsd.toFixed(6)], ['usage', m.outcome]]);
      });
      a.toolCalls.forEach(function (c) {
        var mk = el('div', 'mark tool', track);
        mk.setAttribute('data-verdict', c.verdict);
        mk.style.left = pct(Math.max(c.start, t0)) + '%';
        tip(mk, 'Tool ' + c.tool, [['verdict', c.verdict], ['ledger', c.state],
          ['turn', c.turn], ['runs', c.runs], ['at', at(c.start)],
          ['duration', c.end === null ? 'open' : fmt(c.end - c.start)], ['call', c.callId],
          ['error', c.error]].concat(c.executions.map(function (x, i) {
            return ['recorded ' + (i + 1), x.verdict + ' at ' + at(x.at) +
              (x.durationMs === null ? '' : ', ' + fmt(x.durationMs))];
          })));
      });
    });
  });
  var box = document.getElementById('tip');
  document.addEventListener('mouseover', function (ev) {
    var t = ev.target && ev.target.closest ? ev.target.closest('[data-tip]') : null;
    if (!t) { box.style.display = 'none'; return; }
    var text = t.getAttribute('data-tip').split('\\n');
    box.textContent = '';
    var b = el('b', '', box);
    b.textContent = text[0];
    box.appendChild(document.createTextNode('\\n' + text.slice(1).join('\\n')));
    box.style.display = 'block';
  });
  document.addEventListener('mousemove', function (ev) {
    var x = Math.min(ev.clientX + 14, window.innerWidth - box.offsetWidth - 8);
    var y = Math.min(ev.clientY + 14, window.innerHeight - box.offsetHeight - 8);
    box.style.left = Math.max(4, x) + 'px';
    box.style.top = Math.max(4, y) + 'px';
  });
})();
`;

const LEGEND: [string, string][] = [
  ['succeeded', 'var(--ok)'],
  ['failed', 'var(--fail)'],
  ['running', 'var(--run)'],
  ['waiting for approval', 'var(--wait)'],
  ['skipped', 'var(--skip)'],
  ['cancelled', 'var(--cancel)'],
  ['model call', '#7c5cd6'],
  ['tool call (white: receipt replayed)', 'var(--ok)'],
  ['taken over after a worker stopped', 'var(--fail)'],
];

/**
 * A self-contained HTML page (inline CSS and script, works offline) that draws a run's trace
 * (`runtime.trace(runId)`) as a timeline.
 */
export function renderTraceHtml(trace: RunTrace): string {
  const title = `Run ${trace.runId}`;
  const legend = LEGEND.map(([name, c]) => `<span style="--c:${c}">${escapeHtml(name)}</span>`);
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)} · flujo trace</title>
<style>${CSS}</style>
</head>
<body>
<h1>${escapeHtml(title)}</h1>
<div class="meta">plan <b>${escapeHtml(trace.planName)}</b> · tenant <b>${escapeHtml(trace.tenantId)}</b> · status <b>${escapeHtml(trace.status)}</b> · started <b>${escapeHtml(new Date(trace.start).toISOString())}</b> · took <b id="duration"></b>${trace.traceId === null ? '' : ` · trace id <b>${escapeHtml(trace.traceId)}</b>`}</div>
<div class="legend">${legend.join('')}</div>
<div class="timeline"><div class="axis" id="axis"></div><div id="lanes"></div></div>
<div id="tip"></div>
<script type="application/json" id="trace">${scriptJson(trace)}</script>
<script>${SCRIPT}</script>
</body>
</html>
`;
}

/**
 * The timeline's style and drawing script, for a page that embeds the timeline (the web view's
 * run page): the script draws the trace in `#trace` into `#axis`, `#lanes`, `#duration` and `#tip`.
 * @internal
 */
export { CSS as TIMELINE_CSS, SCRIPT as TIMELINE_SCRIPT };
