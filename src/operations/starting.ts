/**
 * Starting runs: a new run (or the one a request key leads to), a handle on an existing run, and
 * what a handle reads. Each a plain function of the runtime core.
 */
import type { RuntimeCore } from '../actors/core.js';
import type { Plan, PlanInput } from '../plan/schema.js';
import { withRedisDeadline } from '../persistence/redis-errors.js';
import type { StepOutcome } from '../schemas/outcomes.js';
import { launchRun, type StartOptions } from '../worker/start-run.js';
import { outcomesOf } from '../worker/streams.js';
import { resumeRun } from './decisions.js';
import { loadRun, readReport, waitSettled, type RunReport } from './reading.js';
import { InputValidationError } from '../errors.js';
import { appendSignal, checkSignal, type SignalReceipt, type StartSignal } from './signals.js';

/** Options of `runtime.start`: a start's, and a signal for the run the request key leads to. */
export interface BeginOptions extends StartOptions {
  /**
   * Start or signal: with `requestKey`, the signal is sent to the run the key leads to, whether
   * this call started it or found it; concurrent calls with one key make one run, and each call's
   * signal is delivered once (give each an `id` to make a call's retry a no-op).
   */
  signal?: StartSignal;
}

/** A started (or found) run. */
export interface RunHandle {
  runId: string;
  /** False when a request key led to a run that already existed. */
  created: boolean;
  /** Where the start's `signal` went, when it had one. */
  signal?: SignalReceipt;
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
  const { signal, ...opts } = options;
  // The signal is checked before anything is written: a bad one starts nothing.
  const text = signal === undefined ? undefined : startSignalText(core, planSource, signal, opts);
  const started = await launchRun(core, planSource, input, opts, true);
  if (opts.resumeFailed === true && started.found === 'failed') {
    await resumeRun(core, started.runId, { by: 'request-key' });
  }
  const handle = runHandle(core, started.runId, started.created);
  if (signal === undefined || text === undefined) return handle;
  const receipt = await appendSignal(core, started.runId, signal.name, text, signal.id ?? null);
  return { ...handle, signal: receipt };
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
