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
  })
  .strict() satisfies z.ZodType<SerializedError>;
