/**
 * A run stored in Redis restores as an XState actor: `runtime.snapshot(runId)` is what
 * `createActor(runMachine, { snapshot })` takes, every step comes back as a child actor with its
 * state, attempt and output, and the remaining events bring the restored run to `succeeded`.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createActor, type Actor } from 'xstate';
import type { OperatorContext } from '../../src/execution/execute-step.js';
import { InputValidationError, RunNotFoundError } from '../../src/errors.js';
import { runMachine } from '../../src/machines/run-machine.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const ran: string[] = [];
const operators = {
  fetch: (ctx: OperatorContext) => {
    ran.push(`${ctx.stepId}#${ctx.attempt}`);
    return { pages: 3 };
  },
  // Fails (retryable) on its first attempt.
  flaky: (ctx: OperatorContext) => {
    ran.push(`${ctx.stepId}#${ctx.attempt}`);
    if (ctx.attempt === 1) {
      throw Object.assign(new Error('flaky first attempt'), { retryable: true });
    }
    return { tries: ctx.attempt };
  },
  send: () => ({ sent: true }),
  merge: () => ({ merged: true }),
};

// root → a, b → join: `a` fails once and is retried; `b` waits for a person.
const plan: PlanInput = {
  name: 'restore-me',
  steps: [
    { id: 'root', kind: 'operator', operator: 'fetch' },
    {
      id: 'a',
      kind: 'operator',
      operator: 'flaky',
      dependsOn: ['root'],
      retry: { maxAttempts: 3, initialDelayMs: 20, jitter: 0 },
    },
    { id: 'b', kind: 'operator', operator: 'send', dependsOn: ['root'], gate: {} },
    { id: 'join', kind: 'operator', operator: 'merge', dependsOn: ['a', 'b'] },
  ],
};

let redis: Redis;
let prefix: string;
let rt: Runtime;

beforeAll(() => {
  redis = connect();
  prefix = testPrefix();
  rt = createRuntime({ redis: redisUrl(), prefix, queueName: 'run-actor-restore', operators });
});
afterAll(async () => {
  await rt.close();
  await deletePrefix(redis, prefix);
  await deletePrefix(redis, `{${prefix}:q}`);
  await deletePrefix(redis, `{${prefix}:runs}`);
  await redis.quit();
});

type RunActor = Actor<typeof runMachine>;

function stepsOf(actor: RunActor): Record<string, [unknown, number | undefined]> {
  return Object.fromEntries(
    Object.entries(actor.getSnapshot().children).map(([id, child]) => {
      const s = child?.getSnapshot();
      return [id, [s?.value, s?.context.attempt]];
    }),
  );
}

describe('a stored run restored as an actor', () => {
  it('a run a worker drove partway restores with every step and finishes in memory', async () => {
    const worker: FlujoWorker = rt.createWorker({ concurrency: 2 });
    let handle;
    try {
      await worker.ready();
      handle = await rt.start(plan);
      const waiting = await handle.settled({ timeoutMs: 10_000 });
      expect(waiting.status).toBe('waiting');
    } finally {
      // Nothing drives the stored run from here on.
      await worker.close();
    }
    expect(ran).toEqual(['root#1', 'a#1', 'a#2']);

    const snapshot = await rt.snapshot(handle.runId);
    expect(snapshot.status).toBe('active');
    expect(snapshot.value).toBe('waiting');
    expect(Object.keys(snapshot.children)).toEqual(['root', 'a', 'b', 'join']);
    expect(Object.values(snapshot.children).map((c) => c.src)).toEqual([
      'step',
      'step',
      'step',
      'step',
    ]);

    const actor = createActor(runMachine, { snapshot }).start();
    expect(actor.getSnapshot().value).toBe('waiting');
    expect(stepsOf(actor)).toEqual({
      root: ['SUCCEEDED', 1],
      a: ['SUCCEEDED', 2],
      b: ['WAITING_APPROVAL', 0],
      join: ['PENDING', 0],
    });
    // Outputs come back with their steps.
    expect(actor.getSnapshot().children['root']?.getSnapshot().context.output).toEqual({
      pages: 3,
    });
    expect(actor.getSnapshot().children['a']?.getSnapshot().context.output).toEqual({ tries: 2 });

    const at = snapshot.context.updatedAt + 1000;
    actor.send({ type: 'gate.approved', stepId: 'b', by: 'ana', at });
    expect(stepsOf(actor)['b']).toEqual(['READY', 1]);
    expect(actor.getSnapshot().value).toBe('running');
    actor.send({ type: 'step.started', stepId: 'b', attempt: 1, at: at + 1 });
    actor.send({ type: 'step.succeeded', stepId: 'b', attempt: 1, output: 'b', at: at + 2 });
    expect(stepsOf(actor)['join']).toEqual(['READY', 1]);
    actor.send({ type: 'step.succeeded', stepId: 'join', attempt: 1, output: 'j', at: at + 3 });

    expect(actor.getSnapshot().value).toBe('succeeded');
    expect(actor.getSnapshot().status).toBe('done');
    expect(stepsOf(actor)).toEqual({
      root: ['SUCCEEDED', 1],
      a: ['SUCCEEDED', 2],
      b: ['SUCCEEDED', 1],
      join: ['SUCCEEDED', 1],
    });

    // The actor's own persisted snapshot restores as well, and says the same.
    const again = createActor(runMachine, {
      snapshot: JSON.parse(JSON.stringify(actor.getPersistedSnapshot())) as typeof snapshot,
    });
    expect(again.getSnapshot().value).toBe('succeeded');
    expect(stepsOf(again)).toEqual(stepsOf(actor));

    // Nothing of this went back to Redis: the stored run still waits.
    expect((await rt.status(handle.runId)).status).toBe('waiting');
  });

  it('a run no worker touched restores with its first step ready', async () => {
    const handle = await rt.start(plan, null, { runId: 'untouched' });
    const actor = createActor(runMachine, { snapshot: await rt.snapshot(handle.runId) }).start();
    expect(actor.getSnapshot().context.runId).toBe('untouched');
    expect(stepsOf(actor)).toEqual({
      root: ['READY', 1],
      a: ['PENDING', 0],
      b: ['PENDING', 0],
      join: ['PENDING', 0],
    });
  });

  it('a bad or unknown run id is refused, naming the field', async () => {
    await expect(rt.snapshot('')).rejects.toBeInstanceOf(InputValidationError);
    await expect(rt.snapshot('')).rejects.toThrow(/runId/);
    await expect(rt.snapshot('no-such-run')).rejects.toBeInstanceOf(RunNotFoundError);
  });
});
