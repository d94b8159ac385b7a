/**
 * The web view's schedules page: every schedule of the prefix with its rule, state and next fire,
 * and its newest fires with their outcome, each started fire linking to its run. Read only (the
 * schedules are changed with the API or `flujo schedule`).
 */
import type { ScheduleInfo } from '../operations/schedules.js';
import type { ScheduleFire } from '../worker/schedule-store.js';
import { escapeHtml as h } from './escape.js';
import { badge, page, time, urlPath } from './html.js';

/** How many fires of each schedule the page shows. */
const SHOWN_FIRES = 10;

/** One fire: when, what came of it (its run linked), and why. */
function fireHtml(fire: ScheduleFire): string {
  const run =
    fire.runId === undefined || (fire.outcome !== 'started' && fire.outcome !== 'buffered')
      ? ''
      : ` <a class="mono" href="${h(urlPath('runs', fire.runId))}">${h(fire.runId)}</a>`;
  const manual = fire.manual === true ? ' <span class="small">(trigger)</span>' : '';
  const why = fire.reason === undefined ? '' : ` <span class="small">${h(fire.reason)}</span>`;
  return `<li>${time(fire.at)}${manual} ${badge(fire.outcome)}${run}${why}</li>`;
}

/** A schedule's rule in words. */
function ruleText(s: ScheduleInfo): string {
  if (s.cron === undefined) return `every ${s.everyMs ?? '?'} ms`;
  return `cron <span class="mono">${h(s.cron)}</span>${s.tz === undefined ? ' UTC' : ` ${h(s.tz)}`}`;
}

/** The schedules page. */
export function renderSchedulesPage(schedules: readonly ScheduleInfo[]): string {
  const rows = schedules.map((s) => {
    const fires = s.fires.slice(0, SHOWN_FIRES).map(fireHtml).join('');
    const more =
      s.fires.length > SHOWN_FIRES
        ? `<li class="small">… ${s.fires.length - SHOWN_FIRES} older</li>`
        : '';
    return `<tr data-schedule="${h(s.id)}"><td class="mono">${h(s.id)}</td><td>${ruleText(s)}</td><td>${h(s.plan)}</td><td>${badge(s.paused ? 'paused' : 'active')}</td><td>${h(s.overlap)}</td><td>${time(s.nextFireAt)}</td><td><ul class="fires">${fires}${more}</ul></td></tr>`;
  });
  const body =
    schedules.length === 0
      ? '<p class="empty">No schedules. Define one with runtime.schedule(…) or flujo schedule add.</p>'
      : `<table class="grid schedules"><thead><tr><th>Schedule</th><th>Fires</th><th>Plan</th><th>State</th><th>Overlap</th><th>Next fire</th><th>Newest fires</th></tr></thead>
<tbody>${rows.join('\n')}</tbody></table>`;
  return page('Schedules', `<h1>Schedules</h1>\n${body}`);
}
