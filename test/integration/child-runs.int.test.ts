/**
 * Child runs (`run` steps), with the job module test/fixtures/jobs/supervisor.ts and its
 * `flujo worker` processes (the real binary): a supervisor hands three tasks to three child runs,
 * one of them a granular agent on the scripted model server. Each child is started once and each
 * operator runs once, also when a worker is SIGKILLed at each point between the parent's step
 * start and the commit of the child's end (a test per point); the children are linked both ways
 * (the report, `flujo status`, `flujo list`); cancelling the parent cancels its children; a run
 * budget that only the sum over the children passes stops the parent; a run step naming an
 * unknown plan is refused with nothing written.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createRuntime, jobQueueName, type PlanInput, type Runtime } from '../../src/index.js';
import { InputValidationError } from '../../src/errors.js';
import { silentLogger } from '../../src/logging.js';
import type { RecordedRequest } from '../../src/testing/index.js';
import { plan as supervisorPlan, plans as modulePlans } from '../fixtures/jobs/supervisor.js';
import { runFlujo, startFlujo, type RunningChild } from '../helpers/cli.js';
import { deleteRuntimeKeys, redisUrl, scanKeys, connect, testPrefix } from '../helpers/redis.js';
import { useScriptedModel } from '../helpers/scripted-agent.js';

const MODULE = 'test/fixtures/jobs/supervisor.ts';
const plan = supervisorPlan as PlanInput;
const plans = modulePlans as Record<string, PlanInput>;
const QUEUE = jobQueueName('supervisor');

const model = useScriptedModel();
let prefix: string;
let dir: string;
let effectFile: string;
let rt: Runtime;
const workers = new Set<RunningChild>();

/** The agent: a note on its first turn, then its answer. */
function scriptAgent(): void {
  model.setDefaultReply((r: RecordedRequest) =>
    r.messages.some((m) => m.role === 'tool')
      ? { text: 'A run started by a step.', usage: { prompt_tokens: 50, completion_tokens: 8 } }
      : {
          toolCalls: [{ id: 'n1', name: 'note', arguments: { text: 'child' } }],
          usage: { prompt_tokens: 40, completion_tokens: 10 },
        },
  );
}

/** `flujo worker` of the module; with `killAt`, it dies there (not awaited to listen then). */
async function worker(killAt = '', env: Record<string, string> = {}): Promise<RunningChild> {
  const child = startFlujo(['worker', MODULE], {
    prefix,
    env: {
      EFFECT_FILE: effectFile,
      MODEL_URL: model.url,
      FLUJO_KILL_AT: killAt,
      ...env,
    },
  });
  workers.add(child);
  if (killAt === '') {
    await expect
      .poll(() => child.out() + child.err(), { timeout: 30_000 })
      .toContain('flujo worker: processing runs');
  }
  return child;
}

/** What ran, as "<what>" per effect line whose run id starts with `runId` (of process `pid`). */
function effects(runId: string, pid?: number): string[] {
  if (!existsSync(effectFile)) return [];
  return readFileSync(effectFile, 'utf8')
    .split('\n')
    .filter((l) => l.startsWith(runId) && (pid === undefined || l.endsWith(` ${pid}`)))
    .map((l) => l.split(' ')[1]!);
}

const count = (list: string[], what: string) => list.filter((x) => x === what).length;

/** The run ids the prefix holds a snapshot of. */
async function runIds(): Promise<string[]> {
  const redis = connect();
  try {
    const keys = await scanKeys(redis, `${prefix}:*:snap`);
    return keys.map((k) => k.slice(k.indexOf('{') + 1, k.lastIndexOf('}'))).sort();
  } finally {
    await redis.quit();
  }
}

