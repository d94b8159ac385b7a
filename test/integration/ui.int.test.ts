/**
 * The web view (`startUi`, `flujo ui`) against real Redis, driven in headless chromium: the run
 * list and its filters, a run page that follows a run live, approving and a refused approval from
 * the page, escaping, 404s and refused cross-site posts; operators' progress shown live and the
 * notice that due work waits for a worker; and the built command's life cycle.
 * Screenshots go to test-results/ui/; with FLUJO_DOCS_IMAGES=1 the images of the observability guide
 * (docs/images/) are written from the same pages.
 */
import { randomUUID } from 'node:crypto';
import { request } from 'node:http';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Browser, Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineTool,
  renderTraceHtml,
  startUi,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
  type UiServer,
} from '../../src/index.js';
import { main } from '../../src/cli/main.js';
import { RUN_MODULE_FIELD, writeMetaField } from '../../src/persistence/run-lookups.js';
import { runtimeCore } from '../../src/runtime.js';
import { silentLogger } from '../../src/logging.js';
import { launchChromium } from '../helpers/chromium.js';
import { root, startFlujo } from '../helpers/cli.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';

const OUT = join(root, 'test-results', 'ui');
const DOCS = join(root, 'docs', 'images');
const writeDocs = process.env['FLUJO_DOCS_IMAGES'] === '1';

const reportPlan: PlanInput = {
  name: 'report',
  steps: [{ id: 'draft', kind: 'operator', operator: 'draft' }],
};
const importPlan: PlanInput = {
  name: 'import',
  steps: [{ id: 'load', kind: 'operator', operator: 'boom', retry: { maxAttempts: 1 } }],
};
const publishPlan: PlanInput = {
  name: 'publish',
  steps: [
    { id: 'fetch', kind: 'operator', operator: 'fetch' },
    {
      id: 'review',
      kind: 'human_gate',
      dependsOn: ['fetch'],
      gate: { approvers: ['ana'], reason: 'check the numbers' },
    },
    { id: 'summarize', kind: 'agent', agent: 'writer', dependsOn: ['review'], maxTurns: 4 },
  ],
};
const tickPlan: PlanInput = {
  name: 'ticks',
  steps: [{ id: 'count', kind: 'operator', operator: 'tick' }],
};
const pricing = { models: { 'gpt-test': { inputPerMillion: 2.5, outputPerMillion: 10 } } };

let browser: Browser;
const model = useScriptedModel();
let runtime: Runtime;
let worker: FlujoWorker;
let ui: UiServer;
let prefix: string;
let calls: { draft: number; boom: number; fetch: number };
let release: () => void;
let held: Promise<void>;
let boomMessage: string;
/** The tick operator: how many of its pauses it reached, and what lets it go on from the latest. */
let ticking: { at: number; next: () => void; over: boolean };

