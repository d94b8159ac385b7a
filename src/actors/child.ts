/**
 * The life of a run step: a child run of a registered plan, started by the step and awaited
 * without holding a worker. The child is a run of its own (its own keys, its own hash tag): no
 * script and no transaction touches the parent and the child together.
 *
 * 1. Start (the step's own job, handed over by `runStepUnit` once admitted): the child's id is
 *    derived from the parent's run id, the step and the attempt (`childRunId`), so the start run
 *    again after a crash finds the child it created instead of creating a second one. The child
 *    is created (its meta names its parent) and queued, the parent's meta records it
 *    (`child:<step>:<attempt>`), and the step commits `wait.started` naming the child (READY →
 *    WAITING). A child that has already ended by then (a start run again late) is taken at once.
 * 2. End: when the child ends (succeeded, failed, cancelled), its end path (the queues' end hook,
 *    `runEnded`) adds the parent's wake job (`childWakeJob`: one id per attempt) before the child
 *    leaves the active runs, so a crash in between is healed by the child's next sweep. Any guard
 *    or sweep of the parent that finds a WAITING step whose child ended adds the same job too.
 * 3. Wake (that job): the step must still wait for this child (WAITING, or READY when the child
 *    ended before the step committed its wait). The child's result becomes the step's output; a
 *    child that failed or was cancelled fails the step with `child_failed` and the child's
 *    summary, and the step's retry policy decides (a retry is a new attempt: a new child).
 *
 * A cancel or budget stop of the parent cancels its children still going (the end hook again),
 * unless the step says `onParentCancel: 'abandon'` (the children of a map's `run` items are
 * always cancelled). A child's usage counts against its
 * ancestors' run budgets (see `child-budgets.ts`).
 */
import { createHash } from 'node:crypto';
import { ChildFailedError, FlujoError, type SerializedError } from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import { runStatus, runSteps, type RunSnapshot, type StepState } from '../machines/kernel.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import { RUN_ID_MAX_LENGTH } from '../persistence/keys.js';
import { writeMetaField } from '../persistence/run-lookups.js';
import type { Plan, RunStep } from '../plan/schema.js';
import type { RunEvent } from '../schemas/events.js';
import type { RuntimeCore } from './core.js';
import { treeBudgetOver } from './child-budgets.js';
import { childWakeJob, itemWakeJob, type JobData } from './jobs.js';
import { childField, childrenOf, parentFields, type RunMeta } from './runtime-meta.js';
import {
  failed,
  notifyFailures,
  outputsOf,
  stopForBudget,
  type Admitted,
  type UnitHost,
} from './unit.js';
import { planStep } from '../plan/graph.js';

/** How many lost races a run step's unit absorbs (each reloads the run and decides again). */
const MAX_TRIES = 50;

/**
 * The id of the child run that attempt `attempt` of run step `stepId` of run `runId` starts:
 * `<runId>:<stepId>:<attempt>` (shortened with a hash when longer than a run id may be). The same
 * for every worker and every try, so a crash never starts a second child for one attempt.
 */
export function childRunId(runId: string, stepId: string, attempt: number): string {
  return fitRunId(`${runId}:${stepId}:${attempt}`);
}

/**
 * The id of the child run that attempt `itemAttempt` of item `index` of attempt `attempt` of map
 * step `stepId` starts: `<runId>:<stepId>.<index>:<attempt>.<itemAttempt>` (shortened as
 * {@link childRunId} does). The same for every worker and every try.
 */
export function itemChildRunId(
  runId: string,
  stepId: string,
  attempt: number,
  index: number,
  itemAttempt: number,
): string {
  return fitRunId(`${runId}:${stepId}.${index}:${attempt}.${itemAttempt}`);
}

/** `id`, or when longer than a run id may be, its head and a hash of the whole. */
function fitRunId(id: string): string {
  if (id.length <= RUN_ID_MAX_LENGTH) return id;
  const hash = createHash('sha256').update(id).digest('hex').slice(0, 32);
  return `${id.slice(0, RUN_ID_MAX_LENGTH - 40)}~${hash}`;
}

