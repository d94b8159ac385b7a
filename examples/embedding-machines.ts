import { createActor, type Actor } from 'xstate';
import {
  createRuntime,
  runMachine,
  type PlanInput,
  type PlannedAction,
  type RunSnapshot,
} from '../src/index.js';
import { ensureEmbeddedRedis } from '../src/testing/index.js';

const plan: PlanInput = {
  name: 'digest',
  steps: [
    { id: 'fetch', kind: 'operator', operator: 'fetch' },
    { id: 'summarize', kind: 'operator', operator: 'summarize', dependsOn: ['fetch'] },
    { id: 'review', kind: 'human_gate', dependsOn: ['fetch'] },
    { id: 'send', kind: 'operator', operator: 'send', dependsOn: ['summarize', 'review'] },
  ],
};

// What must happen outside (run a step, schedule a retry, ask a person) is the `plan` action.
const planned: PlannedAction[] = [];
const machine = runMachine.provide({
  actions: { plan: (_, action: PlannedAction) => void planned.push(action) },
});

// Each step is a child actor under its step id.
const steps = (run: Actor<typeof runMachine>) =>
  Object.fromEntries(
    Object.entries(run.getSnapshot().children).map(([id, step]) => [id, step?.getSnapshot().value]),
  );

// A plan run in memory: no Redis, no worker; you send the facts.
const run = createActor(machine, { input: plan }).start();
run.send({ type: 'step.succeeded', stepId: 'fetch', attempt: 1, output: ['a', 'b'], at: 1 });
console.log(steps(run)); // { fetch: 'SUCCEEDED', summarize: 'READY', review: 'WAITING_APPROVAL', send: 'PENDING' }
run.send({
  type: 'step.failed',
  stepId: 'summarize',
  attempt: 1,
  error: { name: 'TimeoutError', code: 'timeout', message: 'slow model', retryable: true },
  jitterSeed: 7,
  at: 2,
});
console.log(planned.at(-1)); // { type: 'step.scheduleRetry', stepId: 'summarize', attempt: 2, … }
run.send({ type: 'retry.due', stepId: 'summarize', attempt: 2, at: 1002 });
run.send({ type: 'step.succeeded', stepId: 'summarize', attempt: 2, output: 'ab', at: 1003 });
run.send({ type: 'gate.approved', stepId: 'review', by: 'ana', at: 1004 });
run.send({ type: 'step.succeeded', stepId: 'review', attempt: 1, output: null, at: 1005 });
console.log(steps(run)['send']); // READY

// A persisted snapshot is plain JSON, and restores with every step.
const saved = JSON.stringify(run.getPersistedSnapshot());
const again = createActor(machine, { snapshot: JSON.parse(saved) as RunSnapshot }).start();
again.send({ type: 'step.succeeded', stepId: 'send', attempt: 1, output: null, at: 1006 });
console.log(again.getSnapshot().value, steps(again)['send']); // succeeded SUCCEEDED

// A run the runtime stored in Redis restores the same way.
const url = process.env.REDIS_URL ?? (await ensureEmbeddedRedis()).url;
const runtime = createRuntime({ redis: url, prefix: 'embedding-example' });
const started = await runtime.start(plan);
const stored = createActor(runMachine, { snapshot: await runtime.snapshot(started.runId) });
console.log(steps(stored.start())); // { fetch: 'READY', summarize: 'PENDING', review: 'PENDING', send: 'PENDING' }
await runtime.close();
