/**
 * The life of one step attempt (an operator, a human gate's decision, a policy check, or an agent
 * step run whole: an atomic agent, or any agent running as a fallback), as one unit of work:
 *
 * 1. Admit: the attempt must still be due and the run's budgets allow it (`admitUnit`), unless the
 *    job's chain admitted it already when the commit before it made it due.
 * 2. Guard: the attempt's time limit (`attemptLimit`), and its execution aborted by a run cancel,
 *    its job, or that limit (`guardUnit`).
 * 3. Execute: the operator, agent or policy (`executeStep`), through the step cache
 *    (`executeCached`), which lets the tagged policies decide before a hit is taken.
 * 4. Commit: the attempt's events (`step.started` when it started the step, a cache hit's source,
 *    `step.succeeded` or `step.failed`) with its records, in one commit; a call that waits for a
 *    person commits the wait instead, and a busy tool call or a budget stop commits nothing of it.
 * 5. Next: the unit the commit made due goes on in the same job, else the queue gets what is due.
 *
 * The phases every kind of unit shares are in `unit.ts`.
 */
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import type { StepState } from '../machines/kernel.js';
import type { RunEvent } from '../schemas/events.js';
import {
  checkTaggedPolicies,
  executeStep,
  type StepExecutionDeps,
  type StepResult,
} from '../execution/execute-step.js';
import type { JobData } from './jobs.js';
import { executeCached } from '../execution/step-cache.js';
import { startUnit } from './unit-start.js';
import { takeSlots, wakeJobIdOf, withRecords } from './concurrency.js';
import type { RunEventRecord } from '../persistence/snapshot-store.js';
import { runWaitUnit } from './wait.js';
import { runMapUnit } from './map.js';
import { runChildUnit } from './child.js';
import { skipIfUntaken } from './condition.js';
import {
  admitUnit,
  agentUnit,
  attemptLimit,
  commitUnit,
  endsEarly,
  executionDepsFor,
  failed,
  guardUnit,
  nextUnit,
  notifyFailures,
  outputsOf,
  pauseUnit,
  replayOf,
  type Admitted,
  type Chain,
  type Unit,
  type UnitHost,
  type UnitOutcome,
} from './unit.js';

/**
 * One step attempt, whole: admitted (unless the chain `held` it admitted already), its
 * dependencies' outputs read, executed guarded through the step cache, and its result committed
 * (a pause, a busy tool call or a budget stop end it before). Returns what it came to.
 */
export async function runStepUnit(
  host: UnitHost,
  data: JobData,
  chain: Chain,
  jobSignal?: AbortSignal,
  held?: Admitted,
): Promise<UnitOutcome> {
  const { core } = host;
  // 1. Admit.
  const admitted = held ?? (await admitUnit(host, data, chain.self));
  if (typeof admitted === 'string') return admitted;
  // A step whose condition is false is skipped, not run.
  const untaken = await skipIfUntaken(host, data, admitted, chain);
  if (untaken !== null) return untaken;
  // The run's and the step's concurrency slots, or the unit parked until it gets them.
  const slots = await takeSlots(core, data, admitted, wakeJobIdOf(chain, held, data));
  if ('parked' in slots) return slots;
  try {
    // A wait step runs no code: its unit is a wait's (wait.ts).
    if (admitted.step.kind === 'wait') return await runWaitUnit(host, data, admitted);
    // A map step's own unit starts its items (map.ts), each a unit of its own (map-item.ts).
    if (admitted.step.kind === 'map') return await runMapUnit(host, data, admitted, chain);
    // A run step runs no code either: its unit starts a child run and waits for it (child.ts).
    if (admitted.step.kind === 'run') return await runChildUnit(host, data, admitted);
    return await heldAttempt(host, { data, chain, admitted, records: slots.records }, jobSignal);
  } finally {
    await slots.release();
  }
}

