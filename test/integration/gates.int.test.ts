/**
 * Who may decide on a gate (approvers, the authorizeDecision hook), risk levels that wait like a
 * gate, READY as a state a step rests in until a worker starts it, and skipping a step (open, or
 * one that failed): checked against what the operators really ran and what Redis holds.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  ApprovalNotAllowedError,
  InputValidationError,
  PlanValidationError,
  StepNotSkippableError,
} from '../../src/errors.js';
import type { OperatorContext } from '../../src/execution/execute-step.js';
import type { JsonValue } from '../../src/internal/json.js';
import type { PlanInput } from '../../src/plan/schema.js';
import type { StoredRunEvent } from '../../src/persistence/snapshot-store.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { connect, deletePrefix, redisUrl, scanKeys, testPrefix } from '../helpers/redis.js';

interface Call {
  runId: string;
  stepId: string;
  attempt: number;
  deps: Record<string, JsonValue>;
  aborted?: boolean;
}
const calls: Call[] = [];
const callsOf = (runId: string) => calls.filter((c) => c.runId === runId);
const ran = (runId: string) => callsOf(runId).map((c) => `${c.stepId}#${c.attempt}`);

function record(ctx: OperatorContext): Call {
  const call: Call = { runId: ctx.runId, stepId: ctx.stepId, attempt: ctx.attempt, deps: ctx.deps };
  calls.push(call);
  return call;
}

const operators = {
  noop: (ctx: OperatorContext) => {
    record(ctx);
    return { step: ctx.stepId };
  },
  broken: (ctx: OperatorContext) => {
    record(ctx);
    throw Object.assign(new Error('the mail server refused the template'), { retryable: false });
  },
  slow: async (ctx: OperatorContext) => {
    const call = record(ctx);
    ctx.signal.addEventListener('abort', () => {
      call.aborted = true;
    });
    const ms = (ctx.input as { ms?: number } | null)?.ms ?? 2000;
    await sleep(ms, undefined, { signal: ctx.signal });
    return { slept: ms };
  },
};

const hookCalls: string[] = [];
let redis: Redis;
let prefix: string;
let rt: Runtime;
let worker: FlujoWorker;

beforeAll(async () => {
  redis = connect();
  prefix = testPrefix();
  rt = createRuntime({
    redis: redisUrl(),
    prefix,
    queueName: 'gates',
    operators,
    // Refuses one person everywhere: as a service checking who really asks would.
    authorizeDecision: (runId, stepId, by, decision) => {
      hookCalls.push(`${runId} ${stepId} ${by} ${decision}`);
      return by !== 'eve';
    },
  });
  worker = rt.createWorker({ concurrency: 8, recoveryMs: 1000 });
  await worker.ready();
});
afterAll(async () => {
  await worker.close();
  await rt.close();
  await deletePrefix(redis, prefix);
  await deletePrefix(redis, `{${prefix}:q}`);
  await redis.quit();
});

type StepDef = { id: string; operator?: string; input?: JsonValue; [k: string]: unknown };

/** A line of steps, each depending on the one before; a step without operator is a human gate. */
function line(name: string, steps: StepDef[]): PlanInput {
  return {
    name,
    steps: steps.map(({ id, operator, ...rest }, i) => ({
      id,
      ...(operator === undefined
        ? { kind: 'human_gate' as const }
        : { kind: 'operator' as const, operator }),
      ...(i === 0 ? {} : { dependsOn: [steps[i - 1]!.id] }),
      ...rest,
    })),
  };
}

async function events(runId: string): Promise<StoredRunEvent[]> {
  const out: StoredRunEvent[] = [];
  for await (const e of rt.events(runId)) out.push(e);
  return out;
}

/** Every key of the run with its whole content (streams included). */
async function runKeys(runId: string): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  for (const key of await scanKeys(redis, `${prefix}:{${runId}}*`)) {
    const type = await redis.type(key);
    if (type === 'hash') out[key] = await redis.hgetall(key);
    else if (type === 'stream') out[key] = await redis.xrange(key, '-', '+');
    else if (type === 'list') out[key] = await redis.lrange(key, 0, -1);
    else out[key] = await redis.get(key);
  }
  return out;
}

const changes = (evs: StoredRunEvent[], stepId: string) =>
  evs
    .filter((e) => e.type === 'step.changed' && e.data['stepId'] === stepId)
    .map((e) => `${String(e.data['from'])}→${String(e.data['to'])}`);

