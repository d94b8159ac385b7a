import { assign, setup } from 'xstate';
import { retryDelayMs } from '../internal/backoff.js';
import type {
  GateApprovedEvent,
  GateRejectedEvent,
  RetryDueEvent,
  StepFailedEvent,
  StepSkippedEvent,
  StepSucceededEvent,
  TurnCommittedEvent,
} from '../schemas/events.js';
import {
  StepReason,
  type AgentProgress,
  type PlannedAction,
  type StepContext,
  type StepReport,
  type StepStatus,
} from './types.js';

/** Input of a step machine: what the run knows about the step from its plan. */
export interface StepInput {
  stepId: string;
  needsApproval: boolean;
  /** Driven one turn per unit of work (a granular agent step). @defaultValue false */
  granular?: boolean;
  retry: StepContext['retry'];
  /** When the step actor was created (epoch ms). */
  at: number;
  /** Attempts already made by earlier machines of this step (a resumed run). @defaultValue 0 */
  attempt?: number;
  /** A granular agent step's committed turns, kept when the step is reopened. @defaultValue null */
  agent?: AgentProgress | null;
}

/** All dependencies of the step succeeded or were skipped: it may start. */
export interface DepsMetEvent {
  type: 'deps.met';
  at: number;
}
/** A dependency failed finally, was rejected or cancelled: the step will never run. */
export interface DepsFailedEvent {
  type: 'deps.failed';
  causeStepId: string;
  at: number;
}
/** The run was cancelled. */
export interface StepCancelEvent {
  type: 'step.cancel';
  reason: string;
  at: number;
}

/** Events a step machine accepts: the run's events about this step, plus the run's own orders. */
export type StepEvent =
  | StepSucceededEvent
  | StepFailedEvent
  | StepSkippedEvent
  | GateApprovedEvent
  | GateRejectedEvent
  | RetryDueEvent
  | TurnCommittedEvent
  | DepsMetEvent
  | DepsFailedEvent
  | StepCancelEvent;

function planFor(status: StepStatus, context: StepContext): PlannedAction | null {
  switch (status) {
    case 'RUNNING':
      return { type: 'step.execute', stepId: context.stepId, attempt: context.attempt };
    case 'FAILED_RETRYABLE':
      return {
        type: 'step.scheduleRetry',
        stepId: context.stepId,
        attempt: context.attempt + 1,
        at: context.retryAt ?? context.updatedAt,
        delayMs: (context.retryAt ?? context.updatedAt) - context.updatedAt,
      };
    case 'WAITING_APPROVAL':
      return { type: 'step.requestApproval', stepId: context.stepId };
    case 'CANCELLED':
      return context.abortedAttempt === null
        ? null
        : { type: 'step.abort', stepId: context.stepId, attempt: context.abortedAttempt };
    default:
      return null;
  }
}

/** Builds the report a step sends its run on entering `status`. */
export function stepReport(status: StepStatus, context: StepContext): StepReport {
  return {
    stepId: context.stepId,
    status,
    attempt: context.attempt,
    planned: planFor(status, context),
    at: context.updatedAt,
  };
}

const decisionOf = (e: GateApprovedEvent | GateRejectedEvent) => ({
  by: e.by,
  at: e.at,
  comment: e.comment ?? null,
});

/**
 * The machine of one step: PENDING → READY → RUNNING → SUCCEEDED | FAILED_RETRYABLE | FAILED_FINAL,
 * READY → WAITING_APPROVAL → READY on approval, FAILED_RETRYABLE → READY when the retry is due, and
 * SKIPPED / CANCELLED. Pure: time, seeds and outputs arrive in events; what must happen outside
 * leaves in the `report` action's {@link PlannedAction}.
 *
 * READY is transient: a ready step either waits for approval or starts its next attempt at once.
 * Events about an attempt other than the current one are ignored, so a redelivered or late report
 * can never finish a newer attempt, and one step never has two attempts running.
 */
