import { assign, enqueueActions, sendTo, setup, type AnyActorRef } from 'xstate';
import { InvariantError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import { parsePlan } from '../plan/parse-plan.js';
import type { Plan, PlanInput } from '../plan/schema.js';
import { stepNeedsApproval } from '../plan/schema.js';
import { CONDITION_FALSE } from '../plan/condition.js';
import type { RunEvent } from '../schemas/events.js';
import { viewsCopy, viewsStatus, withView } from './step-views.js';
import { stepMachine, type StepEvent, type StepInput } from './step-machine.js';
import {
  StepReason,
  isFinalStepStatus,
  type PlannedAction,
  type RunStatus,
  type StepContext,
  type StepReportedEvent,
  type StepView,
} from './types.js';

/** Input of a run machine. */
export interface RunInput {
  runId: string;
  plan: Plan;
  /** Creation time (epoch ms). */
  at: number;
}

/**
 * What `createActor(runMachine, { input })` takes: a {@link RunInput}, or a plan alone (parsed, or
 * a plain plan object, which is parsed with `parsePlan`: a bad plan throws its
 * `PlanValidationError`). A plan alone runs with `runId` = the plan's name, created at time 0.
 */
export type RunMachineInput = RunInput | Plan | PlanInput;

/** Who cancelled the run, when and why. */
export interface CancelRequest {
  by: string | null;
  reason: string | null;
  at: number;
}

/** Why the runtime stopped the run (a budget), and when. */
export interface StopRequest {
  reason: string;
  detail: JsonValue | null;
  at: number;
}

/** The context of a run machine: plain JSON. The full plan is stored beside the run, not here. */
export interface RunContext {
  runId: string;
  planName: string;
  /** Step ids in plan order. */
  order: string[];
  dependsOn: Record<string, string[]>;
  /** The run's view of each step, kept current by the steps' reports. */
  steps: Record<string, StepView>;
  cancel: CancelRequest | null;
  /** Set when the runtime stopped the run; cleared when the run is resumed. */
  stop: StopRequest | null;
  /** How many times the run was resumed after failing. */
  resumes: number;
  /**
   * Signals taken by the run's wait steps, per signal name: the next wait for `name` takes the
   * signal of that name with this index (0-based, in send order). Absent: none taken yet.
   */
  taken?: Record<string, number>;
  /**
   * Steps the run has ordered cancelled (run cancel, failed dependency) whose own report has not
   * arrived yet, so that no second order is sent to them meanwhile.
   */
  cancelOrdered: string[];
  createdAt: number;
  updatedAt: number;
}

/** A step's report to its run: the event its step actor sends its parent on entering a state. */
export type { StepReportedEvent } from './types.js';

/** A message from the run to one of its step actors. */
export interface StepMessage {
  stepId: string;
  event: StepEvent;
}

// The run input each machine input stands for, computed once per input object: the context
// factory and the entry actions (which spawn the steps) both read it.
const resolvedInputs = new WeakMap<object, RunInput>();

/**
 * The {@link RunInput} a run machine input stands for: a `{ runId, plan, at }` as it is, a plan
 * alone parsed with `parsePlan` (throws `PlanValidationError`) and run as `runId` = its name at 0.
 */
export function runInputOf(input: RunMachineInput | undefined): RunInput {
  // No input at all, null or JSON text: `parsePlan` says what is wrong, or parses it.
  if (typeof input !== 'object' || input === null) {
    const plan = parsePlan(input);
    return { runId: plan.name, plan, at: 0 };
  }
  const known = resolvedInputs.get(input);
  if (known !== undefined) return known;
  let resolved: RunInput;
  if ('plan' in input && 'runId' in input) {
    resolved = input;
  } else {
    const plan = parsePlan(input);
    resolved = { runId: plan.name, plan, at: 0 };
  }
  resolvedInputs.set(input, resolved);
  return resolved;
}

/** The run's status, derived from its context (see `deriveRunStatus`; read off a tally here). */
export function statusOf(context: RunContext): RunStatus {
  return viewsStatus(context, context.cancel !== null, context.stop !== null);
}

/** Orders every open step cancelled with `reason`, once; returns the ids ordered. */
function cancelOpenSteps(
  context: RunContext,
  reason: string,
  at: number,
  send: (id: string, event: StepEvent) => void,
): string[] {
  const ordered: string[] = [];
  for (const id of context.order) {
    const view = context.steps[id];
    if (view === undefined || isFinalStepStatus(view.status)) continue;
    if (context.cancelOrdered.includes(id)) continue;
    ordered.push(id);
    send(id, { type: 'step.cancel', reason, at });
  }
  return ordered;
}

// The steps that depend directly on each step, in plan order, computed once per dependency map.
const dependents = new WeakMap<RunContext['dependsOn'], Map<string, string[]>>();

/** The steps that depend directly on `stepId`, in plan order. */
function dependentsOf(context: RunContext, stepId: string): readonly string[] {
  let map = dependents.get(context.dependsOn);
  if (map === undefined) {
    map = new Map();
    for (const id of context.order) {
      for (const d of context.dependsOn[id] ?? []) {
        const list = map.get(d);
        if (list === undefined) map.set(d, [id]);
        else if (list[list.length - 1] !== id) list.push(id);
      }
    }
    dependents.set(context.dependsOn, map);
  }
  return map.get(stepId) ?? [];
}

const satisfied = (view: StepView | undefined): boolean =>
  view !== undefined && (view.status === 'SUCCEEDED' || view.status === 'SKIPPED');

/** The context of the step actor `stepId` of a run, read to reopen the step. */
function endedStepContext(actor: AnyActorRef | undefined, stepId: string): StepContext {
  const snapshot: unknown = actor?.getSnapshot();
  const context =
    typeof snapshot === 'object' && snapshot !== null && 'context' in snapshot
      ? snapshot.context
      : undefined;
  if (
    typeof context !== 'object' ||
    context === null ||
    !('stepId' in context) ||
    context.stepId !== stepId
  ) {
    throw new InvariantError(`run has no actor for step "${stepId}"`);
  }
  return context as StepContext;
}

/**
 * The steps a skip of the ended step `skippedId` reopens: its dependents that were CANCELLED
 * because something upstream failed (reason `upstream_failed`), transitively, as long as each of
 * their dependencies is then SUCCEEDED, SKIPPED, still open, or reopened too. A dependent cancelled
 * otherwise (a run cancel, a budget stop), or with another dependency that failed, stays as it is.
 * `contextOf` reads a step actor's context (it throws when the run holds no actor for the step).
 */
export function reopenedBySkip(
  context: RunContext,
  skippedId: string,
  contextOf: (stepId: string) => StepContext,
): string[] {
  const reopened = new Set<string>([skippedId]);
  const reasons = new Map<string, string | null>();
  const reasonOf = (id: string): string | null => {
    if (!reasons.has(id)) reasons.set(id, contextOf(id).reason);
    return reasons.get(id) ?? null;
  };
  // Plan order need not follow the dependencies: go round until nothing more reopens.
  for (let grew = true; grew;) {
    grew = false;
    for (const id of context.order) {
      if (reopened.has(id) || context.steps[id]?.status !== 'CANCELLED') continue;
      const deps = context.dependsOn[id] ?? [];
      if (!deps.some((d) => reopened.has(d))) continue;
      const clear = deps.every((d) => {
        const view = context.steps[d];
        return (
          reopened.has(d) ||
          satisfied(view) ||
          (view !== undefined && !isFinalStepStatus(view.status))
        );
      });
      if (!clear || reasonOf(id) !== StepReason.upstreamFailed) continue;
      reopened.add(id);
      grew = true;
    }
  }
  reopened.delete(skippedId);
  return context.order.filter((id) => reopened.has(id));
}

/** The reason the ended step actor `stepId` of `run` ended with (null when it has none). */
function endedReason(run: AnyActorRef, stepId: string): string | null {
  const children = (run.getSnapshot() as { children?: Record<string, AnyActorRef | undefined> })
    .children;
  const snapshot: unknown = children?.[stepId]?.getSnapshot();
  if (typeof snapshot !== 'object' || snapshot === null || !('context' in snapshot)) {
    // A run restored without this step (see the kernel): it is restored whole and asked again.
    throw new InvariantError(`run has no actor for step "${stepId}"`);
  }
  const context = snapshot.context as Partial<StepContext> | undefined;
  return context?.reason ?? null;
}

/**
 * What the step `stepId`, whose dependencies are all done, is told: it is skipped too, with reason
 * `condition_false`, when each of them was skipped by a false condition (a branch not taken stays
 * not taken); else its dependencies are met. `run` is the run's actor, whose step actors hold why
 * they ended.
 */
export function readyOrSkipped(
  context: RunContext,
  run: AnyActorRef,
  stepId: string,
  at: number,
): StepEvent {
  const deps = context.dependsOn[stepId] ?? [];
  const untaken =
    deps.length > 0 &&
    deps.every(
      (d) => context.steps[d]?.status === 'SKIPPED' && endedReason(run, d) === CONDITION_FALSE,
    );
  return untaken
    ? { type: 'step.skipped', stepId, reason: CONDITION_FALSE, at }
    : { type: 'deps.met', at };
}

/** The input of a fresh step actor for a step reopened by a resume: its attempts go on. */
export function reopenInput(old: StepContext, at: number): StepInput {
  return {
    stepId: old.stepId,
    needsApproval: old.needsApproval,
    granular: old.granular,
    // A reopened step starts from its primary again.
    fallback: (old.fallback ?? null) !== null,
    retry: old.retry,
    at,
    attempt: old.attempt,
    agent: old.agent,
  };
}

/** A run's context as it is created, before its steps report. */
export function initialRunContext({ runId, plan, at }: RunInput): RunContext {
  return {
    runId,
    planName: plan.name,
    order: plan.steps.map((s) => s.id),
    dependsOn: Object.fromEntries(plan.steps.map((s) => [s.id, [...s.dependsOn]])),
    steps: Object.fromEntries(
      plan.steps.map((s) => [s.id, { status: 'PENDING' as const, attempt: 0 }]),
    ),
    cancel: null,
    stop: null,
    resumes: 0,
    cancelOrdered: [],
    createdAt: at,
    updatedAt: at,
  };
}

/** The input of the step machine of each step of `plan`. */
export function stepInputs(plan: Plan, at: number): StepInput[] {
  return plan.steps.map((step) => ({
    stepId: step.id,
    needsApproval: stepNeedsApproval(step),
    granular: step.kind === 'agent' && step.mode === 'granular',
    fallback: step.fallback !== undefined,
    retry: {
      maxAttempts: step.retry.maxAttempts,
      initialDelayMs: step.retry.initialDelayMs,
      backoffCoefficient: step.retry.backoffCoefficient,
      maxDelayMs: step.retry.maxDelayMs,
      jitter: step.retry.jitter,
    },
    at,
  }));
}

// The event, addressed to the step it is about.
const forward = ({ event }: { event: StepEvent & { stepId: string } }): StepMessage => ({
  stepId: event.stepId,
  event,
});

/**
 * The machine of one run: an XState parent with one step actor ({@link stepMachine}) per step of
 * the plan, spawned as child `step` under the step's id. It starts the steps whose dependencies
 * are met (all of them at once when several are ready: fan-out), forwards each event about a step
 * to that step (`sendTo(stepId, event)`), and derives its status from the reports its steps send it
 * (`step.reported`, by `sendParent`): `running`, `waiting`, then `succeeded` or `cancelled` (final)
 * or `failed` (it rests there until `run.resumed`, which reopens each failed or cancelled step with
 * a fresh step actor under the same id, its attempts going on).
 *
 * Run it as an actor: `createActor(runMachine, { input: plan })` (a `RunMachineInput`), send
 * it the run events of `src/schemas/events.ts`, and read each step from
 * `getSnapshot().children[stepId].getSnapshot()`. A persisted snapshot
 * (`actor.getPersistedSnapshot()`, or a stored run) restores with every step through
 * `createActor(runMachine, { snapshot })`.
 *
 * Dependents of a step that failed finally, was rejected or was cancelled are CANCELLED with reason
 * `upstream_failed` (they will never run), transitively; steps on independent branches go on, and
 * the run ends `failed` once nothing can move. A SKIPPED step satisfies its dependents. A skip
 * request (`step.skipped` naming no attempt) of a step that failed finally or was cancelled, in a
 * run that was not cancelled, hands the step's id to a fresh actor that is skipped at once, and
 * reopens the dependents cancelled because of it (see `reopenedBySkip`): a failed run goes
 * on (or succeeds). A SUCCEEDED or SKIPPED step stays as it is.
 *
 * Pure: it reads no clock and draws no random number. What must happen outside (execute a step,
 * schedule a retry, ask for an approval, abort an attempt) is its `plan` action, one
 * {@link PlannedAction} as params, in the order the steps planned them: a no-op here, for the host
 * to `provide` (`runMachine.provide({ actions: { plan: (_, action) => … } })`).
 */
export const runMachine = setup({
  types: {
    context: {} as RunContext,
    events: {} as RunEvent | StepReportedEvent,
    // Optional to the type checker only, so that a snapshot alone restores an actor.
    input: {} as RunMachineInput | undefined,
  },
  actors: { step: stepMachine },
  guards: {
    isSucceeded: ({ context }) => statusOf(context) === 'succeeded',
    isFailed: ({ context }) => statusOf(context) === 'failed',
    isCancelled: ({ context }) => statusOf(context) === 'cancelled',
    isWaiting: ({ context }) => statusOf(context) === 'waiting',
    isRunning: ({ context }) => statusOf(context) === 'running',
    // Cancel applies once, to a run that is still moving or that failed (it then ends cancelled
    // instead of waiting for a resume); a stop only to a run that is still moving.
    isFirstCancel: ({ context }) =>
      context.cancel === null &&
      (statusOf(context) === 'running' ||
        statusOf(context) === 'waiting' ||
        statusOf(context) === 'failed'),
    isFirstStop: ({ context }) =>
      context.cancel === null &&
      context.stop === null &&
      (statusOf(context) === 'running' || statusOf(context) === 'waiting'),
    // Events about a step that has ended are dropped here: a final step never changes (but for a
    // skip of one that did not succeed, below).
    isStepOpen: ({ context, event }) => {
      const view = 'stepId' in event ? context.steps[event.stepId] : undefined;
      return view !== undefined && !isFinalStepStatus(view.status);
    },
    // A wait step takes the next signal of its name, and no other: the cursor of that name is the
    // signal's index, and the step still waits for it in this attempt (or, a granular agent step
    // with an inbox, is between its turns in this attempt).
    isNextSignal: ({ context, event }) => {
      if (event.type !== 'signal.taken') return false;
      const view = context.steps[event.stepId];
      return (
        view !== undefined &&
        (view.status === 'WAITING' || view.status === 'READY' || view.status === 'RUNNING') &&
        view.attempt === event.attempt &&
        (context.taken?.[event.name] ?? 0) === event.index
      );
    },
    // A person's skip (no attempt named) of a step that failed finally or was cancelled, in a run
    // that was not cancelled.
    isSkipOfEndedStep: ({ context, event }) => {
      if (event.type !== 'step.skipped' || event.attempt !== undefined) return false;
      const status = context.steps[event.stepId]?.status;
      return context.cancel === null && (status === 'FAILED_FINAL' || status === 'CANCELLED');
    },
  },
  actions: {
    // Carried out by the host: something that must happen outside (see the machine's doc).
    plan: (_, _action: PlannedAction) => {},
    // A message to one step actor.
    toStep: sendTo(
      (_, message: StepMessage) => message.stepId,
      (_, message: StepMessage) => message.event,
    ),
    // Orders every open step cancelled with `reason` (a run cancel, a budget stop), once.
    cancelOpenSteps: enqueueActions(
      ({ enqueue, context }, params: { reason: string; at: number }) => {
        const ordered = cancelOpenSteps(context, params.reason, params.at, (stepId, event) =>
          enqueue.sendTo(stepId, event),
        );
        enqueue.assign({ cancelOrdered: ({ context: c }) => [...c.cancelOrdered, ...ordered] });
      },
    ),
  },
}).createMachine({
  id: 'run',
  context: ({ input }) => initialRunContext(runInputOf(input)),
  // One step actor per step, then the steps with no dependencies start. The entry's event is
  // xstate's init event, which carries the input.
  entry: enqueueActions(({ enqueue, context, event }) => {
    if (!('input' in event)) return;
    const { plan } = runInputOf(event.input as RunMachineInput | undefined);
    for (const input of stepInputs(plan, context.createdAt)) {
      enqueue.spawnChild('step', { id: input.stepId, input });
    }
    const at = context.createdAt;
    for (const id of context.order) {
      if ((context.dependsOn[id] ?? []).length === 0) {
        enqueue.sendTo(id, { type: 'deps.met', at } satisfies StepEvent);
      }
    }
  }),
  initial: 'running',
  on: {
    'step.started': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'tool.approvalRequested': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'step.succeeded': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'step.cacheHit': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'step.failed': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'step.skipped': [
      { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
      {
        // A step that ended without succeeding is skipped: a fresh step actor takes over its id
        // (an actor that ended stays ended) and is skipped at once, and the dependents its failure
        // cancelled are reopened like a resume reopens them; they run once their dependencies are
        // done, with the skipped step's output null.
        guard: 'isSkipOfEndedStep',
        actions: enqueueActions(({ enqueue, context, event, self }) => {
          if (event.type !== 'step.skipped') return;
          // The run's own step actors, as they are before this event.
          const children = self.getSnapshot().children;
          const contextOf = (id: string) => endedStepContext(children[id], id);
          const skipped = event.stepId;
          const reopened = reopenedBySkip(context, skipped, contextOf);
          const steps = viewsCopy(context);
          for (const id of [skipped, ...reopened]) {
            const old = contextOf(id);
            enqueue.stopChild(id);
            enqueue.spawnChild('step', { id, input: reopenInput(old, event.at) });
            steps[id] = { status: 'PENDING', attempt: old.attempt };
          }
          // The skipped step's view stays open until its report (which follows at once): a run
          // whose steps all look final may end, and stop its step actors, before the skip lands.
          enqueue.assign({ steps, updatedAt: Math.max(context.updatedAt, event.at) });
          enqueue.sendTo(skipped, event satisfies StepEvent);
        }),
      },
    ],
    'gate.approved': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'gate.rejected': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'retry.due': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'turn.committed': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'wait.started': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'wait.woken': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    // The step's success with the signal's payload is committed with it, as the next event.
    'signal.taken': {
      guard: 'isNextSignal',
      actions: assign({
        taken: ({ context, event }) => ({ ...context.taken, [event.name]: event.index + 1 }),
        updatedAt: ({ context, event }) => Math.max(context.updatedAt, event.at),
      }),
    },
    'run.cancelled': {
      guard: 'isFirstCancel',
      actions: [
        assign({
          cancel: ({ event }) => ({
            by: event.by ?? null,
            reason: event.reason ?? null,
            at: event.at,
          }),
          updatedAt: ({ context, event }) => Math.max(context.updatedAt, event.at),
        }),
        {
          type: 'cancelOpenSteps',
          params: ({ event }) => ({ reason: StepReason.runCancelled, at: event.at }),
        },
      ],
    },
    'run.stopped': {
      guard: 'isFirstStop',
      actions: [
        assign({
          stop: ({ event }) => ({
            reason: event.reason,
            detail: event.detail ?? null,
            at: event.at,
          }),
          updatedAt: ({ context, event }) => Math.max(context.updatedAt, event.at),
        }),
        {
          type: 'cancelOpenSteps',
          params: ({ event }) => ({ reason: event.reason, at: event.at }),
        },
      ],
    },
    'step.reported': {
      actions: [
        assign({
          steps: ({ context, event }) =>
            withView(
              context,
              event.stepId,
              event.planned?.type === 'step.wait' && event.planned.child !== undefined
                ? { status: event.status, attempt: event.attempt, child: true as const }
                : { status: event.status, attempt: event.attempt },
              dependentsOf(context, event.stepId),
            ),
          updatedAt: ({ context, event }) => Math.max(context.updatedAt, event.at),
          cancelOrdered: ({ context, event }) =>
            isFinalStepStatus(event.status)
              ? context.cancelOrdered.filter((id) => id !== event.stepId)
              : context.cancelOrdered,
        }),
        enqueueActions(({ enqueue, context, event, self }) => {
          if (event.planned !== null) enqueue({ type: 'plan', params: event.planned });
          const status = event.status;
          const unblocks = status === 'SUCCEEDED' || status === 'SKIPPED';
          const blocks = status === 'FAILED_FINAL' || status === 'CANCELLED';
          if (!unblocks && !blocks) return;
          const blocked: string[] = [];
          for (const id of dependentsOf(context, event.stepId)) {
            const deps = context.dependsOn[id] ?? [];
            if (context.steps[id]?.status !== 'PENDING') continue;
            if (context.cancelOrdered.includes(id)) continue;
            if (blocks) {
              blocked.push(id);
              enqueue.sendTo(id, {
                type: 'deps.failed',
                causeStepId: event.stepId,
                at: event.at,
              } satisfies StepEvent);
            } else if (deps.every((d) => satisfied(context.steps[d]))) {
              enqueue.sendTo(id, readyOrSkipped(context, self, id, event.at));
            }
          }
          if (blocked.length > 0) {
            enqueue.assign({ cancelOrdered: ({ context: c }) => [...c.cancelOrdered, ...blocked] });
          }
        }),
      ],
    },
  },
  states: {
    running: {
      always: [
        { guard: 'isSucceeded', target: 'succeeded' },
        { guard: 'isFailed', target: 'failed' },
        { guard: 'isCancelled', target: 'cancelled' },
        { guard: 'isWaiting', target: 'waiting' },
      ],
    },
    waiting: {
      always: [
        { guard: 'isSucceeded', target: 'succeeded' },
        { guard: 'isFailed', target: 'failed' },
        { guard: 'isCancelled', target: 'cancelled' },
        { guard: 'isRunning', target: 'running' },
      ],
    },
    succeeded: { type: 'final' },
    // Not final: a failed run rests here until it is resumed (`run.resumed`), or until a skip of a
    // step that failed (or was cancelled by a failure) lets it go on or finish.
    failed: {
      always: [
        // Cancelled while failed: it ends cancelled (every step is final already).
        { guard: 'isCancelled', target: 'cancelled' },
        { guard: 'isSucceeded', target: 'succeeded' },
        { guard: 'isRunning', target: 'running' },
        { guard: 'isWaiting', target: 'waiting' },
      ],
      on: {
        'run.resumed': {
          target: 'running',
          actions: enqueueActions(({ enqueue, context, event, self }) => {
            // The run's own step actors, as they are before this event.
            const children = self.getSnapshot().children;
            const reopened: string[] = [];
            for (const id of context.order) {
              const status = context.steps[id]?.status;
              if (status !== 'FAILED_FINAL' && status !== 'CANCELLED') continue;
              const old = endedStepContext(children[id], id);
              // A step actor that ended stays ended: a fresh one takes over its id.
              enqueue.stopChild(id);
              enqueue.spawnChild('step', { id, input: reopenInput(old, event.at) });
              reopened.push(id);
            }
            const steps = viewsCopy(context);
            for (const id of reopened) {
              steps[id] = { status: 'PENDING', attempt: context.steps[id]?.attempt ?? 0 };
            }
            enqueue.assign({
              steps,
              stop: null,
              cancelOrdered: [],
              resumes: context.resumes + 1,
              updatedAt: Math.max(context.updatedAt, event.at),
            });
            for (const id of reopened) {
              if ((context.dependsOn[id] ?? []).every((d) => satisfied(steps[d]))) {
                enqueue.sendTo(id, { type: 'deps.met', at: event.at } satisfies StepEvent);
              }
            }
          }),
        },
      },
    },
    cancelled: { type: 'final' },
  },
});

/** The run machine's logic type. */
export type RunMachine = typeof runMachine;
