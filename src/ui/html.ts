/**
 * The web view's pages, rendered on the server as plain HTML: inline CSS and a little inline
 * script, nothing fetched from elsewhere. Every text that comes from a run is escaped.
 */
import { createHash } from 'node:crypto';
import { RunStatus } from '../machines/types.js';
import type { RunTrace, TraceAttempt, TraceStep } from '../observability/run-trace.js';
import { TIMELINE_CSS } from '../observability/trace-html.js';
import type { LedgerEntry } from '../persistence/ledger.js';
import type {
  PendingApproval,
  PendingWait,
  RunReport,
  RunUsage,
  StepProgress,
} from '../runtime.js';
import type { JsonValue } from '../internal/json.js';
import type { StoredRunEvent } from '../persistence/snapshot-store.js';
import { countModelCalls, reconciliationText } from '../persistence/reservation-words.js';
import type { SerializedError } from '../errors.js';
import type { RunListEntry } from '../worker/run-list.js';
import { mapText } from '../plan/map-words.js';
import {
  attemptErrors,
  errorHtml,
  eventsHtml,
  ioHtml,
  modelCallsHtml,
  type ModelCallView,
} from './detail-html.js';
import { escapeHtml } from './escape.js';
import { LIST_SCRIPT, PAGE_SCRIPT } from './page-scripts.js';

export { escapeHtml };

const h = escapeHtml;

/** JSON safe inside a `<script>` element: no `<` can close it. */
function scriptJson(value: unknown): string {
  return JSON.stringify(value)
    .replace(/</g, '\\u003c')
    .replace(/\u2028/g, '\\u2028')
    .replace(/\u2029/g, '\\u2029');
}

/** A path of the web view from raw segments, each percent-encoded. */
export function urlPath(...segments: string[]): string {
  return `/${segments.map(encodeURIComponent).join('/')}`;
}

const runHref = (runId: string): string => urlPath('runs', runId);

export function time(ms: number | null): string {
  if (ms === null || !Number.isFinite(ms)) return '-';
  return new Date(ms).toISOString().replace('T', ' ').slice(0, 19);
}

/** A time of day with milliseconds (progress reports come many a second). */
const clock = (ms: number): string => new Date(ms).toISOString().slice(11, 23);

function duration(ms: number | null): string {
  if (ms === null || !Number.isFinite(ms) || ms < 0) return '-';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
}

