/**
 * `runtime.trace(runId)` and its HTML timeline: a run whose operator step fails twice before it
 * succeeds, a gate a person approves, and an atomic agent step whose risky tool waits for
 * approval. The JSON trace is checked field by field; the page is opened in headless chromium
 * (offline: every request but the page's own file is refused and counted) and its bars counted.
 */
import { randomUUID } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { Browser } from 'playwright-core';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineTool,
  renderTraceHtml,
  type FlujoWorker,
  type PlanInput,
  type RunTrace,
  type Runtime,
} from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { launchChromium } from '../helpers/chromium.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';

const OUT = join(import.meta.dirname, '..', '..', 'test-results', 'run-trace');

const plan: PlanInput = {
  name: 'traced',
  steps: [
    {
      id: 'flaky',
      kind: 'operator',
      operator: 'flaky',
      retry: { maxAttempts: 3, initialDelayMs: 30, maxDelayMs: 60, jitter: 0 },
    },
    { id: 'review', kind: 'human_gate', dependsOn: ['flaky'] },
    { id: 'research', kind: 'agent', agent: 'researcher', dependsOn: ['review'], maxTurns: 4 },
  ],
};

const model = useScriptedModel();
let runtime: Runtime;
let worker: FlujoWorker;
let prefix: string;
let flakyCalls: number;
let published: string[];
let browser: Browser;

