/** The inline scripts of the web view's pages: plain JavaScript in strings, nothing built or fetched. */
import { TIMELINE_SCRIPT } from '../observability/trace-html.js';

/** How often the run list asks for the runs again (ms). */
export const LIST_POLL_MS = 1500;

// The list page's script: asks for the list's table (with the page's filters) every
// LIST_POLL_MS and replaces it when its hash changed; says when it could not.
export const LIST_SCRIPT = `
(function () {
  var cfg = JSON.parse(document.getElementById('page').textContent);
  var live = document.getElementById('live');
  var runs = document.getElementById('runs');
  function poll() {
    fetch(cfg.list, { headers: { accept: 'application/json' }, cache: 'no-store' })
      .then(function (r) { if (!r.ok) throw new Error('HTTP ' + r.status); return r.json(); })
      .then(function (d) {
        if (runs.getAttribute('data-hash') !== d.hash) {
          runs.innerHTML = d.html;
          runs.setAttribute('data-hash', d.hash);
        }
        live.textContent = 'live · ' + new Date().toISOString().slice(11, 19);
        live.className = 'live on';
      })
      .catch(function (e) { live.textContent = 'could not reload: ' + e.message; live.className = 'live'; })
      .then(function () { setTimeout(poll, ${LIST_POLL_MS}); });
  }
  poll();
})();
`;

// The run page's script: draws the timeline with the trace page's own drawing code, follows the
// run's events (server-sent) and, after each burst of events, reloads the page's data and
// replaces the parts whose hash changed (keeping what a person typed into a form). Operators'
// progress reports come on the same connection and are drawn in place (the latest per step, also
// over a reloaded steps part that read an older one); an idle notice reloads the data.
export const PAGE_SCRIPT = `
(function () {
  var cfg = JSON.parse(document.getElementById('page').textContent);
  var axis = document.getElementById('axis');
  var lanes = document.getElementById('lanes');
  var traceEl = document.getElementById('trace');
  var drawn = false;
  function drawTimeline() {
    axis.textContent = '';
    lanes.textContent = '';
    // The drawing code adds its tooltip listeners each time it runs: the first ones serve.
    if (drawn) document.addEventListener = function () {};
    try {${TIMELINE_SCRIPT}} finally { delete document.addEventListener; drawn = true; }
  }
  drawTimeline();
  // A refused step action (this page answers its form): its form stays open.
  var acted = new RegExp('/steps/([^/]+)/(skip|retry)$').exec(location.pathname);
  if (acted !== null) {
    document.querySelectorAll('details[data-fold]').forEach(function (d) {
      if (d.getAttribute('data-fold') === 'act:' + decodeURIComponent(acted[1])) d.open = true;
    });
  }
  var live = document.getElementById('live');
  var loading = false, again = false, timer = null;
  function replace(el, part) {
    var folds = {};
    el.querySelectorAll('details[data-fold]').forEach(function (d) { folds[d.getAttribute('data-fold')] = d.open; });
    var kept = {};
    el.querySelectorAll('input').forEach(function (i) {
      if (i.type !== 'hidden') kept[(i.form ? i.form.getAttribute('action') : '') + ' ' + i.name] = i.value;
    });
    el.innerHTML = part.html;
    el.setAttribute('data-hash', part.hash);
    el.querySelectorAll('input').forEach(function (i) {
      var k = (i.form ? i.form.getAttribute('action') : '') + ' ' + i.name;
      if (i.type !== 'hidden' && kept[k] !== undefined) i.value = kept[k];
    });
    el.querySelectorAll('details[data-fold]').forEach(function (d) {
      var open = folds[d.getAttribute('data-fold')];
      if (open !== undefined) d.open = open;
    });
    if (el.id === 'part-steps') Object.keys(latest).forEach(function (id) { showProgress(latest[id]); });
  }
  // The latest progress heard per step: { stepId, attempt, info, at }.
  var latest = Object.create(null);
  function stepRow(stepId) {
    var rows = document.querySelectorAll('[data-step-row]');
    for (var i = 0; i < rows.length; i++) {
      if (rows[i].getAttribute('data-step-row') === stepId) return rows[i];
    }
    return null;
  }
  function previewText(value) {
    var text = typeof value === 'string' ? value : JSON.stringify(value);
    return text.length > 160 ? text.slice(0, 159) + '…' : text;
  }
  function span(cls, text) {
    var s = document.createElement('span');
    s.className = cls;
    s.textContent = text;
    return s;
  }
  function showProgress(p) {
    var row = stepRow(p.stepId);
    if (row === null) return;
    var status = row.querySelector('.status').textContent.trim();
    // Shown while the step runs, as the server draws it; a step the page still shows READY has
    // been taken by a worker: the data is reloaded to say so, and the reloaded row draws it.
    if (status === 'READY') schedule();
    if (status !== 'RUNNING') return;
    var el = row.querySelector('.progress');
    if (el !== null && Number(el.getAttribute('data-at')) > p.at) return;
    if (el === null) {
      el = document.createElement('div');
      el.className = 'progress';
      el.setAttribute('data-progress', p.stepId);
      row.querySelector('td.detail').appendChild(el);
    }
    el.setAttribute('data-at', String(p.at));
    el.textContent = 'progress ';
    el.appendChild(span('mono', previewText(p.info)));
    el.appendChild(document.createTextNode(' '));
    var at = new Date(p.at).toISOString().slice(11, 23);
    el.appendChild(span('small', 'attempt ' + p.attempt + ' · ' + at));
  }
  function refresh() {
    if (loading) { again = true; return; }
    loading = true;
    fetch(cfg.data, { headers: { accept: 'application/json' }, cache: 'no-store' })
      .then(function (r) { if (!r.ok) throw new Error('HTTP ' + r.status); return r.json(); })
      .then(function (d) {
        Object.keys(d.parts).forEach(function (name) {
          var el = document.getElementById('part-' + name);
          if (!el || el.getAttribute('data-hash') === d.parts[name].hash) return;
          // Not under the hands of a person typing in it: looked at again in a moment.
          if (el.contains(document.activeElement) && document.activeElement.tagName === 'INPUT') {
            setTimeout(schedule, 1000);
            return;
          }
          replace(el, d.parts[name]);
        });
        var text = JSON.stringify(d.trace);
        if (text !== traceEl.textContent) { traceEl.textContent = text; drawTimeline(); }
        document.title = d.title;
      })
      .catch(function (e) { live.textContent = 'could not reload: ' + e.message; })
      .then(function () {
        loading = false;
        if (again) { again = false; refresh(); }
      });
  }
  function schedule() {
    if (timer !== null) return;
    timer = setTimeout(function () { timer = null; refresh(); }, 80);
  }
  var source = new EventSource(cfg.events);
  source.onopen = function () { live.textContent = 'live'; live.className = 'live on'; };
  source.onerror = function () { live.textContent = 'reconnecting…'; live.className = 'live'; };
  source.addEventListener('run', function (ev) {
    live.textContent = 'live · ' + JSON.parse(ev.data).type;
    live.className = 'live on';
    schedule();
  });
  source.addEventListener('progress', function (ev) {
    var p = JSON.parse(ev.data);
    var seen = latest[p.stepId];
    if (seen !== undefined && seen.at > p.at) return;
    latest[p.stepId] = p;
    showProgress(p);
  });
  source.addEventListener('idle', function () { schedule(); });
  source.addEventListener('gone', function (ev) {
    source.close();
    live.textContent = JSON.parse(ev.data).message;
    live.className = 'live';
  });
})();
`;