/** A value as short JSON text. */
function preview(value: unknown, max = 160): string {
  let text: string;
  try {
    text = typeof value === 'string' ? value : (JSON.stringify(value) ?? String(value));
  } catch {
    text = String(value);
  }
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

const usd = (microUsd: number): string => `$${(microUsd / 1_000_000).toFixed(6)}`;

export const badge = (status: string): string =>
  `<span class="badge" data-status="${h(status)}">${h(status)}</span>`;

const CSS = `
body { max-width: 1320px; margin: 0 auto; }
a { color: #2456b3; }
header.top { display: flex; gap: 14px; align-items: baseline; padding-bottom: 8px;
  margin-bottom: 14px; border-bottom: 1px solid var(--grid); }
header.top .brand { font-weight: 700; font-size: 15px; color: var(--fg); text-decoration: none; }
header.top .muted { color: var(--muted); }
h1 { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; }
h2 { font-size: 14px; margin: 22px 0 8px; }
table.grid { border-collapse: collapse; width: 100%; }
table.grid th, table.grid td { text-align: left; padding: 5px 8px; vertical-align: top;
  border-bottom: 1px solid var(--grid); }
table.grid th { font-size: 12px; font-weight: 600; color: var(--muted); }
table.grid tbody tr:hover { background: #f7f8fa; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px;
  overflow-wrap: anywhere; }
.small { font-size: 12px; color: var(--muted); }
.badge { display: inline-block; padding: 1px 8px; border-radius: 9px; font-size: 11px;
  font-weight: 600; color: #fff; background: var(--c, var(--muted)); white-space: nowrap; }
.badge[data-status=succeeded], .badge[data-status=SUCCEEDED] { --c: var(--ok); }
.badge[data-status=failed], .badge[data-status=FAILED_FINAL] { --c: var(--fail); }
.badge[data-status=FAILED_RETRYABLE] { --c: #e07b26; }
.badge[data-status=running], .badge[data-status=RUNNING], .badge[data-status=READY] { --c: var(--run); }
.badge[data-status=waiting], .badge[data-status=WAITING_APPROVAL], .badge[data-status=WAITING] { --c: var(--wait); }
.badge[data-status=SKIPPED] { --c: var(--skip); }
.badge[data-status=cancelled], .badge[data-status=CANCELLED] { --c: var(--cancel); }
.badge[data-status=PENDING] { --c: #b0b5bd; }
form.filters { display: flex; gap: 10px; align-items: end; flex-wrap: wrap; margin: 0 0 12px; }
label { display: inline-flex; flex-direction: column; gap: 2px; font-size: 12px; color: var(--muted); }
input, select, button { font: inherit; padding: 4px 7px; }
input, select { border: 1px solid #c4c8cf; border-radius: 4px; }
button { cursor: pointer; border: 1px solid #9aa0a6; border-radius: 4px; background: #f4f5f7; }
button.approve { background: var(--ok); border-color: var(--ok); color: #fff; }
button.reject { background: var(--fail); border-color: var(--fail); color: #fff; }
.notice { padding: 8px 12px; border-radius: 5px; margin: 10px 0; }
.notice.error { background: #fdecea; border: 1px solid #f1b0ab; color: #8a1f17; }
.notice.ok { background: #e8f5ec; border: 1px solid #a8d8b6; color: #1d5e33; }
.notice.idle { background: #fff4e5; border: 1px solid #f0c27b; color: #7a4a06; }
.notice code { background: #fff; padding: 0 4px; border-radius: 3px; }
.progress { color: #1e40af; }
.approval { border: 1px solid #e7c66a; background: #fff9e8; border-radius: 6px;
  padding: 10px 12px; margin-bottom: 8px; }
.approval form { display: flex; gap: 8px; align-items: end; flex-wrap: wrap; margin-top: 8px; }
.kv { display: flex; flex-wrap: wrap; gap: 4px 18px; color: var(--muted); margin: 4px 0; }
.kv b { color: var(--fg); font-weight: 600; }
.live { font-size: 11px; font-weight: 500; padding: 1px 8px; border-radius: 9px;
  background: #e5e7eb; color: var(--muted); }
.live.on { background: #dbeafe; color: #1e40af; }
.timeline { margin-top: 4px; }
h3 { font-size: 12px; margin: 0 0 4px; color: var(--muted); }
pre.text { margin: 2px 0 6px; padding: 6px 8px; background: #f6f7f9; border: 1px solid var(--grid);
  border-radius: 4px; white-space: pre-wrap; overflow-wrap: anywhere; max-height: 480px;
  overflow: auto; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 12px; }
pre.error-text { background: #fdf3f2; border-color: #f1c8c4; }
.io { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; margin: 8px 0; }
.error { margin: 4px 0 8px; }
.error-head { font-size: 12px; color: #8a1f17; font-weight: 600; }
details > summary { cursor: pointer; font-size: 12px; color: #2456b3; }
.actions { border: 1px solid #c9d3e3; background: #f5f8fd; border-radius: 6px; padding: 10px 12px; }
.actions form, form.step-act { display: flex; gap: 8px; align-items: end; flex-wrap: wrap; }
form.step-act { margin: 6px 0 2px; }
button.act { background: #2456b3; border-color: #2456b3; color: #fff; }
button.cancel { background: var(--cancel); border-color: var(--cancel); color: #fff; }
.call { border-top: 1px solid var(--grid); padding: 8px 0; }
.msg { display: grid; grid-template-columns: 72px 1fr; gap: 6px; }
.msg .role { font-size: 11px; color: var(--muted); padding-top: 4px; }
.reply { margin-top: 4px; }
table.events td:nth-child(3), table.events td:nth-child(2) { white-space: nowrap; }
ul.fires { margin: 0; padding-left: 16px; }
`;

/** A whole page around `body`. */
export function page(title: string, body: string, tail = ''): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${h(title)} · flujo</title>
<style>${TIMELINE_CSS}${CSS}</style>
</head>
<body>
<header class="top"><a class="brand" href="/">flujo</a><a href="/">runs</a><a href="/schedules">schedules</a><a href="/workers">workers</a><span class="muted">times in UTC</span></header>
${body}
${tail}
</body>
</html>
`;
}

/** A message on its own page: an unknown run, a path that does not exist, an error. */
export function renderMessagePage(title: string, message: string): string {
  return page(
    title,
    `<h1>${h(title)}</h1>\n<p class="notice error" role="alert">${h(message)}</p>\n<p><a href="/">← all runs</a></p>`,
  );
}

/** The filters of the run list, as the form holds them (empty: any). */
export interface ListFilterForm {
  status: string;
  plan: string;
  tenant: string;
}

/** The run list: a GET form with the filters, one row per run, newest first. */
export function renderListPage(
  runs: readonly RunListEntry[],
  filter: ListFilterForm,
  error?: string,
): string {
  const options = ['', ...Object.values(RunStatus)]
    .map(
      (s) =>
        `<option value="${h(s)}"${s === filter.status ? ' selected' : ''}>${s === '' ? 'any' : h(s)}</option>`,
    )
    .join('');
  const form = `<form class="filters" method="get" action="/">
<label>status <select name="status">${options}</select></label>
<label>plan <input name="plan" value="${h(filter.plan)}" placeholder="any"></label>
<label>tenant <input name="tenant" value="${h(filter.tenant)}" placeholder="any"></label>
<button type="submit">Filter</button> <a href="/">clear</a>
</form>`;
  const notice = error === undefined ? '' : `<p class="notice error" role="alert">${h(error)}</p>`;
  const table = listTableHtml(runs);
  const query = new URLSearchParams();
  if (filter.status !== '') query.set('status', filter.status);
  if (filter.plan !== '') query.set('plan', filter.plan);
  if (filter.tenant !== '') query.set('tenant', filter.tenant);
  const config = { list: `/list.json${query.size === 0 ? '' : `?${query.toString()}`}` };
  const live =
    error === undefined
      ? `<script type="application/json" id="page">${scriptJson(config)}</script>
<script>${LIST_SCRIPT}</script>`
      : '';
  return page(
    'Runs',
    `<h1>Runs <span id="live" class="live">connecting…</span></h1>\n${form}\n${notice}\n<div id="runs" data-hash="${partHash(table)}">${table}</div>`,
    live,
  );
}

/** The run list's table (or that no run matches): what the list page replaces as runs change. */
export function listTableHtml(runs: readonly RunListEntry[]): string {
  const rows = runs.map((r) => {
    const step =
      r.waitingStep !== null
        ? `${h(r.waitingStep)} <span class="small">(waits for ${h(r.waitsFor ?? 'approval')})</span>`
        : h(r.currentStep ?? '');
    return `<tr data-run="${h(r.runId)}"><td class="mono"><a href="${h(runHref(r.runId))}">${h(r.runId)}</a></td><td>${h(r.planName)}</td><td>${h(r.tenantId)}</td><td class="status">${badge(r.status)}</td><td>${time(r.createdAt)}</td><td>${duration(r.durationMs)}</td><td>${step}</td></tr>`;
  });
  return runs.length === 0
    ? '<p class="empty">No runs match.</p>'
    : `<p class="small" id="count">${runs.length} run${runs.length === 1 ? '' : 's'}, newest first</p>
<table class="grid runs"><thead><tr><th>Run</th><th>Plan</th><th>Tenant</th><th>Status</th><th>Started</th><th>Duration</th><th>Step</th></tr></thead>
<tbody>${rows.join('\n')}</tbody></table>`;
}

/** A short hash of a part's HTML: the page replaces a part only when its hash changed. */
export const partHash = (html: string): string =>
  createHash('sha1').update(html).digest('hex').slice(0, 16);

/** What the run page shows. */
export interface RunView {
  report: RunReport;
  trace: RunTrace;
  ledger: readonly LedgerEntry[];
  usage: RunUsage;
  /** The job module `flujo run` recorded for the run, or null (read only when work is idle). */
  module?: string | null;
  /** The input the run was started with. */
  input: JsonValue;
  /** The run's events, oldest first. */
  events: readonly StoredRunEvent[];
  /** The model calls of its model journal, with their prompts. */
  models: readonly ModelCallView[];
  /** The run this one was sent again from (the web view's "Send again"), and by whom. */
  again: { runId: string; by: string } | null;
}

/** The parts of the run page that change as the run goes on. */
export const PART_NAMES = [
  'head',
  'io',
  'actions',
  'approvals',
  'steps',
  'models',
  'ledger',
  'usage',
  'events',
] as const;
/** One of {@link PART_NAMES}. */
export type PartName = (typeof PART_NAMES)[number];

/** A part's HTML and a short hash of it: the page replaces a part only when its hash changed. */
export interface Part {
  hash: string;
  html: string;
}

function headHtml({ report, module, again, events }: RunView): string {
  const s = report.summary;
  const facts = [
    `<span>plan <b>${h(report.planName)}</b></span>`,
    `<span>tenant <b>${h(report.tenantId)}</b></span>`,
    `<span id="run-status">status ${badge(report.status)}</span>`,
    `<span>started <b>${time(report.createdAt)}</b></span>`,
    `<span>updated <b>${time(report.updatedAt)}</b></span>`,
    `<span>commits <b>${report.version}</b></span>`,
  ];
  const lines: string[] = [];
  if (s.blockedStep !== null) lines.push(`blocked at step <b>${h(s.blockedStep)}</b>`);
  if (s.reason !== null) lines.push(`reason <b>${h(s.reason)}</b>`);
  const cancel = events.findLast((e) => e.type === 'run.cancelled')?.data as
    { by?: unknown; reason?: unknown } | undefined;
  if (report.status === 'cancelled' && cancel !== undefined) {
    const by = typeof cancel.by === 'string' ? ` by <b>${h(cancel.by)}</b>` : '';
    const why = typeof cancel.reason === 'string' ? `: ${h(cancel.reason)}` : '';
    lines.push(`<span id="cancelled-by">cancelled${by}${why}</span>`);
  }
  if (again !== null) {
    lines.push(
      `<span id="again-of">sent again from run <a class="mono" href="${h(runHref(again.runId))}">${h(again.runId)}</a> by <b>${h(again.by)}</b></span>`,
    );
  }
  const parent = report.parent ?? null;
  if (parent !== null) {
    lines.push(
      `<span id="parent-run">child of run <a class="mono" href="${h(runHref(parent.runId))}">${h(parent.runId)}</a> (step <b>${h(parent.stepId)}</b>, attempt ${parent.attempt})</span>`,
    );
  }
  const more = lines.length === 0 ? '' : `<div class="kv">${lines.join(' · ')}</div>`;
  return `<div class="kv">${facts.join('')}</div>${more}${childrenHtml(report)}${idleHtml(report, module ?? null)}`;
}

/** The child runs a run's `run` steps started, each linked, with its status (none: nothing). */
function childrenHtml(report: RunReport): string {
  const children = report.children ?? [];
  if (children.length === 0) return '';
  const items = children.map(
    (c) =>
      `<li data-child="${h(c.runId)}">step <b>${h(c.stepId)}</b> (attempt ${c.attempt}): <a class="mono" href="${h(runHref(c.runId))}">${h(c.runId)}</a> ${c.status === null ? 'not found' : badge(c.status)}</li>`,
  );
  return `<div class="kv" id="children">child runs<ul>${items.join('')}</ul></div>`;
}

/** A word a POSIX shell reads as itself. */
const shellWord = (word: string): string =>
  /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;

/**
 * The notice that due work waits for a worker, with the commands that take it up (as `flujo
 * status` says it): with the job module the run recorded, else a placeholder.
 */
function idleHtml(report: RunReport, module: string | null): string {
  if (report.idle === null) return '';
  const { stepId, idleMs } = report.idle;
  const job = module === null ? '<job-module>' : shellWord(module);
  const note =
    module === null
      ? ' (&lt;job-module&gt; stands for the path of the job module that started the run, which the run does not record)'
      : '';
  return `<p class="notice idle" id="idle" role="status" data-step="${h(stepId)}">No worker has taken step <b>${h(stepId)}</b> for ${duration(idleMs)}: start one with <code class="mono">${h(`flujo worker ${job}`)}</code> (same --redis and --prefix as this view), or continue the run with <code class="mono">${h(`flujo resume ${shellWord(report.runId)} ${job}`)}</code>${note}.</p>`;
}

/** An operator's latest `ctx.progress` report, as the page's script also draws it. */
function progressHtml(stepId: string, p: StepProgress): string {
  return `<div class="progress" data-progress="${h(stepId)}" data-at="${p.at}">progress <span class="mono">${h(preview(p.info))}</span> <span class="small">attempt ${p.attempt} · ${clock(p.at)}</span></div>`;
}

function approvalHtml(runId: string, a: PendingApproval): string {
  const action = (decision: string) => urlPath('runs', runId, 'steps', a.stepId, decision);
  const what =
    a.call === null
      ? 'its gate'
      : `tool call <span class="mono">${h(a.call.tool)}</span> with <span class="mono">${h(preview(a.call.args, 400))}</span>`;
  const reason = a.reason === null ? '' : `: ${h(a.reason)}`;
  const call =
    a.call === null ? '' : `<input type="hidden" name="callId" value="${h(a.call.callId)}">`;
  return `<div class="approval" data-approval="${h(a.stepId)}">
<div><b>${h(a.stepId)}</b> waits for approval of ${what}${reason}</div>
<div class="kv"><span>risk <b>${h(a.riskLevel)}</b></span><span>may decide <b>${a.approvers === null ? 'anyone' : h(a.approvers.join(', '))}</b></span></div>
<form method="post" action="${h(action('approve'))}">${call}
<label>by <input name="by" required placeholder="your name"></label>
<label>comment <input name="comment" size="40"></label>
<button type="submit" class="approve">Approve</button>
<button type="submit" class="reject" formaction="${h(action('reject'))}">Reject</button>
</form>
</div>`;
}

/** A wait step that waits: for a signal (with a form that sends one), or for its timer. */
function waitHtml(runId: string, w: PendingWait): string {
  if (w.signal === null) {
    return `<div class="approval" data-wait="${h(w.stepId)}"><b>${h(w.stepId)}</b> waits for a timer: it fires at ${time(w.dueAt)}</div>`;
  }
  const timeout = w.dueAt === null ? '' : `; it times out at ${time(w.dueAt)}`;
  return `<div class="approval" data-wait="${h(w.stepId)}">
<div><b>${h(w.stepId)}</b> waits for signal <span class="mono">${h(w.signal)}</span> (${w.queued} queued${timeout})</div>
<form method="post" action="${h(urlPath('runs', runId, 'signal'))}">
<input type="hidden" name="name" value="${h(w.signal)}">
<label>payload (JSON) <textarea name="payload" rows="2" cols="50" placeholder="null"></textarea></label>
<label>id <input name="id" placeholder="optional: a send again is a no-op"></label>
<button type="submit" class="approve">Send signal</button>
</form>
</div>`;
}

function approvalsHtml({ report }: RunView): string {
  const waits = (report.waits ?? []).map((w) => waitHtml(report.runId, w));
  if (report.approvals.length === 0 && waits.length === 0) {
    return '<p class="empty">Nothing waits for a person, a signal or a time.</p>';
  }
  return [...report.approvals.map((a) => approvalHtml(report.runId, a)), ...waits].join('\n');
}

function attemptHtml(
  stepId: string,
  a: TraceAttempt,
  errors: ReadonlyMap<string, SerializedError>,
): string {
  const took = a.end === null ? 'running' : duration(a.end - a.start);
  const whole = errors.get(`${stepId}#${a.attempt}`);
  const error =
    whole !== undefined
      ? errorHtml(whole, `${stepId}#${a.attempt}`)
      : a.error === null
        ? ''
        : `<pre class="text error-text">${h(`${a.error.code}: ${a.error.message}`)}</pre>`;
  return `<div data-attempt="${a.attempt}">#${a.attempt} ${h(a.outcome)} <span class="small">${took}</span>${error}</div>`;
}

