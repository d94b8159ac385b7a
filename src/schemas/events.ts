import { z } from 'zod';
import { jsonValueSchema } from '../internal/json.js';
import { serializedErrorSchema } from './error.js';

/** Epoch milliseconds. Time enters the core only through events. */
const at = z.number().int().nonnegative();
const stepId = z.string().min(1);
const attempt = z.number().int().min(1);

/**
 * Attempt `attempt` of step `stepId` finished and returned `output`; `producedBy` says whether the
 * step's fallback produced it (absent: the primary).
 */
export const stepSucceededSchema = z
  .object({
    type: z.literal('step.succeeded'),
    stepId,
    attempt,
    output: jsonValueSchema,
    producedBy: z.enum(['primary', 'fallback']).optional(),
    at,
  })
  .strict();

/**
 * Attempt `attempt` of step `stepId` did not run: its output is the cache entry run `sourceRunId`
 * stored at `storedAt` (committed with the `step.succeeded` that carries that output).
 */
export const stepCacheHitSchema = z
  .object({
    type: z.literal('step.cacheHit'),
    stepId,
    attempt,
    sourceRunId: z.string().min(1),
    storedAt: at,
    cacheClass: z.enum(['deterministic', 'stable_nondeterministic', 'external']),
    provenance: z.string().min(1).optional(),
    at,
  })
  .strict();

/**
 * A worker started executing attempt `attempt` (READY → RUNNING) at `at`. A worker commits it with
 * the first result of the execution (its outcome, a turn, a pause), so the stream records the
 * interval the attempt ran without a commit of its own (but a map step's, committed alone).
 */
export const stepStartedSchema = z
  .object({
    type: z.literal('step.started'),
    stepId,
    attempt,
    /**
     * A map step's attempt started with this many items: it stays RUNNING while its items run,
     * each a unit of its own, and no unit of the step itself is due.
     */
    items: z.number().int().nonnegative().optional(),
    at,
  })
  .strict();

/**
 * Attempt `attempt` reached a call of a tool with risk level high or critical that has no decision
 * yet: the step waits in WAITING_APPROVAL showing the call until a person approves or rejects it.
 */
export const toolApprovalRequestedSchema = z
  .object({
    type: z.literal('tool.approvalRequested'),
    stepId,
    attempt,
    callId: z.string().min(1),
    tool: z.string().min(1),
    args: jsonValueSchema,
    toolCallId: z.string().min(1).optional(),
    turn: z.number().int().nonnegative().optional(),
    at,
  })
  .strict();

/**
 * Attempt `attempt` failed with `error`. `jitterSeed` (a 32-bit integer drawn by the sender) decides
 * the retry jitter, so replaying the event schedules the retry at the same time.
 */
export const stepFailedSchema = z
  .object({
    type: z.literal('step.failed'),
    stepId,
    attempt,
    error: serializedErrorSchema,
    jitterSeed: z.number().int().min(0).max(0xffffffff),
    at,
  })
  .strict();

/**
 * The step is skipped: with `attempt`, the running attempt decided there is nothing to do; without,
 * a step that has not run (pending, waiting for approval or for a retry) is skipped by request.
 */
export const stepSkippedSchema = z
  .object({
    type: z.literal('step.skipped'),
    stepId,
    attempt: attempt.optional(),
    reason: z.string().min(1),
    /** Who skipped it, for a skip by request. */
    by: z.string().min(1).optional(),
    at,
  })
  .strict();

const decision = {
  stepId,
  by: z.string().min(1),
  comment: z.string().optional(),
  /** The tool call decided on, when the step waits on one; must be the call it waits on. */
  callId: z.string().min(1).optional(),
  at,
};
/**
 * A person approved what a step waits on: its gate (the step starts an attempt), or the tool call
 * it waits on (the attempt goes on, and this call may run once).
 */
export const gateApprovedSchema = z
  .object({ type: z.literal('gate.approved'), ...decision })
  .strict();
/**
 * A person rejected what a step waits on: its gate (the step fails finally), or the tool call it
 * waits on (the attempt goes on, and the call is refused).
 */
export const gateRejectedSchema = z
  .object({ type: z.literal('gate.rejected'), ...decision })
  .strict();

/** The backoff of a failed step has elapsed: start attempt `attempt`. */
export const retryDueSchema = z
  .object({ type: z.literal('retry.due'), stepId, attempt, at })
  .strict();

/**
 * Turn `turn` (0-based) of a granular agent step's attempt `attempt` is committed: the step's
 * history now holds `cursor` messages, and `fingerprint` is what the turn ran under. Accepted
 * only for the current attempt's next turn, with the fingerprint of the first turn.
 */
export const turnCommittedSchema = z
  .object({
    type: z.literal('turn.committed'),
    stepId,
    attempt,
    turn: z.number().int().nonnegative(),
    cursor: z.number().int().positive(),
    fingerprint: z.string().regex(/^[0-9a-f]{64}$/),
    at,
  })
  .strict();

/**
 * Attempt `attempt` of wait step `stepId` started waiting (READY → WAITING): for the next signal
 * named `signal` (until `dueAt` when the step has a `timeoutMs`), or for the time `dueAt` (a
 * timer); or attempt `attempt` of run step `stepId` waits for its child run `child` to end. `dueAt` is computed once, here, so that a restart never moves it.
 */
