import { assign, enqueueActions, setup } from 'xstate';
import type { Plan } from '../plan/schema.js';
import { stepNeedsApproval } from '../plan/schema.js';
import type { JsonValue } from '../internal/json.js';
import type { RunEvent } from '../schemas/events.js';
import { deriveRunStatus } from './run-status.js';
import type { StepEvent, StepInput } from './step-machine.js';
import {
  StepReason,
  isFinalStepStatus,
  type PlannedAction,
  type RunStatus,
  type StepReport,
  type StepView,
} from './types.js';

/** Input of a run machine. */
export interface RunInput {
  runId: string;
  plan: Plan;
  /** Creation time (epoch ms). */
  at: number;
}

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
   * Steps the run has ordered cancelled (run cancel, failed dependency) whose own report has not
   * arrived yet, so that no second order is sent to them meanwhile.
   */
  cancelOrdered: string[];
  createdAt: number;
  updatedAt: number;
}

/** A step's report to its run (sent by the step machine's `report` action). */
export type StepReportedEvent = { type: 'step.reported' } & StepReport;

/** A message from the run to one of its steps, delivered by the kernel. */
export interface StepMessage {
  stepId: string;
  event: StepEvent;
}

// Contexts are never mutated (each assign makes a new one), so the status derived from one can be
// kept: the eventless guards below ask for it several times per event.
const statuses = new WeakMap<RunContext, RunStatus>();

/** The run's status, derived from its context. */
export function statusOf(context: RunContext): RunStatus {
  let status = statuses.get(context);
  if (status === undefined) {
    status = deriveRunStatus({
      steps: context.steps,
      dependsOn: context.dependsOn,
      cancelRequested: context.cancel !== null,
      stopped: context.stop !== null,
    });
    statuses.set(context, status);
  }
  return status;
}