/** What a run step's child is given: the step's `input`, else its dependencies' outputs, else the run's input. */
async function childInput(
  core: RuntimeCore,
  admitted: Admitted,
  runId: string,
): Promise<JsonValue> {
  const { step, env, meta } = admitted;
  if (step.input !== undefined) return step.input;
  if (step.dependsOn.length === 0) return meta.input;
  return outputsOf(core, runId, env, step.dependsOn);
}

/**
 * A run step's own job: starts (or finds) the child of its attempt, then commits the step waiting
 * for it, or takes its end at once when it has ended already.
 */
export async function runChildUnit(
  host: UnitHost,
  data: JobData,
  admitted: Admitted,
): Promise<string> {
  const { core } = host;
  const { runId } = data;
  const step = admitted.step as RunStep;
  const attempt = data.attempt!;
  const childId = childRunId(runId, step.id, attempt);
  const plan = core.registry.plans.get(step.plan);
  const refused = (error: SerializedError) => commitRefusal(host, data, admitted, error);
  if (plan === undefined) {
    const registered = [...core.registry.plans.keys()].join(', ') || '(none)';
    const error = new ChildFailedError(
      step.id,
      childId,
      'failed',
      `no plan "${step.plan}" is registered in this worker (register it with runtime.plan("${step.plan}", plan), or plans in the job module; registered: ${registered})`,
    );
    return refused({ ...error.toJSON(), retryable: false });
  }
  if (host.startRun === undefined) {
    throw new Error('this unit host cannot start child runs (created without startRun)');
  }
  try {
    await host.startRun(
      plan,
      await childInput(core, admitted, runId),
      { runId: childId, tenantId: admitted.meta.tenantId, queue: admitted.meta.queue },
      parentFields({ runId, stepId: step.id, attempt }),
    );
  } catch (error) {
    // A child that can never start (its plan names an unknown plan, its id is taken by another
    // run, its input is refused): the step fails for good. Trouble with Redis is thrown: the job
    // runs again and finds the child it may have created.
    if (error instanceof FlujoError && !error.retryable) return refused(error.toJSON());
    throw error;
  }
  await recordChild(core, runId, step.id, attempt, childId);
  debugPoint(DebugPoint.afterChildStart, step.id);
  return settleChild(host, data, admitted.env);
}

/**
 * Records child `childId` in its parent's meta (`child:<step>:<attempt>`, one HSET on the parent's
 * own key): after the child exists, and again before each commit about it, so that a start that
 * died before its record and whose child's end was taken by a wake still leaves the record.
 */
async function recordChild(
  core: RuntimeCore,
  runId: string,
  stepId: string,
  attempt: number,
  childId: string,
): Promise<void> {
  await writeMetaField(core.redis, core.stores.keys, runId, childField(stepId, attempt), childId);
}

/** A child that could not start: the step's attempt fails with `error`. */
async function commitRefusal(
  host: UnitHost,
  data: JobData,
  admitted: Admitted,
  error: SerializedError,
): Promise<string> {
  const { core } = host;
  const events = [failed(host, data.stepId!, data.attempt!, error)];
  const applied = await core.host.apply(data.runId, events, admitted.env);
  notifyFailures(host, data.runId, events, applied);
  await core.queues.enqueuePlanned(data.runId, applied);
  return 'failed';
}

/** A `wake` job of a run step: its child ended (or a sweep thinks so). */
export async function runChildWake(host: UnitHost, data: JobData): Promise<string> {
  return settleChild(host, data, await host.core.host.load(data.runId));
}

/** The run step's state in `env` when it still waits for the child of the job's attempt. */
function awaitingState(env: SnapshotEnvelope<RunSnapshot>, data: JobData): StepState | null {
  const child = env.snapshot.children[data.stepId!]?.snapshot;
  if (env.snapshot.status !== 'active' || child === undefined) return null;
  if (child.value !== 'READY' && child.value !== 'WAITING') return null;
  if (child.context.attempt !== data.attempt) return null;
  return { ...child.context, status: child.value };
}