export const waitStartedSchema = z
  .object({
    type: z.literal('wait.started'),
    stepId,
    attempt,
    signal: z.string().min(1).optional(),
    dueAt: at.optional(),
    /** A run step: the id of the child run it waits for. */
    child: z.string().min(1).optional(),
    at,
  })
  .strict();

/**
 * A conversation step (a granular agent step that waits for the messages of its inbox) goes on
 * (WAITING → READY): a message, or an `end` signal, is in its inbox. Its next turn takes it.
 */
export const waitWokenSchema = z
  .object({ type: z.literal('wait.woken'), stepId, attempt, at })
  .strict();

/**
 * Wait step `stepId` takes the signal `name` number `index` (0-based, in send order among the
 * signals of that name): the run's cursor for `name` moves past it. Accepted only when `index` is
 * the cursor, so a signal is taken once; committed with the step's `step.succeeded`.
 */
export const signalTakenSchema = z
  .object({
    type: z.literal('signal.taken'),
    stepId,
    attempt,
    /** The turn of a granular agent step that took it as a message, or ended with it. */
    turn: z.number().int().nonnegative().optional(),
    name: z.string().min(1),
    index: z.number().int().nonnegative(),
    /** The signal's place in the run's inbox, all names together (1-based). */
    seq: z.number().int().positive(),
    id: z.string().min(1).optional(),
    at,
  })
  .strict();

/** Cancellation of the whole run was requested. */
export const runCancelledSchema = z
  .object({
    type: z.literal('run.cancelled'),
    by: z.string().min(1).optional(),
    reason: z.string().min(1).optional(),
    at,
  })
  .strict();

/**
 * The run is stopped by the runtime, e.g. a budget was hit (`reason: 'budget_exceeded'`): open
 * steps are cancelled and the run ends `failed` with this reason. `detail` says which limit.
 */
export const runStoppedSchema = z
  .object({
    type: z.literal('run.stopped'),
    reason: z.string().min(1),
    detail: jsonValueSchema.optional(),
    at,
  })
  .strict();

/**
 * A failed run is resumed: its failed and cancelled steps start again as fresh step actors (their
 * attempt numbers go on), the ones whose dependencies are met at once.
 */
export const runResumedSchema = z
  .object({ type: z.literal('run.resumed'), by: z.string().min(1).optional(), at })
  .strict();

/** Every event a run accepts from outside. */
export const runEventSchema = z.discriminatedUnion('type', [
  stepStartedSchema,
  toolApprovalRequestedSchema,
  stepSucceededSchema,
  stepCacheHitSchema,
  stepFailedSchema,
  stepSkippedSchema,
  gateApprovedSchema,
  gateRejectedSchema,
  retryDueSchema,
  turnCommittedSchema,
  waitStartedSchema,
  waitWokenSchema,
  signalTakenSchema,
  runCancelledSchema,
  runStoppedSchema,
  runResumedSchema,
]);

export type StepStartedEvent = z.infer<typeof stepStartedSchema>;
export type ToolApprovalRequestedEvent = z.infer<typeof toolApprovalRequestedSchema>;
/** An attempt of a step finished and returned its output (`step.succeeded`). */
export type StepSucceededEvent = z.infer<typeof stepSucceededSchema>;
export type StepCacheHitEvent = z.infer<typeof stepCacheHitSchema>;
/** An attempt of a step failed (`step.failed`); its error says whether it may be retried. */
export type StepFailedEvent = z.infer<typeof stepFailedSchema>;
/** A step was skipped (`step.skipped`): its dependents run with its output `null`. */
export type StepSkippedEvent = z.infer<typeof stepSkippedSchema>;
/** A person approved a step's gate or the tool call it waits on (`gate.approved`). */
export type GateApprovedEvent = z.infer<typeof gateApprovedSchema>;
/** A person rejected a step's gate or the tool call it waits on (`gate.rejected`). */
export type GateRejectedEvent = z.infer<typeof gateRejectedSchema>;
/** The backoff of a failed step has elapsed: its next attempt may start (`retry.due`). */
export type RetryDueEvent = z.infer<typeof retryDueSchema>;
/** A turn of a granular agent step is committed (`turn.committed`). */
export type TurnCommittedEvent = z.infer<typeof turnCommittedSchema>;
/** A wait step started waiting (`wait.started`). */
export type WaitStartedEvent = z.infer<typeof waitStartedSchema>;
/** A conversation step goes on with a message (`wait.woken`). */
export type WaitWokenEvent = z.infer<typeof waitWokenSchema>;
/** A wait step took a signal (`signal.taken`). */
export type SignalTakenEvent = z.infer<typeof signalTakenSchema>;
/** Cancellation of the whole run was requested (`run.cancelled`). */
export type RunCancelledEvent = z.infer<typeof runCancelledSchema>;
export type RunStoppedEvent = z.infer<typeof runStoppedSchema>;
export type RunResumedEvent = z.infer<typeof runResumedSchema>;
/** An event a run accepts from outside (validated by {@link runEventSchema}). */
export type RunEvent = z.infer<typeof runEventSchema>;
