/**
 * The web view's workers page: every live worker of the prefix (a heartbeat that has not lapsed)
 * with its host, pid, queues, operators, agents, units in flight and latest beat. Read only.
 */
import type { WorkerInfo } from '../worker/heartbeat.js';
import { escapeHtml as h } from './escape.js';
import { page, time } from './html.js';

/** A list of names, or a dash. */
const names = (list: readonly string[]): string =>
  list.length === 0 ? '-' : list.map((n) => `<span class="mono">${h(n)}</span>`).join(', ');

/** The workers page. */
export function renderWorkersPage(workers: readonly WorkerInfo[]): string {
  const rows = workers.map(
    (w) =>
      `<tr data-worker="${h(w.id)}"><td class="mono">${h(w.host)}/${w.pid}</td><td>${names(w.queues)}</td><td>${names(w.operators)}</td><td>${names(w.agents)}</td><td>${w.inFlight}</td><td>${time(w.beatAt)}</td><td>${time(w.startedAt)}</td></tr>`,
  );
  const body =
    workers.length === 0
      ? '<p class="empty">No live worker on this prefix. Start one with flujo worker or runtime.createWorker().</p>'
      : `<table class="grid workers"><thead><tr><th>Worker</th><th>Queues</th><th>Operators</th><th>Agents</th><th>In flight</th><th>Last beat</th><th>Started</th></tr></thead>
<tbody>${rows.join('\n')}</tbody></table>`;
  return page('Workers', `<h1>Workers</h1>\n${body}`);
}
