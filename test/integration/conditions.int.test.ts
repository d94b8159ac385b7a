/**
 * Conditional steps on a real Redis: a triage step's output picks a branch; only the chosen
 * branch's operators run, the other branch's steps end SKIPPED with reason `condition_false` (its
 * later steps too), and the join runs once, with null for the branch not taken. A plan whose
 * condition names a step that is not an ancestor is refused, and nothing is written.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  createRuntime,
  PlanValidationError,
  type FlujoWorker,
  type JsonValue,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { runFlujo } from '../helpers/cli.js';
import { expectIntact } from '../helpers/integrity.js';
import { connect, deleteRuntimeKeys, redisUrl, scanKeys } from '../helpers/redis.js';

let runtime: Runtime;
let worker: FlujoWorker | undefined;
let prefix: string;

const quiet = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

type When = NonNullable<PlanInput['steps'][number]['when']>;

/** triage → (branchA1 → branchA2) | branchB1 → join, each branch under its own condition. */
const triagePlan = (whenA: When, whenB: When): PlanInput => ({
  name: 'triage',
  steps: [
    { id: 'triage', kind: 'operator', operator: 'triage' },
    { id: 'branchA1', kind: 'operator', operator: 'a1', dependsOn: ['triage'], when: whenA },
    { id: 'branchA2', kind: 'operator', operator: 'a2', dependsOn: ['branchA1'] },
    { id: 'branchB1', kind: 'operator', operator: 'b1', dependsOn: ['triage'], when: whenB },
    { id: 'join', kind: 'operator', operator: 'join', dependsOn: ['branchA2', 'branchB1'] },
  ],
});

const byBranch = triagePlan(
  { step: 'triage', path: 'route.branch', equals: 'a' },
  { step: 'triage', path: 'route.branch', equals: 'b' },
);

let calls: Record<string, number>;
let joined: Record<string, JsonValue>[];

function register(triageOutput: JsonValue): void {
  calls = {};
  joined = [];
  const count = (name: string) => (calls[name] = (calls[name] ?? 0) + 1);
  runtime
    .operator('triage', () => (count('triage'), triageOutput))
    .operator('a1', () => (count('a1'), { from: 'a1' }))
    .operator('a2', ({ deps }) => (count('a2'), { from: 'a2', saw: deps['branchA1'] ?? null }))
    .operator('b1', () => (count('b1'), { from: 'b1' }))
    .operator('join', ({ deps }) => {
      count('join');
      joined.push({ ...deps });
      return { joined: true };
    });
}

