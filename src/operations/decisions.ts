/**
 * Decisions on runs: approve or reject what a step waits on, skip a step, cancel or resume a run,
 * resolve an in-doubt tool call, set a tenant's quota. Each a plain function of the runtime core
 * (and, for a decision on a step, the embedding service's `authorizeDecision` hook).
 */
import { actionScopesOf } from '../execution/action-keys.js';
import type { RuntimeCore } from '../actors/core.js';
import {
  ApprovalNotAllowedError,
  InputValidationError,
  RunNotResumableError,
  StepNotSkippableError,
  StepNotWaitingError,
} from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import {
  runSteps,
  runStatus,
  type RunSnapshot,
  type StepChange,
  type StepState,
} from '../machines/kernel.js';
import { isFinalStepStatus } from '../machines/types.js';
import { assertTenantId } from '../persistence/keys.js';
import type { LedgerEntry } from '../persistence/ledger.js';
import { outsideRedisDeadline } from '../persistence/redis-errors.js';
import { readReport, type RunReport } from './reading.js';

/** Who decided on a gate, and why. */
export interface DecisionInput {
  /** Who decides: a claim the embedding service must authenticate (see `authorizeDecision`). */
  by: string;
  comment?: string;
  /**
   * The tool call decided on, when the step waits on one: the decision is refused unless that is
   * the call it waits on (so an approval never lands on a call its author did not see).
   */
  callId?: string;
}

/** Who skips a step, and why. */
export interface SkipInput {
  by: string;
  reason: string;
}

/** A decision a person takes on a step. */
export type StepDecision = 'approve' | 'reject' | 'skip';

/** The `authorizeDecision` hook of the runtime's options: false refuses the decision. */
export type AuthorizeDecision = (
  runId: string,
  stepId: string,
  by: string,
  decision: StepDecision,
) => boolean | Promise<boolean>;

/** A tenant's quota in USD, as `runtime.setTenantQuota` takes and returns it. */
export interface TenantQuota {
  maxTokens: number | null;
  maxCostUsd: number | null;
}

/** Refuses a decision that does not say who takes it. */
export function checkBy(by: unknown, what: string): asserts by is string {
  if (typeof by !== 'string' || by === '') {
    throw new InputValidationError(what, [
      { path: 'by', message: 'say who decides, e.g. { by: "ana" } (--by NAME on the CLI)' },
    ]);
  }
}

/** Refuses a skip that does not say who skips and why. */
export function checkSkip(request: SkipInput): void {
  checkBy(request?.by, 'skip');
  if (typeof request.reason !== 'string' || request.reason.trim() === '') {
    throw new InputValidationError('skip', [
      { path: 'reason', message: 'say why, e.g. { reason: "done by hand" } (--reason TEXT)' },
    ]);
  }
}

/**
 * Whether a skip of `step` can be taken: a step that has not succeeded or been skipped, in a run
 * that was not cancelled (a cancelled run is over).
 */
export function skippable(snapshot: RunSnapshot, step: StepState): boolean {
  if (step.status === 'SUCCEEDED' || step.status === 'SKIPPED') return false;
  return !isFinalStepStatus(step.status) || snapshot.context.cancel === null;
}

/** The steps a transition reopened (a resume, a skip of a step that failed): final, then open. */
export function reopenedSteps(changes: readonly StepChange[]): string[] {
  return changes
    .filter((c) => isFinalStepStatus(c.from) && !isFinalStepStatus(c.to))
    .map((c) => c.stepId);
}

/**
 * Refuses a decision on `stepId` by `by` unless the step's gate lists `by` among its approvers
 * (when it lists any) and the `authorizeDecision` hook allows it. Reads only; writes nothing.
 */
export async function authorize(
  core: RuntimeCore,
  hook: AuthorizeDecision | undefined,
  runId: string,
  stepId: string,
  by: string,
  decision: StepDecision,
): Promise<void> {
  const planStep = (await core.meta.read(runId)).plan.steps.find((s) => s.id === stepId);
  const approvers = planStep?.gate?.approvers;
  if (approvers !== undefined && !approvers.includes(by)) {
    throw new ApprovalNotAllowedError(runId, stepId, by, approvers);
  }
  if (
    hook !== undefined &&
    (await outsideRedisDeadline(() => hook(runId, stepId, by, decision))) !== true
  ) {
    throw new ApprovalNotAllowedError(runId, stepId, by, null);
  }
}

