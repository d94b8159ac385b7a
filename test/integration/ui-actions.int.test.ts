/**
 * Acting on runs from the web view, in headless chromium against real Redis: resume, retry a step,
 * skip, cancel and send again, each clicked through a run page and checked in the runtime; a
 * refused action that changes nothing; forms posted from another site refused. And what the run
 * page shows in full (input and result, every attempt's whole error, the model journal's prompts
 * and replies, the event history) and the run list following new runs live.
 * Screenshots go to test-results/ui/ (test-results/ is not committed).
 */
import { randomUUID } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import type { Browser, Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineTool,
  startUi,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
  type UiServer,
} from '../../src/index.js';
import { runtimeCore } from '../../src/runtime.js';
import { silentLogger } from '../../src/logging.js';
import { launchChromium } from '../helpers/chromium.js';
import { root } from '../helpers/cli.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';

const OUT = join(root, 'test-results', 'ui');

/** `load` fails while `failing` holds (one attempt each time); `report` depends on it. */
const importPlan: PlanInput = {
  name: 'import',
  steps: [
    { id: 'load', kind: 'operator', operator: 'flaky', retry: { maxAttempts: 1 } },
    { id: 'report', kind: 'operator', operator: 'draft', dependsOn: ['load'] },
  ],
};
const heldPlan: PlanInput = {
  name: 'held',
  steps: [
    { id: 'wait', kind: 'operator', operator: 'slow' },
    { id: 'after', kind: 'operator', operator: 'draft', dependsOn: ['wait'] },
  ],
};
const reportPlan: PlanInput = {
  name: 'report',
  steps: [{ id: 'draft', kind: 'operator', operator: 'draft' }],
};
const gatedPlan: PlanInput = {
  name: 'gated',
  steps: [
    { id: 'draft', kind: 'operator', operator: 'draft' },
    {
      id: 'review',
      kind: 'human_gate',
      dependsOn: ['draft'],
      gate: { approvers: ['ana'], reason: 'check the draft' },
    },
  ],
};
const researchPlan: PlanInput = {
  name: 'research',
  steps: [{ id: 'research', kind: 'agent', agent: 'researcher', mode: 'granular', maxTurns: 4 }],
};

const FAILURE =
  'the source said no\n  at row 17: "amount" is empty\n  at row 18: "amount" is empty';

let browser: Browser;
const model = useScriptedModel();
let runtime: Runtime;
let worker: FlujoWorker;
let ui: UiServer;
let prefix: string;
let calls: { flaky: number; draft: number; slow: number; inputs: unknown[] };
let failing: boolean;
let release: () => void;
let aborted: boolean;

