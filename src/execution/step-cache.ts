/**
 * The cache classes of a step (`cachePolicy`), around one execution of its primary: a hit returns
 * the stored output without running the step; a miss runs it and stores what it produced. The key
 * is the hash of the step's code identity (operator or agent name and registered version), its
 * input and its dependencies' outputs; entries are the tenant's, so any of its runs may hit.
 */
import { StepNonDeterminismError } from '../errors.js';
import { canonicalHash } from '../internal/canonical-hash.js';
import type { JsonValue } from '../internal/json.js';
import type { StepState } from '../machines/kernel.js';
import type { CacheSource } from '../machines/types.js';
import type { PlanStep } from '../plan/schema.js';
import type { CacheEntry, CacheStore } from '../persistence/cache-store.js';
import type { Logger } from '../logging.js';
import type { StepResult } from './execute-step.js';

/** What the cache of step outputs needs. */
export interface StepCacheDeps {
  cache: CacheStore;
  /** A time source, epoch ms: a plain value read, not a call back up (the runtime's clock). */
  clock: () => number;
  /** The code identities of the registered operators and agents (the runtime's registry). */
  identities: StepIdentities;
  /** Warned when a cache read or write failed; the step then runs (or keeps its output) uncached. */
  log?: Pick<Logger, 'warn'>;
}

/** Says what code a step runs, for its cache key. */
export interface StepIdentities {
  /** The code identity of the step's primary: kind, name, registered version (and an agent's settings). */
  identityOf(step: PlanStep): JsonValue;
}

/** What the run's start said about cached outputs. */
export interface RunCacheOptions {
  /** Stable nondeterministic steps may use a stored output. @defaultValue false */
  allowCacheHit?: boolean;
  /** Cached steps run even on a hit (a deterministic one is still checked). @defaultValue false */
  refresh?: boolean;
}

/** Where a step's output came from when a cache entry gave it. */
export type CacheHit = CacheSource;

/** The cache key of `step` on `input` and `depOutputs` (a SHA-256 in hex). */
export function stepCacheKey(
  identity: JsonValue,
  input: JsonValue,
  depOutputs: Readonly<Record<string, JsonValue>>,
): string {
  return canonicalHash({ identity, input, deps: depOutputs }, 'step cache key');
}

/** What one step attempt executes on: its step and state, its run, and the inputs it reads. */
export interface AttemptInputs {
  step: PlanStep;
  state: StepState;
  runId: string;
  tenantId: string;
  runInput: JsonValue;
  depOutputs: Record<string, JsonValue>;
}

/**
 * Runs `execute` (the step's primary) under the step's cache policy. Nothing is cached for a step
 * of class `none` or in its fallback phase. A deterministic step that runs and produces an output
 * other than the stored one (canonical JSON compared byte-wise) fails with `NonDeterminismError`.
 */
export async function executeCached(
  deps: StepCacheDeps,
  args: AttemptInputs & {
    options: RunCacheOptions;
    /** Decides before a hit is used (the step's tagged policies): a result here ends the attempt. */
    beforeHit?: () => Promise<StepResult | null>;
  },
  execute: () => Promise<StepResult>,
): Promise<StepResult> {
  const { step, state, runId, tenantId, options } = args;
  const policy = step.cachePolicy;
  if (policy.class === 'none' || state.fallback?.active === true) return execute();
  const identity = deps.identities.identityOf(step);
  const input = step.input === undefined ? args.runInput : step.input;
  const key = stepCacheKey(identity, input, args.depOutputs);
  const now = deps.clock();

  const entry = await guard(() => deps.cache.get(tenantId, key), null);
  if (entry !== null && entry.cacheClass === policy.class && options.refresh !== true) {
    const usable =
      policy.class === 'deterministic' ||
      (policy.class === 'stable_nondeterministic' &&
        (policy.allowCacheHit || options.allowCacheHit === true)) ||
      (policy.class === 'external' && (entry.expiresAt ?? 0) > now);
    if (usable) {
      const refused = (await args.beforeHit?.()) ?? null;
      if (refused !== null) return refused;
      return {
        kind: 'succeeded',
        output: entry.output,
        cacheHit: {
          runId: entry.runId,
          storedAt: entry.storedAt,
          cacheClass: entry.cacheClass,
          provenance: entry.provenance ?? null,
        },
      };
    }
  }

  const result = await execute();
  if (result.kind !== 'succeeded') return result;
  const outputHash = canonicalHash(result.output, 'step output');
  if (policy.class === 'deterministic') {
    const stored = await guard(() => deps.cache.digest(tenantId, key), null);
    if (stored !== null && stored.outputHash !== outputHash) {
      const error = new StepNonDeterminismError(
        step.id,
        stored.runId,
        stored.outputHash,
        outputHash,
      );
      return { kind: 'failed', error: error.toJSON() };
    }
  }
  const storedAt = deps.clock();
  const stored: CacheEntry = {
    cacheClass: policy.class,
    output: result.output,
    outputHash,
    runId,
    stepId: step.id,
    storedAt,
    identity,
    ...(policy.class === 'stable_nondeterministic'
      ? { inputs: { input, deps: args.depOutputs } }
      : {}),
    ...(policy.class === 'external'
      ? { provenance: policy.provenance, fetchedAt: storedAt, expiresAt: storedAt + policy.ttlMs }
      : {}),
  };
  await guard(() => deps.cache.put(tenantId, key, stored), false);
  return result;

  async function guard<T>(op: () => Promise<T>, fallback: T): Promise<T> {
    try {
      return await op();
    } catch (error) {
      deps.log?.warn(
        { stepId: step.id, error: error instanceof Error ? error.message : String(error) },
        'the step cache failed; the step runs uncached',
      );
      return fallback;
    }
  }
}
