/**
 * Policies through the worker: `policy_check` steps run their registered policy, policies bound to
 * `policyTags` guard every step with those tags; a denial is final, cancels the dependents, fails
 * the run with the reason in its summary, and no operator behind it runs.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { OperatorContext } from '../../src/execution/execute-step.js';
import type { PolicyContext } from '../../src/execution/policies.js';
import { InputValidationError } from '../../src/errors.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { connect, deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

/** Operator invocations, as `runId/stepId#attempt`. */
const invoked: string[] = [];
/** What each policy saw, as `policy@stepId`, with its context. */
const seen: { at: string; ctx: Omit<PolicyContext, 'signal'> }[] = [];

const noop = (ctx: OperatorContext) => {
  invoked.push(`${ctx.runId}/${ctx.stepId}#${ctx.attempt}`);
  return { from: ctx.stepId, amount: 120 };
};

const note =
  (name: string) =>
  ({ signal: _signal, ...ctx }: PolicyContext): void => {
    seen.push({ at: `${name}@${ctx.stepId}`, ctx });
  };

let redis: Redis;
let runtime: Runtime;
let worker: FlujoWorker;
const prefix = testPrefix();

beforeAll(async () => {
  redis = connect();
  runtime = createRuntime({
    redis: redisUrl(),
    prefix,
    operators: { noop },
    policies: {
      // Allows amounts up to the run input's limit, read from the dependency's output.
      'under-limit': (ctx) => {
        note('under-limit')(ctx);
        const limit = (ctx.runInput as { limit: number }).limit;
        const amount = (ctx.deps['quote'] as { amount: number }).amount;
        return amount <= limit
          ? { allow: true }
          : { allow: false, reason: `amount ${amount} is over the limit ${limit}` };
      },
      // The shape of the bug this guards against: not a verdict.
      sloppy: () => ({ allowed: false }) as never,
      // Bound to the tag "pii": denies unless the run input says consent.
      consent: {
        check: (ctx) => {
          note('consent')(ctx);
          return (ctx.runInput as { consent?: boolean }).consent === true
            ? { allow: true }
            : { allow: false, reason: 'no consent for personal data' };
        },
        appliesTo: { tags: ['pii'] },
      },
    },
  });
  worker = runtime.createWorker({ concurrency: 4 });
  await worker.ready();
});
afterAll(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
  redis.disconnect();
});

/** quote → check (policy_check) → pay, and an independent branch `audit`. */
const checked = (policy: string): PlanInput => ({
  name: 'checked',
  // Retries would be allowed: a denial must still be final.
  defaults: { retry: { maxAttempts: 5, initialDelayMs: 10, jitter: 0 } },
  steps: [
    { id: 'quote', kind: 'operator', operator: 'noop' },
    { id: 'check', kind: 'policy_check', policy, dependsOn: ['quote'] },
    { id: 'pay', kind: 'operator', operator: 'noop', dependsOn: ['check'] },
    { id: 'receipt', kind: 'operator', operator: 'noop', dependsOn: ['pay'] },
    { id: 'audit', kind: 'operator', operator: 'noop' },
  ],
});

const statusOf = async (runId: string) =>
  Object.fromEntries((await runtime.status(runId)).steps.map((s) => [s.stepId, s.status]));
const invokedIn = (runId: string) =>
  invoked.filter((i) => i.startsWith(`${runId}/`)).map((i) => i.slice(runId.length + 1));