beforeAll(async () => {
  browser = await launchChromium();
  mkdirSync(OUT, { recursive: true });
});
afterAll(async () => {
  await browser.close();
});
beforeEach(async () => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  calls = { flaky: 0, draft: 0, slow: 0, inputs: [] };
  failing = true;
  aborted = false;
  const held = new Promise<void>((resolve) => (release = resolve));
  const lookup = defineTool({
    name: 'lookup',
    input: z.object({ q: z.string() }),
    class: 'read_only',
    run: ({ q }) => ({ rows: [`${q}: 3 rows`] }),
  });
  runtime = createRuntime({
    redis: redisUrl(),
    prefix,
    logger: silentLogger,
    pricing: { models: { 'gpt-test': { inputPerMillion: 2.5, outputPerMillion: 10 } } },
    operators: {
      flaky: () => {
        calls.flaky += 1;
        if (failing) throw new Error(FAILURE);
        return { rows: 2 };
      },
      draft: ({ input }) => {
        calls.draft += 1;
        calls.inputs.push(input);
        return { text: 'draft ready' };
      },
      slow: async ({ signal }) => {
        calls.slow += 1;
        signal.addEventListener('abort', () => (aborted = true));
        await Promise.race([
          held,
          new Promise((resolve) => signal.addEventListener('abort', resolve)),
        ]);
        return { done: true };
      },
    },
  }).agent(
    scriptedAgent(model, {
      name: 'researcher',
      systemPrompt: 'Look things up, then answer.',
      tools: [lookup],
      timeoutMs: 5000,
    }),
  );
  worker = runtime.createWorker({ concurrency: 2 });
  await worker.ready();
  ui = await startUi(runtime, { port: 0 });
});
afterEach(async () => {
  release();
  await ui.close();
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

async function openPage(path: string): Promise<{ page: Page; errors: string[] }> {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.route('**/*', (route) => {
    if (route.request().url().startsWith(ui.url)) return route.continue();
    errors.push(`fetched ${route.request().url()}`);
    return route.abort();
  });
  await page.goto(new URL(path, ui.url).href);
  return { page, errors };
}

/** A run of the import plan that failed at `load` (its `report` cancelled). */
async function failedRun(): Promise<string> {
  const run = await runtime.start(importPlan, { source: 'sales.csv' });
  const report = await run.settled({ timeoutMs: 10_000 });
  expect(report.status).toBe('failed');
  expect(report.steps.map((s) => s.status)).toEqual(['FAILED_FINAL', 'CANCELLED']);
  return run.runId;
}

const stepOf = async (runId: string, stepId: string) =>
  (await runtime.status(runId)).steps.find((s) => s.stepId === stepId)!;

/** The run's events of `type`, as committed. */
async function eventsOf(runId: string, type: string): Promise<Record<string, unknown>[]> {
  const out: Record<string, unknown>[] = [];
  for await (const e of runtime.events(runId)) {
    if (e.type === type) out.push(e.data);
  }
  return out;
}

const shot = (page: Page, name: string) =>
  page.screenshot({ path: join(OUT, `${name}.png`), fullPage: true });

describe('acting on a run from its page', () => {
  it('resumes a failed run: its failed steps get one more attempt and the run succeeds', async () => {
    const runId = await failedRun();
    const { page, errors } = await openPage(`/runs/${runId}`);
    expect(await page.locator('button.resume').count()).toBe(1);
    // A failed run is over: there is nothing to cancel.
    expect(await page.locator('button.cancel').count()).toBe(0);
    failing = false;
    await page.fill('.actions input[name=by]', 'ana');
    await page.click('button.resume');
    await page.waitForURL(`**/runs/${runId}?done=resume`);
    const end = await (await runtime.attach(runId)).settled({ timeoutMs: 10_000 });
    expect(end.status).toBe('succeeded');
    expect(calls.flaky).toBe(2);
    expect(calls.draft).toBe(1);
    expect((await stepOf(runId, 'load')).attempt).toBe(2);
    expect(await eventsOf(runId, 'run.resumed')).toEqual([
      expect.objectContaining({ type: 'run.resumed', by: 'ana' }),
    ]);
    expect(await page.locator('#notice').innerText()).toContain('Resumed');
    await expect.poll(() => page.locator('#run-status').innerText()).toContain('succeeded');
    await expect
      .poll(() => page.locator('[data-step-row="report"] .status').innerText())
      .toBe('SUCCEEDED');
    expect(await page.locator('button.resume').count()).toBe(0);
    await shot(page, 'resume');
    await page.close();
    expect(errors).toEqual([]);
  });

  it('retries a step that failed finally (a resume of its run)', async () => {
    const runId = await failedRun();
    const { page, errors } = await openPage(`/runs/${runId}`);
    const row = page.locator('[data-step-row="load"]');
    // Only the failed step offers a retry; the cancelled one can be skipped.
    expect(await page.locator('button.retry').count()).toBe(1);
    expect(await page.locator('[data-step-row="report"] button.skip').count()).toBe(1);
    failing = false;
    await row.locator('details.act summary').click();
    expect(await row.locator('details.act').innerText()).toContain(
      'every step that failed finally (load) gets one more attempt',
    );
    await row.locator('input[name=by]').fill('ana');
    await row.locator('button.retry').click();
    await page.waitForURL(`**/runs/${runId}?done=retry`);
    const end = await (await runtime.attach(runId)).settled({ timeoutMs: 10_000 });
    expect(end.status).toBe('succeeded');
    expect(calls.flaky).toBe(2);
    expect(end.steps.map((s) => [s.stepId, s.status, s.attempt])).toEqual([
      ['load', 'SUCCEEDED', 2],
      ['report', 'SUCCEEDED', 1],
    ]);
    expect((await eventsOf(runId, 'run.resumed')).map((e) => e['by'])).toEqual(['ana']);
    await expect.poll(() => page.locator('[data-step-row="load"] [data-attempt]').count()).toBe(2);
    // The first attempt's error stays on the page, whole.
    expect(await page.locator('[data-error="load#1"] pre').first().innerText()).toBe(FAILURE);
    await shot(page, 'retry');
    await page.close();
    expect(errors).toEqual([]);
  });

  it('refuses to retry a step that did not fail, saying why, and changes nothing', async () => {
    const runId = await failedRun();
    const before = await runtime.status(runId);
    const res = await post(`/runs/${runId}/steps/report/retry`, 'by=ana');
    expect(res.status).toBe(409);
    expect(res.body).toContain(
      'Step &quot;report&quot; is CANCELLED; only a step that failed finally can be retried.',
    );
    expect((await runtime.status(runId)).version).toBe(before.version);
  });

  it('skips a failed step with a reason: its dependent runs and the run succeeds', async () => {
    const runId = await failedRun();
    const { page, errors } = await openPage(`/runs/${runId}`);
    const row = page.locator('[data-step-row="load"]');
    await row.locator('details.act summary').click();
    await row.locator('input[name=by]').fill('ana');
    // Without a reason: refused, whole, and nothing changes.
    await row.locator('button.skip').click();
    await page.waitForSelector('#notice');
    expect(await page.locator('#notice').innerText()).toBe(
      'Say why step "load" is skipped: fill in "reason" (e.g. done by hand), then skip again.',
    );
    expect((await runtime.status(runId)).status).toBe('failed');
    const again = page.locator('[data-step-row="load"]');
    // The refused form stays open.
    expect(await again.locator('details.act').getAttribute('open')).toBe('');
    await again.locator('input[name=by]').fill('ana');
    await again.locator('input[name=reason]').fill('loaded by hand');
    await again.locator('button.skip').click();
    await page.waitForURL(`**/runs/${runId}?done=skip`);
    const end = await (await runtime.attach(runId)).settled({ timeoutMs: 10_000 });
    expect(end.status).toBe('succeeded');
    expect(calls.flaky).toBe(1);
    expect(calls.draft).toBe(1);
    const load = end.steps.find((s) => s.stepId === 'load')!;
    expect(load.status).toBe('SKIPPED');
    expect(load.reason).toBe('loaded by hand');
    expect(await eventsOf(runId, 'step.skipped')).toEqual([
      expect.objectContaining({ stepId: 'load', by: 'ana', reason: 'loaded by hand' }),
    ]);
    await expect
      .poll(() => page.locator('[data-step-row="report"] .status').innerText())
      .toBe('SUCCEEDED');
    expect(await page.locator('[data-step-row="load"]').innerText()).toContain(
      'reason loaded by hand',
    );
    await shot(page, 'skip');
    await page.close();
    expect(errors).toEqual([]);
  });

  it('cancels a running run: its running attempt is aborted and nothing else runs', async () => {
    const run = await runtime.start(heldPlan, null);
    await expect.poll(() => calls.slow).toBe(1);
    const { page, errors } = await openPage(`/runs/${run.runId}`);
    await page.fill('.actions input[name=by]', 'ana');
    await page.fill('.actions input[name=reason]', 'wrong input');
    await page.click('button.cancel');
    await page.waitForURL(`**/runs/${run.runId}?done=cancel`);
    const end = await run.settled({ timeoutMs: 10_000 });
    expect(end.status).toBe('cancelled');
    expect(end.steps.map((s) => s.status)).toEqual(['CANCELLED', 'CANCELLED']);
    await expect.poll(() => aborted).toBe(true);
    expect(calls.draft).toBe(0);
    expect(await eventsOf(run.runId, 'run.cancelled')).toEqual([
      expect.objectContaining({ by: 'ana', reason: 'wrong input' }),
    ]);
    await expect.poll(() => page.locator('#run-status').innerText()).toContain('cancelled');
    await expect
      .poll(() => page.locator('#cancelled-by').innerText())
      .toBe('cancelled by ana: wrong input');
    // Over: no cancel, resume or skip any more; sending it again still can be done.
    await expect.poll(() => page.locator('button.cancel').count()).toBe(0);
    expect(await page.locator('button.resume').count()).toBe(0);
    expect(await page.locator('button.skip').count()).toBe(0);
    expect(await page.locator('button.again').count()).toBe(1);
    await shot(page, 'cancel');
    await page.close();
    expect(errors).toEqual([]);
  });

  it('sends the run again: a new run of the same plan, input and tenant', async () => {
    const first = await runtime.start(reportPlan, { topic: 'q3 <numbers>' }, { tenantId: 'acme' });
    expect((await first.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const firstVersion = (await runtime.status(first.runId)).version;
    const { page, errors } = await openPage(`/runs/${first.runId}`);
    await page.fill('.actions input[name=by]', 'ana');
    await page.click('button.again');
    await page.waitForURL(/\/runs\/[^/?]+\?done=again$/);
    const second = decodeURIComponent(new URL(page.url()).pathname.split('/')[2]!);
    expect(second).not.toBe(first.runId);
    const end = await (await runtime.attach(second)).settled({ timeoutMs: 10_000 });
    expect(end.status).toBe('succeeded');
    expect(end.planName).toBe('report');
    expect(end.tenantId).toBe('acme');
    expect(calls.draft).toBe(2);
    expect(calls.inputs).toEqual([{ topic: 'q3 <numbers>' }, { topic: 'q3 <numbers>' }]);
    expect((await runtimeCore(runtime).meta.read(second)).input).toEqual({ topic: 'q3 <numbers>' });
    const listed = await runtime.list();
    expect(listed.map((r) => r.runId).sort()).toEqual([first.runId, second].sort());
    // The original is as it was.
    expect((await runtime.status(first.runId)).version).toBe(firstVersion);
    expect(await page.locator('h1 .mono').innerText()).toBe(second);
    expect(await page.locator('#again-of').innerText()).toBe(
      `sent again from run ${first.runId} by ana`,
    );
    expect(await page.locator('.io pre').first().innerText()).toBe(
      JSON.stringify({ topic: 'q3 <numbers>' }, null, 2),
    );
    await expect.poll(() => page.locator('#run-status').innerText()).toContain('succeeded');
    await shot(page, 'again');
    await page.close();
    expect(errors).toEqual([]);
  });

  it('resumes a stalled run: its lost work is queued again and a worker runs it', async () => {
    await worker.close();
    const run = await runtime.start(reportPlan, null);
    // The queued unit is lost (a flushed queue, say): no worker would ever take the run.
    const queue = runtimeCore(runtime).queues.queue;
    await queue.drain(true);
    expect((await queue.getJobCounts('waiting', 'delayed', 'prioritized')).waiting).toBe(0);
    const { page, errors } = await openPage(`/runs/${run.runId}`);
    await expect.poll(() => page.locator('#idle').count(), { timeout: 15_000 }).toBe(1);
    await expect.poll(() => page.locator('button.resume').count()).toBe(1);
    await page.fill('.actions input[name=by]', 'ana');
    await page.click('button.resume');
    await page.waitForURL(`**/runs/${run.runId}?done=requeue`);
    const counts = await queue.getJobCounts('waiting', 'prioritized');
    expect((counts.waiting ?? 0) + (counts.prioritized ?? 0)).toBe(1);
    worker = runtime.createWorker({ concurrency: 1 });
    await worker.ready();
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    expect(calls.draft).toBe(1);
    await shot(page, 'resume-stalled');
    await page.close();
    expect(errors).toEqual([]);
  });
});

describe('a refused action', () => {
  it('shows the refusal whole (a name the gate does not list) and changes nothing', async () => {
    const run = await runtime.start(gatedPlan, null);
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('waiting');
    const before = await runtime.status(run.runId);
    const { page, errors } = await openPage(`/runs/${run.runId}`);
    const row = page.locator('[data-step-row="review"]');
    await row.locator('details.act summary').click();
    await row.locator('input[name=by]').fill('bo');
    await row.locator('input[name=reason]').fill('not needed');
    await row.locator('button.skip').click();
    await page.waitForSelector('#notice');
    const refusal = await page.locator('#notice').innerText();
    expect(refusal).toContain('bo may not decide on step "review"');
    expect(refusal).toContain('only ana may approve or reject it');
    // The form stays open, to try again.
    expect(await row.locator('details.act').getAttribute('open')).toBe('');
    const after = await runtime.status(run.runId);
    expect(after.status).toBe('waiting');
    expect(after.version).toBe(before.version);
    expect(after.steps.find((s) => s.stepId === 'review')?.status).toBe('WAITING_APPROVAL');
    expect(await eventsOf(run.runId, 'step.skipped')).toEqual([]);
    await shot(page, 'refused');
    await page.close();
    expect(errors).toEqual([]);
  });
});

/** A form posted straight to the view, with the headers given. */
function post(
  path: string,
  body: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: string; location: string | undefined }> {
  const url = new URL(path, ui.url);
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
      },
      (res) => {
        let text = '';
        res.on('data', (d: Buffer) => (text += d.toString()));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, body: text, location: res.headers.location }),
        );
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

describe('forms from elsewhere', () => {
  it('refuses every action posted from another site or host name; nothing changes', async () => {
    const runId = await failedRun();
    const before = await runtime.status(runId);
    const paths = [
      `/runs/${runId}/resume`,
      `/runs/${runId}/cancel`,
      `/runs/${runId}/again`,
      `/runs/${runId}/steps/load/retry`,
      `/runs/${runId}/steps/load/skip`,
    ];
    for (const path of paths) {
      const body = 'by=ana&reason=x';
      const foreign = await post(path, body, { origin: 'http://evil.test' });
      expect([path, foreign.status]).toEqual([path, 403]);
      expect(foreign.body).toContain('another site');
      const crossSite = await post(path, body, { 'sec-fetch-site': 'cross-site' });
      expect([path, crossSite.status]).toEqual([path, 403]);
      const rebound = await post(path, body, { host: 'evil.test' });
      expect([path, rebound.status]).toEqual([path, 421]);
      const nobody = await post(path, 'by=+&reason=x');
      expect([path, nobody.status]).toEqual([path, 400]);
      expect(nobody.body).toContain('Say who decides');
      // Not a GET.
      const got = await fetch(new URL(path, ui.url));
      expect([path, got.status]).toEqual([path, 404]);
    }
    expect(await runtime.list()).toHaveLength(1);
    const after = await runtime.status(runId);
    expect(after.status).toBe('failed');
    expect(after.version).toBe(before.version);
    expect(calls.flaky).toBe(1);
    // From the view itself (its Origin), the same form acts.
    failing = false;
    const own = await post(`/runs/${runId}/resume`, 'by=ana', { origin: ui.url.slice(0, -1) });
    expect(own.status).toBe(303);
    expect(own.location).toBe(`/runs/${runId}?done=resume`);
    expect((await (await runtime.attach(runId)).settled({ timeoutMs: 10_000 })).status).toBe(
      'succeeded',
    );
  });
});

describe('what a run page shows', () => {
  it('input, result, whole errors, model calls with prompt and reply, and the events', async () => {
    const long = `Findings:\n${Array.from({ length: 40 }, (_, i) => `- row ${i + 1}: fine`).join('\n')}`;
    model.enqueue(
      {
        toolCalls: [{ id: 'c1', name: 'lookup', arguments: { q: 'q3' } }],
        usage: { prompt_tokens: 40, completion_tokens: 12 },
      },
      { text: long, usage: { prompt_tokens: 70, completion_tokens: 80 } },
    );
    const run = await runtime.start(researchPlan, 'q3 numbers, <b>please</b>');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const failed = await failedRun();

    const { page, errors } = await openPage(`/runs/${run.runId}`);
    // Input and result at the top.
    expect(await page.locator('.io pre').first().innerText()).toBe('"q3 numbers, <b>please</b>"');
    expect(await page.locator('#result').innerText()).toContain('succeeded');
    // The result is long: folded, whole.
    expect(await page.locator('#result details').getAttribute('open')).toBe(null);
    expect(await page.locator('#result pre').textContent()).toContain('row 40: fine');
    // Two model calls: the prompt of the second holds the tool's result, its reply is folded.
    const models = page.locator('[data-model-call]');
    expect(await models.count()).toBe(2);
    const firstCall = await models.nth(0).innerText();
    expect(firstCall).toContain('research turn 1');
    expect(firstCall).toContain('q3 numbers, <b>please</b>');
    expect(firstCall).toContain('lookup');
    const second = models.nth(1);
    expect(await second.locator('[data-role="tool"]').innerText()).toContain('q3: 3 rows');
    const reply = second.locator('.reply details');
    expect(await reply.count()).toBe(1);
    expect(await reply.getAttribute('open')).toBe(null);
    expect(await second.locator('.reply pre').isVisible()).toBe(false);
    await second.locator('.reply summary').click();
    expect(await second.locator('.reply pre').isVisible()).toBe(true);
    expect(await second.locator('.reply pre').innerText()).toBe(long);
    // The event history, oldest first.
    const types = await page.locator('table.events tbody tr td:nth-child(3)').allInnerTexts();
    expect(types[0]).toBe('run.created');
    expect(types.at(-1)).toBe('run.finished');
    expect(types).toContain('turn.committed');
    await shot(page, 'run-models');

    // A failed run: its attempt's error, all lines.
    await page.goto(new URL(`/runs/${failed}`, ui.url).href);
    const error = page.locator('[data-error="load#1"]');
    expect(await error.locator('.error-head').innerText()).toBe(
      'UnknownError unknown (retryable) (thrown: Error)',
    );
    expect(await error.locator('pre').first().innerText()).toBe(FAILURE);
    await expect(error.locator('details summary').first().innerText()).resolves.toContain('stack');
    expect(await page.locator('#result').innerText()).toContain('failed at step load');
    await shot(page, 'run-failed');
    await page.close();
    expect(errors).toEqual([]);
  });

  it('the run list follows new runs and their status without a reload', async () => {
    const { page, errors } = await openPage('/');
    let loads = 0;
    page.on('load', () => (loads += 1));
    expect(await page.locator('table.runs tbody tr').count()).toBe(0);
    await expect.poll(() => page.locator('#live').innerText()).toContain('live');
    const held = await runtime.start(heldPlan, null);
    await expect
      .poll(() => page.locator(`[data-run="${held.runId}"] .status`).innerText(), {
        timeout: 10_000,
      })
      .toBe('running');
    const done = await runtime.start(reportPlan, null);
    expect((await done.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await expect
      .poll(() => page.locator('table.runs tbody tr').count(), { timeout: 10_000 })
      .toBe(2);
    release();
    expect((await held.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await expect
      .poll(() => page.locator(`[data-run="${held.runId}"] .status`).innerText(), {
        timeout: 10_000,
      })
      .toBe('succeeded');
    expect(loads).toBe(0);
    // A filtered list follows with its filter.
    await page.goto(new URL('/?plan=held', ui.url).href);
    const more = await runtime.start(heldPlan, null);
    await expect
      .poll(() => page.locator('table.runs tbody tr').count(), { timeout: 10_000 })
      .toBe(2);
    expect(await page.locator(`[data-run="${more.runId}"]`).count()).toBe(1);
    expect(await page.locator(`[data-run="${done.runId}"]`).count()).toBe(0);
    await shot(page, 'list-live');
    await page.close();
    expect(errors).toEqual([]);
  });
});