/**
 * The result of a child run that succeeded: the outputs of its last steps (those no other step
 * depends on), by step id (`null` for one that was skipped).
 */
export function childResult(plan: Plan, snapshot: RunSnapshot): JsonValue {
  const depended = new Set(plan.steps.flatMap((s) => s.dependsOn));
  const out: Record<string, JsonValue> = {};
  for (const s of runSteps(snapshot)) {
    if (!depended.has(s.stepId)) out[s.stepId] = s.output ?? null;
  }
  return out;
}

/** A child's own account of why it did not succeed, in one line. */
export function childSummary(snapshot: RunSnapshot): string {
  const ctx = snapshot.context;
  if (ctx.stop !== null) return `stopped (${ctx.stop.reason}: ${JSON.stringify(ctx.stop.detail)})`;
  if (ctx.cancel !== null) {
    return `cancelled${ctx.cancel.reason === null ? '' : ` (${String(ctx.cancel.reason)})`}`;
  }
  const failedStep = runSteps(snapshot).find((s) => s.status === 'FAILED_FINAL');
  if (failedStep === undefined) return 'failed';
  const error = failedStep.error;
  return `step "${failedStep.stepId}" failed (${error?.code ?? failedStep.reason ?? 'failed'}): ${error?.message ?? ''}`;
}

/** The events that take a child's end into its parent's step, or null while the child goes on. */
async function endEvents(
  host: UnitHost,
  data: JobData,
  childId: string,
): Promise<RunEvent[] | null> {
  const { core } = host;
  const child = await core.stores.store.tryLoad(childId);
  if (child === null) return null;
  const status = runStatus(child.snapshot);
  const stepId = data.stepId!;
  const attempt = data.attempt!;
  if (status === 'succeeded') {
    const childMeta = await core.meta.read(childId);
    const output = childResult(childMeta.plan, child.snapshot);
    return [{ type: 'step.succeeded', stepId, attempt, output, at: core.clock() }];
  }
  if (status !== 'failed' && status !== 'cancelled') return null;
  const error = new ChildFailedError(stepId, childId, status, childSummary(child.snapshot));
  return [failed(host, stepId, attempt, error.toJSON())];
}

/**
 * Decides and commits against the parent as loaded: the child's end when it ended, else (for a
 * READY step) the wait for it. A lost race reloads and decides again; a step that no longer waits
 * for this child (cancelled, skipped, moved on) gets nothing, and a child it started for nothing is
 * cancelled.
 */
async function settleChild(
  host: UnitHost,
  data: JobData,
  loaded: SnapshotEnvelope<RunSnapshot>,
): Promise<string> {
  const { core } = host;
  const { runId } = data;
  const stepId = data.stepId!;
  const childId = childRunId(runId, stepId, data.attempt!);
  let env = loaded;
  for (let tries = 0; tries < MAX_TRIES; tries++) {
    if (tries > 0) env = await core.host.load(runId);
    const state = awaitingState(env, data);
    const meta = await core.meta.read(runId);
    if (state === null) {
      await cancelOrphan(core, runId, meta, env.snapshot, stepId);
      await core.queues.enqueueDue(runId, env);
      return 'already-done';
    }
    const ended = await endEvents(host, data, childId);
    if (ended === null && state.status === 'WAITING') return 'waiting';
    if (ended !== null) {
      const over = await treeBudgetOver(core, runId, meta);
      if (over !== null) {
        await stopForBudget(host, over.runId, await core.host.load(over.runId), over.detail);
        return 'budget';
      }
    }
    const events: RunEvent[] = ended ?? [
      { type: 'wait.started', stepId, attempt: data.attempt!, child: childId, at: core.clock() },
    ];
    if (tries === 0) await recordChild(core, runId, stepId, data.attempt!, childId);
    if (ended !== null) debugPoint(DebugPoint.beforeCommit, stepId);
    const applied = await core.host.apply(runId, events, env);
    if (!applied.committed) continue;
    if (ended === null) {
      debugPoint(DebugPoint.afterChildWait, stepId);
      await core.queues.enqueuePlanned(runId, applied);
      return 'waiting';
    }
    notifyFailures(host, runId, events, applied);
    debugPoint(DebugPoint.afterCommit, stepId);
    await core.queues.enqueuePlanned(runId, applied);
    return events.some((e) => e.type === 'step.failed') ? 'failed' : 'succeeded';
  }
  throw new Error(
    `run step "${stepId}" of run ${runId}: ${MAX_TRIES} commits in a row lost their race; trying again`,
  );
}