describe('policy_check steps', { timeout: 30_000 }, () => {
  it('a denial fails the step finally (one attempt), cancels its dependents and fails the run with the reason', async () => {
    const run = await runtime.start(checked('under-limit'), { limit: 100 });
    const report = await run.settled({ timeoutMs: 20_000 });
    expect(report.status).toBe('failed');
    expect(await statusOf(run.runId)).toEqual({
      quote: 'SUCCEEDED',
      check: 'FAILED_FINAL',
      pay: 'CANCELLED',
      receipt: 'CANCELLED',
      audit: 'SUCCEEDED',
    });
    const check = report.steps.find((s) => s.stepId === 'check')!;
    expect(check.attempt).toBe(1);
    expect(check.error?.code).toBe('policy_denied');
    expect(report.steps.find((s) => s.stepId === 'pay')!.reason).toBe('upstream_failed');
    // Neither `pay` nor `receipt` ran; the independent branch did.
    expect(invokedIn(run.runId).sort()).toEqual(['audit#1', 'quote#1']);
    expect(report.summary.blockedStep).toBe('check');
    expect(report.summary.reason).toBe('policy_denied');
    expect(JSON.stringify(report.summary.detail)).toContain('amount 120 is over the limit 100');
    // The policy saw the run input and the dependency's output.
    const saw = seen.filter((s) => s.ctx.runId === run.runId);
    expect(saw).toHaveLength(1);
    expect(saw[0]!.at).toBe('under-limit@check');
    expect(saw[0]!.ctx.runInput).toEqual({ limit: 100 });
    expect(saw[0]!.ctx.deps).toEqual({ quote: { from: 'quote', amount: 120 } });
  });

  it('an allowing policy lets the dependents run; its step outputs the verdict', async () => {
    const run = await runtime.start(checked('under-limit'), { limit: 500 });
    const report = await run.settled({ timeoutMs: 20_000 });
    expect(report.status).toBe('succeeded');
    expect(report.summary.produced['check']).toEqual({ policy: 'under-limit', allow: true });
    expect(invokedIn(run.runId).sort()).toEqual(['audit#1', 'pay#1', 'quote#1', 'receipt#1']);
  });

  it('a policy that returns no verdict fails its step finally and nothing after it runs', async () => {
    const run = await runtime.start(checked('sloppy'), { limit: 500 });
    const report = await run.settled({ timeoutMs: 20_000 });
    expect(report.status).toBe('failed');
    const check = report.steps.find((s) => s.stepId === 'check')!;
    expect(check.status).toBe('FAILED_FINAL');
    expect(check.attempt).toBe(1);
    expect(check.error?.code).toBe('configuration_invalid');
    expect(check.error?.message).toContain('policy "sloppy" returned {"allowed":false}');
    expect(invokedIn(run.runId).sort()).toEqual(['audit#1', 'quote#1']);
  });

  it('a policy no worker registered fails the step with the fix named', async () => {
    const run = await runtime.start(checked('nowhere'), { limit: 500 });
    const report = await run.settled({ timeoutMs: 20_000 });
    const check = report.steps.find((s) => s.stepId === 'check')!;
    expect(check.status).toBe('FAILED_FINAL');
    expect(check.error?.message).toContain('no policy "nowhere" is registered');
    expect(invokedIn(run.runId).sort()).toEqual(['audit#1', 'quote#1']);
  });
});

describe('policies bound to policyTags', { timeout: 30_000 }, () => {
  const tagged: PlanInput = {
    name: 'tagged',
    defaults: { retry: { maxAttempts: 5, initialDelayMs: 10, jitter: 0 } },
    steps: [
      { id: 'collect', kind: 'operator', operator: 'noop', policyTags: ['pii'] },
      { id: 'store', kind: 'operator', operator: 'noop', dependsOn: ['collect'] },
      { id: 'count', kind: 'operator', operator: 'noop', policyTags: ['metrics'] },
    ],
  };

  it('deny: the tagged step never runs its operator, fails finally, and its dependents are cancelled', async () => {
    const plan = { ...tagged, steps: tagged.steps.slice(0, 2) };
    const run = await runtime.start(plan, { consent: false });
    const report = await run.settled({ timeoutMs: 20_000 });
    expect(report.status).toBe('failed');
    expect(await statusOf(run.runId)).toEqual({ collect: 'FAILED_FINAL', store: 'CANCELLED' });
    expect(invokedIn(run.runId)).toEqual([]);
    expect(report.summary.reason).toBe('policy_denied');
    expect(report.steps[0]!.attempt).toBe(1);
    expect(report.steps[0]!.error?.details).toEqual({
      policy: 'consent',
      stepId: 'collect',
      reason: 'no consent for personal data',
    });
    expect(seen.filter((s) => s.ctx.runId === run.runId).map((s) => s.at)).toEqual([
      'consent@collect',
    ]);
  });

  it('allow: the tagged step runs once, after its policy; untagged steps are not checked', async () => {
    const plan = { ...tagged, steps: tagged.steps.slice(0, 2) };
    const run = await runtime.start(plan, { consent: true });
    const report = await run.settled({ timeoutMs: 20_000 });
    expect(report.status).toBe('succeeded');
    expect(invokedIn(run.runId).sort()).toEqual(['collect#1', 'store#1']);
    const saw = seen.filter((s) => s.ctx.runId === run.runId);
    expect(saw.map((s) => s.at)).toEqual(['consent@collect']);
    expect(saw[0]!.ctx.tags).toEqual(['pii']);
  });

  it('a tag no registered policy applies to fails the step instead of skipping the check', async () => {
    const plan = { ...tagged, steps: [tagged.steps[2]!] };
    const run = await runtime.start(plan, { consent: true });
    const report = await run.settled({ timeoutMs: 20_000 });
    expect(report.status).toBe('failed');
    expect(report.steps[0]!.error?.message).toContain(
      'carries policy tag "metrics", which no policy registered in this worker applies to',
    );
    expect(invokedIn(run.runId)).toEqual([]);
  });
});

describe('registering policies', () => {
  it('refuses a policy that is not a function, or bad appliesTo tags, naming the field', () => {
    expect(() => runtime.policy('x', 'no' as never)).toThrow(InputValidationError);
    expect(() => runtime.policy('x', () => ({ allow: true }), { appliesTo: { tags: [] } })).toThrow(
      /appliesTo\.tags: must be a non-empty array of tags/,
    );
    expect(() => runtime.policy('under-limit', () => ({ allow: true }))).toThrow(
      /already registered/,
    );
  });
});
