/**
 * Signals and wait steps in one process: a run waits for a signal, takes each signal once in send
 * order, refuses bad input writing nothing, and fires timers once, not before their time. What is
 * checked comes from what the operators ran and what Redis holds.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  InputValidationError,
  PlanValidationError,
  RunEndedError,
  RunNotFoundError,
  SignalIdConflictError,
} from '../../src/errors.js';
import type { OperatorContext } from '../../src/execution/execute-step.js';
import type { JsonValue } from '../../src/internal/json.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, runtimeCore, type Runtime } from '../../src/runtime.js';
import { timerJobId } from '../../src/actors/jobs.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { connect, deletePrefix, redisUrl, scanKeys, testPrefix } from '../helpers/redis.js';

interface Call {
  runId: string;
  stepId: string;
  deps: Record<string, JsonValue>;
  at: number;
}
const calls: Call[] = [];
const callsOf = (runId: string) => calls.filter((c) => c.runId === runId);

const operators = {
  noop: (ctx: OperatorContext) => {
    calls.push({ runId: ctx.runId, stepId: ctx.stepId, deps: ctx.deps, at: Date.now() });
    return { step: ctx.stepId };
  },
};

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
    queueName: 'signals',
    operators,
    signals: {
      typed: {
        order: z.object({ sku: z.string(), qty: z.number().int().positive() }),
        done: z.null(),
      },
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

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until<T>(what: string, probe: () => Promise<T | undefined>, ms = 10_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

const statusIs = (runId: string, status: string) =>
  until(`${runId} ${status}`, async () => {
    const r = await rt.status(runId);
    return r.status === status ? r : undefined;
  });

/** a → wait(signal) → b. */
const waitPlan = (
  name: string,
  signal: string,
  extra: Record<string, unknown> = {},
): PlanInput => ({
  name,
  steps: [
    { id: 'a', kind: 'operator', operator: 'noop' },
    { id: 'w', kind: 'wait', for: { signal }, dependsOn: ['a'], ...extra },
    { id: 'b', kind: 'operator', operator: 'noop', dependsOn: ['w'] },
  ],
});

/** Every key of the run with its whole content (streams included). */
async function runKeys(runId: string): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  // Every master of a cluster is scanned (a run's keys are on the one that holds its slot).
  for (const key of (await scanKeys(redis, `${prefix}:{${runId}}*`)).sort()) {
    const type = await redis.type(key);
    if (type === 'hash') out[key] = await redis.hgetall(key);
    else if (type === 'stream') out[key] = await redis.xrange(key, '-', '+');
    else if (type === 'list') out[key] = await redis.lrange(key, 0, -1);
    else out[key] = await redis.get(key);
  }
  return out;
}

/** What a call was refused with (it must be refused). */
async function refusal(p: Promise<unknown>): Promise<Error & { code?: string }> {
  return p.then(
    () => {
      throw new Error('expected a refusal');
    },
    (e: unknown) => e as Error & { code?: string },
  );
}

async function eventTypes(runId: string): Promise<string[]> {
  const out: string[] = [];
  for await (const e of rt.events(runId)) out.push(e.type);
  return out;
}