/** An attempt admitted, with its slots: guarded, executed, committed, and what follows. */
async function heldAttempt(
  host: UnitHost,
  a: { data: JobData; chain: Chain; admitted: Admitted; records: RunEventRecord[] },
  jobSignal: AbortSignal | undefined,
): Promise<UnitOutcome> {
  const { core } = host;
  const { data, chain, admitted } = a;
  const { env, state, meta, step } = admitted;
  const { runId } = data;
  const stepId = data.stepId!;
  const attempt = data.attempt!;
  const depOutputs = await outputsOf(core, runId, env, step.dependsOn);
  // 2. Guard, and 3. execute.
  const limit = await attemptLimit(host, runId, step, attempt);
  const unit = withRecords(
    startUnit(
      host,
      state,
      runId,
      stepId,
      undefined,
      admitted.noted,
      agentUnit(host, meta, step, state),
    ),
    a.records,
  );
  const result = await guardUnit(host, { runId, stepId, attempt }, jobSignal, limit, (signal) =>
    executeAttempt(host, { runId, admitted, depOutputs, unit, signal }),
  );
  // 4. Commit.
  const early = await endsEarly(host, env, result, data);
  if (early !== null) return early;
  if (result.kind === 'paused') return pauseUnit(host, env, unit, data, result.call, chain);
  const events: RunEvent[] =
    result.kind === 'succeeded'
      ? succeededEvents(host, stepId, attempt, result, state)
      : [failed(host, stepId, attempt, result.error)];
  debugPoint(DebugPoint.beforeCommit, stepId);
  const { applied, next } = await commitUnit(host, { data, env, unit, events, chain });
  notifyFailures(host, runId, events, applied);
  debugPoint(DebugPoint.afterCommit, stepId);
  // 5. Next.
  if (next !== null) return nextUnit(host, next, applied, chain, result.kind);
  await core.queues.enqueuePlanned(runId, applied);
  return result.kind;
}

/**
 * The execution of an admitted attempt: the step's operator, agent or policy through the step
 * cache, the tagged policies deciding before a cache hit is taken as before a run.
 */
function executeAttempt(
  host: UnitHost,
  a: {
    runId: string;
    admitted: Admitted;
    depOutputs: Record<string, JsonValue>;
    unit: Unit;
    signal: AbortSignal;
  },
): Promise<StepResult> {
  const { runId, signal } = a;
  const { state, meta, step } = a.admitted;
  const where = {
    step,
    state,
    runId,
    tenantId: meta.tenantId,
    runInput: meta.input,
    depOutputs: a.depOutputs,
  };
  const deps: StepExecutionDeps = executionDepsFor(host, meta);
  return executeCached(
    host.stepCache,
    {
      ...where,
      options: meta.cache,
      beforeHit: () => checkTaggedPolicies(deps, { ...where, signal }),
    },
    () =>
      executeStep(
        { ...deps, recorder: a.unit.recorder },
        { ...where, signal, ...replayOf(host, runId, meta, step) },
      ),
  );
}

/** The commit of a success: a cache hit's source first, and who produced the output. */
function succeededEvents(
  host: UnitHost,
  stepId: string,
  attempt: number,
  result: Extract<StepResult, { kind: 'succeeded' }>,
  state: StepState,
): RunEvent[] {
  const at = host.core.clock();
  const hit = result.cacheHit;
  const events: RunEvent[] = [];
  if (hit !== undefined) {
    events.push({
      type: 'step.cacheHit',
      stepId,
      attempt,
      sourceRunId: hit.runId,
      storedAt: hit.storedAt,
      cacheClass: hit.cacheClass,
      ...(hit.provenance === null ? {} : { provenance: hit.provenance }),
      at,
    });
  }
  const phase = state.fallback ?? null;
  const producedBy = phase === null ? undefined : phase.active ? 'fallback' : 'primary';
  events.push({
    type: 'step.succeeded',
    stepId,
    attempt,
    output: result.output,
    ...(producedBy === undefined ? {} : { producedBy }),
    at,
  });
  return events;
}
