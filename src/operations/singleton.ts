/**
 * Singleton starts (`start(…, { singleton: { key, mode } })`): at most one live run per key and
 * tenant. The key is claimed in one script (`persistence/singletons.ts`) after every check of the
 * start and before its first write; the run releases it when it ends (`RuntimeMeta.ended`). A
 * holder found ended (or never created, after {@link STALE_CLAIM_MS}) is cleared by the start that
 * finds it, so a process that died between a run's end and its release blocks nothing.
 */
import type { RuntimeCore } from '../actors/core.js';
import { InputValidationError, RunNotFoundError } from '../errors.js';
import type { SingletonHolder } from '../persistence/singletons.js';
import type { LaunchedRun, LaunchHooks } from '../worker/start-run.js';
import { cancelRun } from './decisions.js';

/** `start(…, { singleton })`: one live run per key. */
export interface SingletonOptions {
  /** The key (1 to 512 characters), per tenant. */
  key: string;
  /**
   * What a start does while a run of the key is live: `'skip'` starts nothing and returns that
   * run (`skipped: true` on the handle); `'cancel_previous'` cancels it and starts the new run.
   * @defaultValue 'skip'
   */
  mode?: 'skip' | 'cancel_previous';
}

/** How long a claimed key whose run does not exist yet counts as a start under way. */
export const STALE_CLAIM_MS = 30_000;

/** How many stale holders one start clears before it gives up (each clear is a race lost). */
const CLAIM_TRIES = 10;

/** Checks `singleton` (a start's option), naming the field of each problem. */
export function checkSingleton(value: unknown): Required<SingletonOptions> {
  const issues: { path: string; message: string }[] = [];
  const o = value as Partial<SingletonOptions> | null;
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    issues.push({
      path: 'singleton',
      message: `must be an object { key, mode? }, e.g. { key: "inbox-42", mode: "skip" }, got ${JSON.stringify(value)}`,
    });
  } else {
    if (typeof o!.key !== 'string' || o!.key.length === 0 || o!.key.length > 512) {
      issues.push({
        path: 'singleton.key',
        message: `must be a string of 1 to 512 characters, got ${JSON.stringify(o!.key)}`,
      });
    }
    if (o!.mode !== undefined && o!.mode !== 'skip' && o!.mode !== 'cancel_previous') {
      issues.push({
        path: 'singleton.mode',
        message: `must be "skip" or "cancel_previous", got ${JSON.stringify(o!.mode)}`,
      });
    }
  }
  if (issues.length > 0) throw new InputValidationError('start options', issues);
  return { key: o!.key!, mode: o!.mode ?? 'skip' };
}

/** Whether a holder's run is live, has ended, is being created, or never got created. */
async function holderState(
  core: RuntimeCore,
  holder: SingletonHolder,
): Promise<'live' | 'ended' | 'pending' | 'lost'> {
  const env = await core.stores.store.tryLoad(holder.runId, { outputs: false });
  if (env === null) return core.clock() - holder.at < STALE_CLAIM_MS ? 'pending' : 'lost';
  const { snapshot } = env;
  return snapshot.status !== 'active' || snapshot.value === 'failed' ? 'ended' : 'live';
}

/** What a singleton start did besides starting: the run it claimed the key for, the run it cancelled. */
export interface SingletonOutcome {
  claimed?: string;
  cancelled?: string;
}

/**
 * The claim of a singleton start (see `LaunchHooks.claim`): null when the key is now the new
 * run's; the live holder (`skipped`) in mode `skip`. In mode `cancel_previous` the key is taken
 * and its live holder cancelled (noted in `outcome`).
 */
export function singletonHooks(
  core: RuntimeCore,
  singleton: Required<SingletonOptions>,
  outcome: SingletonOutcome,
): LaunchHooks {
  const { key, mode } = singleton;
  const claim = async (runId: string, tenantId: string): Promise<LaunchedRun | null> => {
    const store = core.stores.singletons;
    for (let i = 0; i < CLAIM_TRIES; i++) {
      const r = await store.claim(tenantId, key, runId, core.clock(), mode === 'cancel_previous');
      if (r.claimed) {
        outcome.claimed = runId;
        const previous = r.previous;
        if (previous !== null && previous.runId !== runId) {
          if ((await holderState(core, previous)) === 'live') {
            await cancelPrevious(core, previous.runId, runId, key);
            outcome.cancelled = previous.runId;
          }
        }
        return null;
      }
      const state = await holderState(core, r.holder);
      if (state === 'live' || state === 'pending') {
        return { runId: r.holder.runId, created: false, skipped: true };
      }
      // Ended (its release was lost) or never created: cleared unless another start was first.
      await store.clear(tenantId, key, r.holder.raw);
    }
    throw new InputValidationError('start options', [
      {
        path: 'singleton.key',
        message: `key "${key}" changed hands ${CLAIM_TRIES} times while this start tried to claim it; start again`,
      },
    ]);
  };
  return { singleton: key, claim };
}

/** Cancels the live run of a singleton key taken over by run `by`. */
async function cancelPrevious(
  core: RuntimeCore,
  runId: string,
  by: string,
  key: string,
): Promise<void> {
  try {
    await cancelRun(core, runId, {
      by: 'singleton',
      reason: `superseded by run ${by} (singleton key "${key}", mode cancel_previous)`,
    });
  } catch (error) {
    if (!(error instanceof RunNotFoundError)) throw error;
  }
}

/**
 * After a singleton start created its run: if the key no longer names it (a `cancel_previous`
 * start took it between this start's claim and its create, and found no run to cancel yet), the
 * run cancels itself, so that one run of the key stays live.
 */
export async function checkStillHeld(
  core: RuntimeCore,
  runId: string,
  tenantId: string,
  key: string,
): Promise<void> {
  const holder = await core.stores.singletons.holder(tenantId, key);
  // No holder: the run ended already and released it.
  if (holder === null || holder.runId === runId) return;
  await cancelPrevious(core, runId, holder.runId, key);
}

/**
 * After a singleton start that claimed its key but created no run (its request key led to another
 * run, or the create failed): the key is released at once rather than left to lapse as a claim
 * whose run never came.
 */
export async function releaseUnused(
  core: RuntimeCore,
  outcome: SingletonOutcome,
  startedRunId: string | null,
  tenantId: string,
  key: string,
): Promise<void> {
  if (outcome.claimed === undefined || outcome.claimed === startedRunId) return;
  await core.stores.singletons.release(tenantId, key, outcome.claimed);
}