/** Orders every open step cancelled with `reason`, once; returns the ids ordered. */
function cancelOpenSteps(
  context: RunContext,
  reason: string,
  at: number,
  send: (id: string, event: { type: 'step.cancel'; reason: string; at: number }) => void,
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

const satisfied = (view: StepView | undefined): boolean =>
  view !== undefined && (view.status === 'SUCCEEDED' || view.status === 'SKIPPED');

// The event, addressed to the step it is about.
const forward = ({ event }: { event: StepEvent & { stepId: string } }): StepMessage => ({
  stepId: event.stepId,
  event,
});

/** The input of the step machine of each step of `plan`. */
export function stepInputs(plan: Plan, at: number): StepInput[] {
  return plan.steps.map((step) => ({
    stepId: step.id,
    needsApproval: stepNeedsApproval(step),
    granular: step.kind === 'agent' && step.mode === 'granular',
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

/**
 * The machine of one run. It owns one step machine per step of the plan, addressed by step id:
 * it starts the steps whose dependencies are met (all of them at once when several are ready:
 * fan-out), forwards each event about a step to that step, and derives its status from the
 * steps' reports: `running`, `waiting`, then one of the final `succeeded`, `failed`, `cancelled`.
 *
 * Messages between the run and its steps are actions the kernel delivers (`toStep` to a step; a
 * step's `report` comes back as `step.reported`), the pure equivalent of `sendTo`/`sendParent`:
 * the kernel computes every next snapshot with the machines' pure `transition`, and no actor
 * system is started to feed a run one event.
 *
 * Dependents of a step that failed finally, was rejected or was cancelled are CANCELLED with reason
 * `upstream_failed` (they will never run), transitively; steps on independent branches go on, and
 * the run ends `failed` once nothing can move. A SKIPPED step satisfies its dependents.
 *
 * Pure: it reads no clock and draws no random number; what must happen outside is emitted as
 * `planned` events (see {@link PlannedAction}) for the host to carry out.
 */
export const runMachine = setup({
  types: {
    context: {} as RunContext,
    events: {} as RunEvent | StepReportedEvent,
    input: {} as RunInput,
  },
  guards: {
    isSucceeded: ({ context }) => statusOf(context) === 'succeeded',
    isFailed: ({ context }) => statusOf(context) === 'failed',
    isCancelled: ({ context }) => statusOf(context) === 'cancelled',
    isWaiting: ({ context }) => statusOf(context) === 'waiting',
    isRunning: ({ context }) => statusOf(context) === 'running',
    // Cancel and stop apply once, to a run that is still moving (not to one that failed).
    isFirstCancel: ({ context }) =>
      context.cancel === null &&
      context.stop === null &&
      (statusOf(context) === 'running' || statusOf(context) === 'waiting'),
    // Events about a step that has ended are dropped here: a final step never changes.
    isStepOpen: ({ context, event }) => {
      const view = 'stepId' in event ? context.steps[event.stepId] : undefined;
      return view !== undefined && !isFinalStepStatus(view.status);
    },
  },
  actions: {
    // Orders every open step cancelled with `reason` (a run cancel, a budget stop), once.
    // Delivered by the kernel: the step's machine takes `event`.
    toStep: (_, _message: StepMessage) => {},
    // Carried out by the host: something that must happen outside.
    plan: (_, _action: PlannedAction) => {},
    // The kernel replaces the step's ended machine with a fresh one (attempts go on).
    reopenStep: (_, _params: { stepId: string; at: number }) => {},
    // Orders every open step cancelled with `reason` (a run cancel, a budget stop), once.
    cancelOpenSteps: enqueueActions(
      ({ enqueue, context }, params: { reason: string; at: number }) => {
        // `enqueue` is typed before the sibling actions exist; `toStep` is one of them.
        const send = enqueue as unknown as (action: {
          type: 'toStep';
          params: StepMessage;
        }) => void;
        const ordered = cancelOpenSteps(context, params.reason, params.at, (stepId, event) =>
          send({ type: 'toStep', params: { stepId, event } }),
        );
        enqueue.assign({ cancelOrdered: ({ context: c }) => [...c.cancelOrdered, ...ordered] });
      },
    ),
  },
}).createMachine({
  id: 'run',
  context: ({ input }) => ({
    runId: input.runId,
    planName: input.plan.name,
    order: input.plan.steps.map((s) => s.id),
    dependsOn: Object.fromEntries(input.plan.steps.map((s) => [s.id, [...s.dependsOn]])),
    steps: Object.fromEntries(
      input.plan.steps.map((s) => [s.id, { status: 'PENDING', attempt: 0 }]),
    ),
    cancel: null,
    stop: null,
    resumes: 0,
    cancelOrdered: [],
    createdAt: input.at,
    updatedAt: input.at,
  }),
  entry: enqueueActions(({ enqueue, context }) => {
    const at = context.createdAt;
    for (const id of context.order) {
      if ((context.dependsOn[id] ?? []).length === 0) {
        enqueue({ type: 'toStep', params: { stepId: id, event: { type: 'deps.met', at } } });
      }
    }
  }),
  initial: 'running',
  on: {
    'step.succeeded': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'step.failed': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'step.skipped': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'gate.approved': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'gate.rejected': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'retry.due': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
    'turn.committed': { guard: 'isStepOpen', actions: { type: 'toStep', params: forward } },
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
      guard: 'isFirstCancel',
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
          steps: ({ context, event }) => ({
            ...context.steps,
            [event.stepId]: { status: event.status, attempt: event.attempt },
          }),
          updatedAt: ({ context, event }) => Math.max(context.updatedAt, event.at),
          cancelOrdered: ({ context, event }) =>
            isFinalStepStatus(event.status)
              ? context.cancelOrdered.filter((id) => id !== event.stepId)
              : context.cancelOrdered,
        }),
        enqueueActions(({ enqueue, context, event }) => {
          if (event.planned !== null) enqueue({ type: 'plan', params: event.planned });
          const status = event.status;
          const unblocks = status === 'SUCCEEDED' || status === 'SKIPPED';
          const blocks = status === 'FAILED_FINAL' || status === 'CANCELLED';
          if (!unblocks && !blocks) return;
          const blocked: string[] = [];
          for (const id of context.order) {
            const deps = context.dependsOn[id] ?? [];
            if (!deps.includes(event.stepId) || context.steps[id]?.status !== 'PENDING') continue;
            if (context.cancelOrdered.includes(id)) continue;
            if (blocks) {
              blocked.push(id);
              enqueue({
                type: 'toStep',
                params: {
                  stepId: id,
                  event: { type: 'deps.failed', causeStepId: event.stepId, at: event.at },
                },
              });
            } else if (deps.every((d) => satisfied(context.steps[d]))) {
              enqueue({
                type: 'toStep',
                params: { stepId: id, event: { type: 'deps.met', at: event.at } },
              });
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
    // Not final: a failed run rests here until it is resumed (`run.resumed`).
    failed: {
      on: {
        'run.resumed': {
          target: 'running',
          actions: enqueueActions(({ enqueue, context, event }) => {
            const reopened: string[] = [];
            for (const id of context.order) {
              const status = context.steps[id]?.status;
              if (status !== 'FAILED_FINAL' && status !== 'CANCELLED') continue;
              // A step machine that ended stays ended: a fresh one takes over its id.
              enqueue({ type: 'reopenStep', params: { stepId: id, at: event.at } });
              reopened.push(id);
            }
            const steps = { ...context.steps };
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
                enqueue({
                  type: 'toStep',
                  params: { stepId: id, event: { type: 'deps.met', at: event.at } },
                });
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
