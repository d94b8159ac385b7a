/**
 * Starting runs: a new run (or the one a request key leads to), a handle on an existing run, and
 * what a handle reads. Each a plain function of the runtime core.
 */
import type { RuntimeCore } from '../actors/core.js';
import type { Plan, PlanInput } from '../plan/schema.js';
import { withRedisDeadline } from '../persistence/redis-errors.js';
import type { StepOutcome } from '../schemas/outcomes.js';
import { launchRun, type LaunchedRun, type StartOptions } from '../worker/start-run.js';
import { outcomesOf } from '../worker/streams.js';
import { resumeRun } from './decisions.js';
import { loadRun, readReport, waitSettled, type RunReport } from './reading.js';
import { InputValidationError } from '../errors.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { runExists } from '../persistence/run-lookups.js';
import {
  checkDebounce,
  checkDebouncedStart,
  debounceStart,
  type DebounceInfo,
  type DebounceOptions,
} from './debounce.js';
import {
  checkSingleton,
  checkStillHeld,
  releaseUnused,
  singletonHooks,
  type SingletonOptions,
  type SingletonOutcome,
} from './singleton.js';
import { appendSignal, checkSignal, type SignalReceipt, type StartSignal } from './signals.js';

/** Options of `runtime.start`: a start's, and a signal for the run the request key leads to. */
export interface BeginOptions extends StartOptions {
  /**
   * Start or signal: with `requestKey`, the signal is sent to the run the key leads to, whether
   * this call started it or found it; concurrent calls with one key make one run, and each call's
   * signal is delivered once (give each an `id` to make a call's retry a no-op).
   */
  signal?: StartSignal;
  /**
   * At most one live run per key (and tenant): while a run started with the key has not ended, a
   * start in mode `'skip'` (the default) starts nothing and returns that run with `skipped: true`;
   * one in mode `'cancel_previous'` cancels it and starts its own (`cancelled` names the run).
   * The key is released when its run ends (succeeds, fails or is cancelled). Concurrent starts of
   * one key, from any number of processes, make one live run.
   */
  singleton?: SingletonOptions;
  /**
   * A burst of starts of one key (and tenant), each within `delayMs` of the one before, becomes one
   * run with the last start's input (and options), started `delayMs` after the last start, or
   * `maxDelayMs` after the first. Every start of a burst returns the run id the burst's run will
   * have (chosen by its first start; `created: false`, `debounce` says when it is due); the run is
   * started by a worker of the run's queue. Goes with neither `runId`, `requestKey`,
   * `resumeFailed`, `signal` nor `singleton`.
   */
  debounce?: DebounceOptions;
}

/** A started (or found) run. */
export interface RunHandle {
  runId: string;
  /** False when a request key led to a run that already existed. */
  created: boolean;
  /** Where the start's `signal` went, when it had one. */
  signal?: SignalReceipt;
  /**
   * True when a `singleton` start (mode `'skip'`) found a live run of its key and started nothing:
   * `runId` is that run.
   */
  skipped?: boolean;
  /** The live run of its key that a `singleton` start in mode `'cancel_previous'` cancelled. */
  cancelled?: string;
  /**
   * For a `debounce` start: its key and when the burst's run is due. `runId` is the run the
   * burst becomes: `status()` finds it once it started, and `settled()` waits for it to start.
   */
  debounce?: DebounceInfo;
  /** The run's status report now. */
  status(): Promise<RunReport>;
  /** Resolves when the run succeeds, fails, is cancelled, or waits for a person. */
  settled(options?: { timeoutMs?: number }): Promise<RunReport>;
  /** The run's typed outcomes from its event stream; `follow` keeps reading until it ends. */
  outcomes(options?: { follow?: boolean; signal?: AbortSignal }): AsyncIterable<StepOutcome>;
}

/** The handle on run `runId`: its status within the Redis deadline, its settling, its outcomes. */
export function runHandle(core: RuntimeCore, runId: string, created: boolean): RunHandle {
  return {
    runId,
    created,
    status: () => withRedisDeadline(() => readReport(core, runId), core.redisTimeoutMs, core.redis),
    settled: (o) => waitSettled(core, runId, o?.timeoutMs),
    outcomes: (o) => outcomesOf(core, runId, o),
  };
}

/**
 * Starts a run of `planSource` with `input`, or finds the one its request key names
 * (`runtime.start`). A request key whose run failed resumes that run when `resumeFailed` says so.
 */