/**
 * A step that no longer waits for its child (the run was cancelled or stopped, the step skipped)
 * while the child may still go on: the child is cancelled, unless the step abandons it.
 */
async function cancelOrphan(
  core: RuntimeCore,
  runId: string,
  meta: RunMeta,
  snapshot: RunSnapshot,
  stepId: string,
): Promise<void> {
  const step = planStep(meta.plan, stepId);
  const state = snapshot.children[stepId]?.snapshot;
  if (step?.kind !== 'run' || step.onParentCancel === 'abandon' || state === undefined) return;
  if (state.value !== 'CANCELLED' && state.value !== 'SKIPPED') return;
  await cancelChild(core, runId, childRunId(runId, stepId, state.context.attempt));
}

/** Cancels child run `childId` of run `runId` if it exists and has not ended. */
async function cancelChild(core: RuntimeCore, runId: string, childId: string): Promise<void> {
  const env = await core.stores.store.tryLoad(childId, { outputs: false });
  if (env === null || env.snapshot.status !== 'active' || env.snapshot.value === 'failed') return;
  const applied = await core.host.apply(
    childId,
    {
      type: 'run.cancelled',
      by: 'flujo',
      reason: `its parent run "${runId}" ended`,
      at: core.clock(),
    },
    env,
  );
  if (!applied.committed) return;
  await core.queues.publishAborts(childId, applied.transition.planned);
  await core.queues.removeTimers(childId, applied.transition.changes);
  if (applied.transition.status === 'cancelled') {
    await core.stores.runs.ended(childId, 'cancelled', applied.envelope.updatedAt);
  }
  // Its own end cancels its children in turn (see runEnded).
  await core.queues.enqueueDue(childId, applied.envelope);
}

/**
 * The end hook of every run (called by the queues each time they find a run ended, before it
 * leaves the active runs): a child run wakes its parent's step; a parent that was cancelled or
 * stopped cancels its children still going (but those its steps abandon).
 */
export async function runEnded(
  core: RuntimeCore,
  runId: string,
  snapshot: RunSnapshot,
): Promise<void> {
  const meta = await core.meta.read(runId);
  if (meta.parent !== null) {
    debugPoint(DebugPoint.afterChildEnd);
    const { runId: parentId, stepId, attempt, itemAttempt } = meta.parent;
    await core.queues.add([
      itemAttempt === undefined
        ? childWakeJob(parentId, stepId, attempt)
        : itemWakeJob(parentId, stepId, attempt, itemAttempt),
    ]);
  }
  const status = runStatus(snapshot);
  if (status !== 'cancelled' && status !== 'failed') return;
  for (const step of meta.plan.steps) {
    await cancelOrphan(core, runId, meta, snapshot, step.id);
  }
  await cancelItemChildren(core, runId, meta);
}

/** Cancels the children of the `run` items of a run's map steps that are still going. */
async function cancelItemChildren(core: RuntimeCore, runId: string, meta: RunMeta): Promise<void> {
  const maps = meta.plan.steps.filter((s) => s.kind === 'map' && s.item.kind === 'run');
  if (maps.length === 0) return;
  const items = new Set(maps.map((s) => `${s.id}.`));
  for (const child of childrenOf(await core.stores.store.loadMeta(runId))) {
    const at = child.stepId.lastIndexOf('.');
    if (at > 0 && items.has(child.stepId.slice(0, at + 1))) {
      await cancelChild(core, runId, child.runId);
    }
  }
}
