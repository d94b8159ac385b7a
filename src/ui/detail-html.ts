/**
 * The parts of a run's page that show what the run holds in full: its input and result, each
 * failed attempt's whole error, the prompt and reply of each journaled model call, and its event
 * history. Every text that comes from a run is escaped; long texts fold into `<details>`.
 */
import type { JsonValue } from '../internal/json.js';
import type { RunEventRecord, StoredRunEvent } from '../persistence/snapshot-store.js';
import type { SerializedError } from '../errors.js';
import type { ChatMessage, ModelReply } from '../schemas/messages.js';
import type { RunReport } from '../runtime.js';
import { escapeHtml as h } from './escape.js';

/** Texts longer than this (characters) or with more lines are folded. */
const FOLD_CHARS = 600;
const FOLD_LINES = 20;
/** The most events the page lists (the newest); `flujo events` prints them all. */
export const MAX_EVENTS_SHOWN = 300;

/** One model call as the model journal holds it, with the prompt the history holds for it. */
export interface ModelCallView {
  stepId: string;
  /** The granular turn (0-based), or null for a reply of an atomic step's attempt. */
  turn: number | null;
  /** The atomic step's attempt, or null for a granular turn. */
  attempt: number | null;
  /** The reply's place among its attempt's replies (0 for a granular turn). */
  index: number;
  reply: ModelReply;
  /**
   * The conversation the call answered, as the step's history holds it (the agent's system
   * prompt is the agent's own and not stored); null when the run does not store it.
   */
  prompt: ChatMessage[] | null;
}

/** JSON text, indented. */
export function jsonText(value: unknown): string {
  try {
    return JSON.stringify(value, null, 2) ?? String(value);
  } catch {
    return String(value);
  }
}

const isLong = (text: string): boolean =>
  text.length > FOLD_CHARS || text.split('\n').length > FOLD_LINES;

/**
 * A block of preformatted text, whole; folded (closed) under `label` when it is long. `key`
 * names the fold, so that the page keeps it open across live updates.
 */
export function block(text: string, label: string, key: string, cls = ''): string {
  const pre = `<pre class="text${cls === '' ? '' : ` ${cls}`}">${h(text)}</pre>`;
  if (!isLong(text)) return pre;
  const size = `${text.length} characters, ${text.split('\n').length} lines`;
  return `<details data-fold="${h(key)}"><summary>${h(label)} <span class="small">(${size})</span></summary>${pre}</details>`;
}

/** The run's input and what it came to. */
export function ioHtml(report: RunReport, input: JsonValue): string {
  const s = report.summary;
  const produced = Object.keys(s.produced).length === 0 ? null : s.produced;
  const lead =
    report.status === 'succeeded'
      ? 'succeeded; the outputs of its steps:'
      : report.status === 'failed'
        ? `failed${s.blockedStep === null ? '' : ` at step <b>${h(s.blockedStep)}</b>`}${s.reason === null ? '' : ` (${h(s.reason)})`}; produced so far:`
        : report.status === 'cancelled'
          ? 'cancelled; produced before:'
          : `not yet (${h(report.status)}); produced so far:`;
  const result =
    produced === null
      ? '<p class="small">nothing</p>'
      : block(jsonText(produced), 'outputs', 'result');
  return `<div class="io"><div><h3>Input</h3>${block(jsonText(input), 'input', 'input')}</div>
<div id="result"><h3>Result</h3><p class="small">${lead}</p>${result}</div></div>`;
}

/** A failed attempt's error, whole: its message (every line), what was thrown, causes, details. */
export function errorHtml(error: SerializedError, key: string): string {
  const thrownName =
    error.thrown !== undefined && error.thrown.name !== error.name
      ? ` <span class="small">(thrown: ${h(error.thrown.name)})</span>`
      : '';
  const head = `<div class="error-head">${h(error.name)} <span class="mono">${h(error.code)}</span>${error.retryable ? ' (retryable)' : ''}${thrownName}</div>`;
  const parts = [head, block(error.message, 'message', `${key}:message`, 'error-text')];
  const thrown = error.thrown;
  if (thrown !== undefined) {
    if (thrown.message !== error.message) {
      parts.push(
        `<div class="small">thrown: ${h(thrown.name)}</div>${block(thrown.message, 'thrown message', `${key}:thrown`, 'error-text')}`,
      );
    }
    if (thrown.stack !== undefined && thrown.stack !== '') {
      parts.push(
        `<details data-fold="${h(`${key}:stack`)}"><summary>stack <span class="small">(${thrown.stack.split('\n').length} lines)</span></summary><pre class="text">${h(thrown.stack)}</pre></details>`,
      );
    }
    for (const c of thrown.causes ?? []) {
      parts.push(
        `<div class="small">caused by ${h(c.name)}: </div>${block(c.message, 'cause', `${key}:cause`)}`,
      );
    }
  }
  if (error.details !== undefined) {
    parts.push(
      `<details data-fold="${h(`${key}:details`)}"><summary>details</summary><pre class="text">${h(jsonText(error.details))}</pre></details>`,
    );
  }
  return `<div class="error" data-error="${h(key)}">${parts.join('')}</div>`;
}

/** The errors of the run's failed attempts, by `<stepId>#<attempt>`, from its events. */
export function attemptErrors(events: readonly StoredRunEvent[]): Map<string, SerializedError> {
  const out = new Map<string, SerializedError>();
  for (const e of events) {
    const d = e.data as RunEventRecord & { stepId?: string; attempt?: number; error?: unknown };
    if (d.type === 'step.failed' && d.stepId !== undefined && d.attempt !== undefined) {
      out.set(`${d.stepId}#${d.attempt}`, d.error as SerializedError);
    }
  }
  return out;
}

