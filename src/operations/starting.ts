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

/** A started (or found) run. */
export interface RunHandle {
  runId: string;
  /** False when a request key led to a run that already existed. */
  created: boolean;
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
  opts: StartOptions = {},
): Promise<RunHandle> {
  const started = await launchRun(core, planSource, input, opts, true);
  if (opts.resumeFailed === true && started.found === 'failed') {
    await resumeRun(core, started.runId, { by: 'request-key' });
  }
  return runHandle(core, started.runId, started.created);
}

/** A handle on an existing run (`runtime.attach`); refuses a run that does not exist (any more). */
export async function attachRun(core: RuntimeCore, runId: string): Promise<RunHandle> {
  await loadRun(core, runId);
  return runHandle(core, runId, false);
}