/**
 * A form's first, disabled submit button: Enter in a field of a form with several actions does
 * nothing (the browser's implicit submission takes the first button), so only a click acts.
 */
const NO_ENTER = '<button type="submit" disabled hidden aria-hidden="true"></button>';

/** What a person may do to a step from the page: skip it, retry it when it failed finally. */
function stepActionHtml(report: RunReport, s: RunReport['steps'][number]): string {
  const canSkip =
    s.status !== 'SUCCEEDED' && s.status !== 'SKIPPED' && report.status !== 'cancelled';
  const canRetry = s.status === 'FAILED_FINAL' && report.status === 'failed';
  if (!canSkip && !canRetry) return '';
  const action = (what: string) => urlPath('runs', report.runId, 'steps', s.stepId, what);
  const failed = report.steps.filter((x) => x.status === 'FAILED_FINAL').map((x) => x.stepId);
  const retry = canRetry
    ? `<button type="submit" class="act retry" formaction="${h(action('retry'))}" title="${h(`Resumes the run: every step that failed finally (${failed.join(', ')}) gets one more attempt`)}">Retry</button>`
    : '';
  const skip = canSkip
    ? `<label>reason <input name="reason" placeholder="why skip"></label>
<button type="submit" class="skip">Skip</button>`
    : '';
  const note = canRetry
    ? `<div class="small">Retry resumes the run (as <code class="mono">flujo resume</code> does): every step that failed finally (${h(failed.join(', '))}) gets one more attempt.</div>`
    : '';
  return `<details class="act" data-fold="${h(`act:${s.stepId}`)}"><summary>${canRetry ? 'retry or skip' : 'skip'}…</summary>
<form class="step-act" method="post" action="${h(action(canSkip ? 'skip' : 'retry'))}">${NO_ENTER}
<label>by <input name="by" required placeholder="your name"></label>
${skip}${retry}
</form>${note}</details>`;
}

