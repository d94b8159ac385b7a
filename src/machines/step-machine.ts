import { assign, sendParent, setup } from 'xstate';
import { retryDelayMs } from '../internal/backoff.js';
import type {
  GateApprovedEvent,
  GateRejectedEvent,
  RetryDueEvent,
  StepCacheHitEvent,
  StepFailedEvent,
  StepSkippedEvent,
  StepStartedEvent,
  StepSucceededEvent,
  ToolApprovalRequestedEvent,
  TurnCommittedEvent,
  WaitStartedEvent,
  WaitWokenEvent,
} from '../schemas/events.js';
import {
  StepReason,
  type AgentProgress,
  type PlannedAction,
  type StepContext,
  type StepReport,
  type StepReportedEvent,
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
  /** The step has a fallback, run once its primary failed finally. @defaultValue false */
  fallback?: boolean;
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
  | StepStartedEvent
  | ToolApprovalRequestedEvent
  | StepSucceededEvent
  | StepCacheHitEvent
  | StepFailedEvent
  | StepSkippedEvent
  | GateApprovedEvent
  | GateRejectedEvent
  | RetryDueEvent
  | TurnCommittedEvent
  | WaitStartedEvent
  | WaitWokenEvent
  | DepsMetEvent
  | DepsFailedEvent
  | StepCancelEvent;

function planFor(status: StepStatus, context: StepContext): PlannedAction | null {
  switch (status) {
    case 'READY':
      return {
        type: 'step.execute',
        stepId: context.stepId,
        attempt: context.attempt,
        ...(context.pauses > 0 ? { pause: context.pauses } : {}),
      };
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
    case 'WAITING':
      return {
        type: 'step.wait',
        stepId: context.stepId,
        attempt: context.attempt,
        dueAt: context.wait?.dueAt ?? null,
        ...(context.wait?.child === undefined ? {} : { child: context.wait.child }),
      };
    case 'CANCELLED':
    case 'SKIPPED':
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
 * PENDING → WAITING_APPROVAL → READY on approval, FAILED_RETRYABLE → READY when the retry is due,
 * RUNNING → WAITING_APPROVAL → READY around a tool call that needs approval, and SKIPPED /
 * CANCELLED. Pure: time, seeds and outputs arrive in events; what must happen outside leaves in
 * the {@link PlannedAction} of the `report` it sends its parent (the run) on entering each state
 * other than PENDING (`sendParent`, as `step.reported`). Run alone, give `report` an
 * implementation of your own (`stepMachine.provide({ actions: { report } })`): there is no parent.
 *
 * READY is a state a step rests in: its dependencies are done (and its gate approved), its next
 * attempt is numbered and planned (`step.execute`), and it waits for a worker. It becomes RUNNING
 * with `step.started`, which a worker commits together with the first result of its execution,
 * stamped with the time the execution began; a result fed to a READY step directly (a caller
 * driving the kernel by hand) is taken as well.
 *
 * A step whose tool call needs approval goes RUNNING → WAITING_APPROVAL with the call
 * (`tool.approvalRequested`); the decision is recorded for that call and that attempt only, and
 * the step goes back to READY with the same attempt: the execution that resumes reaches the same
 * call and finds the decision. Events about an attempt other than the current one are ignored, so
 * a redelivered or late report can never finish a newer attempt, and one step never has two
 * attempts running.
 */
export const stepMachine = setup({
  types: {
    context: {} as StepContext,
    events: {} as StepEvent,
    input: {} as StepInput,
  },
  actions: {
    // Tells the run (the parent actor) the state the step entered, with what it plans.
    report: sendParent((_, report: StepReport): StepReportedEvent => ({
      type: 'step.reported',
      ...report,
    })),
    // Ends the step with the event's reason (a skip or a cancel); no retry stays scheduled.
    close: assign(({ event }) => ({
      reason: 'reason' in event ? event.reason : null,
      retryAt: null,
      pendingCall: null,
      updatedAt: event.at,
    })),
    // A running (or ready, perhaps executing) attempt was cancelled: the host must abort it.
    markAborted: assign({ abortedAttempt: ({ context }) => context.attempt }),
    // Numbers the next attempt; decisions on the last attempt's tool calls do not carry over.
    nextAttempt: assign(({ context, event }) => ({
      attempt: context.attempt + 1,
      retryAt: null,
      pendingCall: null,
      callDecisions: null,
      pauses: 0,
      updatedAt: event.at,
    })),
    touch: assign({ updatedAt: ({ event }) => event.at }),
    // A step starts; a map step's start says how many items its attempt runs.
    start: assign(({ event }) =>
      event.type === 'step.started' && event.items !== undefined
        ? { map: { total: event.items }, updatedAt: event.at }
        : { updatedAt: event.at },
    ),
    // A wait step starts waiting: what for, and until when, as the event computed it once.
    startWait: assign(({ event }) =>
      event.type !== 'wait.started'
        ? {}
        : {
            wait: {
              signal: event.signal ?? null,
              dueAt: event.dueAt ?? null,
              since: event.at,
              ...(event.child === undefined ? {} : { child: event.child }),
            },
            updatedAt: event.at,
          },
    ),
    commitTurn: assign(({ event }) =>
      event.type !== 'turn.committed'
        ? {}
        : {
            agent: {
              turns: event.turn + 1,
              cursor: event.cursor,
              fingerprint: event.fingerprint,
            },
            updatedAt: event.at,
          },
    ),
    // The primary failed finally: the fallback runs as the next attempt, told the primary's error.
    startFallback: assign(({ context, event }) => {
      if (event.type !== 'step.failed') return {};
      return {
        fallback: { active: true, primaryError: event.error },
        error: event.error,
        attempt: context.attempt + 1,
        retryAt: null,
        pendingCall: null,
        callDecisions: null,
        pauses: 0,
        updatedAt: event.at,
      };
    }),
    noteCacheHit: assign(({ event }) =>
      event.type !== 'step.cacheHit'
        ? {}
        : {
            cachedFrom: {
              runId: event.sourceRunId,
              storedAt: event.storedAt,
              cacheClass: event.cacheClass,
              provenance: event.provenance ?? null,
            },
            updatedAt: event.at,
          },
    ),
    succeed: assign(({ event }) => ({
      output: event.type === 'step.succeeded' ? event.output : null,
      error: null,
      updatedAt: event.at,
    })),
    failRetryable: assign(({ context, event }) => {
      if (event.type !== 'step.failed') return {};
      return {
        error: event.error,
        retryAt:
          event.at +
          retryDelayMs(context.retry, event.attempt, event.jitterSeed, event.error.retryAfterMs),
        updatedAt: event.at,
      };
    }),
    failFinal: assign(({ context, event }) => {
      if (event.type !== 'step.failed') return {};
      let reason: string = event.error.retryable
        ? StepReason.retriesExhausted
        : StepReason.nonRetryableError;
      if (context.fallback?.active === true) reason = StepReason.fallbackFailed;
      return { error: event.error, reason, updatedAt: event.at };
    }),
    holdCall: assign(({ event }) => {
      if (event.type !== 'tool.approvalRequested') return {};
      return {
        pendingCall: {
          callId: event.callId,
          tool: event.tool,
          args: event.args,
          toolCallId: event.toolCallId ?? null,
          turn: event.turn ?? null,
          at: event.at,
        },
        updatedAt: event.at,
      };
    }),
    // Records the decision on the pending call, for this attempt; the attempt then goes on.
    decideCall: assign(({ context, event }) => {
      const call = context.pendingCall;
      if (call === null || (event.type !== 'gate.approved' && event.type !== 'gate.rejected')) {
        return {};
      }
      const decision = {
        callId: call.callId,
        attempt: context.attempt,
        approved: event.type === 'gate.approved',
        ...decisionOf(event),
      };
      return {
        callDecisions: [...(context.callDecisions ?? []), decision],
        pendingCall: null,
        pauses: context.pauses + 1,
        updatedAt: event.at,
      };
    }),
  },
  guards: {
    isCurrentAttempt: ({ context, event }) =>
      'attempt' in event && event.attempt === context.attempt,
    needsApproval: ({ context }) => context.needsApproval && context.approval === null,
    // A fallback runs once: its failure is final.
    canRetry: ({ context, event }) =>
      event.type === 'step.failed' &&
      event.attempt === context.attempt &&
      event.error.retryable &&
      context.fallback?.active !== true &&
      context.attempt < context.retry.maxAttempts,
    // The current attempt failed finally, and the step has a fallback that has not run yet.
    canFallBack: ({ context, event }) =>
      event.type === 'step.failed' &&
      event.attempt === context.attempt &&
      // Also false for a snapshot older than fallbacks (no field at all).
      context.fallback?.active === false,
    isNextAttemptDue: ({ context, event }) =>
      event.type === 'retry.due' && event.attempt === context.attempt + 1,
    isSkipOfRunningAttempt: ({ context, event }) =>
      event.type === 'step.skipped' && event.attempt === context.attempt,
    isSkipRequest: ({ event }) => event.type === 'step.skipped' && event.attempt === undefined,
    // A decision on the tool call the step waits on (naming it, or naming no call).
    isCallDecision: ({ context, event }) => {
      const named = 'callId' in event ? event.callId : undefined;
      return (
        context.pendingCall !== null &&
        (named === undefined || named === context.pendingCall.callId)
      );
    },
    // A decision on the step's own gate (no tool call pending, none named).
    isGateDecision: ({ context, event }) =>
      context.pendingCall === null && (!('callId' in event) || event.callId === undefined),
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
    pendingCall: null,
    callDecisions: null,
    pauses: 0,
    fallback: input.fallback === true ? { active: false, primaryError: null } : null,
    // No `cachedFrom` until a cache entry gives the output: with it, the context would hold 20
    // fields, and V8 keeps an object of 20 fields or more that `Object.assign` builds (as xstate's
    // `assign` builds each next context) as a dictionary, several times slower to copy and read.
    updatedAt: input.at,
  }),
  states: {
    PENDING: {
      on: {
        'deps.met': [
          { guard: 'needsApproval', target: 'WAITING_APPROVAL', actions: 'touch' },
          { target: 'READY', actions: 'nextAttempt' },
        ],
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
      entry: { type: 'report', params: ({ context }) => stepReport('READY', context) },
      on: {
        'step.started': { guard: 'isCurrentAttempt', target: 'RUNNING', actions: 'start' },
        'turn.committed': { guard: 'isNextTurn', target: 'RUNNING', actions: 'commitTurn' },
        'wait.started': { guard: 'isCurrentAttempt', target: 'WAITING', actions: 'startWait' },
        'step.cacheHit': { guard: 'isCurrentAttempt', actions: 'noteCacheHit' },
        'step.succeeded': { guard: 'isCurrentAttempt', target: 'SUCCEEDED', actions: 'succeed' },
        'step.failed': [
          { guard: 'canRetry', target: 'FAILED_RETRYABLE', actions: 'failRetryable' },
          // READY again, entered anew: its entry plans the fallback's attempt.
          { guard: 'canFallBack', target: 'READY', reenter: true, actions: 'startFallback' },
          { guard: 'isCurrentAttempt', target: 'FAILED_FINAL', actions: 'failFinal' },
        ],
        // A worker may be executing the attempt already (it records RUNNING with its result).
        'step.skipped': [
          { guard: 'isSkipOfRunningAttempt', target: 'SKIPPED', actions: 'close' },
          { guard: 'isSkipRequest', target: 'SKIPPED', actions: ['close', 'markAborted'] },
        ],
        'step.cancel': { target: 'CANCELLED', actions: ['close', 'markAborted'] },
      },
    },
    WAITING_APPROVAL: {
      entry: { type: 'report', params: ({ context }) => stepReport('WAITING_APPROVAL', context) },
      on: {
        'gate.approved': [
          { guard: 'isCallDecision', target: 'READY', actions: 'decideCall' },
          {
            guard: 'isGateDecision',
            target: 'READY',
            actions: [assign({ approval: ({ event }) => decisionOf(event) }), 'nextAttempt'],
          },
        ],
        'gate.rejected': [
          { guard: 'isCallDecision', target: 'READY', actions: 'decideCall' },
          {
            guard: 'isGateDecision',
            target: 'FAILED_FINAL',
            actions: assign({
              rejection: ({ event }) => decisionOf(event),
              reason: StepReason.approvalRejected,
              updatedAt: ({ event }) => event.at,
            }),
          },
        ],
        'step.skipped': { guard: 'isSkipRequest', target: 'SKIPPED', actions: 'close' },
        'step.cancel': { target: 'CANCELLED', actions: 'close' },
      },
    },
    RUNNING: {
      entry: { type: 'report', params: ({ context }) => stepReport('RUNNING', context) },
      on: {
        'wait.started': { guard: 'isCurrentAttempt', target: 'WAITING', actions: 'startWait' },
        'step.cacheHit': { guard: 'isCurrentAttempt', actions: 'noteCacheHit' },
        'step.succeeded': { guard: 'isCurrentAttempt', target: 'SUCCEEDED', actions: 'succeed' },
        'step.failed': [
          { guard: 'canRetry', target: 'FAILED_RETRYABLE', actions: 'failRetryable' },
          { guard: 'canFallBack', target: 'READY', actions: 'startFallback' },
          { guard: 'isCurrentAttempt', target: 'FAILED_FINAL', actions: 'failFinal' },
        ],
        'tool.approvalRequested': {
          guard: 'isCurrentAttempt',
          target: 'WAITING_APPROVAL',
          actions: 'holdCall',
        },
        'turn.committed': { guard: 'isNextTurn', actions: 'commitTurn' },
        'step.skipped': [
          { guard: 'isSkipOfRunningAttempt', target: 'SKIPPED', actions: 'close' },
          { guard: 'isSkipRequest', target: 'SKIPPED', actions: ['close', 'markAborted'] },
        ],
        'step.cancel': { target: 'CANCELLED', actions: ['close', 'markAborted'] },
      },
    },
    // A wait step waits for a signal or a time: no worker holds it. The unit that takes the signal
    // or fires the timer commits its success (or a signal wait's timeout, final) straight from here.
    WAITING: {
      entry: { type: 'report', params: ({ context }) => stepReport('WAITING', context) },
      on: {
        'step.succeeded': { guard: 'isCurrentAttempt', target: 'SUCCEEDED', actions: 'succeed' },
        'step.failed': [
          // A run step whose child failed: its retry policy decides (a new attempt, a new child).
          { guard: 'canRetry', target: 'FAILED_RETRYABLE', actions: 'failRetryable' },
          { guard: 'isCurrentAttempt', target: 'FAILED_FINAL', actions: 'failFinal' },
        ],
        // A conversation step with a message to take: its next turn is due.
        'wait.woken': {
          guard: 'isCurrentAttempt',
          target: 'READY',
          actions: assign({ wait: null, updatedAt: ({ event }) => event.at }),
        },
        'step.skipped': { guard: 'isSkipRequest', target: 'SKIPPED', actions: 'close' },
        'step.cancel': { target: 'CANCELLED', actions: 'close' },
      },
    },
    FAILED_RETRYABLE: {
      entry: { type: 'report', params: ({ context }) => stepReport('FAILED_RETRYABLE', context) },
      on: {
        'retry.due': { guard: 'isNextAttemptDue', target: 'READY', actions: 'nextAttempt' },
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