describe('signals and wait steps', () => {
  it('a run waits for its signal (visible as waiting), then takes its payload once', async () => {
    const run = await rt.start(waitPlan('one', 'go'), null);
    const waiting = await statusIs(run.runId, 'waiting');
    const w = waiting.steps.find((s) => s.stepId === 'w')!;
    expect(w.status).toBe('WAITING');
    expect(w.wait).toMatchObject({ signal: 'go', dueAt: null });
    expect(waiting.waits).toEqual([
      { stepId: 'w', signal: 'go', queued: 0, dueAt: null, since: w.wait!.since },
    ]);
    const listed = await rt.list({ status: 'waiting', plan: 'one' });
    expect(listed).toEqual([
      expect.objectContaining({ runId: run.runId, waitingStep: 'w', waitsFor: 'signal "go"' }),
    ]);
    const receipt = await rt.signal(run.runId, 'go', { hello: 1 });
    expect(receipt).toMatchObject({ name: 'go', index: 0, seq: 1, duplicate: false });
    const done = await statusIs(run.runId, 'succeeded');
    expect(done.steps.find((s) => s.stepId === 'w')!.output).toEqual({ hello: 1 });
    expect(callsOf(run.runId).map((c) => c.stepId)).toEqual(['a', 'b']);
    expect(callsOf(run.runId)[1]!.deps).toEqual({ w: { hello: 1 } });
    const types = await eventTypes(run.runId);
    expect(types.filter((t) => t === 'signal.received')).toHaveLength(1);
    expect(types.filter((t) => t === 'signal.taken')).toHaveLength(1);
    expect(types).toContain('wait.started');
    // The stored events lead to the stored snapshot (the signal cursor included).
    const reproduced = await rt.replay(run.runId, { mode: 'reproduce' });
    expect(reproduced.integrity).toEqual({ ok: true, problems: [], differences: [] });
    const trace = await rt.trace(run.runId);
    expect(trace.steps.map((s) => s.stepId)).toEqual(['a', 'w', 'b']);
  });

  it('a signal sent before the wait is reached waits in the inbox', async () => {
    const plan: PlanInput = {
      name: 'early',
      steps: [
        { id: 'a', kind: 'wait', for: { durationMs: 300 } },
        { id: 'w', kind: 'wait', for: { signal: 'go' }, dependsOn: ['a'] },
        { id: 'b', kind: 'operator', operator: 'noop', dependsOn: ['w'] },
      ],
    };
    const run = await rt.start(plan, null);
    await rt.signal(run.runId, 'go', 'early bird');
    const done = await statusIs(run.runId, 'succeeded');
    expect(done.steps.find((s) => s.stepId === 'w')!.output).toBe('early bird');
  });

  it('two waits side by side on one name take one signal each', async () => {
    const plan: PlanInput = {
      name: 'side',
      steps: [
        { id: 'w1', kind: 'wait', for: { signal: 'go' } },
        { id: 'w2', kind: 'wait', for: { signal: 'go' } },
        { id: 'b', kind: 'operator', operator: 'noop', dependsOn: ['w1', 'w2'] },
      ],
    };
    const run = await rt.start(plan, null);
    await statusIs(run.runId, 'waiting');
    await Promise.all([rt.signal(run.runId, 'go', 'x'), rt.signal(run.runId, 'go', 'y')]);
    const done = await statusIs(run.runId, 'succeeded');
    expect(
      done.steps
        .slice(0, 2)
        .map((s) => s.output)
        .sort(),
    ).toEqual(['x', 'y']);
    expect(callsOf(run.runId)).toHaveLength(1);
  });

  it('ten signals to ten waits in a line arrive in send order, each taken once', async () => {
    const steps: PlanInput['steps'] = [];
    for (let i = 0; i < 10; i++) {
      steps.push({
        id: `w${i}`,
        kind: 'wait',
        for: { signal: 'msg' },
        ...(i === 0 ? {} : { dependsOn: [`w${i - 1}`] }),
      });
    }
    steps.push({ id: 'end', kind: 'operator', operator: 'noop', dependsOn: ['w9'] });
    const run = await rt.start({ name: 'ten', steps }, null);
    // Sent at once, some before their wait is reached, some while one waits.
    for (let i = 0; i < 10; i++) await rt.signal(run.runId, 'msg', { n: i });
    const done = await statusIs(run.runId, 'succeeded');
    for (let i = 0; i < 10; i++) {
      expect(done.steps.find((s) => s.stepId === `w${i}`)!.output).toEqual({ n: i });
    }
    const types = await eventTypes(run.runId);
    expect(types.filter((t) => t === 'signal.taken')).toHaveLength(10);
  });

  it('a retried send with the same id delivers once; another payload under it is refused', async () => {
    const plan: PlanInput = {
      name: 'dedup',
      steps: [
        { id: 'w1', kind: 'wait', for: { signal: 'pay' } },
        { id: 'w2', kind: 'wait', for: { signal: 'pay' }, dependsOn: ['w1'] },
      ],
    };
    const run = await rt.start(plan, null);
    const first = await rt.signal(run.runId, 'pay', { cents: 5 }, { id: 'p-1' });
    const again = await rt.signal(run.runId, 'pay', { cents: 5 }, { id: 'p-1' });
    expect(again).toEqual({ ...first, duplicate: true });
    await until('w1 to take it', async () => {
      const r = await rt.status(run.runId);
      return r.steps[0]!.status === 'SUCCEEDED' && r.steps[1]!.status === 'WAITING' ? r : undefined;
    });
    const before = await runKeys(run.runId);
    await expect(rt.signal(run.runId, 'pay', { cents: 6 }, { id: 'p-1' })).rejects.toThrow(
      SignalIdConflictError,
    );
    await expect(rt.signal(run.runId, 'other', { cents: 5 }, { id: 'p-1' })).rejects.toThrow(
      SignalIdConflictError,
    );
    expect(await runKeys(run.runId)).toEqual(before);
    await sleep(200);
    const r = await rt.status(run.runId);
    expect(r.steps[1]!.status).toBe('WAITING');
    expect(r.waits).toEqual([expect.objectContaining({ stepId: 'w2', queued: 0 })]);
    await rt.signal(run.runId, 'pay', { cents: 7 }, { id: 'p-2' });
    const done = await statusIs(run.runId, 'succeeded');
    expect(done.steps.map((s) => s.output)).toEqual([{ cents: 5 }, { cents: 7 }]);
  });

  it('bad input is refused with the field named, writing nothing', async () => {
    const run = await rt.start(waitPlan('typed', 'order'), null);
    await statusIs(run.runId, 'waiting');
    const before = await runKeys(run.runId);
    const undeclared = await refusal(rt.signal(run.runId, 'ordr', { sku: 'x', qty: 1 }));
    expect(undeclared).toBeInstanceOf(InputValidationError);
    expect(undeclared.code).toBe('input_invalid');
    expect(undeclared.message).toContain('name: plan "typed" declares no signal "ordr"');
    const bad = await refusal(rt.signal(run.runId, 'order', { sku: 'x', qty: 0 }));
    expect(bad).toBeInstanceOf(InputValidationError);
    expect(bad.message).toContain('payload.qty');
    const badName = await refusal(rt.signal(run.runId, 'no spaces', null));
    expect(badName).toBeInstanceOf(InputValidationError);
    expect(badName.message).toContain('name');
    const notJson = await refusal(rt.signal(run.runId, 'order', { when: new Date() }));
    expect(notJson).toBeInstanceOf(InputValidationError);
    expect(notJson.message).toContain('payload.when');
    expect(await runKeys(run.runId)).toEqual(before);

    const unknown = await refusal(rt.signal('no-such-run', 'order', null));
    expect(unknown).toBeInstanceOf(RunNotFoundError);
    expect(unknown.code).toBe('run_not_found');
    expect(await redis.exists(`${prefix}:{no-such-run}:inbox`)).toBe(0);

    await rt.signal(run.runId, 'order', { sku: 'x', qty: 2 });
    await statusIs(run.runId, 'succeeded');
    const after = await runKeys(run.runId);
    const ended = await refusal(rt.signal(run.runId, 'order', { sku: 'y', qty: 1 }));
    expect(ended).toBeInstanceOf(RunEndedError);
    expect(ended.code).toBe('run_ended');
    expect(await runKeys(run.runId)).toEqual(after);
  });

  it('a wait step with a bad `for` is refused at start, naming the field and the fix', async () => {
    const bad = (f: unknown, extra: Record<string, unknown> = {}) =>
      rt.start(
        { name: 'bad', steps: [{ id: 'w', kind: 'wait', for: f, ...extra }] } as never,
        null,
      );
    const none = await refusal(bad({}));
    expect(none).toBeInstanceOf(PlanValidationError);
    expect(none.message).toContain('steps[0].for: give exactly one of');
    const two = await refusal(bad({ signal: 'a', durationMs: 5 }));
    expect(two.message).toContain('steps[0].for: give exactly one of');
    const neg = await refusal(bad({ durationMs: -5 }));
    expect(neg.message).toContain('steps[0].for.durationMs');
    const when = await refusal(bad({ until: 'tomorrow' }));
    expect(when.message).toContain('steps[0].for.until: until "tomorrow" is not a time');
    const typo = await refusal(bad({ signl: 'a' }));
    expect(typo.message).toContain('steps[0].for');
    const timeout = await refusal(bad({ durationMs: 5 }, { timeoutMs: 10 }));
    expect(timeout.message).toContain(
      'steps[0].timeoutMs: timeoutMs bounds a wait for a signal only',
    );
    expect(await rt.list({ plan: 'bad' })).toEqual([]);
  });

  it('a timer fires once, not before its time, with the time it fired', async () => {
    const plan: PlanInput = {
      name: 'timer',
      steps: [
        { id: 't', kind: 'wait', for: { durationMs: 600 } },
        { id: 'b', kind: 'operator', operator: 'noop', dependsOn: ['t'] },
      ],
    };
    const run = await rt.start(plan, null);
    const waiting = await statusIs(run.runId, 'waiting');
    const t = waiting.steps[0]!;
    expect(t.wait!.dueAt! - t.wait!.since).toBe(600);
    const done = await statusIs(run.runId, 'succeeded');
    const out = done.steps[0]!.output as { firedAt: string; dueAt: string };
    expect(Date.parse(out.firedAt)).toBeGreaterThanOrEqual(t.wait!.dueAt!);
    expect(out.dueAt).toBe(new Date(t.wait!.dueAt!).toISOString());
    expect(callsOf(run.runId).map((c) => c.stepId)).toEqual(['b']);
    expect(callsOf(run.runId)[0]!.at).toBeGreaterThanOrEqual(t.wait!.dueAt!);
  });

  it('a signal wait past its timeoutMs fails final with wait_timeout', async () => {
    const run = await rt.start(waitPlan('timeout', 'late', { timeoutMs: 300 }), null);
    const failed = await statusIs(run.runId, 'failed');
    const w = failed.steps.find((s) => s.stepId === 'w')!;
    expect(w.status).toBe('FAILED_FINAL');
    expect(w.error?.code).toBe('wait_timeout');
    expect(failed.summary.reason).toBe('wait_timeout');
    expect(callsOf(run.runId).map((c) => c.stepId)).toEqual(['a']);
  });

  it('cancelling a run removes its timer job', async () => {
    const plan: PlanInput = {
      name: 'cancel',
      steps: [{ id: 't', kind: 'wait', for: { durationMs: 60_000 } }],
    };
    const run = await rt.start(plan, null);
    const waiting = await statusIs(run.runId, 'waiting');
    const queue = runtimeCore(rt).queues.queue;
    const id = timerJobId(run.runId, 't', waiting.steps[0]!.attempt);
    expect(await queue.getJobState(id)).toBe('delayed');
    await rt.cancel(run.runId, { by: 'test' });
    expect(await queue.getJobState(id)).toBe('unknown');
    expect((await rt.status(run.runId)).status).toBe('cancelled');
  });

  it('start or signal: 20 concurrent calls with one request key make one run, each signal taken once', async () => {
    const steps: PlanInput['steps'] = [];
    for (let i = 0; i < 20; i++) {
      steps.push({
        id: `m${i}`,
        kind: 'wait',
        for: { signal: 'msg' },
        ...(i === 0 ? {} : { dependsOn: [`m${i - 1}`] }),
      });
    }
    const plan: PlanInput = { name: 'conversation', steps };
    const handles = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        rt.start(plan, null, {
          requestKey: 'chat-1',
          signal: { name: 'msg', payload: { text: `m${i}` }, id: `call-${i}` },
        }),
      ),
    );
    const runIds = new Set(handles.map((h) => h.runId));
    expect(runIds.size).toBe(1);
    expect(handles.filter((h) => h.created)).toHaveLength(1);
    expect(new Set(handles.map((h) => h.signal!.seq)).size).toBe(20);
    const runId = handles[0]!.runId;
    const done = await statusIs(runId, 'succeeded');
    const texts = done.steps.map((s) => (s.output as { text: string }).text).sort();
    expect(texts).toEqual(Array.from({ length: 20 }, (_, i) => `m${i}`).sort());
    // Taken in send order: the n-th wait took the signal sent n-th.
    const bySeq = [...handles].sort((a, b) => a.signal!.seq - b.signal!.seq);
    expect(done.steps.map((s) => s.output)).toEqual(
      bySeq.map((h) => ({ text: `m${h.signal!.id!.slice(5)}` })),
    );
    const types = await eventTypes(runId);
    expect(types.filter((t) => t === 'signal.taken')).toHaveLength(20);
    expect(await rt.list({ plan: 'conversation' })).toHaveLength(1);
  });

  it('a start with a bad signal starts nothing', async () => {
    const noKey = await refusal(
      rt.start(waitPlan('nokey', 'go'), null, { signal: { name: 'go' } }),
    );
    expect(noKey).toBeInstanceOf(InputValidationError);
    expect(noKey.message).toContain('signal: a start with a signal needs a requestKey');
    const badPayload = await refusal(
      rt.start(waitPlan('typed', 'order'), null, {
        requestKey: 'typed-1',
        signal: { name: 'order', payload: { sku: 1 } },
      }),
    );
    expect(badPayload).toBeInstanceOf(InputValidationError);
    expect(badPayload.message).toContain('payload.sku');
    expect(await rt.list({ plan: 'nokey' })).toEqual([]);
    expect(await redis.exists(`${prefix}:request:default:typed-1`)).toBe(0);
  });
});
