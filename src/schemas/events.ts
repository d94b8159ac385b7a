import { z } from 'zod';
import { jsonValueSchema } from '../internal/json.js';
import { serializedErrorSchema } from './error.js';

/** Epoch milliseconds. Time enters the core only through events. */
const at = z.number().int().nonnegative();
const stepId = z.string().min(1);
const attempt = z.number().int().min(1);

/** Attempt `attempt` of step `stepId` finished and returned `output`. */
export const stepSucceededSchema = z
  .object({ type: z.literal('step.succeeded'), stepId, attempt, output: jsonValueSchema, at })
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
    at,
  })
  .strict();

const decision = { stepId, by: z.string().min(1), comment: z.string().optional(), at };
/** A person approved the gate of a step waiting for approval. */
export const gateApprovedSchema = z
  .object({ type: z.literal('gate.approved'), ...decision })
  .strict();
/** A person rejected the gate of a step waiting for approval. */
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
  stepSucceededSchema,
  stepFailedSchema,
  stepSkippedSchema,
  gateApprovedSchema,
  gateRejectedSchema,
  retryDueSchema,
  turnCommittedSchema,
  runCancelledSchema,
  runStoppedSchema,
  runResumedSchema,
]);

export type StepSucceededEvent = z.infer<typeof stepSucceededSchema>;
export type StepFailedEvent = z.infer<typeof stepFailedSchema>;
export type StepSkippedEvent = z.infer<typeof stepSkippedSchema>;
export type GateApprovedEvent = z.infer<typeof gateApprovedSchema>;
export type GateRejectedEvent = z.infer<typeof gateRejectedSchema>;
export type RetryDueEvent = z.infer<typeof retryDueSchema>;
export type TurnCommittedEvent = z.infer<typeof turnCommittedSchema>;
export type RunCancelledEvent = z.infer<typeof runCancelledSchema>;
export type RunStoppedEvent = z.infer<typeof runStoppedSchema>;
export type RunResumedEvent = z.infer<typeof runResumedSchema>;
/** An event a run accepts from outside (validated by {@link runEventSchema}). */
export type RunEvent = z.infer<typeof runEventSchema>;