function stepsHtml({ report, trace, events }: RunView): string {
  const traced = new Map<string, TraceStep>(trace.steps.map((s) => [s.stepId, s]));
  const errors = attemptErrors(events);
  const rows = report.steps.map((s) => {
    const t = traced.get(s.stepId);
    const attempts =
      t === undefined || t.attempts.length === 0
        ? '-'
        : t.attempts.map((a) => attemptHtml(s.stepId, a, errors)).join('');
    const detail: string[] = [];
    if (s.status === 'SUCCEEDED' && s.output !== null) {
      detail.push(`output <span class="mono">${h(preview(s.output))}</span>`);
    }
    if (s.error !== null && s.status !== 'SUCCEEDED') {
      detail.push(
        `error <span class="mono">${h(s.error.code)}: ${h(preview(s.error.message))}</span>`,
      );
    }
    if (s.reason !== null) detail.push(`reason ${h(s.reason)}`);
    if (s.approval !== null) detail.push(`approved by ${h(s.approval.by)}`);
    if (s.rejection !== null) detail.push(`rejected by ${h(s.rejection.by)}`);
    if (s.retryAt !== null) detail.push(`retry at ${time(s.retryAt)}`);
    if (s.cachedFrom != null) detail.push(`from the cache of run ${h(s.cachedFrom.runId)}`);
    const items = report.maps?.[s.stepId];
    if (items !== undefined) detail.push(`items ${h(mapText(items))}`);
    const progress = report.progress[s.stepId];
    const shown =
      progress !== undefined && s.status === 'RUNNING' ? progressHtml(s.stepId, progress) : '';
    return `<tr data-step-row="${h(s.stepId)}"><td><b>${h(s.stepId)}</b></td><td>${h(t?.kind ?? '')}</td><td class="status">${badge(s.status)}</td><td class="attempts">${attempts}</td><td class="detail">${detail.join('<br>')}${shown}${stepActionHtml(report, s)}</td></tr>`;
  });
  return `<table class="grid steps"><thead><tr><th>Step</th><th>Kind</th><th>Status</th><th>Attempts</th><th>Detail</th></tr></thead>
<tbody>${rows.join('\n')}</tbody></table>`;
}

