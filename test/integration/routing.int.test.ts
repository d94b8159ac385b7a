/**
 * Work goes to a worker that can do it: two job modules with different operators on one Redis and
 * prefix, each with its own `flujo worker` process. Runs started through the API on each module's
 * queue are run only by that module's worker; `flujo workers --json` lists both; a worker killed
 * stops being listed once its heartbeat lapses; a run whose module has no worker waits, its
 * status says so (no worker on its queue; a unit put back by a worker that lacks its operator),
 * and it finishes once a worker of its module starts. The web view's workers page lists the
 * workers. The real binary (bin/flujo.js → dist).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createRuntime, jobQueueName, type PlanInput, type Runtime } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { startUi } from '../../src/ui/server.js';
import type { WorkerInfo } from '../../src/worker/heartbeat.js';
import { plan as alphaPlan } from '../fixtures/jobs/routed-alpha.js';
import { plan as betaPlan } from '../fixtures/jobs/routed-beta.js';
import { runFlujo, startFlujo, type RunningChild } from '../helpers/cli.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const ALPHA = 'test/fixtures/jobs/routed-alpha.ts';
const BETA = 'test/fixtures/jobs/routed-beta.ts';
const RUNS = 50;

describe('routing units to the workers of their job module', { timeout: 120_000 }, () => {
  const prefix = testPrefix();
  const dir = mkdtempSync(join(tmpdir(), 'flujo-routing-'));
  const log = join(dir, 'calls.log');
  const children = new Set<RunningChild>();
  let runtime: Runtime | undefined;

  afterAll(async () => {
    for (const c of children) c.child.kill('SIGKILL');
    await Promise.all([...children].map((c) => c.done.catch(() => null)));
    await runtime?.close();
    await deleteRuntimeKeys(prefix);
    rmSync(dir, { recursive: true, force: true });
  });

  /** `flujo worker <module>` on the test's prefix, once it listens. */
  async function worker(module: string): Promise<RunningChild> {
    const child = startFlujo(['worker', module], { prefix, env: { ROUTED_LOG: log } });
    children.add(child);
    await expect
      .poll(() => child.out() + child.err(), { timeout: 30_000 })
      .toContain('flujo worker: processing runs');
    return child;
  }

  /** The calls the operators logged: module, operator, run, pid. */
  function calls(): { module: string; operator: string; runId: string; pid: number }[] {
    let text: string;
    try {
      text = readFileSync(log, 'utf8');
    } catch {
      return [];
    }
    return text
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => {
        const [module, operator, runId, pid] = l.split(' ') as [string, string, string, string];
        return { module, operator, runId, pid: Number(pid) };
      });
  }

  async function workersJson(): Promise<WorkerInfo[]> {
    const r = await runFlujo(['workers', '--json'], { prefix });
    expect(r.code, r.err).toBe(0);
    return JSON.parse(r.out) as WorkerInfo[];
  }

  it('runs each module’s units only on its worker; lists the workers; a run with no worker of its module waits, says so, and finishes when one starts', async () => {
    const [alpha, beta] = await Promise.all([worker(ALPHA), worker(BETA)]);
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
    const rt = runtime;

    // Both workers are listed, with their queues and operators.
    const listed = await workersJson();
    expect(listed.map((w) => w.pid).sort()).toEqual([alpha.child.pid, beta.child.pid].sort());
    const byPid = new Map(listed.map((w) => [w.pid, w]));
    expect(byPid.get(alpha.child.pid!)).toMatchObject({
      queues: ['plan.alpha', 'runs'],
      operators: ['alpha_fetch', 'alpha_sum'],
      agents: [],
    });
    expect(byPid.get(beta.child.pid!)).toMatchObject({
      queues: ['plan.beta', 'runs'],
      operators: ['beta_fetch', 'beta_sum'],
    });

    // The web view's workers page lists them too.
    const ui = await startUi(rt, { port: 0 });
    try {
      const html = await (await fetch(`${ui.url}workers`)).text();
      const rows = html.split('<tr data-worker=').slice(1);
      expect(rows).toHaveLength(2);
      for (const w of listed) {
        const row = rows.find((r) => r.includes(`/${w.pid}</td>`));
        expect(row).toContain(`<span class="mono">plan.${w.operators[0]!.split('_')[0]!}</span>`);
        expect(row).toContain(`<span class="mono">${w.operators[0]!}</span>`);
      }
    } finally {
      await ui.close();
    }

    // 50 runs of each module, started through the API on the module's queue.
    const started = await Promise.all(
      Array.from({ length: RUNS }, (_, i) => [
        rt.start(alphaPlan as PlanInput, { i }, { queue: jobQueueName('alpha') }),
        rt.start(betaPlan as PlanInput, { i }, { queue: jobQueueName('beta') }),
      ]).flat(),
    );
    const reports = await Promise.all(started.map((h) => h.settled({ timeoutMs: 60_000 })));
    expect(reports.filter((r) => r.status === 'succeeded')).toHaveLength(2 * RUNS);
    expect(reports.every((r) => r.steps.every((s) => s.attempt === 1))).toBe(true);
    const pidOf = { alpha: alpha.child.pid, beta: beta.child.pid };
    const seen = calls();
    expect(seen).toHaveLength(4 * RUNS);
    for (const c of seen) expect(c.pid).toBe(pidOf[c.module as 'alpha' | 'beta']);
    // Each unit ran once.
    expect(new Set(seen.map((c) => `${c.runId} ${c.operator}`)).size).toBe(4 * RUNS);

    // Beta's worker is killed: its heartbeat lapses (three beats of 5 s at most), alpha's stays.
    beta.child.kill('SIGKILL');
    await beta.done;
    await expect
      .poll(async () => (await workersJson()).map((w) => w.pid), {
        timeout: 20_000,
        interval: 500,
      })
      .toEqual([alpha.child.pid]);

    // A beta run on beta's queue, and one on the default queue (which alpha's worker takes too).
    const routed = await rt.start(betaPlan as PlanInput, { late: 1 }, { queue: 'plan.beta' });
    const shared = await rt.start(betaPlan as PlanInput, { late: 2 });
    expect((await shared.status()).queue).toBe('runs');
    await expect
      .poll(async () => (await runFlujo(['status', routed.runId], { prefix })).out, {
        timeout: 20_000,
        interval: 500,
      })
      .toMatch(/no worker on queue plan\.beta; last seen \d\d:\d\d:\d\d/);
    await expect
      .poll(async () => (await runFlujo(['status', shared.runId], { prefix })).out, {
        timeout: 20_000,
        interval: 500,
      })
      .toContain(`no worker knows operator "beta_fetch" on queue runs: worker`);
    const waiting = await shared.status();
    expect(waiting.status).toBe('running');
    expect(waiting.routing?.putBack?.pid).toBe(alpha.child.pid);
    expect(waiting.steps.find((s) => s.stepId === 'fetch')).toMatchObject({
      status: 'READY',
      attempt: 1,
    });
    expect(calls().filter((c) => c.runId === routed.runId || c.runId === shared.runId)).toEqual([]);

    // A worker of beta starts: both runs finish, on it.
    const beta2 = await worker(BETA);
    const done = await Promise.all([routed, shared].map((h) => h.settled({ timeoutMs: 30_000 })));
    expect(done.map((r) => r.status)).toEqual(['succeeded', 'succeeded']);
    expect(done.every((r) => r.steps.every((s) => s.attempt === 1))).toBe(true);
    const late = calls().filter((c) => c.runId === routed.runId || c.runId === shared.runId);
    expect(late).toHaveLength(4);
    expect(late.every((c) => c.pid === beta2.child.pid)).toBe(true);
  });
});
