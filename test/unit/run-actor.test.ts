import { describe, expect, it } from 'vitest';
import { createActor, initialTransition, type Actor } from 'xstate';
import { PlanValidationError } from '../../src/errors.js';
import type { RunSnapshot } from '../../src/machines/kernel.js';
import { runMachine } from '../../src/machines/run-machine.js';
import type { PlannedAction } from '../../src/machines/types.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import type { PlanInput } from '../../src/plan/schema.js';

// root → a, b → join: `a` retries (no jitter, so the backoff is exact), `b` waits for a gate.
const plan = {
  name: 'fan-out',
  steps: [
    { id: 'root', kind: 'operator', operator: 'fetch' },
    {
      id: 'a',
      kind: 'operator',
      operator: 'flaky',
      dependsOn: ['root'],
      retry: { maxAttempts: 3, initialDelayMs: 1000, backoffCoefficient: 2, jitter: 0 },
    },
    {
      id: 'b',
      kind: 'operator',
      operator: 'send',
      dependsOn: ['root'],
      gate: { reason: 'check the recipient' },
    },
    { id: 'join', kind: 'operator', operator: 'merge', dependsOn: ['a', 'b'] },
  ],
} satisfies PlanInput;

const T = 1_700_000_000_000;
const timeout = { name: 'TimeoutError', code: 'timeout', message: 'timed out', retryable: true };

type RunActor = Actor<typeof runMachine>;

/** Each step's state value, read from the run's child actors. */
function steps(actor: RunActor): Record<string, unknown> {
  const children = actor.getSnapshot().children;
  return Object.fromEntries(
    Object.entries(children).map(([id, child]) => [id, child?.getSnapshot().value]),
  );
}

function attempt(actor: RunActor, stepId: string): number | undefined {
  return actor.getSnapshot().children[stepId]?.getSnapshot().context.attempt;
}

/** A run actor of `plan` whose `plan` actions are collected. */
function planned(): { actor: RunActor; actions: PlannedAction[] } {
  const actions: PlannedAction[] = [];
  const machine = runMachine.provide({
    actions: { plan: (_, action: PlannedAction) => void actions.push(action) },
  });
  return { actor: createActor(machine, { input: plan }), actions };
}