beforeAll(async () => {
  browser = await launchChromium();
  mkdirSync(OUT, { recursive: true });
  if (writeDocs) mkdirSync(DOCS, { recursive: true });
});
afterAll(async () => {
  await browser.close();
});
beforeEach(async () => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  calls = { draft: 0, boom: 0, fetch: 0 };
  boomMessage = 'the source said no';
  ticking = { at: 0, next: () => {}, over: false };
  const pause = async () => {
    if (ticking.over) return;
    ticking.at += 1;
    await new Promise<void>((resolve) => (ticking.next = resolve));
  };
  held = new Promise((resolve) => (release = resolve));
  const search = defineTool({
    name: 'search',
    input: z.object({ q: z.string() }),
    class: 'read_only',
    run: ({ q }) => ({ hits: [`${q}: 3 rows`] }),
  });
  const writer = scriptedAgent(model, {
    name: 'writer',
    systemPrompt: 'Search, then answer.',
    tools: [search],
    timeoutMs: 5000,
  });
  runtime = createRuntime({
    pricing,
    redis: redisUrl(),
    prefix,
    logger: silentLogger,
    operators: {
      draft: () => {
        calls.draft += 1;
        return { text: 'draft ready' };
      },
      boom: () => {
        calls.boom += 1;
        throw new Error(boomMessage);
      },
      fetch: async () => {
        calls.fetch += 1;
        await held;
        return { rows: 3 };
      },
      tick: async ({ progress }) => {
        await pause();
        progress({ done: 1, of: 3 });
        await pause();
        progress({ done: 2, of: 3 });
        await pause();
        // A burst: only the latest counts.
        for (const note of ['a', 'b', 'c', 'last']) progress({ done: 3, of: 3, note });
        await pause();
        return { counted: 3 };
      },
    },
  }).agent(writer);
  worker = runtime.createWorker({ concurrency: 2 });
  await worker.ready();
  ui = await startUi(runtime, { port: 0 });
});
afterEach(async () => {
  release();
  ticking.over = true;
  ticking.next();
  await ui.close();
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

async function openPage(
  path: string,
  base: string = ui.url,
): Promise<{ page: Page; errors: string[] }> {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  // Nothing but the view itself: every other request is refused and counted as an error.
  await page.route('**/*', (route) => {
    if (route.request().url().startsWith(base)) return route.continue();
    errors.push(`fetched ${route.request().url()}`);
    return route.abort();
  });
  await page.goto(new URL(path, base).href);
  return { page, errors };
}

/** Starts a publish run and waits until it waits at its gate (its fetch released). */
async function waitingRun(): Promise<string> {
  release();
  const run = await runtime.start(publishPlan, null);
  const report = await run.settled({ timeoutMs: 10_000 });
  expect(report.status).toBe('waiting');
  return run.runId;
}

/** The run ids of the list, in its order. */
async function listed(page: Page): Promise<string[]> {
  const rows = page.locator('table.runs tbody tr');
  const ids: string[] = [];
  for (let i = 0; i < (await rows.count()); i++) {
    ids.push((await rows.nth(i).getAttribute('data-run')) ?? '');
  }
  return ids;
}

/** Each listed run's status, by run id. */
async function statuses(page: Page): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const id of await listed(page)) {
    out[id] = await page.locator(`[data-run="${id}"] .status`).innerText();
  }
  return out;
}