function ledgerHtml({ ledger }: RunView): string {
  if (ledger.length === 0) return '<p class="empty">No tool calls recorded.</p>';
  const rows = ledger.map((e) => {
    const result =
      e.error !== null
        ? `${h(e.error.code)}: ${h(preview(e.error.message))}`
        : e.receipt !== null
          ? h(preview(e.receipt))
          : '';
    return `<tr data-call="${h(e.callId)}"><td class="mono">${h(e.callId.slice(0, 12))}</td><td>${h(e.stepId)}</td><td class="mono">${h(e.tool)}</td><td class="status">${badge(e.state)}</td><td>${e.runs}</td><td class="mono">${h(preview(e.args))}</td><td class="mono">${result}</td><td>${time(e.updatedAt)}</td></tr>`;
  });
  return `<table class="grid ledger"><thead><tr><th>Call</th><th>Step</th><th>Tool</th><th>State</th><th>Runs</th><th>Arguments</th><th>Receipt or error</th><th>Updated</th></tr></thead>
<tbody>${rows.join('\n')}</tbody></table>`;
}

function usageHtml({ usage }: RunView): string {
  const t = usage.totals;
  const limit = (n: number | null, unit: (v: number) => string) => (n === null ? 'none' : unit(n));
  const totals = `<div class="kv totals"><span>spent <b>${t.spentTokens} tokens</b></span><span>cost <b id="cost">${usd(t.spentMicroUsd)}</b></span><span>reserved now <b>${t.reservedTokens} tokens ${usd(t.reservedMicroUsd)}</b></span><span>budgets <b>${limit(t.maxTokens, (v) => `${v} tokens`)}, ${limit(t.maxMicroUsd, usd)}</b></span></div>`;
  if (usage.reservations.length === 0) {
    return `${totals}<p class="empty">No model calls recorded.</p>`;
  }
  const rows = usage.reservations.map((r) => {
    const spent =
      r.charged === null ? '-' : `${r.charged.inputTokens} in + ${r.charged.outputTokens} out`;
    return `<tr><td>${h(r.stepId)}</td><td>${r.turn}</td><td>${r.reservedTokens} tokens ${usd(r.reservedMicroUsd)}</td><td>${spent}</td><td>${r.charged === null ? '-' : usd(r.charged.microUsd)}</td><td>${h(reconciliationText(r))}</td></tr>`;
  });
  // Counted as `flujo usage` counts them: a reservation released with nothing sent is no call.
  const { calls, released, open } = countModelCalls(usage.reservations);
  const count = `<p class="small calls">model calls: <b>${calls}</b>; released without a call: ${released}${open === 0 ? '' : `; open: ${open}`}</p>`;
  return `${totals}${count}<table class="grid usage"><thead><tr><th>Step</th><th>Turn</th><th>Reserved</th><th>Spent</th><th>Cost</th><th>Reconciled</th></tr></thead>
<tbody>${rows.join('\n')}</tbody></table>`;
}