beforeEach(() => {
  prefix = testPrefix();
  dir = mkdtempSync(join(tmpdir(), 'flujo-child-runs-'));
  effectFile = join(dir, 'effects.log');
  rt = createRuntime({ redis: redisUrl(), prefix, queueName: QUEUE, plans, logger: silentLogger });
  scriptAgent();
});
afterEach(async () => {
  for (const c of workers) c.child.kill('SIGKILL');
  await Promise.all([...workers].map((c) => c.done.catch(() => null)));
  workers.clear();
  await rt.close();
  await deleteRuntimeKeys(prefix);
  rmSync(dir, { recursive: true, force: true });
});
afterAll(() => {});

/** The supervisor's run settled as it should: three children, each once, each operator once. */
async function expectSupervised(runId: string, victim?: number): Promise<void> {
  const report = await (await rt.attach(runId)).settled({ timeoutMs: 45_000 });
  expect(report.status).toBe('succeeded');
  expect(report.parent).toBeNull();
  // The agent's child may fail once on a loaded machine (a scripted reply taken by a turn whose
  // worker died): the step's retry starts a new child for its next attempt. Whatever happens, one
  // child per step attempt, never two.
  const agentChildren = report.children.filter((c) => c.stepId === 'research');
  const attempts = agentChildren.length;
  expect(agentChildren.map((c) => [c.attempt, c.runId, c.status])).toEqual(
    Array.from({ length: attempts }, (_, i) => [
      i + 1,
      `${runId}:research:${i + 1}`,
      i + 1 === attempts ? 'succeeded' : 'failed',
    ]),
  );
  expect(attempts).toBeLessThanOrEqual(2);
  expect(
    report.children
      .filter((c) => c.stepId !== 'research')
      .map((c) => [c.stepId, c.attempt, c.runId, c.status]),
  ).toEqual([
    ['fetch', 1, `${runId}:fetch:1`, 'succeeded'],
    ['summary', 1, `${runId}:summary:1`, 'succeeded'],
  ]);
  // Exactly the children listed were ever created: one per step attempt.
  expect(await runIds()).toEqual(
    [runId, `${runId}:fetch:1`, ...agentChildren.map((c) => c.runId), `${runId}:summary:1`].sort(),
  );
  const ran = effects(runId);
  const died = victim === undefined ? [] : effects(runId, victim);
  for (const what of ['plan_tasks', 'fetch_page', 'summarize', 'combine', 'tool:child']) {
    // An operator the killed worker was running when it died (its commit lost) runs once more;
    // nothing runs twice otherwise. The agent's tool call is in the ledger: once, whatever died.
    const where = `${what} in ${ran.join(', ')} (killed: ${died.join(', ')})`;
    if (what === 'tool:child' || victim === undefined) {
      expect(count(ran, what), where).toBe(1);
      continue;
    }
    expect(count(ran, what), where).toBeGreaterThanOrEqual(1);
    expect(count(died, what), where).toBeLessThanOrEqual(1);
    expect(count(ran, what) - count(died, what), where).toBeLessThanOrEqual(1);
  }
  // The agent's child took its two turns (a turn whose call was in flight in a worker that died
  // is asked again; its tool ran once, above).
  const research = report.steps.find((s) => s.stepId === 'research')!;
  expect(research.output).toMatchObject({ ask: { answer: 'A run started by a step.' } });
  expect(model.requests.length).toBeGreaterThanOrEqual(2);
  const fetch = report.steps.find((s) => s.stepId === 'fetch')!;
  expect(fetch.output).toEqual({
    get: { page: 'contents of {"plan":{"url":"https://example.com/durable"}}' },
  });
  const child = await rt.status(`${runId}:fetch:1`);
  expect(child.parent).toEqual({ runId, stepId: 'fetch', attempt: 1 });
  expect(child.status).toBe('succeeded');
}