describe('the run list', () => {
  it('shows finished, failed and waiting runs newest first, and its filters narrow it', async () => {
    const done = await runtime.start(reportPlan, null);
    expect((await done.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const failed = await runtime.start(importPlan, null, { tenantId: 'acme' });
    expect((await failed.settled({ timeoutMs: 10_000 })).status).toBe('failed');
    const waiting = await waitingRun();

    const { page, errors } = await openPage('/');
    expect(await page.locator('table.runs tbody tr').count()).toBe(3);
    expect(await statuses(page)).toEqual({
      [done.runId]: 'succeeded',
      [failed.runId]: 'failed',
      [waiting]: 'waiting',
    });
    // Newest first.
    expect(await listed(page)).toEqual([waiting, failed.runId, done.runId]);
    expect(await page.locator(`[data-run="${waiting}"]`).innerText()).toContain(
      'review (waits for approval)',
    );
    await page.setViewportSize({ width: 1180, height: 300 });
    await page.screenshot({ path: join(OUT, 'list.png'), fullPage: true });
    if (writeDocs) await page.screenshot({ path: join(DOCS, 'ui-list.png'), fullPage: true });
    await page.setViewportSize({ width: 1280, height: 900 });

    // The GET form: status failed.
    await page.selectOption('select[name=status]', 'failed');
    await page.click('form.filters button[type=submit]');
    await page.waitForURL(/status=failed/);
    expect(await statuses(page)).toEqual({ [failed.runId]: 'failed' });
    // Tenant, then plan.
    await page.selectOption('select[name=status]', '');
    await page.fill('input[name=tenant]', 'acme');
    await page.click('form.filters button[type=submit]');
    await page.waitForURL(/tenant=acme/);
    expect(await statuses(page)).toEqual({ [failed.runId]: 'failed' });
    await page.goto(new URL('/?plan=publish', ui.url).href);
    expect(await statuses(page)).toEqual({ [waiting]: 'waiting' });
    await page.goto(new URL('/?plan=nothing-like-it', ui.url).href);
    expect(await page.locator('table.runs tbody tr').count()).toBe(0);
    expect(await page.locator('.empty').innerText()).toBe('No runs match.');

    // A run's link leads to its page.
    await page.goto(ui.url);
    await page.click(`[data-run="${done.runId}"] a`);
    await page.waitForURL(`**/runs/${done.runId}`);
    expect(await page.locator('[data-step-row="draft"] .status').innerText()).toBe('SUCCEEDED');
    await page.close();
    expect(errors).toEqual([]);
  });

  it('refuses a status filter that is not a status, naming the field', async () => {
    const res = await fetch(new URL('/?status=bogus', ui.url));
    expect(res.status).toBe(400);
    const text = await res.text();
    expect(text).toContain('status');
    expect(text).toContain('bogus');
  });
});

describe('a run page', () => {
  it('follows the run live, refuses a person the gate does not list, and approves', async () => {
    model.enqueue(
      {
        toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'q3' } }],
        usage: { prompt_tokens: 40, completion_tokens: 12 },
      },
      { text: 'Three rows, all fine.', usage: { prompt_tokens: 70, completion_tokens: 8 } },
    );
    const run = await runtime.start(publishPlan, 'q3 numbers');
    await expect.poll(() => calls.fetch).toBe(1);
    const { page, errors } = await openPage(`/runs/${run.runId}`);
    let loads = 0;
    page.on('load', () => (loads += 1));
    const stepStatus = (id: string) => page.locator(`[data-step-row="${id}"] .status`).innerText();
    expect(await stepStatus('fetch')).toBe('RUNNING');
    expect(await page.locator('[data-approval]').count()).toBe(0);
    await expect.poll(() => page.locator('#live').innerText()).toContain('live');
    await page.evaluate(() => ((globalThis as unknown as { mark: number }).mark = 7));

    // The operator finishes: the page shows it without a reload.
    release();
    await expect.poll(() => stepStatus('fetch'), { timeout: 10_000 }).toBe('SUCCEEDED');
    await expect.poll(() => stepStatus('review')).toBe('WAITING_APPROVAL');
    await expect.poll(() => page.locator('[data-approval="review"]').count()).toBe(1);
    await expect.poll(() => page.locator('#run-status').innerText()).toContain('waiting');
    await expect
      .poll(() => page.locator('[data-step="fetch"] .bar.attempt').getAttribute('data-outcome'))
      .toBe('succeeded');
    expect(await page.evaluate(() => (globalThis as unknown as { mark?: number }).mark)).toBe(7);
    expect(loads).toBe(0);
    expect(await page.locator('[data-approval="review"]').innerText()).toContain(
      'check the numbers',
    );

    // bo is not among the gate's approvers: refused, and nothing changes.
    const before = await runtime.status(run.runId);
    await page.fill('[data-approval="review"] input[name=by]', 'bo');
    await page.fill('[data-approval="review"] input[name=comment]', 'looks fine');
    await page.click('[data-approval="review"] button.approve');
    await page.waitForSelector('#notice');
    const refusal = await page.locator('#notice').innerText();
    expect(refusal).toContain('bo may not decide on step "review"');
    expect(refusal).toContain('only ana may approve or reject it');
    const after = await runtime.status(run.runId);
    expect(after.status).toBe('waiting');
    expect(after.version).toBe(before.version);
    expect(await stepStatus('review')).toBe('WAITING_APPROVAL');
    expect(model.requests).toHaveLength(0);

    // ana approves: the run goes on to its end, and the page follows it.
    await page.fill('[data-approval="review"] input[name=by]', 'ana');
    await page.fill('[data-approval="review"] input[name=comment]', 'numbers check out');
    await page.click('[data-approval="review"] button.approve');
    await page.waitForURL(`**/runs/${run.runId}?done=approve`);
    expect(await page.locator('#notice').innerText()).toBe('Approved: the step goes on.');
    await page.screenshot({ path: join(OUT, 'approve.png'), fullPage: true });
    const end = await run.settled({ timeoutMs: 10_000 });
    expect(end.status).toBe('succeeded');
    expect(end.steps.find((s) => s.stepId === 'review')?.approval).toMatchObject({
      by: 'ana',
      comment: 'numbers check out',
    });
    expect(model.requests).toHaveLength(2);
    await expect.poll(() => stepStatus('summarize')).toBe('SUCCEEDED');
    await expect.poll(() => page.locator('#run-status').innerText()).toContain('succeeded');
    expect(await page.locator('[data-approval]').count()).toBe(0);
    expect(await page.locator('[data-step-row="review"]').innerText()).toContain('approved by ana');
    expect(await page.locator('.lane').count()).toBe(3);
    // The agent's tool call, model calls and cost: 110 tokens in at $2.5/M, 20 out at $10/M.
    await expect.poll(() => page.locator('table.ledger tbody tr').count()).toBe(1);
    const call = await page.locator('table.ledger tbody tr').innerText();
    expect(call).toContain('search@1');
    expect(call).toContain('SUCCEEDED');
    expect(call).toContain('q3: 3 rows');
    expect(await page.locator('table.usage tbody tr').count()).toBe(2);
    expect(await page.locator('#cost').innerText()).toBe('$0.000475');
    expect(await page.locator('[data-step="summarize"] .bar.model').count()).toBe(2);
    await page.screenshot({ path: join(OUT, 'run.png'), fullPage: true });
    if (writeDocs) await page.screenshot({ path: join(DOCS, 'ui-run.png'), fullPage: true });
    await page.close();
    expect(errors).toEqual([]);

    // The trace page `flujo trace --html` writes, for the observability guide.
    const trace = await browser.newPage({ viewport: { width: 1200, height: 360 } });
    await trace.setContent(renderTraceHtml(await runtime.trace(run.runId)));
    expect(await trace.locator('.lane').count()).toBe(3);
    await trace.screenshot({ path: join(OUT, 'trace.png'), fullPage: true });
    if (writeDocs) await trace.screenshot({ path: join(DOCS, 'trace.png'), fullPage: true });
    await trace.close();
  });

  it('rejects from the page: the gated step fails finally', async () => {
    const runId = await waitingRun();
    const { page, errors } = await openPage(`/runs/${runId}`);
    await page.fill('[data-approval="review"] input[name=by]', 'ana');
    await page.click('[data-approval="review"] button.reject');
    await page.waitForURL(`**/runs/${runId}?done=reject`);
    const report = await runtime.status(runId);
    expect(report.status).toBe('failed');
    expect(report.steps.find((s) => s.stepId === 'review')?.rejection?.by).toBe('ana');
    expect(model.requests).toHaveLength(0);
    await expect.poll(() => page.locator('#run-status').innerText()).toContain('failed');
    expect(await page.locator('#notice').innerText()).toBe('Rejected.');
    await page.screenshot({ path: join(OUT, 'reject.png'), fullPage: true });
    await page.close();
    expect(errors).toEqual([]);
  });

  it('shows the progress an operator reports live, the latest only, without a reload', async () => {
    const run = await runtime.start(tickPlan, null);
    await expect.poll(() => ticking.at).toBe(1);
    const { page, errors } = await openPage(`/runs/${run.runId}`);
    let loads = 0;
    page.on('load', () => (loads += 1));
    await page.evaluate(() => ((globalThis as unknown as { mark: number }).mark = 7));
    await expect.poll(() => page.locator('#live').innerText()).toContain('live');
    const progress = page.locator('[data-step-row="count"] [data-progress="count"]');
    expect(await progress.count()).toBe(0);

    ticking.next();
    await expect.poll(() => ticking.at).toBe(2);
    await expect.poll(() => progress.count()).toBe(1);
    await expect.poll(() => progress.locator('.mono').innerText()).toBe('{"done":1,"of":3}');
    expect(await progress.innerText()).toContain('attempt 1');
    expect(await page.locator('[data-step-row="count"] .status').innerText()).toBe('RUNNING');

    ticking.next();
    await expect.poll(() => ticking.at).toBe(3);
    await expect.poll(() => progress.locator('.mono').innerText()).toBe('{"done":2,"of":3}');

    ticking.next();
    await expect.poll(() => ticking.at).toBe(4);
    await expect
      .poll(() => progress.locator('.mono').innerText())
      .toBe('{"done":3,"of":3,"note":"last"}');
    // Settled on the latest: nothing older comes after it.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(await progress.locator('.mono').innerText()).toBe('{"done":3,"of":3,"note":"last"}');
    expect(await progress.count()).toBe(1);
    await page.screenshot({ path: join(OUT, 'run-progress.png'), fullPage: true });
    // Progress is not history: the run's events hold none of it.
    const types: string[] = [];
    for await (const e of runtime.events(run.runId)) types.push(e.type);
    expect(types.filter((t) => t.includes('progress'))).toEqual([]);
    // A page opened now starts from the latest.
    const second = await openPage(`/runs/${run.runId}`);
    expect(await second.page.locator('[data-progress="count"] .mono').innerText()).toBe(
      '{"done":3,"of":3,"note":"last"}',
    );
    await second.page.close();
    expect(second.errors).toEqual([]);

    // The step ends: its progress goes with its running.
    ticking.next();
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await expect
      .poll(() => page.locator('[data-step-row="count"] .status').innerText())
      .toBe('SUCCEEDED');
    expect(await progress.count()).toBe(0);
    expect(await page.evaluate(() => (globalThis as unknown as { mark?: number }).mark)).toBe(7);
    expect(loads).toBe(0);
    await page.close();
    expect(errors).toEqual([]);
  });

  it('says when due work waits for a worker, naming the command that starts one', async () => {
    await worker.close();
    const run = await runtime.start(reportPlan, null);
    // The job module, as `flujo run` records it; a second run records none.
    const core = runtimeCore(runtime);
    const module = '/srv/jobs/my report.ts';
    await writeMetaField(core.redis, core.stores.keys, run.runId, RUN_MODULE_FIELD, module);
    const unrecorded = await runtime.start(reportPlan, null);
    const { page, errors } = await openPage(`/runs/${run.runId}`);
    let loads = 0;
    page.on('load', () => (loads += 1));
    const notice = page.locator('#idle');
    expect(await notice.count()).toBe(0);
    await expect.poll(() => page.locator('#live').innerText()).toContain('live');

    // No event comes while nothing runs: the page is told when the work has waited 5 s.
    await expect.poll(() => notice.count(), { timeout: 15_000 }).toBe(1);
    const text = await notice.innerText();
    expect(text).toMatch(/^No worker has taken step draft for \d+(\.\d)? s: /);
    expect(text).toContain(`start one with flujo worker '${module}' (same --redis and --prefix`);
    expect(text).toContain(`continue the run with flujo resume ${run.runId} '${module}'.`);
    await page.screenshot({ path: join(OUT, 'run-idle.png'), fullPage: true });
    const other = await openPage(`/runs/${unrecorded.runId}`);
    const placeholder = await other.page.locator('#idle').innerText();
    expect(placeholder).toContain('start one with flujo worker <job-module>');
    expect(placeholder).toContain(`flujo resume ${unrecorded.runId} <job-module>`);
    expect(placeholder).toContain('<job-module> stands for the path of the job module');
    await other.page.close();
    expect(other.errors).toEqual([]);

    // A worker takes the work: the notice goes and the run ends, all without a reload.
    worker = runtime.createWorker({ concurrency: 1 });
    await worker.ready();
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await expect
      .poll(() => page.locator('[data-step-row="draft"] .status').innerText())
      .toBe('SUCCEEDED');
    expect(await notice.count()).toBe(0);
    expect(loads).toBe(0);
    expect((await unrecorded.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await page.close();
    expect(errors).toEqual([]);
  });
});

/** A raw request, with headers fetch would not let a caller set (Host). */
function raw(
  path: string,
  options: { method?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<{ status: number; body: string }> {
  const url = new URL(path, ui.url);
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      { method: options.method ?? 'GET', headers: options.headers ?? {} },
      (res) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on('error', reject);
    req.end(options.body);
  });
}

const FORM = { 'content-type': 'application/x-www-form-urlencoded' };

describe('what the view refuses', () => {
  it('escapes what comes from a run', async () => {
    const runId = `<img src=x onerror="window.pwned=1">`;
    boomMessage = '<script>window.pwned=2</script> went wrong';
    const run = await runtime.start(importPlan, null, { runId });
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('failed');
    const { page, errors } = await openPage('/');
    expect(await page.locator('table.runs tbody tr a').innerText()).toBe(runId);
    await page.click('table.runs tbody tr a');
    await page.waitForSelector('[data-step-row="load"]');
    expect(await page.locator('h1 .mono').innerText()).toBe(runId);
    expect(await page.locator('[data-step-row="load"]').innerText()).toContain(
      '<script>window.pwned=2</script> went wrong',
    );
    expect(await page.locator('img').count()).toBe(0);
    expect(await page.locator('script:not([type="application/json"])').count()).toBe(1);
    expect(await page.evaluate(() => (globalThis as unknown as { pwned?: number }).pwned)).toBe(
      undefined,
    );
    await page.close();
    expect(errors).toEqual([]);
  });

  it('answers 404 for an unknown run and for paths it does not serve', async () => {
    const unknown = await raw('/runs/no-such-run');
    expect(unknown.status).toBe(404);
    expect(unknown.body).toContain('Run &quot;no-such-run&quot; not found');
    for (const path of [
      '/nope',
      '/runs',
      '/runs/',
      '/runs/no-such-run/else',
      '/runs/%E0%A4%A',
      '/runs/no-such-run/events',
      '/runs/no-such-run/data',
    ]) {
      expect([path, (await raw(path)).status]).toEqual([path, 404]);
    }
    const post = await raw('/runs/no-such-run/steps/review/approve', {
      method: 'POST',
      headers: FORM,
      body: 'by=ana',
    });
    expect(post.status).toBe(404);
  });

  it('refuses a decision from another site, another host name, or without "by"; nothing changes', async () => {
    const runId = await waitingRun();
    const trace = await raw(`/runs/${runId}/trace`);
    expect(trace.status).toBe(200);
    expect(trace.body).toContain(`<title>Run ${runId} · flujo trace</title>`);
    const before = await runtime.status(runId);
    const path = `/runs/${runId}/steps/review/approve`;
    const foreign = await raw(path, {
      method: 'POST',
      headers: { ...FORM, origin: 'http://evil.test' },
      body: 'by=ana',
    });
    expect(foreign.status).toBe(403);
    expect(foreign.body).toContain('another site');
    const crossSite = await raw(path, {
      method: 'POST',
      headers: { ...FORM, 'sec-fetch-site': 'cross-site' },
      body: 'by=ana',
    });
    expect(crossSite.status).toBe(403);
    const rebound = await raw(path, {
      method: 'POST',
      headers: { ...FORM, host: 'evil.test' },
      body: 'by=ana',
    });
    expect(rebound.status).toBe(421);
    const nobody = await raw(path, { method: 'POST', headers: FORM, body: 'by=%20&comment=x' });
    expect(nobody.status).toBe(400);
    expect(nobody.body).toContain('Say who decides');
    const after = await runtime.status(runId);
    expect(after.status).toBe('waiting');
    expect(after.version).toBe(before.version);
    expect(model.requests).toHaveLength(0);
    // The same form from the view itself goes through.
    model.enqueue({ text: 'Fine.', usage: { prompt_tokens: 10, completion_tokens: 2 } });
    const own = await raw(path, {
      method: 'POST',
      headers: { ...FORM, origin: ui.url.slice(0, -1) },
      body: 'by=ana',
    });
    expect(own.status).toBe(303);
    expect((await runtime.status(runId)).steps[1]?.approval?.by).toBe('ana');
  });
});

describe('a decision the embedding service refuses', () => {
  it('shows the refusal of authorizeDecision, and nothing changes', async () => {
    const runId = await waitingRun();
    const asked: string[] = [];
    const guarded = createRuntime({
      redis: redisUrl(),
      prefix,
      logger: silentLogger,
      authorizeDecision: (_run, stepId, by, decision) => {
        asked.push(`${decision} ${stepId} by ${by}`);
        return false;
      },
    });
    const guardedUi = await startUi(guarded, { port: 0 });
    try {
      const before = await runtime.status(runId);
      const { page, errors } = await openPage(`/runs/${runId}`, guardedUi.url);
      await page.fill('[data-approval="review"] input[name=by]', 'ana');
      await page.click('[data-approval="review"] button.approve');
      await page.waitForSelector('#notice');
      expect(await page.locator('#notice').innerText()).toContain(
        'ana may not decide on step "review"',
      );
      expect(await page.locator('#notice').innerText()).toContain('refused by authorizeDecision');
      expect(asked).toEqual(['approve review by ana']);
      const after = await runtime.status(runId);
      expect(after.status).toBe('waiting');
      expect(after.version).toBe(before.version);
      expect(model.requests).toHaveLength(0);
      await page.close();
      expect(errors).toEqual([]);
    } finally {
      await guardedUi.close();
      await guarded.close();
    }
  });
});

describe('flujo ui', () => {
  it('refuses a bad port and exits 6 when Redis is unreachable', async () => {
    expect(await main(['ui', '--port', 'x', '--redis', redisUrl()])).toBe(2);
    expect(await main(['ui', '--port', '70000', '--redis', redisUrl()])).toBe(2);
    expect(await main(['ui', 'extra', '--redis', redisUrl()])).toBe(2);
    expect(await main(['ui', '--redis', 'redis://127.0.0.1:1'])).toBe(6);
  });

  it('prints its URL, serves the runs, and stops on SIGTERM (the built command)', async () => {
    const runId = await waitingRun();
    const { child, out, done } = startFlujo(['ui', '--port', '0'], { prefix });
    const exited = done.then((r) => r.code);
    await expect
      .poll(() => out(), { timeout: 15_000 })
      .toMatch(/flujo ui: http:\/\/127\.0\.0\.1:\d+\//);
    const url = /(http:\/\/127\.0\.0\.1:\d+\/)/.exec(out())![1]!;
    const list = await (await fetch(url)).text();
    expect(list).toContain(runId);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  });
});