async function waitFor<T>(what: string, probe: () => T | undefined, timeoutMs = 5000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

describe('approvers', () => {
  const plan = () =>
    line('approvers', [
      { id: 'a', operator: 'noop' },
      {
        id: 'pay',
        operator: 'noop',
        gate: { approvers: ['ana', 'bo'], reason: 'moves money' },
      },
    ]);

  it('anyone but the approvers is refused, naming who may decide, and nothing changes', async () => {
    const run = await rt.start(plan());
    const waiting = await run.settled({ timeoutMs: 10_000 });
    expect(waiting.status).toBe('waiting');
    expect(waiting.approvals).toEqual([
      {
        stepId: 'pay',
        reason: 'moves money',
        approvers: ['ana', 'bo'],
        riskLevel: 'low',
        call: null,
      },
    ]);
    const before = await runKeys(run.runId);
    expect(Object.keys(before).length).toBeGreaterThan(2);
    for (const decision of ['approve', 'reject'] as const) {
      const e = await rt[decision](run.runId, 'pay', { by: 'mallory' }).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(ApprovalNotAllowedError);
      expect((e as ApprovalNotAllowedError).code).toBe('approval_not_allowed');
      expect((e as Error).message).toContain('only ana, bo may approve or reject');
    }
    const skipped = await rt
      .skip(run.runId, 'pay', { by: 'mallory', reason: 'in a hurry' })
      .catch((x: unknown) => x);
    expect(skipped).toBeInstanceOf(ApprovalNotAllowedError);
    expect(await runKeys(run.runId)).toEqual(before);
    expect(ran(run.runId)).toEqual(['a#1']);

    await rt.approve(run.runId, 'pay', { by: 'bo', comment: 'fine' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.steps[1]!.approval).toMatchObject({ by: 'bo', comment: 'fine' });
    expect(ran(run.runId)).toEqual(['a#1', 'pay#1']);
  });

  it('authorizeDecision sees every decision and can refuse one the approvers allow', async () => {
    const run = await rt.start(line('hook', [{ id: 'g' }, { id: 'b', operator: 'noop' }]));
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('waiting');
    const before = await runKeys(run.runId);
    const e = await rt.approve(run.runId, 'g', { by: 'eve' }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ApprovalNotAllowedError);
    expect((e as Error).message).toContain('refused by authorizeDecision');
    expect(await runKeys(run.runId)).toEqual(before);
    expect(hookCalls).toContain(`${run.runId} g eve approve`);
    await rt.reject(run.runId, 'g', { by: 'ana', comment: 'no' });
    expect(hookCalls).toContain(`${run.runId} g ana reject`);
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.summary.reason).toBe('approval_rejected');
    expect(ran(run.runId)).toEqual([]);
  });

  it('an empty approvers list is refused with the fix', async () => {
    const e = await rt
      .start(line('empty', [{ id: 'a', operator: 'noop', gate: { approvers: [] } }]))
      .catch((x: unknown) => x);
    expect(e).toBeInstanceOf(PlanValidationError);
    expect((e as Error).message).toContain('steps[0].gate.approvers');
    expect((e as Error).message).toContain('list at least one approver');
  });
});

describe('risk levels', () => {
  it.each(['high', 'critical'])(
    'a step with riskLevel %s waits for approval before it runs',
    async (riskLevel) => {
      const run = await rt.start(
        line(`risk-${riskLevel}`, [{ id: 'r', operator: 'noop', riskLevel }]),
      );
      const waiting = await run.settled({ timeoutMs: 10_000 });
      expect(waiting.status).toBe('waiting');
      expect(waiting.steps[0]).toMatchObject({ status: 'WAITING_APPROVAL', attempt: 0 });
      expect(waiting.approvals).toEqual([
        { stepId: 'r', reason: null, approvers: null, riskLevel, call: null },
      ]);
      await sleep(100);
      expect(ran(run.runId)).toEqual([]);
      await rt.approve(run.runId, 'r', { by: 'ana' });
      expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
      expect(ran(run.runId)).toEqual(['r#1']);
    },
  );

  it.each(['low', 'medium'])(
    'a step with riskLevel %s runs without approval',
    async (riskLevel) => {
      const run = await rt.start(
        line(`risk-${riskLevel}`, [{ id: 'r', operator: 'noop', riskLevel }]),
      );
      expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
      expect(ran(run.runId)).toEqual(['r#1']);
    },
  );
});

describe('READY', () => {
  it('a due step is READY until a worker starts it; status then shows RUNNING', async () => {
    // A runtime with no worker of its own on another queue: nothing executes the run.
    const idle = createRuntime({ redis: redisUrl(), prefix, queueName: 'gates-idle', operators });
    try {
      const run = await idle.start(
        line('ready', [
          { id: 'a', operator: 'slow', input: { ms: 400 } },
          { id: 'b', operator: 'noop' },
        ]),
      );
      await sleep(200);
      const ready = await run.status();
      expect(ready.status).toBe('running');
      expect(ready.steps.map((s) => [s.stepId, s.status, s.attempt])).toEqual([
        ['a', 'READY', 1],
        ['b', 'PENDING', 0],
      ]);
      expect(changes(await events(run.runId), 'a')).toEqual(['PENDING→READY']);
      const w = idle.createWorker({ concurrency: 2, recoveryMs: 1000 });
      try {
        await w.ready();
        await waitFor('a to start', () => callsOf(run.runId)[0]);
        const running = await run.status();
        expect(running.steps[0]).toMatchObject({ stepId: 'a', status: 'RUNNING', attempt: 1 });
        const done = await run.settled({ timeoutMs: 10_000 });
        expect(done.status).toBe('succeeded');
      } finally {
        await w.close();
      }
      const evs = await events(run.runId);
      expect(changes(evs, 'a')).toEqual(['PENDING→READY', 'READY→RUNNING', 'RUNNING→SUCCEEDED']);
      expect(changes(evs, 'b')).toEqual(['PENDING→READY', 'READY→RUNNING', 'RUNNING→SUCCEEDED']);
      // RUNNING is stamped with the start of the execution, before its result, after READY.
      const at = (stepId: string, to: string) =>
        Number(
          evs.find(
            (e) => e.type === 'step.changed' && e.data['stepId'] === stepId && e.data['to'] === to,
          )!.data['at'],
        );
      expect(at('a', 'RUNNING')).toBeGreaterThanOrEqual(at('a', 'READY') + 150);
      expect(at('a', 'SUCCEEDED') - at('a', 'RUNNING')).toBeGreaterThanOrEqual(350);
      expect(evs.filter((e) => e.type === 'step.started').map((e) => e.data['stepId'])).toEqual([
        'a',
        'b',
      ]);
      expect(ran(run.runId)).toEqual(['a#1', 'b#1']);
    } finally {
      await idle.close();
    }
  });
});

describe('skip', () => {
  it('a waiting step skipped: it never runs, and its dependents run with its output null', async () => {
    const run = await rt.start(
      line('skip-gate', [
        { id: 'a', operator: 'noop' },
        { id: 'b', operator: 'noop', gate: { reason: 'check first' } },
        { id: 'c', operator: 'noop' },
      ]),
    );
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('waiting');
    const report = await rt.skip(run.runId, 'b', { by: 'ana', reason: 'done by hand' });
    expect(report.steps[1]).toMatchObject({ status: 'SKIPPED', reason: 'done by hand' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(ran(run.runId)).toEqual(['a#1', 'c#1']);
    expect(callsOf(run.runId)[1]!.deps).toEqual({ b: null });
    const skippedEvent = (await events(run.runId)).find((e) => e.type === 'step.skipped');
    expect(skippedEvent?.data).toMatchObject({ stepId: 'b', by: 'ana', reason: 'done by hand' });
    expect(hookCalls).toContain(`${run.runId} b ana skip`);
  });

  it('a running step skipped is aborted; its dependents go on', async () => {
    const run = await rt.start(
      line('skip-running', [
        { id: 'a', operator: 'slow', input: { ms: 5000 } },
        { id: 'b', operator: 'noop' },
      ]),
    );
    const call = await waitFor('a to start', () => callsOf(run.runId)[0]);
    await rt.skip(run.runId, 'a', { by: 'ana', reason: 'taking too long' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.steps.map((s) => s.status)).toEqual(['SKIPPED', 'SUCCEEDED']);
    await waitFor('the abort', () => (call.aborted === true ? true : undefined), 2000);
    expect(ran(run.runId)).toEqual(['a#1', 'b#1']);
    expect(callsOf(run.runId)[1]!.deps).toEqual({ a: null });
  });

  it('a step that failed finally is skipped: its cancelled dependent runs with its output null, and the failed run succeeds', async () => {
    const run = await rt.start(
      line('skip-failed', [
        { id: 'a', operator: 'broken', retry: { maxAttempts: 1 } },
        { id: 'b', operator: 'noop' },
        { id: 'c', operator: 'noop' },
      ]),
    );
    const failed = await run.settled({ timeoutMs: 10_000 });
    expect(failed.status).toBe('failed');
    expect(failed.steps.map((s) => [s.status, s.reason])).toEqual([
      ['FAILED_FINAL', 'non_retryable_error'],
      ['CANCELLED', 'upstream_failed'],
      ['CANCELLED', 'upstream_failed'],
    ]);
    expect(ran(run.runId)).toEqual(['a#1']);

    const report = await rt.skip(run.runId, 'a', { by: 'ana', reason: 'sent by hand' });
    expect(report.status).toBe('running');
    expect(report.steps.map((s) => s.status)).toEqual(['SKIPPED', 'READY', 'PENDING']);
    expect(report.steps[0]).toMatchObject({ reason: 'sent by hand', attempt: 1 });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.steps.map((s) => s.status)).toEqual(['SKIPPED', 'SUCCEEDED', 'SUCCEEDED']);
    // a never ran again; b and c ran once each, b with a's output null.
    expect(ran(run.runId)).toEqual(['a#1', 'b#1', 'c#1']);
    expect(callsOf(run.runId)[1]!.deps).toEqual({ a: null });
    const evs = await events(run.runId);
    expect(changes(evs, 'a')).toEqual([
      'PENDING→READY',
      'READY→RUNNING',
      'RUNNING→FAILED_FINAL',
      'FAILED_FINAL→SKIPPED',
    ]);
    expect(changes(evs, 'b')).toEqual([
      'PENDING→CANCELLED',
      'CANCELLED→READY',
      'READY→RUNNING',
      'RUNNING→SUCCEEDED',
    ]);
    expect(
      evs.filter((e) => e.type === 'run.status').map((e) => `${String(e.data['to'])}`),
    ).toEqual(['running', 'failed', 'running', 'succeeded']);
    expect(hookCalls).toContain(`${run.runId} a ana skip`);
    // The run list has it as it ended: succeeded.
    const listed = await rt.list({ plan: 'skip-failed' });
    expect(listed.find((r) => r.runId === run.runId)?.status).toBe('succeeded');
  });

  it('a step that succeeded, or any step of a cancelled run, cannot be skipped, and bad requests write nothing', async () => {
    const run = await rt.start(line('skip-done', [{ id: 'a', operator: 'noop' }, { id: 'g' }]));
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('waiting');
    const before = await runKeys(run.runId);
    const ended = await rt
      .skip(run.runId, 'a', { by: 'ana', reason: 'x' })
      .catch((x: unknown) => x);
    expect(ended).toBeInstanceOf(StepNotSkippableError);
    expect((ended as StepNotSkippableError).status).toBe('SUCCEEDED');
    expect((ended as Error).message).toContain(
      'only a step that has not succeeded or been skipped',
    );
    const unknown = await rt
      .skip(run.runId, 'zz', { by: 'ana', reason: 'x' })
      .catch((x: unknown) => x);
    expect(unknown).toBeInstanceOf(StepNotSkippableError);
    expect((unknown as Error).message).toContain('Its steps: a, g');
    const noReason = await rt
      .skip(run.runId, 'g', { by: 'ana', reason: ' ' })
      .catch((x: unknown) => x);
    expect(noReason).toBeInstanceOf(InputValidationError);
    expect((noReason as Error).message).toContain('reason');
    expect(await runKeys(run.runId)).toEqual(before);

    // Cancelled: the run is over, none of its steps can be skipped.
    await rt.cancel(run.runId, { by: 'ops', reason: 'not needed' });
    const cancelled = await runKeys(run.runId);
    const refused = await rt
      .skip(run.runId, 'g', { by: 'ana', reason: 'x' })
      .catch((x: unknown) => x);
    expect(refused).toBeInstanceOf(StepNotSkippableError);
    expect((refused as StepNotSkippableError).status).toBe('CANCELLED');
    expect(await runKeys(run.runId)).toEqual(cancelled);
    expect(ran(run.runId)).toEqual(['a#1']);
  });
});