/** The run's own actions: resume, cancel, send its input again as a new run. */
function actionsHtml({ report }: RunView): string {
  const action = (what: string) => urlPath('runs', report.runId, what);
  const resumable =
    report.status === 'failed' || (report.status === 'running' && report.idle !== null);
  const cancellable = report.status === 'running' || report.status === 'waiting';
  const buttons: string[] = [];
  const notes: string[] = [];
  if (resumable) {
    buttons.push(
      `<button type="submit" class="act resume" formaction="${h(action('resume'))}">Resume</button>`,
    );
    notes.push(
      report.status === 'failed'
        ? 'Resume reopens every step that failed finally or was cancelled (as <code class="mono">flujo resume</code> does); a worker of the run’s job module runs them.'
        : 'Resume queues the run’s due work again (as a starting worker does); a worker of the run’s job module must run it.',
    );
  }
  if (cancellable) {
    buttons.push(
      `<label>reason <input name="reason" placeholder="why cancel (optional)"></label><button type="submit" class="cancel" formaction="${h(action('cancel'))}">Cancel run</button>`,
    );
  }
  buttons.push(`<button type="submit" class="again">Send again</button>`);
  notes.push('Send again starts a new run of the same plan with the same input (a new run id).');
  return `<div class="actions"><form method="post" action="${h(action('again'))}">${NO_ENTER}
<label>by <input name="by" required placeholder="your name"></label>
${buttons.join('\n')}
</form><div class="small">${notes.join(' ')}</div></div>`;
}

