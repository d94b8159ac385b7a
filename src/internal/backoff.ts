import { unitFromSeed } from './rng.js';

/** The parts of a retry policy that decide the delay. */
export interface BackoffPolicy {
  initialDelayMs: number;
  backoffCoefficient: number;
  maxDelayMs: number;
  /** Fraction of the delay, in [0, 1], that jitter may take away. */
  jitter: number;
}

/**
 * Delay before the attempt that follows failed attempt `failedAttempt` (1-based): exponential,
 * capped at `maxDelayMs`, minus up to `jitter` of itself drawn from `seed`, and never sooner than
 * `retryAfterMs` when the failure said when to come back (a rate limit's `retry-after`).
 */
export function retryDelayMs(
  policy: BackoffPolicy,
  failedAttempt: number,
  seed: number,
  retryAfterMs?: number,
): number {
  const exponential = policy.initialDelayMs * policy.backoffCoefficient ** (failedAttempt - 1);
  const capped = Math.min(policy.maxDelayMs, exponential);
  const jittered = Math.round(capped * (1 - policy.jitter * unitFromSeed(seed)));
  return Math.max(jittered, retryAfterMs ?? 0);
}