describe('the run machine as an actor', () => {
  it('runs a plan in memory: fan-out, a retry with backoff, a gate, the join', () => {
    const { actor, actions } = planned();
    actor.start();
    expect(actor.getSnapshot().value).toBe('running');
    expect(actor.getSnapshot().context.runId).toBe('fan-out');
    expect(steps(actor)).toEqual({ root: 'READY', a: 'PENDING', b: 'PENDING', join: 'PENDING' });
    // Each step is a child actor spawned from `step` under its own id.
    const persisted = actor.getPersistedSnapshot() as RunSnapshot;
    expect(
      Object.entries(persisted.children).map(([id, c]) => [id, c.src, c.snapshot.value]),
    ).toEqual([
      ['root', 'step', 'READY'],
      ['a', 'step', 'PENDING'],
      ['b', 'step', 'PENDING'],
      ['join', 'step', 'PENDING'],
    ]);
    expect(actions).toEqual([{ type: 'step.execute', stepId: 'root', attempt: 1 }]);

    actor.send({ type: 'step.started', stepId: 'root', attempt: 1, at: T });
    expect(steps(actor)['root']).toBe('RUNNING');
    actor.send({
      type: 'step.succeeded',
      stepId: 'root',
      attempt: 1,
      output: { n: 2 },
      at: T + 10,
    });
    // Fan-out: both dependents move at once; `b` waits for its gate.
    expect(steps(actor)).toEqual({
      root: 'SUCCEEDED',
      a: 'READY',
      b: 'WAITING_APPROVAL',
      join: 'PENDING',
    });
    expect(actor.getSnapshot().value).toBe('running');
    expect(actions.slice(1)).toEqual([
      { type: 'step.execute', stepId: 'a', attempt: 1 },
      { type: 'step.requestApproval', stepId: 'b' },
    ]);

    actor.send({
      type: 'step.failed',
      stepId: 'a',
      attempt: 1,
      error: timeout,
      jitterSeed: 7,
      at: T + 20,
    });
    expect(steps(actor)['a']).toBe('FAILED_RETRYABLE');
    expect(actor.getSnapshot().children['a']?.getSnapshot().context.retryAt).toBe(T + 1020);
    expect(actions.at(-1)).toEqual({
      type: 'step.scheduleRetry',
      stepId: 'a',
      attempt: 2,
      at: T + 1020,
      delayMs: 1000,
    });
    expect(actor.getSnapshot().value).toBe('running');

    // A retry due for the wrong attempt changes nothing.
    actor.send({ type: 'retry.due', stepId: 'a', attempt: 3, at: T + 1020 });
    expect(steps(actor)['a']).toBe('FAILED_RETRYABLE');
    actor.send({ type: 'retry.due', stepId: 'a', attempt: 2, at: T + 1020 });
    expect(steps(actor)['a']).toBe('READY');
    expect(attempt(actor, 'a')).toBe(2);
    expect(actions.at(-1)).toEqual({ type: 'step.execute', stepId: 'a', attempt: 2 });

    actor.send({ type: 'step.succeeded', stepId: 'a', attempt: 2, output: 'a', at: T + 1100 });
    expect(steps(actor)['a']).toBe('SUCCEEDED');
    // Only a person can move the run on now.
    expect(actor.getSnapshot().value).toBe('waiting');

    actor.send({ type: 'gate.approved', stepId: 'b', by: 'ana', at: T + 2000 });
    expect(steps(actor)['b']).toBe('READY');
    expect(actor.getSnapshot().children['b']?.getSnapshot().context.approval).toEqual({
      by: 'ana',
      at: T + 2000,
      comment: null,
    });
    expect(actor.getSnapshot().value).toBe('running');
    actor.send({ type: 'step.succeeded', stepId: 'b', attempt: 1, output: 'b', at: T + 2100 });
    expect(steps(actor)['join']).toBe('READY');
    actor.send({ type: 'step.succeeded', stepId: 'join', attempt: 1, output: 'j', at: T + 2200 });

    expect(steps(actor)).toEqual({
      root: 'SUCCEEDED',
      a: 'SUCCEEDED',
      b: 'SUCCEEDED',
      join: 'SUCCEEDED',
    });
    expect(actor.getSnapshot().value).toBe('succeeded');
    expect(actor.getSnapshot().status).toBe('done');
    expect(actor.getSnapshot().context.steps).toEqual({
      root: { status: 'SUCCEEDED', attempt: 1 },
      a: { status: 'SUCCEEDED', attempt: 2 },
      b: { status: 'SUCCEEDED', attempt: 1 },
      join: { status: 'SUCCEEDED', attempt: 1 },
    });
    expect(actions.map((a) => a.type)).toEqual([
      'step.execute',
      'step.execute',
      'step.requestApproval',
      'step.scheduleRetry',
      'step.execute',
      'step.execute',
      'step.execute',
    ]);
  });

  it('a cancel ends one run and leaves another run alone', () => {
    const one = planned();
    const other = planned();
    one.actor.start();
    other.actor.start();
    for (const { actor } of [one, other]) {
      actor.send({ type: 'step.succeeded', stepId: 'root', attempt: 1, output: 1, at: T });
    }
    other.actor.send({ type: 'run.cancelled', by: 'ops', reason: 'deploy', at: T + 50 });

    expect(other.actor.getSnapshot().value).toBe('cancelled');
    expect(other.actor.getSnapshot().status).toBe('done');
    expect(steps(other.actor)).toEqual({
      root: 'SUCCEEDED',
      a: 'CANCELLED',
      b: 'CANCELLED',
      join: 'CANCELLED',
    });
    expect(other.actor.getSnapshot().context.cancel).toEqual({
      by: 'ops',
      reason: 'deploy',
      at: T + 50,
    });
    expect(other.actor.getSnapshot().children['a']?.getSnapshot().context.reason).toBe(
      'run_cancelled',
    );
    // `a` was READY (a worker may be executing it): the host is told to abort that attempt.
    expect(other.actions.at(-1)).toEqual({ type: 'step.abort', stepId: 'a', attempt: 1 });

    expect(one.actor.getSnapshot().value).toBe('running');
    expect(steps(one.actor)).toEqual({
      root: 'SUCCEEDED',
      a: 'READY',
      b: 'WAITING_APPROVAL',
      join: 'PENDING',
    });
    expect(one.actions).toHaveLength(3);
  });

  it('restores from its persisted snapshot with every step, and goes on', () => {
    const { actor } = planned();
    actor.start();
    actor.send({ type: 'step.succeeded', stepId: 'root', attempt: 1, output: 1, at: T });
    actor.send({
      type: 'step.failed',
      stepId: 'a',
      attempt: 1,
      error: timeout,
      jitterSeed: 7,
      at: T + 20,
    });
    const persisted = JSON.parse(JSON.stringify(actor.getPersistedSnapshot())) as ReturnType<
      RunActor['getPersistedSnapshot']
    >;
    actor.stop();

    const restored = createActor(runMachine, { snapshot: persisted }).start();
    expect(restored.getSnapshot().value).toBe('running');
    expect(steps(restored)).toEqual({
      root: 'SUCCEEDED',
      a: 'FAILED_RETRYABLE',
      b: 'WAITING_APPROVAL',
      join: 'PENDING',
    });
    expect(attempt(restored, 'a')).toBe(1);
    restored.send({ type: 'retry.due', stepId: 'a', attempt: 2, at: T + 1020 });
    restored.send({ type: 'step.succeeded', stepId: 'a', attempt: 2, output: 'a', at: T + 1100 });
    restored.send({ type: 'gate.approved', stepId: 'b', by: 'ana', at: T + 1200 });
    restored.send({ type: 'step.succeeded', stepId: 'b', attempt: 1, output: 'b', at: T + 1300 });
    restored.send({
      type: 'step.succeeded',
      stepId: 'join',
      attempt: 1,
      output: 'j',
      at: T + 1400,
    });
    expect(restored.getSnapshot().value).toBe('succeeded');
    expect(attempt(restored, 'a')).toBe(2);
  });

  it('a resumed run reopens its failed step with a fresh actor under the same id', () => {
    const { actor, actions } = planned();
    actor.start();
    const failRoot = (n: number, at: number) =>
      actor.send({
        type: 'step.failed',
        stepId: 'root',
        attempt: n,
        error: { ...timeout, retryable: false },
        jitterSeed: 1,
        at,
      });
    failRoot(1, T);
    expect(actor.getSnapshot().value).toBe('failed');
    expect(steps(actor)).toEqual({
      root: 'FAILED_FINAL',
      a: 'CANCELLED',
      b: 'CANCELLED',
      join: 'CANCELLED',
    });
    const ended = actor.getSnapshot().children['root'];

    actor.send({ type: 'run.resumed', at: T + 100 });
    const reopened = actor.getSnapshot().children['root'];
    expect(reopened).not.toBe(ended);
    expect(reopened?.id).toBe('root');
    expect(actor.getSnapshot().value).toBe('running');
    // Its attempts go on: the second attempt, not a new first one.
    expect(steps(actor)).toEqual({ root: 'READY', a: 'PENDING', b: 'PENDING', join: 'PENDING' });
    expect(attempt(actor, 'root')).toBe(2);
    expect(actions.at(-1)).toEqual({ type: 'step.execute', stepId: 'root', attempt: 2 });
    // The persisted run names the reopened step's logic, so it restores too.
    expect(actor.getPersistedSnapshot()).toMatchObject({
      children: { root: { src: 'step', snapshot: { value: 'READY' } } },
    });
  });

  it('takes a parsed plan, or { runId, plan, at }', () => {
    const parsed = parsePlan(plan);
    const alone = createActor(runMachine, { input: parsed }).start();
    expect(alone.getSnapshot().context).toMatchObject({
      runId: 'fan-out',
      planName: 'fan-out',
      createdAt: 0,
    });
    const full = createActor(runMachine, { input: { runId: 'r1', plan: parsed, at: T } }).start();
    expect(full.getSnapshot().context).toMatchObject({
      runId: 'r1',
      planName: 'fan-out',
      createdAt: T,
      updatedAt: T,
    });
    expect(steps(full)).toEqual({ root: 'READY', a: 'PENDING', b: 'PENDING', join: 'PENDING' });
  });

  it('a bad plan fails with the PlanValidationError parsePlan throws, and starts nothing', () => {
    const bad = { name: 'bad', steps: [{ id: 'x', kind: 'operator', dependsOn: ['nope'] }] };
    const expected = (() => {
      try {
        parsePlan(bad);
      } catch (error) {
        return error;
      }
      throw new Error('parsePlan took a bad plan');
    })();
    expect(expected).toBeInstanceOf(PlanValidationError);

    // xstate keeps what the context factory throws as the snapshot's error (status `error`).
    const [initial, actions] = initialTransition(runMachine, bad as PlanInput);
    expect(initial.status).toBe('error');
    expect(initial.error).toBeInstanceOf(PlanValidationError);
    expect((initial.error as PlanValidationError).message).toBe((expected as Error).message);
    expect(actions).toEqual([]);

    // As an actor: its snapshot holds the error, `start()` reports it, no step actor exists.
    const actor = createActor(runMachine, { input: bad as PlanInput });
    expect(actor.getSnapshot().status).toBe('error');
    const reported: unknown[] = [];
    actor.subscribe({ error: (error) => void reported.push(error) });
    actor.start();
    expect(reported).toHaveLength(1);
    expect(reported[0]).toBeInstanceOf(PlanValidationError);
    expect((reported[0] as PlanValidationError).issues).toEqual(
      (expected as PlanValidationError).issues,
    );
    expect(actor.getSnapshot().children ?? {}).toEqual({});

    // No input at all, or null: the same kind of error, naming what is missing.
    const [none] = initialTransition(runMachine, undefined);
    expect(none.error).toBeInstanceOf(PlanValidationError);
    expect((none.error as Error).message).toMatch(/expected a plan object, received nothing/);
    const [nothing] = initialTransition(runMachine, null as unknown as PlanInput);
    expect((nothing.error as Error).message).toMatch(/expected a plan object, received null/);
  });
});