function messageHtml(m: ChatMessage, key: string): string {
  const parts: string[] = [];
  if (m.content !== null && m.content !== '') parts.push(block(m.content, m.role, key));
  if (m.role === 'assistant') {
    for (const c of m.tool_calls ?? []) {
      parts.push(
        `<div class="small">calls <span class="mono">${h(c.name)}</span> <span class="mono">${h(c.id)}</span></div>${block(c.arguments, 'arguments', `${key}:${c.id}`)}`,
      );
    }
  }
  if (m.role === 'tool') {
    parts.unshift(
      `<div class="small">answers <span class="mono">${h(m.tool_call_id)}</span></div>`,
    );
  }
  return `<div class="msg" data-role="${h(m.role)}"><div class="role">${h(m.role)}</div><div>${parts.join('')}</div></div>`;
}

function modelCallHtml(c: ModelCallView): string {
  const where =
    c.turn === null ? `attempt ${c.attempt ?? '?'}, call ${c.index + 1}` : `turn ${c.turn + 1}`;
  const key = `${c.stepId}:${c.turn ?? `a${c.attempt}.${c.index}`}`;
  const u = c.reply.usage;
  const facts = [
    `model <b>${h(c.reply.model)}</b>`,
    `finish <b>${h(c.reply.finishReason)}</b>`,
    u === null
      ? 'usage not reported'
      : `<b>${u.promptTokens}</b> in + <b>${u.completionTokens}</b> out`,
  ];
  let prompt: string;
  if (c.prompt === null) {
    prompt =
      '<p class="small">The prompt of an atomic step’s call is not stored: the journal keeps each reply with a digest of its request.</p>';
  } else if (c.prompt.length === 0) {
    prompt = '<p class="small">Not in the history yet: the turn is not committed.</p>';
  } else {
    const chars = c.prompt.reduce((n, m) => n + (m.content?.length ?? 0), 0);
    const open = chars <= FOLD_CHARS * 2 ? ' open' : '';
    prompt = `<details data-fold="${h(`${key}:prompt`)}"${open}><summary>prompt <span class="small">(${c.prompt.length} message${c.prompt.length === 1 ? '' : 's'}, ${chars} characters; the agent's system prompt is not stored)</span></summary>${c.prompt.map((m, i) => messageHtml(m, `${key}:p${i}`)).join('')}</details>`;
  }
  return `<div class="call" data-model-call="${h(key)}"><div><b>${h(c.stepId)}</b> ${where} <span class="kv">${facts.map((f) => `<span>${f}</span>`).join('')}</span></div>
${prompt}<div class="reply"><div class="small">reply</div>${messageHtml(c.reply.message, `${key}:reply`)}</div></div>`;
}

/**
 * The conversation turn `turn` (0-based) of a granular agent step answered, from the step's
 * history: the messages before the step's (turn+1)-th assistant message; the whole history while
 * that turn is not committed.
 */
export function promptOf(history: readonly ChatMessage[], turn: number): ChatMessage[] {
  let seen = -1;
  const end = history.findIndex((m) => m.role === 'assistant' && ++seen === turn);
  return end === -1 ? [...history] : history.slice(0, end);
}

/** Every journaled model call: prompt and reply. */
export function modelCallsHtml(calls: readonly ModelCallView[]): string {
  if (calls.length === 0) {
    return '<p class="empty">The model journal holds no calls of this run (it records each turn of a granular agent step and each reply of an atomic step’s attempt).</p>';
  }
  return calls.map(modelCallHtml).join('\n');
}

const clockOf = (at: unknown): string =>
  typeof at === 'number' && Number.isFinite(at) ? new Date(at).toISOString().slice(11, 23) : '-';

/** The run's event history, oldest first (the newest {@link MAX_EVENTS_SHOWN}). */
export function eventsHtml(runId: string, events: readonly StoredRunEvent[]): string {
  if (events.length === 0) return '<p class="empty">No events.</p>';
  const shown = events.slice(-MAX_EVENTS_SHOWN);
  const note =
    shown.length < events.length
      ? `<p class="small">The newest ${shown.length} of ${events.length} events; <code class="mono">${h(`flujo events ${runId}`)}</code> prints them all.</p>`
      : `<p class="small">${events.length} event${events.length === 1 ? '' : 's'}, oldest first.</p>`;
  const rows = shown.map((e) => {
    const d = e.data as RunEventRecord & { stepId?: unknown; at?: unknown; by?: unknown };
    const step = typeof d.stepId === 'string' ? d.stepId : '';
    const data = JSON.stringify(d);
    const cell =
      data.length <= 160
        ? `<span class="mono">${h(data)}</span>`
        : `<details data-fold="${h(`event:${e.id}`)}"><summary class="mono">${h(`${data.slice(0, 120)}…`)}</summary><pre class="text">${h(jsonText(d))}</pre></details>`;
    return `<tr data-event="${h(e.id)}"><td>${e.version}</td><td>${clockOf(d.at)}</td><td class="mono">${h(e.type)}</td><td>${h(step)}</td><td>${cell}</td></tr>`;
  });
  return `${note}<table class="grid events"><thead><tr><th>Version</th><th>At</th><th>Type</th><th>Step</th><th>Event</th></tr></thead>
<tbody>${rows.join('\n')}</tbody></table>`;
}