beforeAll(async () => {
  browser = await launchChromium();
  mkdirSync(OUT, { recursive: true });
});
afterAll(async () => {
  await browser.close();
});
beforeEach(async () => {
  flakyCalls = 0;
  published = [];
  prefix = `t-${randomUUID().slice(0, 8)}`;
  const search = defineTool({
    name: 'search',
    input: z.object({ q: z.string() }),
    class: 'read_only',
    run: ({ q }) => ({ hits: [`${q}: one`] }),
  });
  const publish = defineTool({
    name: 'publish',
    input: z.object({ text: z.string() }),
    riskLevel: 'high',
    idempotent: false,
    run: ({ text }) => {
      published.push(text);
      return { url: `https://example.test/${published.length}` };
    },
  });
  const researcher = scriptedAgent(model, {
    name: 'researcher',
    systemPrompt: 'Search, publish, answer.',
    tools: [search, publish],
  });
  runtime = createRuntime({
    redis: redisUrl(),
    prefix,
    logger: silentLogger,
    operators: {
      flaky: () => {
        flakyCalls += 1;
        if (flakyCalls < 3) throw new Error(`flake ${flakyCalls}`);
        return { ok: true };
      },
    },
  }).agent(researcher);
  worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
  await worker.ready();
});
afterEach(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

/** Runs the plan to its end: the gate and the risky call approved by ana. */
async function finishedRun(): Promise<string> {
  model.enqueue(
    {
      toolCalls: [
        { id: 'c1', name: 'search', arguments: { q: 'durable' } },
        { id: 'c2', name: 'publish', arguments: { text: 'notes' } },
      ],
      usage: { prompt_tokens: 40, completion_tokens: 12 },
    },
    { text: 'Published.', usage: { prompt_tokens: 70, completion_tokens: 3 } },
  );
  const run = await runtime.start(plan, 'durable agents');
  const atGate = await run.settled({ timeoutMs: 10_000 });
  expect(atGate.approvals.map((a) => a.stepId)).toEqual(['review']);
  await runtime.approve(run.runId, 'review', { by: 'ana', comment: 'go' });
  const atCall = await run.settled({ timeoutMs: 10_000 });
  const call = atCall.approvals[0]?.call;
  expect(call?.tool).toBe('publish@1');
  await runtime.approve(run.runId, 'research', { by: 'ana', callId: call!.callId });
  const done = await run.settled({ timeoutMs: 10_000 });
  expect(done.status).toBe('succeeded');
  return run.runId;
}

/** Every time the trace holds is within the run's start and end, and each end follows its start. */
function checkTimes(trace: RunTrace): void {
  const pairs: [number, number | null][] = [];
  for (const s of trace.steps) {
    for (const w of s.waits) pairs.push([w.start, w.end]);
    for (const a of s.attempts) {
      pairs.push([a.start, a.end]);
      for (const x of [...a.turns, ...a.modelCalls, ...a.toolCalls, ...a.waits]) {
        pairs.push([x.start, x.end]);
      }
    }
  }
  for (const [start, end] of pairs) {
    expect(start).toBeGreaterThanOrEqual(trace.start);
    expect(end).not.toBeNull();
    expect(end!).toBeGreaterThanOrEqual(start);
    expect(end!).toBeLessThanOrEqual(trace.end!);
  }
}

describe('runtime.trace', () => {
  it('records every attempt, turn, model call, tool call and wait of a run', async () => {
    const runId = await finishedRun();
    const trace = await runtime.trace(runId);
    writeFileSync(join(OUT, 'trace.json'), JSON.stringify(trace, null, 2));
    expect(flakyCalls).toBe(3);
    expect(published).toEqual(['notes']);
    expect(trace).toMatchObject({
      version: 1,
      runId,
      planName: 'traced',
      tenantId: 'default',
      status: 'succeeded',
    });
    expect(trace.traceId).toMatch(/^[0-9a-f]{32}$/);
    checkTimes(trace);
    const [flaky, review, research] = trace.steps;
    expect(flaky!.attempts.map((a) => [a.attempt, a.outcome, a.error?.message ?? null])).toEqual([
      [1, 'failed', 'flake 1'],
      [2, 'failed', 'flake 2'],
      [3, 'succeeded', null],
    ]);
    expect(flaky!.attempts.map((a) => a.error?.retryable ?? null)).toEqual([true, true, null]);
    // The gate waited from the end of the step it depends on to ana's approval.
    expect(review!.attempts.map((a) => a.outcome)).toEqual(['succeeded']);
    expect(review!.waits).toEqual([
      expect.objectContaining({
        kind: 'gate',
        start: flaky!.attempts[2]!.end,
        decision: 'approved',
        by: 'ana',
        comment: 'go',
      }),
    ]);
    const attempt = research!.attempts;
    expect(attempt.map((a) => [a.attempt, a.outcome])).toEqual([[1, 'succeeded']]);
    const a = attempt[0]!;
    expect(a.waits).toEqual([
      expect.objectContaining({ kind: 'tool', tool: 'publish@1', decision: 'approved', by: 'ana' }),
    ]);
    // The paused execution's reply was replayed, not asked for again: two model calls.
    expect(a.modelCalls.map((m) => [m.turn, m.inputTokens, m.outputTokens])).toEqual([
      [0, 40, 12],
      [1, 70, 3],
    ]);
    expect(a.turns.map((t) => [t.turn, t.outcome])).toEqual([
      [0, 'done'],
      [1, 'done'],
    ]);
    expect(a.toolCalls.map((c) => [c.tool, c.state, c.verdict, c.runs, c.turn])).toEqual([
      ['search@1', 'SUCCEEDED', 'executed', 1, 0],
      ['publish@1', 'SUCCEEDED', 'executed', 1, 0],
    ]);
    expect(model.requests).toHaveLength(2);
  });

  it('refuses a run that does not exist, naming it', async () => {
    await expect(runtime.trace('no-such-run')).rejects.toMatchObject({
      code: 'run_not_found',
      message: expect.stringContaining('no-such-run') as unknown,
    });
  });
});

describe('the HTML timeline', () => {
  it('draws one bar per attempt and turn, marks calls and waits, and shows details on hover', async () => {
    const runId = await finishedRun();
    const trace = await runtime.trace(runId);
    const file = join(OUT, 'timeline.html');
    writeFileSync(file, renderTraceHtml(trace));
    const page = await browser.newPage({ viewport: { width: 1200, height: 420 } });
    const url = pathToFileURL(file).href;
    const refused: string[] = [];
    await page.route('**/*', (route) => {
      if (route.request().url() === url) return route.continue();
      refused.push(route.request().url());
      return route.abort();
    });
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(url);
    const count = (selector: string) => page.locator(selector).count();
    expect(await count('.lane')).toBe(3);
    expect(await count('[data-step="flaky"] .bar.attempt')).toBe(3);
    const flakyBars = page.locator('[data-step="flaky"] .bar.attempt');
    const outcomes: (string | null)[] = [];
    const lefts: number[] = [];
    for (let i = 0; i < 3; i++) {
      outcomes.push(await flakyBars.nth(i).getAttribute('data-outcome'));
      lefts.push((await flakyBars.nth(i).boundingBox())!.x);
    }
    expect(outcomes).toEqual(['failed', 'failed', 'succeeded']);
    expect(await count('[data-step="review"] .bar.attempt')).toBe(1);
    expect(await count('[data-step="review"] .bar.wait.gate')).toBe(1);
    expect(await count('[data-step="research"] .bar.attempt')).toBe(1);
    expect(await count('[data-step="research"] .bar.turn')).toBe(2);
    expect(await count('[data-step="research"] .bar.model')).toBe(2);
    expect(await count('[data-step="research"] .mark.tool')).toBe(2);
    expect(await count('[data-step="research"] .bar.wait.tool')).toBe(1);
    // Bars sit in time order along their lane.
    expect([...lefts].sort((x, y) => x - y)).toEqual(lefts);
    expect(lefts[0]).toBeLessThan(lefts[2]!);

    const tip = page.locator('#tip');
    await expect.poll(() => tip.isVisible()).toBe(false);
    await page.locator('[data-step="flaky"] .bar.attempt[data-attempt="2"]').hover();
    await expect.poll(() => tip.isVisible()).toBe(true);
    const shown = await tip.innerText();
    expect(shown).toContain('flaky · attempt 2');
    expect(shown).toContain('outcome: failed');
    expect(shown).toContain('flake 2 (retryable)');
    await page.locator('[data-step="research"] .mark.tool').nth(1).hover();
    expect(await tip.innerText()).toContain('Tool publish@1');
    await page.mouse.move(1, 1);
    await expect.poll(() => tip.isVisible()).toBe(false);
    await page.screenshot({ path: join(OUT, 'timeline.png'), fullPage: true });
    await page.close();
    expect(errors).toEqual([]);
    expect(refused).toEqual([]);
  });
});

describe('the HTML timeline of a unit taken over', () => {
  it('marks the takeover and lists what each worker recorded for a call', async () => {
    const T = 1_700_000_000_000;
    const trace: RunTrace = {
      version: 1,
      runId: 'taken',
      planName: 'p',
      tenantId: 't',
      status: 'succeeded',
      traceId: null,
      start: T,
      end: T + 1000,
      steps: [
        {
          stepId: 'agent',
          kind: 'agent',
          status: 'SUCCEEDED',
          waits: [],
          skipped: null,
          attempts: [
            {
              attempt: 1,
              start: T,
              end: T + 1000,
              outcome: 'succeeded',
              error: null,
              workers: ['h:1', 'h:2'],
              takeovers: [
                {
                  at: T + 900,
                  turn: 1,
                  previousWorker: 'h:1',
                  previousStartedAt: T + 30,
                  worker: 'h:2',
                },
              ],
              turns: [
                { turn: 0, start: T, end: T + 20, outcome: 'committed' },
                { turn: 1, start: T + 30, end: T + 1000, outcome: 'committed' },
              ],
              modelCalls: [],
              toolCalls: [
                {
                  callId: 'c1',
                  tool: 'save@1',
                  state: 'SUCCEEDED',
                  verdict: 'receipt_replayed',
                  executions: [
                    { at: T + 40, verdict: 'executed', durationMs: 3, turn: null },
                    { at: T + 950, verdict: 'receipt_replayed', durationMs: 1, turn: null },
                  ],
                  runs: 1,
                  start: T + 35,
                  end: T + 40,
                  turn: 1,
                  error: null,
                },
              ],
              waits: [],
            },
          ],
        },
      ],
    };
    const page = await browser.newPage({ viewport: { width: 1000, height: 300 } });
    await page.setContent(renderTraceHtml(trace));
    expect(await page.locator('[data-step="agent"] .takeover').count()).toBe(1);
    expect(await page.locator('[data-step="agent"] .bar.turn').count()).toBe(2);
    await page.locator('.takeover').hover();
    const tip = page.locator('#tip');
    expect(await tip.innerText()).toContain('Taken over, turn 1');
    expect(await tip.innerText()).toContain('stopped worker: h:1');
    await page.locator('.mark.tool').hover();
    expect(await tip.innerText()).toContain('recorded 2: receipt_replayed at +950 ms');
    await page.locator('.bar.attempt').hover({ position: { x: 5, y: 5 } });
    expect(await tip.innerText()).toContain('workers: h:1, h:2');
    await page.close();
  });
});