describe('child runs', { timeout: 120_000 }, () => {
  it('a supervisor runs three children, linked both ways, each once', async () => {
    await worker();
    const run = await rt.start(plan, null);
    await expectSupervised(run.runId);
    const status = await runFlujo(['status', run.runId], { prefix });
    expect(status.code, status.err).toBe(0);
    expect(status.out).toContain(`${run.runId}:fetch:1`);
    expect(status.out).toContain('children');
    const childStatus = await runFlujo(['status', `${run.runId}:research:1`], { prefix });
    expect(childStatus.out).toContain(`parent`);
    expect(childStatus.out).toContain(run.runId);
    const list = await runFlujo(['list', '--json'], { prefix });
    expect(list.code, list.err).toBe(0);
    const listed = JSON.parse(list.out) as { runId: string; parentRunId?: string | null }[];
    expect(listed.filter((r) => r.parentRunId === run.runId)).toHaveLength(3);
  });

  for (const killAt of [
    'after-child-start:fetch',
    'after-child-wait:fetch',
    'after-child-end',
    'before-commit:fetch',
    'after-commit:fetch',
  ]) {
    it(`a worker killed at ${killAt}: each child once, each operator once`, async () => {
      const victim = await worker(killAt);
      const run = await rt.start(plan, null);
      const exit = await victim.done;
      expect(exit.signal, exit.err).toBe('SIGKILL');
      await worker();
      await expectSupervised(run.runId, victim.child.pid);
    });
  }

  it('cancelling the parent cancels its children still going', async () => {
    await worker('', { SLOW_MS: '60000' });
    const run = await rt.start(plan, null);
    const child = `${run.runId}:fetch:1`;
    await expect.poll(async () => (await runIds()).includes(child), { timeout: 20_000 }).toBe(true);
    const cancelled = await rt.cancel(run.runId);
    expect(cancelled.status).toBe('cancelled');
    await expect
      .poll(async () => (await rt.status(child)).status, { timeout: 20_000 })
      .toBe('cancelled');
    const report = await rt.status(run.runId);
    for (const c of report.children) expect(['cancelled', 'succeeded']).toContain(c.status);
    expect(count(effects(run.runId), 'combine')).toBe(0);
  });

  it('a run budget only the sum over its children passes stops the parent', async () => {
    await worker();
    const run = await rt.start(plans['spender']!, null);
    const report = await run.settled({ timeoutMs: 45_000 });
    expect(report.status).toBe('failed');
    expect(report.summary.reason).toBe('budget_exceeded');
    expect(report.summary.detail).toMatchObject({
      budget: 'maxToolCalls',
      limit: 3,
      scope: 'tree',
    });
    // Each child stayed within its own budget of two; the third never started.
    expect(report.children.map((c) => [c.stepId, c.status])).toEqual([
      ['one', 'succeeded'],
      ['two', 'succeeded'],
    ]);
    expect(count(effects(run.runId), 'spend')).toBe(2);
  });

  it('a run step naming an unknown plan is refused, nothing written', async () => {
    const bad: PlanInput = {
      name: 'lost',
      steps: [
        { id: 'first', kind: 'operator', operator: 'plan_tasks' },
        { id: 'child', kind: 'run', plan: 'nowhere', dependsOn: ['first'] },
      ],
    };
    const refused = await rt.start(bad, null).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(InputValidationError);
    const issues = (refused as InputValidationError).issues;
    expect(issues.map((i) => i.path)).toEqual(['steps[1].plan']);
    expect(issues[0]!.message).toContain('runtime.plan("nowhere", plan)');
    const validate = await runFlujo(['validate', 'test/fixtures/jobs/supervisor-lost.ts']);
    expect(validate.code).toBe(2);
    expect(validate.err).toContain('steps[1].plan names plan "nowhere"');
    const started = await runFlujo(['run', 'test/fixtures/jobs/supervisor-lost.ts'], { prefix });
    expect(started.code).toBe(2);
    const redis = connect();
    try {
      expect(await scanKeys(redis, `${prefix}:*`)).toEqual([]);
    } finally {
      await redis.quit();
    }
  });
});
