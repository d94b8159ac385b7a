/**
 * The life of a wait step, as units of work. A wait step runs no code: it waits for a signal sent
 * to its run, or for a time, and no worker holds it while it waits.
 *
 * 1. Start (the step's own job, handed over by `runStepUnit` once admitted): a signal wait takes
 *    the first signal of its name the run has not taken yet, if one is in the inbox; a timer whose
 *    time has come fires. Otherwise the unit commits `wait.started` (READY → WAITING) with the due
 *    time computed once (a timer's, or a signal wait's `timeoutMs` from now), and the commit plans
 *    the timer's delayed job. A signal sent while the unit looked (its sender saw the step READY
 *    and woke nothing) is found by reading the inbox again after the commit.
 * 2. Wake (a `wake` job: a sender's, a sweep's, or the timer's): the step must still wait in this
 *    attempt. A signal to take is taken (`signal.taken` and `step.succeeded` with its payload, in
 *    one commit: the run's cursor of that name moves with the step, so a crash never takes a
 *    signal twice or loses one); a timer that is due fires (`step.succeeded` with `{ firedAt }`);
 *    a signal wait past its due time fails final (`wait_timeout`).
 *
 * A conversation step (a granular agent step with `conversation: true`) waits in WAITING too,
 * between its turns; its wake commits `wait.woken` (WAITING → READY) when a message or an `end`
 * signal is there to take, and the next turn takes it (see `turn.ts`).
 *
 * Every commit is compare-and-set like any unit's: a lost race reloads and decides again, and a
 * duplicate wake finds the step done. A commit that ends a wait removes its timer job.
 */
