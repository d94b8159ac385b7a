import { z } from 'zod';
import type { SerializedError } from '../errors.js';

/** zod schema of a {@link SerializedError}: how errors are stored in snapshots, events and outcomes. */
export const serializedErrorSchema = z
  .object({
    name: z.string().min(1),
    code: z.string().min(1),
    message: z.string(),
    retryable: z.boolean(),
    retryAfterMs: z.number().int().nonnegative().optional(),
    details: z.unknown().optional(),
    thrown: z
      .object({
        name: z.string(),
        message: z.string(),
        stack: z.string().optional(),
        causes: z.array(z.object({ name: z.string(), message: z.string() }).strict()).optional(),
      })
      .strict()
      .optional(),
  })
  .strict() satisfies z.ZodType<SerializedError>;