/**
 * Approves (`gate.approved`) or rejects (`gate.rejected`) what a step waits on: its gate, or the
 * tool call it waits on, which `decision.callId` must name when given.
 */
export async function decide(
  core: RuntimeCore,
  hook: AuthorizeDecision | undefined,
  runId: string,
  stepId: string,
  decision: DecisionInput,
  type: 'gate.approved' | 'gate.rejected',
): Promise<RunReport> {
  checkBy(decision?.by, 'decision');
  const env = await core.stores.store.load(runId, { outputs: false });
  const step = runSteps(env.snapshot).find((s) => s.stepId === stepId);
  if (step === undefined) {
    throw new StepNotWaitingError(runId, stepId, null, env.snapshot.context.order);
  }
  if (step.status !== 'WAITING_APPROVAL') {
    throw new StepNotWaitingError(runId, stepId, step.status, env.snapshot.context.order);
  }
  const pending = step.pendingCall ?? null;
  if (decision.callId !== undefined && decision.callId !== pending?.callId) {
    throw new InputValidationError('decision', [
      {
        path: 'callId',
        message:
          pending === null
            ? `step "${stepId}" waits on its gate, not on a tool call; leave callId out`
            : `step "${stepId}" waits on tool call ${pending.callId} (${pending.tool}), not ${decision.callId}; see \`flujo status ${runId}\``,
      },
    ]);
  }
  await authorize(
    core,
    hook,
    runId,
    stepId,
    decision.by,
    type === 'gate.approved' ? 'approve' : 'reject',
  );
  const event = {
    type,
    stepId,
    by: decision.by,
    ...(decision.comment === undefined ? {} : { comment: decision.comment }),
    // Bound to the call the step waits on as loaded: a decision never lands on another call.
    ...(pending === null ? {} : { callId: pending.callId }),
    at: core.clock(),
  };
  const applied = await core.host.apply(runId, event, env);
  if (!applied.committed) {
    const now = runSteps(applied.envelope.snapshot).find((s) => s.stepId === stepId);
    throw new StepNotWaitingError(runId, stepId, now?.status ?? null, env.snapshot.context.order);
  }
  await core.queues.enqueueDue(runId, applied.envelope);
  return readReport(core, runId);
}

/**
 * Skips a step that has not succeeded: it becomes SKIPPED, an execution in progress is aborted,
 * dependents a failure of it cancelled are reopened, and a failed run goes on.
 */
export async function skipStep(
  core: RuntimeCore,
  hook: AuthorizeDecision | undefined,
  runId: string,
  stepId: string,
  request: SkipInput,
): Promise<RunReport> {
  checkSkip(request);
  const env = await core.stores.store.load(runId, { outputs: false });
  const step = runSteps(env.snapshot).find((s) => s.stepId === stepId);
  if (step === undefined || !skippable(env.snapshot, step)) {
    throw new StepNotSkippableError(
      runId,
      stepId,
      step?.status ?? null,
      env.snapshot.context.order,
    );
  }
  await authorize(core, hook, runId, stepId, request.by, 'skip');
  const before = runStatus(env.snapshot);
  const applied = await core.host.apply(
    runId,
    { type: 'step.skipped', stepId, reason: request.reason, by: request.by, at: core.clock() },
    env,
  );
  if (!applied.committed) {
    const now = runSteps(applied.envelope.snapshot).find((s) => s.stepId === stepId);
    throw new StepNotSkippableError(runId, stepId, now?.status ?? null, env.snapshot.context.order);
  }
  // Dependents the skip reopened (a step that failed was skipped) start a fresh step budget.
  await core.stores.counters.resetSteps(runId, reopenedSteps(applied.transition.changes));
  const after = applied.transition.status;
  if (before === 'failed' && after !== 'failed') {
    // The failed run goes on (or succeeded): as after a resume, it keeps its keys again.
    await core.meta.resumed(runId);
    if (after !== 'succeeded') {
      await Promise.all([core.stores.activeRuns.add(runId), core.stores.runs.reopened(runId)]);
    }
  }
  if (after === 'succeeded') await core.stores.runs.ended(runId, after, applied.envelope.updatedAt);
  await core.queues.publishAborts(runId, applied.transition.planned);
  await core.queues.removeTimers(runId, applied.transition.changes);
  await core.queues.enqueueDue(runId, applied.envelope);
  return readReport(core, runId);
}