const RENDER: Record<PartName, (view: RunView) => string> = {
  head: headHtml,
  io: (v) => ioHtml(v.report, v.input),
  actions: actionsHtml,
  approvals: approvalsHtml,
  steps: stepsHtml,
  models: (v) => modelCallsHtml(v.models),
  ledger: ledgerHtml,
  usage: usageHtml,
  events: (v) => eventsHtml(v.report.runId, v.events),
};

/** The changing parts of a run's page, each with its hash. */
export function runParts(view: RunView): Record<PartName, Part> {
  const parts = {} as Record<PartName, Part>;
  for (const name of PART_NAMES) {
    const html = RENDER[name](view);
    parts[name] = { hash: partHash(html), html };
  }
  return parts;
}

/** A line over the run page: what a decision did, or why it was refused. */
export interface Notice {
  kind: 'ok' | 'error';
  text: string;
}

/** The title of a run's page (it follows the run's status). */
export const runTitle = (report: RunReport): string => `Run ${report.runId} (${report.status})`;

/** A run's page: its state, approvals, steps, timeline, tool calls and usage, updated live. */
export function renderRunPage(view: RunView, notice?: Notice): string {
  const { report } = view;
  const parts = runParts(view);
  const part = (name: PartName) =>
    `<div id="part-${name}" data-hash="${parts[name].hash}">${parts[name].html}</div>`;
  const base = runHref(report.runId);
  const shown =
    notice === undefined
      ? ''
      : `<p class="notice ${notice.kind}" id="notice" role="${notice.kind === 'error' ? 'alert' : 'status'}">${h(notice.text)}</p>`;
  const body = `<p><a href="/">← all runs</a></p>
<h1>Run <span class="mono">${h(report.runId)}</span> <span id="live" class="live">connecting…</span></h1>
${shown}
${part('head')}
${part('io')}
<h2>Act on the run</h2>
${part('actions')}
<h2>Waiting for approval</h2>
${part('approvals')}
<h2>Steps</h2>
${part('steps')}
<h2>Timeline</h2>
<div class="timeline"><div class="axis" id="axis"></div><div id="lanes"></div></div>
<p class="small">took <b id="duration"></b> · hover a bar for its details · <a href="${h(`${base}/trace`)}">the trace page</a></p>
<h2>Tool calls</h2>
${part('ledger')}
<h2>Usage and cost</h2>
${part('usage')}
<h2>Model calls</h2>
${part('models')}
<h2>Event history</h2>
${part('events')}
<div id="tip"></div>`;
  const tail = `<script type="application/json" id="trace">${scriptJson(view.trace)}</script>
<script type="application/json" id="page">${scriptJson({ data: `${base}/data`, events: `${base}/events` })}</script>
<script>${PAGE_SCRIPT}</script>`;
  return page(runTitle(report), body, tail);
}