export async function beginRun(
  core: RuntimeCore,
  planSource: Plan | PlanInput | string,
  input: unknown = null,
  options: BeginOptions = {},
): Promise<RunHandle> {
  const { signal, singleton: singletonOption, debounce: debounceOption, ...opts } = options;
  if (debounceOption !== undefined) {
    return debouncedRun(core, planSource, input, options);
  }
  // The options are checked before anything is written: a bad one starts nothing.
  const singleton = singletonOption === undefined ? undefined : checkSingleton(singletonOption);
  const text = signal === undefined ? undefined : startSignalText(core, planSource, signal, opts);
  const started = await launchSingleton(core, planSource, input, opts, singleton);
  if (opts.resumeFailed === true && started.found === 'failed') {
    await resumeRun(core, started.runId, { by: 'request-key' });
  }
  const handle = {
    ...runHandle(core, started.runId, started.created),
    ...(started.skipped === true ? { skipped: true } : {}),
    ...(started.cancelled === undefined ? {} : { cancelled: started.cancelled }),
  };
  if (signal === undefined || text === undefined) return handle;
  const receipt = await appendSignal(core, started.runId, signal.name, text, signal.id ?? null);
  return { ...handle, signal: receipt };
}

/**
 * `launchRun`, with the claim of a singleton key when the start has one: a run created under a
 * key taken meanwhile cancels itself, and a claim whose run was not created is released.
 */
async function launchSingleton(
  core: RuntimeCore,
  planSource: Plan | PlanInput | string,
  input: unknown,
  opts: StartOptions,
  singleton: Required<SingletonOptions> | undefined,
): Promise<LaunchedRun & { cancelled?: string }> {
  if (singleton === undefined) return launchRun(core, planSource, input, opts, true);
  const outcome: SingletonOutcome = {};
  const tenantId = opts.tenantId ?? core.tenantId;
  let started: LaunchedRun;
  try {
    started = await launchRun(core, planSource, input, opts, true, {
      ...singletonHooks(core, singleton, outcome),
    });
  } catch (error) {
    await releaseUnused(core, outcome, null, tenantId, singleton.key).catch(() => {});
    throw error;
  }
  await releaseUnused(core, outcome, started.runId, tenantId, singleton.key);
  if (started.created) await checkStillHeld(core, started.runId, tenantId, singleton.key);
  return outcome.cancelled === undefined ? started : { ...started, cancelled: outcome.cancelled };
}

/** A debounced start (see `BeginOptions.debounce`): its options checked, then its burst joined. */
async function debouncedRun(
  core: RuntimeCore,
  planSource: Plan | PlanInput | string,
  input: unknown,
  options: BeginOptions,
): Promise<RunHandle> {
  const { debounce: debounceOption, singleton, ...opts } = options;
  const debounce = checkDebounce(debounceOption);
  checkDebouncedStart(opts);
  if (singleton !== undefined) {
    throw new InputValidationError('start options', [
      { path: 'singleton', message: 'does not go with debounce: give one or the other' },
    ]);
  }
  const { runId, debounce: info } = await debounceStart(core, planSource, input, opts, debounce);
  const handle = runHandle(core, runId, false);
  return {
    ...handle,
    debounce: info,
    // A run that is not there when the time is up: its report says so (run not found).
    settled: async (o) =>
      handle.settled({ timeoutMs: await waitCreated(core, runId, o?.timeoutMs) }),
  };
}

/**
 * Waits until run `runId` exists (a debounced run, started when its burst ends), at most
 * `timeoutMs` (0: no limit); returns the time left of it (0 when there was no limit).
 */
async function waitCreated(core: RuntimeCore, runId: string, timeoutMs = 0): Promise<number> {
  const until = timeoutMs > 0 ? core.clock() + timeoutMs : Infinity;
  while (!(await runExists(core.redis, core.stores.keys, runId)) && core.clock() < until) {
    await sleep(50);
  }
  return timeoutMs > 0 ? Math.max(1, until - core.clock()) : 0;
}

/** A start's signal, checked against the plan: it needs a request key to find its run by. */
function startSignalText(
  core: RuntimeCore,
  planSource: Plan | PlanInput | string,
  signal: StartSignal,
  opts: StartOptions,
): string {
  if (opts.requestKey === undefined) {
    throw new InputValidationError('start', [
      {
        path: 'signal',
        message:
          'a start with a signal needs a requestKey (the run it starts, or finds, by that key takes the signal); add requestKey, or send the signal with runtime.signal',
      },
    ]);
  }
  const plan = core.meta.plans.parse(planSource);
  return checkSignal(core, plan.name, signal.name, signal.payload, signal.id);
}

/** A handle on an existing run (`runtime.attach`); refuses a run that does not exist (any more). */
export async function attachRun(core: RuntimeCore, runId: string): Promise<RunHandle> {
  await loadRun(core, runId);
  return runHandle(core, runId, false);
}