/** Cancels a run: open steps are cancelled, running attempts aborted. */
export async function cancelRun(
  core: RuntimeCore,
  runId: string,
  o: { by?: string; reason?: string } = {},
): Promise<RunReport> {
  const applied = await core.apply(runId, {
    type: 'run.cancelled',
    ...(o.by === undefined ? {} : { by: o.by }),
    ...(o.reason === undefined ? {} : { reason: o.reason }),
    at: core.clock(),
  });
  await core.queues.publishAborts(runId, applied.transition.planned);
  await core.queues.removeTimers(runId, applied.transition.changes);
  if (applied.transition.status === 'cancelled') {
    await core.stores.runs.ended(runId, 'cancelled', applied.envelope.updatedAt);
  }
  return readReport(core, runId);
}

/** Resumes a failed run: its failed and cancelled steps are reopened, their attempts going on. */
export async function resumeRun(
  core: RuntimeCore,
  runId: string,
  o: { by?: string } = {},
): Promise<RunReport> {
  const applied = await core.host.apply(runId, {
    type: 'run.resumed',
    ...(o.by === undefined ? {} : { by: o.by }),
    at: core.clock(),
  });
  if (!applied.committed) {
    throw new RunNotResumableError(runId, runStatus(applied.envelope.snapshot));
  }
  // Each reopened step gets one more attempt, under a fresh step budget (tool calls, wall
  // clock): what its failed attempts counted would fail it again at once.
  await core.stores.counters.resetSteps(runId, reopenedSteps(applied.transition.changes));
  // It goes on: its keys lose the expiry it got when it failed.
  await core.meta.resumed(runId);
  await Promise.all([core.stores.activeRuns.add(runId), core.stores.runs.reopened(runId)]);
  await core.queues.enqueueDue(runId, applied.envelope);
  return readReport(core, runId);
}

/**
 * Resolves an in-doubt tool call: records its receipt, or lets the step call it again. The call is
 * in the run's own ledger, else in the action ledger of one of its steps with key inputs.
 */
export async function resolveToolCall(
  core: RuntimeCore,
  runId: string,
  callId: string,
  resolution: { succeeded: JsonValue } | { retry: true },
  by: string,
): Promise<LedgerEntry> {
  const meta = await core.meta.read(runId);
  const scopes = new Set(actionScopesOf(meta.plan, meta.input, meta.tenantId).values());
  if (scopes.size > 0 && (await core.stores.ledger.get(runId, meta.tenantId, callId)) === null) {
    for (const scope of scopes) {
      if ((await core.stores.ledger.get(scope, meta.tenantId, callId)) !== null) {
        return core.stores.ledger.resolve(scope, meta.tenantId, callId, resolution, by);
      }
    }
  }
  return core.stores.ledger.resolve(runId, meta.tenantId, callId, resolution, by);
}

/**
 * The store's form of a tenant quota given in USD: micro-USD, an omitted field left out. Refuses a
 * cost that is not a number ≥ 0 or null.
 */
export function tenantQuotaUpdate(quota: {
  maxTokens?: number | null;
  maxCostUsd?: number | null;
}): { maxTokens?: number | null; maxMicroUsd?: number | null } {
  const cost = quota.maxCostUsd;
  if (cost !== undefined && cost !== null && (typeof cost !== 'number' || !(cost >= 0))) {
    throw new InputValidationError('tenant quota', [
      {
        path: 'maxCostUsd',
        message: `must be a number ≥ 0 (USD) or null, got ${String(cost)}`,
      },
    ]);
  }
  return {
    ...(quota.maxTokens === undefined ? {} : { maxTokens: quota.maxTokens }),
    ...(cost === undefined
      ? {}
      : { maxMicroUsd: cost === null ? null : Math.round(cost * 1_000_000) }),
  };
}

/** Sets a tenant's quota over all its runs; returns it as it now stands, in USD. */
export async function setTenantQuota(
  core: RuntimeCore,
  tenantId: string,
  quota: { maxTokens?: number | null; maxCostUsd?: number | null },
): Promise<TenantQuota> {
  assertTenantId(tenantId);
  const set = await core.stores.quota.setTenantQuota(tenantId, tenantQuotaUpdate(quota));
  return {
    maxTokens: set.maxTokens,
    maxCostUsd: set.maxMicroUsd === null ? null : set.maxMicroUsd / 1_000_000,
  };
}
