import { isFinalStepStatus, type RunStatus, type StepView } from './types.js';

/** What the run's status is derived from. */
export interface RunStatusInput {
  steps: Readonly<Record<string, StepView>>;
  dependsOn: Readonly<Record<string, readonly string[]>>;
  cancelRequested: boolean;
  /** The runtime stopped the run (a budget): it ends failed. */
  stopped?: boolean;
}

const satisfies = (view: StepView | undefined): boolean =>
  view !== undefined && (view.status === 'SUCCEEDED' || view.status === 'SKIPPED');

/**
 * The run's status, derived from its steps (never stored apart from them):
 * - every step final: `cancelled` if cancel was requested, else `failed` if any step failed finally
 *   or was cancelled (a step is only cancelled without a run cancel when upstream of it failed),
 *   or the runtime stopped the run (a budget), else `succeeded` (every step SUCCEEDED or SKIPPED);
 * - otherwise `running` while any step is running, ready (or pending with its dependencies met) or
 *   due for a retry, else `waiting` (only a person deciding on a gate or a call, a signal or a
 *   wait step's time can move the run on: WAITING_APPROVAL and WAITING steps are not active, but
 *   for a run step waiting for its child run, which works meanwhile).
 */
export function deriveRunStatus({
  steps,
  dependsOn,
  cancelRequested,
  stopped = false,
}: RunStatusInput): RunStatus {
  let allFinal = true;
  let anyFailed = false;
  let anyActive = false;
  for (const id of Object.keys(steps)) {
    const view = steps[id];
    if (view === undefined) continue;
    const s = view.status;
    // A pending step whose dependencies are all met is about to start: it counts as active.
    if (s === 'PENDING' && (dependsOn[id] ?? []).every((d) => satisfies(steps[d])))
      anyActive = true;
    if (!isFinalStepStatus(s)) allFinal = false;
    if (s === 'FAILED_FINAL' || s === 'CANCELLED') anyFailed = true;
    if (s === 'RUNNING' || s === 'READY' || s === 'FAILED_RETRYABLE') anyActive = true;
    // A step waiting for its child run: the child works, so the run does.
    if (s === 'WAITING' && view.child === true) anyActive = true;
  }
  if (allFinal) {
    if (cancelRequested) return 'cancelled';
    return anyFailed || stopped ? 'failed' : 'succeeded';
  }
  return anyActive ? 'running' : 'waiting';
}