export const stepMachine = setup({
  types: {
    context: {} as StepContext,
    events: {} as StepEvent,
    input: {} as StepInput,
  },
  actions: {
    // The kernel delivers it to the run as `step.reported`.
    report: (_, _report: StepReport) => {},
    // Ends the step with the event's reason (a skip or a cancel); no retry stays scheduled.
    close: assign(({ event }) => ({
      reason: 'reason' in event ? event.reason : null,
      retryAt: null,
      updatedAt: event.at,
    })),
    // A running attempt was cancelled: the host must abort it.
    markAborted: assign({ abortedAttempt: ({ context }) => context.attempt }),
  },
  guards: {
    isCurrentAttempt: ({ context, event }) =>
      'attempt' in event && event.attempt === context.attempt,
    needsApproval: ({ context }) => context.needsApproval && context.approval === null,
    canRetry: ({ context, event }) =>
      event.type === 'step.failed' &&
      event.attempt === context.attempt &&
      event.error.retryable &&
      context.attempt < context.retry.maxAttempts,
    isNextAttemptDue: ({ context, event }) =>
      event.type === 'retry.due' && event.attempt === context.attempt + 1,
    isSkipOfRunningAttempt: ({ context, event }) =>
      event.type === 'step.skipped' && event.attempt === context.attempt,
    isSkipRequest: ({ event }) => event.type === 'step.skipped' && event.attempt === undefined,
    // The current attempt's next turn, under the fingerprint the first turn stored.
    isNextTurn: ({ context, event }) =>
      event.type === 'turn.committed' &&
      context.granular &&
      event.attempt === context.attempt &&
      event.turn === (context.agent?.turns ?? 0) &&
      event.cursor > (context.agent?.cursor ?? 0) &&
      (context.agent === null || event.fingerprint === context.agent.fingerprint),
  },
}).createMachine({
  id: 'step',
  initial: 'PENDING',
  context: ({ input }) => ({
    stepId: input.stepId,
    needsApproval: input.needsApproval,
    granular: input.granular ?? false,
    retry: input.retry,
    attempt: input.attempt ?? 0,
    approval: null,
    rejection: null,
    output: null,
    error: null,
    retryAt: null,
    reason: null,
    causeStepId: null,
    abortedAttempt: null,
    agent: input.agent ?? null,
    updatedAt: input.at,
  }),
  states: {
    PENDING: {
      on: {
        'deps.met': {
          target: 'READY',
          actions: assign({ updatedAt: ({ event }) => event.at }),
        },
        'deps.failed': {
          target: 'CANCELLED',
          actions: assign({
            reason: StepReason.upstreamFailed,
            causeStepId: ({ event }) => event.causeStepId,
            updatedAt: ({ event }) => event.at,
          }),
        },
        'step.skipped': { guard: 'isSkipRequest', target: 'SKIPPED', actions: 'close' },
        'step.cancel': { target: 'CANCELLED', actions: 'close' },
      },
    },
    READY: {
      always: [
        { guard: 'needsApproval', target: 'WAITING_APPROVAL' },
        {
          target: 'RUNNING',
          actions: assign({ attempt: ({ context }) => context.attempt + 1, retryAt: null }),
        },
      ],
    },
    WAITING_APPROVAL: {
      entry: { type: 'report', params: ({ context }) => stepReport('WAITING_APPROVAL', context) },
      on: {
        'gate.approved': {
          target: 'READY',
          actions: assign({
            approval: ({ event }) => decisionOf(event),
            updatedAt: ({ event }) => event.at,
          }),
        },
        'gate.rejected': {
          target: 'FAILED_FINAL',
          actions: assign({
            rejection: ({ event }) => decisionOf(event),
            reason: StepReason.approvalRejected,
            updatedAt: ({ event }) => event.at,
          }),
        },
        'step.skipped': { guard: 'isSkipRequest', target: 'SKIPPED', actions: 'close' },
        'step.cancel': { target: 'CANCELLED', actions: 'close' },
      },
    },
    RUNNING: {
      entry: { type: 'report', params: ({ context }) => stepReport('RUNNING', context) },
      on: {
        'step.succeeded': {
          guard: 'isCurrentAttempt',
          target: 'SUCCEEDED',
          actions: assign({
            output: ({ event }) => event.output,
            error: null,
            updatedAt: ({ event }) => event.at,
          }),
        },
        'step.failed': [
          {
            guard: 'canRetry',
            target: 'FAILED_RETRYABLE',
            actions: assign({
              error: ({ event }) => event.error,
              retryAt: ({ context, event }) =>
                event.at +
                retryDelayMs(
                  context.retry,
                  event.attempt,
                  event.jitterSeed,
                  event.error.retryAfterMs,
                ),
              updatedAt: ({ event }) => event.at,
            }),
          },
          {
            guard: 'isCurrentAttempt',
            target: 'FAILED_FINAL',
            actions: assign({
              error: ({ event }) => event.error,
              reason: ({ event }) =>
                event.error.retryable ? StepReason.retriesExhausted : StepReason.nonRetryableError,
              updatedAt: ({ event }) => event.at,
            }),
          },
        ],
        'turn.committed': {
          guard: 'isNextTurn',
          actions: assign({
            agent: ({ event }) => ({
              turns: event.turn + 1,
              cursor: event.cursor,
              fingerprint: event.fingerprint,
            }),
            updatedAt: ({ event }) => event.at,
          }),
        },
        'step.skipped': { guard: 'isSkipOfRunningAttempt', target: 'SKIPPED', actions: 'close' },
        'step.cancel': { target: 'CANCELLED', actions: ['close', 'markAborted'] },
      },
    },
    FAILED_RETRYABLE: {
      entry: { type: 'report', params: ({ context }) => stepReport('FAILED_RETRYABLE', context) },
      on: {
        'retry.due': {
          guard: 'isNextAttemptDue',
          target: 'READY',
          actions: assign({ updatedAt: ({ event }) => event.at }),
        },
        'step.skipped': { guard: 'isSkipRequest', target: 'SKIPPED', actions: 'close' },
        'step.cancel': { target: 'CANCELLED', actions: 'close' },
      },
    },
    SUCCEEDED: {
      type: 'final',
      entry: { type: 'report', params: ({ context }) => stepReport('SUCCEEDED', context) },
    },
    FAILED_FINAL: {
      type: 'final',
      entry: { type: 'report', params: ({ context }) => stepReport('FAILED_FINAL', context) },
    },
    SKIPPED: {
      type: 'final',
      entry: { type: 'report', params: ({ context }) => stepReport('SKIPPED', context) },
    },
    CANCELLED: {
      type: 'final',
      entry: { type: 'report', params: ({ context }) => stepReport('CANCELLED', context) },
    },
  },
});

/** The step machine's logic type. */
export type StepMachine = typeof stepMachine;
