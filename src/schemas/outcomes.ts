import { z } from 'zod';
import { toFlujoError } from '../errors.js';
import { jsonValueSchema } from '../internal/json.js';
import { serializedErrorSchema } from './error.js';

const base = {
  runId: z.string().min(1),
  stepId: z.string().min(1),
  /** Epoch ms. */
  at: z.number().int().nonnegative(),
};

/** A step attempt finished with an output. */
export const successSchema = z
  .object({
    type: z.literal('success'),
    ...base,
    attempt: z.number().int().min(1),
    output: jsonValueSchema,
    /** For a step with a fallback: whether its primary or its fallback produced the output. */
    producedBy: z.enum(['primary', 'fallback']).optional(),
  })
  .strict();

/**
 * A step attempt failed. `feedback` is the human-readable account; `partial` is what the step had
 * produced when it failed, if anything; `final` says whether the step will be retried.
 */
export const failureSchema = z
  .object({
    type: z.literal('failure'),
    ...base,
    attempt: z.number().int().min(1),
    error: serializedErrorSchema,
    feedback: z.string(),
    partial: jsonValueSchema.optional(),
    final: z.boolean(),
  })
  .strict();

/** The step waits for a person (an approval) or for outside input; `stateToken` helps resume it. */
export const pausedSchema = z
  .object({
    type: z.literal('paused'),
    ...base,
    message: z.string(),
    stateToken: jsonValueSchema.optional(),
  })
  .strict();

/**
 * Execution was halted on purpose (cancel, budget, a rejected gate); `reason` is a code. Without
 * `stepId`, the whole run was halted.
 */
export const abortedSchema = z
  .object({
    type: z.literal('aborted'),
    ...base,
    stepId: z.string().min(1).optional(),
    reason: z.string().min(1),
    message: z.string().optional(),
  })
  .strict();

/** A piece of a streamed result (e.g. model tokens). Streamed live, never persisted. */
export const chunkSchema = z
  .object({
    type: z.literal('chunk'),
    ...base,
    attempt: z.number().int().min(1),
    /** Position of the chunk within its attempt, from 0. */
    seq: z.number().int().nonnegative(),
    data: jsonValueSchema,
  })
  .strict();

/** Every outcome a step execution yields. */
export const stepOutcomeSchema = z.discriminatedUnion('type', [
  successSchema,
  failureSchema,
  pausedSchema,
  abortedSchema,
  chunkSchema,
]);

/** A step attempt finished with an output. */
export type Success = z.infer<typeof successSchema>;
/** A step attempt failed. */
export type Failure = z.infer<typeof failureSchema>;
/** A step waits for a person or for outside input. */
export type Paused = z.infer<typeof pausedSchema>;
/** Execution was halted on purpose. */
export type Aborted = z.infer<typeof abortedSchema>;
/** A piece of a streamed result. */
export type Chunk = z.infer<typeof chunkSchema>;
/** Any typed, serializable outcome of a step execution. */
export type StepOutcome = z.infer<typeof stepOutcomeSchema>;

/** Reads an outcome from JSON (a string or a parsed value), validating its shape. */
export function parseOutcome(json: unknown): StepOutcome {
  return stepOutcomeSchema.parse(typeof json === 'string' ? JSON.parse(json) : json);
}

/**
 * The choke point's conversion: anything thrown by a step attempt becomes a `Failure` outcome that
 * keeps the error's name, code and retryability. `final` is the caller's decision (attempts left).
 */
export function failureFrom(
  thrown: unknown,
  where: { runId: string; stepId: string; attempt: number; at: number; final: boolean },
): Failure {
  const error = toFlujoError(thrown).toJSON();
  return {
    type: 'failure',
    runId: where.runId,
    stepId: where.stepId,
    attempt: where.attempt,
    at: where.at,
    error,
    feedback: `${error.name}: ${error.message}`,
    final: where.final,
  };
}