async function runToEnd(plan: PlanInput) {
  worker = runtime.createWorker({ concurrency: 4 });
  await worker.ready();
  const run = await runtime.start(plan, {});
  const report = await run.settled({ timeoutMs: 15_000 });
  const steps = Object.fromEntries(
    report.steps.map((s) => [s.stepId, `${s.status}${s.reason === null ? '' : `:${s.reason}`}`]),
  );
  return { runId: run.runId, report, steps };
}

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  runtime = createRuntime({ redis: redisUrl(), prefix, logger: quiet });
});
afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('conditional steps', () => {
  it('branch b chosen: branch a is skipped (both its steps), the join runs once with null for it', async () => {
    register({ route: { branch: 'b' } });
    const { runId, report, steps } = await runToEnd(byBranch);
    expect(report.status).toBe('succeeded');
    expect(calls).toEqual({ triage: 1, b1: 1, join: 1 });
    expect(steps).toEqual({
      triage: 'SUCCEEDED',
      branchA1: 'SKIPPED:condition_false',
      branchA2: 'SKIPPED:condition_false',
      branchB1: 'SUCCEEDED',
      join: 'SUCCEEDED',
    });
    expect(joined).toEqual([{ branchA2: null, branchB1: { from: 'b1' } }]);
    // The skip is in the run's events, with its reason; the untaken steps never started.
    const events: Record<string, unknown>[] = [];
    for await (const e of runtime.events(runId)) events.push(e.data);
    const skips = events.filter((e) => e.type === 'step.skipped');
    expect(skips.map((e) => [e.stepId, e.reason])).toEqual([['branchA1', 'condition_false']]);
    const started = events.filter((e) => e.type === 'step.started').map((e) => e.stepId);
    expect(started).not.toContain('branchA1');
    expect(started).not.toContain('branchA2');
    const moved = events
      .filter((e) => e.type === 'step.changed' && e.to === 'SKIPPED')
      .map((e) => e.stepId);
    expect(moved).toEqual(['branchA1', 'branchA2']);
    // Attempts made: triage, branchB1 and join; the skips made none.
    const finished = events.filter((e) => e.type === 'run.finished');
    expect(finished.map((e) => e.attempts)).toEqual([3]);
    // The trace shows both skips with their reason, and no attempt of either.
    const trace = await runtime.trace(runId);
    const traced = Object.fromEntries(
      trace.steps.map((s) => [s.stepId, [s.status, s.skipped?.reason ?? null, s.attempts.length]]),
    );
    expect(traced).toMatchObject({
      branchA1: ['SKIPPED', 'condition_false', 0],
      branchA2: ['SKIPPED', 'condition_false', 0],
      branchB1: ['SUCCEEDED', null, 1],
      join: ['SUCCEEDED', null, 1],
    });
    // The events lead to the stored snapshot (the cascade is the machine's, not an event).
    await expectIntact(runtime, runId);
  });

  it('branch a chosen: both its steps run in order, branch b is skipped, the join runs once', async () => {
    register({ route: { branch: 'a' } });
    const { runId, report, steps } = await runToEnd(byBranch);
    expect(report.status).toBe('succeeded');
    expect(calls).toEqual({ triage: 1, a1: 1, a2: 1, join: 1 });
    await expectIntact(runtime, runId);
    expect(steps).toEqual({
      triage: 'SUCCEEDED',
      branchA1: 'SUCCEEDED',
      branchA2: 'SUCCEEDED',
      branchB1: 'SKIPPED:condition_false',
      join: 'SUCCEEDED',
    });
    expect(joined).toEqual([{ branchA2: { from: 'a2', saw: { from: 'a1' } }, branchB1: null }]);
  });

  it('a skipped step uses none of maxSteps: 3 steps run within maxSteps 3', async () => {
    register({ route: { branch: 'b' } });
    const { report } = await runToEnd({ ...byBranch, budgets: { maxSteps: 3 } });
    expect(report.status).toBe('succeeded');
    expect(calls).toEqual({ triage: 1, b1: 1, join: 1 });
  });

  it('in and exists: a condition on an ancestor, both branches taken or neither', async () => {
    const plan = triagePlan(
      { step: 'triage', path: 'priority', in: ['high', 'urgent'] },
      { step: 'triage', path: 'ticket.id', exists: true },
    );
    register({ priority: 'urgent', ticket: { id: 7 } });
    const both = await runToEnd(plan);
    expect(both.report.status).toBe('succeeded');
    expect(calls).toEqual({ triage: 1, a1: 1, a2: 1, b1: 1, join: 1 });
    await worker?.close();

    register({ priority: 'low', ticket: { id: null } });
    const neither = await runToEnd(plan);
    expect(neither.report.status).toBe('succeeded');
    // Every dependency of the join was skipped by a condition: it is skipped too.
    expect(calls).toEqual({ triage: 1 });
    expect(neither.steps).toEqual({
      triage: 'SUCCEEDED',
      branchA1: 'SKIPPED:condition_false',
      branchA2: 'SKIPPED:condition_false',
      branchB1: 'SKIPPED:condition_false',
      join: 'SKIPPED:condition_false',
    });
    await expectIntact(runtime, neither.runId);
  });

  it('a condition naming a step that is not an ancestor is refused, and nothing is written', async () => {
    register(null);
    const plan: PlanInput = {
      name: 'bad',
      steps: [
        { id: 'triage', kind: 'operator', operator: 'triage' },
        { id: 'other', kind: 'operator', operator: 'a1' },
        {
          id: 'branch',
          kind: 'operator',
          operator: 'b1',
          dependsOn: ['triage'],
          when: { step: 'other', equals: true },
        },
      ],
    };
    const error = await runtime.start(plan, {}).then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(PlanValidationError);
    const issues = (error as PlanValidationError).issues;
    expect(issues.map((i) => i.path)).toEqual(['steps[2].when.step']);
    expect(issues[0]!.message).toContain('"other"');
    const redis = connect();
    try {
      expect(await scanKeys(redis, `${prefix}*`)).toEqual([]);
    } finally {
      redis.disconnect();
    }
  });

  it('flujo validate refuses the plan with exit 2, naming steps[i].when.step and the fix', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'flujo-when-'));
    try {
      const file = join(dir, 'plan.json');
      writeFileSync(
        file,
        JSON.stringify({
          name: 'bad',
          steps: [
            { id: 'triage', kind: 'operator', operator: 't' },
            { id: 'other', kind: 'operator', operator: 't' },
            {
              id: 'branch',
              kind: 'operator',
              operator: 't',
              dependsOn: ['triage'],
              when: { step: 'other', path: 'x', in: ['a'] },
            },
          ],
        }),
      );
      const r = await runFlujo(['validate', file], { prefix });
      expect(r.code).toBe(2);
      expect(r.err).toContain('steps[2].when.step: the condition names step "other"');
      expect(r.err).toContain('add "other" to dependsOn');
      expect(r.out).toBe('');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