import { WaitTimeoutError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import type { RunSnapshot, StepState } from '../machines/kernel.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import type { AgentStep, WaitStep } from '../plan/schema.js';
import { END } from '../execution/conversation.js';
import type { RunEvent } from '../schemas/events.js';
import type { JobData } from './jobs.js';
import { failed, type Admitted, type UnitHost } from './unit.js';
import { runChildWake } from './child.js';
import { planStep } from '../plan/graph.js';

/** What a wait decided: events to commit, nothing to do yet, or a timer woken early. */
type WaitDecision = { events: RunEvent[] } | { idle: true } | { laterMs: number };

/** How many lost races a wait absorbs (each reloads the run and decides again). */
const MAX_TRIES = 50;

/** A wait step's own job: it takes its signal or fires at once, or starts waiting. */
export async function runWaitUnit(
  host: UnitHost,
  data: JobData,
  admitted: Admitted,
): Promise<string> {
  const settled = await settleWait(host, data, admitted.env, 'READY');
  return typeof settled === 'string' ? settled : 'waiting';
}

/**
 * A `wake` job: a signal arrived for a waiting step, or its time came. Returns how it ended, or
 * how long until a timer woken early is due (the caller puts the job back that long).
 */
export async function runWakeUnit(
  host: UnitHost,
  data: JobData,
): Promise<string | { retryAfterMs: number }> {
  const step = planStep((await host.core.meta.read(data.runId)).plan, data.stepId);
  // A run step's child ended: child.ts takes its end.
  if (step?.kind === 'run') return runChildWake(host, data);
  return settleWait(host, data, await host.core.host.load(data.runId), 'WAITING');
}

/** The wait step's state in `env`, when it is still `expected` in the job's attempt. */
function waitingState(
  env: SnapshotEnvelope<RunSnapshot>,
  data: JobData,
  expected: 'READY' | 'WAITING',
): StepState | null {
  const child = env.snapshot.children[data.stepId!]?.snapshot;
  if (env.snapshot.status !== 'active' || child === undefined) return null;
  if (child.value !== expected || child.context.attempt !== data.attempt) return null;
  return { ...child.context, status: child.value };
}

/**
 * Decides and commits, against the run as loaded; a lost race (the run moved: another wait took
 * the signal, a cancel) reloads and decides again.
 */
async function settleWait(
  host: UnitHost,
  data: JobData,
  loaded: SnapshotEnvelope<RunSnapshot>,
  expected: 'READY' | 'WAITING',
): Promise<string | { retryAfterMs: number }> {
  const { core } = host;
  const { runId } = data;
  let env = loaded;
  for (let tries = 0; tries < MAX_TRIES; tries++) {
    if (tries > 0) env = await core.host.load(runId);
    const state = waitingState(env, data, expected);
    if (state === null) {
      await core.queues.enqueueDue(runId, env);
      return 'already-done';
    }
    const meta = await core.meta.read(runId);
    const step = planStep(meta.plan, data.stepId);
    const talks = step?.kind === 'agent' && step.conversation === true;
    if (step?.kind !== 'wait' && !talks) return 'not-a-wait';
    const decision =
      step.kind === 'wait'
        ? await decide(host, runId, step, state, env)
        : await wakeConversation(host, runId, step, state, env);
    if ('idle' in decision) return 'waiting';
    if ('laterMs' in decision) return { retryAfterMs: decision.laterMs };
    const applied = await core.host.apply(runId, decision.events, env);
    if (!applied.committed) continue;
    await core.queues.removeTimers(runId, applied.transition.changes);
    await core.queues.enqueuePlanned(runId, applied);
    if (step.kind !== 'wait') return 'woken';
    const started = decision.events[0]?.type === 'wait.started';
    if (started && step.for.signal !== undefined) {
      const wakes = await core.queues.signalWakes(runId, applied.envelope.snapshot);
      if (wakes.length > 0) await core.queues.add(wakes);
    }
    return started
      ? 'waiting'
      : decision.events.some((e) => e.type === 'step.failed')
        ? 'failed'
        : 'succeeded';
  }
  // The job fails and BullMQ tries it again (its id stays taken meanwhile: no other wake-up of
  // this signal would be queued).
  throw new Error(
    `wait step "${data.stepId}" of run ${runId}: ${MAX_TRIES} commits in a row lost their race; trying again`,
  );
}

/** When a timer is due: its `until`, or its duration from `now` (the time it starts waiting). */
function timerDueAt(step: WaitStep, now: number): number {
  return step.for.until !== undefined ? Date.parse(step.for.until) : now + step.for.durationMs!;
}

/** What the wait does now, from the step as loaded and the run's inbox. */
async function decide(
  host: UnitHost,
  runId: string,
  step: WaitStep,
  state: StepState,
  env: SnapshotEnvelope<RunSnapshot>,
): Promise<WaitDecision> {
  const { core } = host;
  const now = core.clock();
  const { stepId, attempt } = state;
  const ready = state.status === 'READY';
  const name = step.for.signal;
  if (name !== undefined) {
    const index = env.snapshot.context.taken?.[name] ?? 0;
    const signal = await core.stores.inbox.read(runId, name, index);
    if (signal !== null) {
      const taken: RunEvent = {
        type: 'signal.taken',
        stepId,
        attempt,
        name,
        index,
        seq: signal.seq,
        ...(signal.id === null ? {} : { id: signal.id }),
        at: now,
      };
      const output = (signal.payload ?? null) as JsonValue;
      return { events: [taken, { type: 'step.succeeded', stepId, attempt, output, at: now }] };
    }
    if (ready) {
      const dueAt = step.timeoutMs === undefined ? {} : { dueAt: now + step.timeoutMs };
      return {
        events: [{ type: 'wait.started', stepId, attempt, signal: name, ...dueAt, at: now }],
      };
    }
    const dueAt = state.wait?.dueAt ?? null;
    if (dueAt === null) return { idle: true };
    if (now < dueAt) return { laterMs: dueAt - now };
    const error = new WaitTimeoutError(
      stepId,
      name,
      step.timeoutMs ?? dueAt - (state.wait?.since ?? dueAt),
    );
    return { events: [failed(host, stepId, attempt, error.toJSON())] };
  }
  const dueAt = ready ? timerDueAt(step, now) : (state.wait?.dueAt ?? now);
  if (now >= dueAt) {
    const output = { firedAt: new Date(now).toISOString(), dueAt: new Date(dueAt).toISOString() };
    return { events: [{ type: 'step.succeeded', stepId, attempt, output, at: now }] };
  }
  if (ready) return { events: [{ type: 'wait.started', stepId, attempt, dueAt, at: now }] };
  return { laterMs: dueAt - now };
}

/**
 * A conversation step waiting for its next message: woken (WAITING → READY, its next turn due)
 * when a message of its inbox or an `end` signal is there to take. The turn takes it.
 */
async function wakeConversation(
  host: UnitHost,
  runId: string,
  step: AgentStep,
  state: StepState,
  env: SnapshotEnvelope<RunSnapshot>,
): Promise<WaitDecision> {
  const { inbox } = host.core.stores;
  const taken = env.snapshot.context.taken;
  const names = [step.inbox!, END];
  for (const name of names) {
    if ((await inbox.read(runId, name, taken?.[name] ?? 0)) === null) continue;
    const { stepId, attempt } = state;
    return { events: [{ type: 'wait.woken', stepId, attempt, at: host.core.clock() }] };
  }
  return { idle: true };
}
