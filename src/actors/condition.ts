/**
 * The unit of a conditional step (`when`) whose condition is false: instead of running the step,
 * it commits the step's skip (`step.skipped`, reason `condition_false`), and the run machine skips
 * the steps that depended on untaken steps only. The condition reads the output of an ancestor of
 * the step, which the run holds once the step is READY.
 */
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import { CONDITION_FALSE, conditionHolds } from '../plan/condition.js';
import type { RunEvent } from '../schemas/events.js';
import type { JobData } from './jobs.js';
import {
  commitUnit,
  nextUnit,
  outputsOf,
  type Admitted,
  type Chain,
  NO_RUN,
  type UnitHost,
  type UnitOutcome,
} from './unit.js';

/**
 * Whether the condition of an admitted step must be tested: the step has one, and this is its
 * first attempt, not yet begun (a later attempt, a resumed pause, a fallback or a later turn
 * comes after a first attempt that found the condition true; the outputs it reads never change).
 */
function tested(admitted: Admitted): boolean {
  const { step, state } = admitted;
  return (
    step.when !== undefined &&
    state.status === 'READY' &&
    state.attempt === 1 &&
    (state.pauses ?? 0) === 0 &&
    state.fallback?.active !== true &&
    state.agent === null
  );
}

/**
 * The unit of an admitted step whose condition is false: its skip, committed, and the unit that
 * commit made due (null when the step has no condition, or it holds: the step runs).
 */
export async function skipIfUntaken(
  host: UnitHost,
  data: JobData,
  admitted: Admitted,
  chain: Chain,
): Promise<UnitOutcome | null> {
  if (!tested(admitted)) return null;
  const { core } = host;
  const { env, step } = admitted;
  const when = step.when!;
  const { runId } = data;
  const outputs = await outputsOf(core, runId, env, [when.step]);
  if (conditionHolds(when, outputs[when.step] ?? null)) return null;
  const stepId = data.stepId!;
  const events: RunEvent[] = [
    {
      type: 'step.skipped',
      stepId,
      attempt: data.attempt!,
      reason: CONDITION_FALSE,
      at: core.clock(),
    },
  ];
  debugPoint(DebugPoint.beforeCommit, stepId);
  const { applied, next } = await commitUnit(host, { data, env, unit: NO_RUN, events, chain });
  debugPoint(DebugPoint.afterCommit, stepId);
  if (next !== null) return nextUnit(host, next, applied, chain, 'skipped');
  await core.queues.enqueuePlanned(runId, applied);
  return 'skipped';
}
