/**
 * The phases every unit of work shares, whichever kind it is (a step attempt: `step.ts`; one turn
 * of a granular agent step: `turn.ts`), in the order a unit goes through them:
 *
 * 1. Admit (`admitUnit`, `admitLoaded`): the unit must still be due in the run's snapshot, and the
 *    run's budgets (`maxWallClockMs`, `maxSteps`) must allow it; else it ends, and what is due is
 *    enqueued again.
 * 2. Guard (`attemptLimit`, `guardUnit`): its execution runs aborted by a run cancel, by its job,
 *    and by the attempt's time limit (its `timeoutMs`, what is left of its `maxWallClockMs`).
 * 3. Start (`startUnit`, in `unit-start.ts`): the note beside the run that shows it RUNNING, and
 *    the records its commit carries.
 * 4. Commit (`commitUnit`, or `pauseUnit` for a call that waits for a person; `endsEarly` for a
 *    busy tool call or a budget stop, which commit nothing of the unit): its events and records
 *    in one commit, then the failure hook (`notifyFailures`); a run that ended is ended by the
 *    enqueue that follows (`runtime-meta.ts`: `ended`: its expiry, the active runs, the run list,
 *    the settling of what dead workers left reserved).
 * 5. Next (`nextUnit`): the one unit the commit made due goes on in the same job; anything else
 *    is left to the queue.
 *
 * Besides, the jobs that are timers of a run: its deadline (`runDeadline`) and a step's retry
 * backoff (`runRetryDue`), and the budget stop they and admission share (`stopForBudget`).
 */
import { attemptsMade } from '../plan/condition.js';
import { randomInt } from 'node:crypto';
import {
  BudgetExceededError,
  StepTimeoutError,
  type FlujoError,
  type SerializedError,
} from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import {
  runSteps,
  stepEntry,
  type RunSnapshot,
  type RunTransition,
  type StepState,
} from '../machines/kernel.js';
import type { Plan, PlanStep } from '../plan/schema.js';
import { inTree, treeBudgetOver } from './child-budgets.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import type { CommitOptions, RunEventRecord } from '../persistence/snapshot-store.js';
import { formatUnitNote, type WorkerIdentity } from '../persistence/unit-notes.js';
import type { RunEvent } from '../schemas/events.js';
import type { RuntimeCore, StepFailureInfo } from './core.js';
import type { RunMeta } from './runtime-meta.js';
import { abortMessage } from './runtime-queues.js';
import { HistoryCache } from '../execution/history-cache.js';
import { carrierNote, isUnitDue, soleUnit, unitJobOf, type JobData, type JobSpec } from './jobs.js';
import type { CallToApprove } from '../execution/call-approval.js';
import {
  fallbackStep,
  type StepExecutionDeps,
  type StepResult,
} from '../execution/execute-step.js';
import type { CallRecorder } from '../execution/ports.js';
import { replayedCalls } from '../execution/replay-calls.js';
import type { AppliedEvent, HostCommitOptions } from './run-host.js';
import type { StepCacheDeps } from '../execution/step-cache.js';
import type { AgentUnit } from './unit-start.js';
import { planStep } from '../plan/graph.js';

/**
 * What every unit a worker runs is given, built once when the worker starts (see
 * {@link createUnitHost}) and passed to each phase as it is.
 */
export interface UnitHost {
  /** The runtime's stores, queue and registries. */
  core: RuntimeCore;
  /** What an execution needs, but for the run's own budgets (see {@link executionDepsFor}). */
  execution: StepExecutionDeps;
  /** The cache of step outputs. */
  stepCache: StepCacheDeps;
  /** Granular steps' committed histories, kept between turns. */
  histories: HistoryCache;
  /** Who runs the units (noted beside the run when a unit starts). */
  identity: WorkerIdentity;
  /** The running attempts by abort message (see `abortMessage`): a run cancel aborts them. */
  aborts: Map<string, AbortController>;
  /** Starts a child run, or finds the one a start with the same id made (see `child.ts`). */
  startRun?: StartChildRun;
}

/**
 * Starts child run `opts.runId` of `plan` with `input` and the meta fields `links` (its parent),
 * or finds it when a start with the same id, plan, input and tenant created it already; the start
 * path of the runtime (`worker/start-run.ts`), handed down by the worker.
 */
export type StartChildRun = (
  plan: Plan,
  input: JsonValue,
  opts: { runId: string; tenantId: string; queue: string | null },
  links: Record<string, string>,
) => Promise<unknown>;

/** Options of {@link createUnitHost}. */
export interface UnitHostOptions {
  /** Lease of a running tool call in the ledger, renewed while it runs. */
  leaseMs: number;
  /** Who runs the units. */
  identity: WorkerIdentity;
  /** How child runs are started (see {@link StartChildRun}); without it a run step cannot run. */
  startRun?: StartChildRun;
}

/** The composition root of a worker's units: every hook named once, from the runtime's core. */
export function createUnitHost(core: RuntimeCore, options: UnitHostOptions): UnitHost {
  // A granular step's committed history, kept per run and step between turns: it is append-only,
  // so a cached prefix stays true and only the messages after it are read.
  const histories = new HistoryCache(core.stores.history, 512);
  return {
    core,
    histories,
    identity: options.identity,
    aborts: new Map(),
    ...(options.startRun === undefined ? {} : { startRun: options.startRun }),
    execution: {
      operators: core.registry.operators,
      policies: core.registry.policies,
      agents: core.registry.agents,
      clients: core.registry,
      tools: core.registry.tools,
      ledger: core.stores.ledger,
      counter: core.stores.counters,
      maxToolCalls: undefined,
      leaseMs: options.leaseMs,
      journal: core.stores.journal,
      fingerprints: core.stores.fingerprints,
      histories,
      live: {
        chunk: (chunk) => core.queues.publishChunk(chunk),
        progress: (where, info) =>
          core.queues.publishProgress(where.runId, where.stepId, where.attempt, info),
      },
      meter: core.meter,
      context: core.context,
      ...(core.rateLimits === undefined ? {} : { rateLimits: core.rateLimits }),
      results: core.stores.blobs,
      policyVersion: core.policyVersion,
    },
    stepCache: {
      cache: core.stores.cache,
      clock: core.clock,
      identities: core.registry,
      log: core.log,
    },
  };
}

/**
 * Aborts the running attempt an abort message names (a run cancel, a budget stop), if this host
 * runs it. Returns whether it did.
 */
export function abortUnit(host: UnitHost, message: string): boolean {
  const controller = host.aborts.get(message);
  controller?.abort(new Error('the run was cancelled'));
  // The items of a map step's attempt run under keys of their own, after the attempt's message.
  let items = false;
  const prefix = `${message}\nitem\n`;
  for (const [key, c] of host.aborts) {
    if (!key.startsWith(prefix)) continue;
    c.abort(new Error('the run was cancelled'));
    items = true;
  }
  return controller !== undefined || items;
}

/** The job in which units run one after the other, and how long it may take more. */
export interface Chain {
  /** The job's id: the carrier named in the notes of its chained commits. */
  self: string;
  /** Until when (`performance.now()`) the job may take one more unit. */
  until: number;
  /** Aborted when the worker closes: it then takes no more units. */
  closing?: AbortSignal;
  /**
   * Extends the job's lock to `ms` from now (see `commitUnit`); absent outside a BullMQ job.
   */
  holdLock?: (ms: number) => Promise<void>;
}

/**
 * A run of this many steps or more is wide: deciding one of its commits takes time that grows with
 * its steps (the last one, which ends the run, stops every step's actor: about a second at 1,000
 * steps on a small machine), during which the worker's event loop renews no job lock. Before such a
 * commit the unit's job holds its lock for {@link WIDE_COMMIT_LOCK_MS}, so that another worker does
 * not take the unit over (and run it again) while this one decides.
 */
export const WIDE_RUN_STEPS = 200;
/** See {@link WIDE_RUN_STEPS}. */
export const WIDE_COMMIT_LOCK_MS = 30_000;

/** Whether the chain may take one more unit now. */
export const mayGoOn = (chain: Chain): boolean =>
  chain.closing?.aborted !== true && performance.now() < chain.until;

/**
 * What a unit came to: how it ended (a word for the job's return value: `succeeded`, `failed`,
 * `paused`, `already-done`, `budget`, …); the next unit to go on with in the same job, admitted,
 * and how this one `ended`; or "come back later" for a tool call whose lease another worker holds,
 * or for a unit `parked` for a concurrency slot (it tells whether the slot came meanwhile).
 */
export type UnitOutcome =
  | string
  | { next: JobSpec; admitted: Admitted; ended: string }
  | { retryAfterMs: number; unit: JobSpec; parked?: () => Promise<boolean> };

/** A failed attempt, as both a step's and a turn's execution report it. */
type AttemptFailure = { kind: 'failed'; error: SerializedError };

/** When an attempt's time is up, and the error it then fails with. */
export interface AttemptLimit {
  ms: number;
  error: () => FlujoError;
}

/** A unit admitted to run: the run as loaded, its step's state, the run's meta and the step. */
export interface Admitted {
  env: SnapshotEnvelope<RunSnapshot>;
  state: StepState;
  meta: RunMeta;
  step: PlanStep;
  /** The commit that handed this unit to its job wrote the unit's note (its start writes none). */
  noted?: boolean;
}

/** A unit of work as it runs: its start, and what it records besides its result. */
export interface Unit {
  /** `step.started` when the unit starts a READY step's execution. */
  started: RunEvent[];
  /** Records the unit's tool and model calls, for its commit. */
  recorder: CallRecorder;
  /** Its takeover (when it runs again what a dead worker started), its calls, and its run. */
  records(): Promise<RunEventRecord[]>;
}

/** The longest delay a Node timer takes (2^31 - 1 ms); a longer one fires at once. */
const MAX_TIMER_MS = 2_147_483_647;

/**
 * What the steps `ids` produced, by step id: those that produced something, and `null` for a step
 * that was skipped (its dependents run, and see that it gave nothing). A snapshot is loaded
 * without the outputs (they are stored once, beside it): those of steps that succeeded are read
 * here, in one round trip, unless the run held in memory has them.
 */
export async function outputsOf(
  core: RuntimeCore,
  runId: string,
  env: SnapshotEnvelope<RunSnapshot>,
  ids: readonly string[],
): Promise<Record<string, JsonValue>> {
  const out: Record<string, JsonValue> = {};
  const stored: string[] = [];
  const missing = env.outputsMissing;
  for (const d of ids) {
    const child = stepEntry(env.snapshot, d)?.snapshot;
    const output = child?.context.output;
    if (output !== undefined && output !== null) out[d] = output;
    else if (child?.value === 'SKIPPED') out[d] = null;
    // A null output held in memory from the step's own commit: it produced nothing.
    else if (child?.value === 'SUCCEEDED' && (missing === undefined || missing.has(d))) {
      stored.push(d);
    }
  }
  if (stored.length > 0) {
    const read = await core.stores.store.readOutputs(runId, stored);
    for (const d of stored) if (d in read) out[d] = read[d] as JsonValue;
  }
  return out;
}

/** The execution deps of one unit of the run: the host's, with the run's trace and budgets. */
export function executionDepsFor(host: UnitHost, meta: RunMeta): StepExecutionDeps {
  const budgets = meta.plan.budgets;
  return {
    ...host.execution,
    trace: meta.trace,
    maxToolCalls: budgets?.maxToolCalls,
    budget: {
      ...(budgets?.maxTokens === undefined ? {} : { maxTokens: budgets.maxTokens }),
      ...(budgets?.maxCostUsd === undefined ? {} : { maxCostUsd: budgets.maxCostUsd }),
    },
  };
}

/**
 * What an agent's units record beyond their own calls (see {@link startUnit}): a turn of a
 * granular step, or a step attempt run whole (an atomic step, or a fallback agent, which runs
 * atomically); undefined for a unit that runs no agent.
 */
export function agentUnit(
  host: UnitHost,
  meta: RunMeta,
  step: PlanStep,
  state: StepState,
  turn?: number,
): AgentUnit | undefined {
  const fallback = state.fallback?.active === true ? fallbackStep(step) : null;
  const runs = fallback ?? step;
  if (runs.kind !== 'agent') return undefined;
  const agent = host.core.registry.agents.get(runs.agent);
  if (agent === undefined) return undefined;
  return { tenantId: meta.tenantId, agent, mode: turn === undefined ? 'atomic' : 'granular' };
}

/** In a run that replays another: where the step's tool calls find the original's receipts. */
export function replayOf(host: UnitHost, runId: string, meta: RunMeta, step: PlanStep) {
  const { core } = host;
  const blobs = { store: core.stores.blobs, runId };
  const replay = replayedCalls(core.stores.ledger, meta.replay, meta.tenantId, step, blobs);
  return replay === undefined ? {} : { replay };
}

/** Stops the run for a budget: commits `run.stopped`, aborts its attempts, enqueues what is due. */
export async function stopForBudget(
  host: UnitHost,
  runId: string,
  env: SnapshotEnvelope<RunSnapshot>,
  detail: JsonValue,
): Promise<void> {
  const { core } = host;
  const event: RunEvent = {
    type: 'run.stopped',
    reason: 'budget_exceeded',
    detail,
    at: core.clock(),
  };
  const applied = await core.host.apply(runId, event, env);
  await core.queues.publishAborts(runId, applied.transition.planned);
  await core.queues.removeTimers(runId, applied.transition.changes);
  await core.queues.enqueueDue(runId, applied.envelope);
}

/** A deadline job: stops the run for its `maxWallClockMs` unless it ended. */
export async function runDeadline(host: UnitHost, runId: string): Promise<string> {
  const { core } = host;
  const env = await core.stores.store.load(runId, { outputs: false });
  if (env.snapshot.status !== 'active' || env.snapshot.value === 'failed') return 'ended';
  const meta = await core.meta.read(runId);
  const limit = meta.plan.budgets?.maxWallClockMs ?? 0;
  await stopForBudget(host, runId, env, {
    budget: 'maxWallClockMs',
    limit,
    used: core.clock() - meta.createdAt,
  });
  return 'deadline';
}

/** A retry job: the step's backoff is over, it may run again. */
export async function runRetryDue(host: UnitHost, data: JobData): Promise<string> {
  const { core } = host;
  await core.apply(data.runId, {
    type: 'retry.due',
    stepId: data.stepId!,
    attempt: data.attempt!,
    at: core.clock(),
  });
  return 'retry-due';
}

/**
 * The guard of every step and turn job: the attempt must still be RUNNING (else it was already
 * committed or cancelled: a redelivered job is harmless, and enqueueing what is due heals a crash
 * between a commit and its enqueue), and the run's budgets must allow it to go on. `self` is the
 * job's id (see `enqueueDue`). A string says why the unit does not run.
 */
export async function admitUnit(
  host: UnitHost,
  data: JobData,
  self: string,
): Promise<Admitted | string> {
  return admitLoaded(host, data, await host.core.host.load(data.runId), self);
}

/** {@link admitUnit} of a unit of a run as `env` holds it. */
export async function admitLoaded(
  host: UnitHost,
  data: JobData,
  env: SnapshotEnvelope<RunSnapshot>,
  self: string,
): Promise<Admitted | string> {
  const { core } = host;
  const { runId } = data;
  const child = stepEntry(env.snapshot, data.stepId!)?.snapshot;
  const state: StepState | undefined =
    child === undefined ? undefined : { ...child.context, status: child.value };
  if (
    state === undefined ||
    !isUnitDue(state) ||
    state.attempt !== data.attempt ||
    (state.pauses ?? 0) !== (data.pause ?? 0)
  ) {
    await core.stores.acknowledgeRead(runId);
    await core.queues.enqueueDue(runId, env, self);
    return 'already-done';
  }
  const meta = await core.meta.read(runId);
  const budgets = meta.plan.budgets;
  const now = core.clock();
  if (budgets?.maxWallClockMs !== undefined && now - meta.createdAt > budgets.maxWallClockMs) {
    await stopForBudget(host, runId, env, {
      budget: 'maxWallClockMs',
      limit: budgets.maxWallClockMs,
      used: now - meta.createdAt,
    });
    return 'budget';
  }
  if (budgets?.maxSteps !== undefined) {
    const used = attemptsMade(runSteps(env.snapshot));
    if (used > budgets.maxSteps) {
      await stopForBudget(host, runId, env, { budget: 'maxSteps', limit: budgets.maxSteps, used });
      return 'budget';
    }
  }
  // Runs with a parent or children: their budgets bind the sum over the tree (child-budgets.ts).
  if (inTree(meta)) {
    const over = await treeBudgetOver(core, runId, meta);
    if (over !== null) {
      const at = over.runId === runId ? env : await core.host.load(over.runId);
      await stopForBudget(host, over.runId, at, over.detail);
      return 'budget';
    }
  }
  const step = planStep(meta.plan, data.stepId)!;
  return { env, state, meta, step };
}

/**
 * Runs `work` as the attempt's execution: aborted by a run cancel or the job's own signal, and,
 * with a `limit`, when the limit's time is up. Then the attempt is over: it fails with the
 * limit's error at once, and whatever `work` still produces is discarded (a late success is
 * never committed; a tool still running loses its lease and lapses into doubt).
 */
export async function guardUnit<T extends { kind: string }>(
  host: UnitHost,
  where: { runId: string; stepId: string; attempt: number },
  jobSignal: AbortSignal | undefined,
  limit: AttemptLimit | null,
  work: (signal: AbortSignal) => Promise<T>,
): Promise<T | AttemptFailure> {
  const controller = new AbortController();
  const abortKey = abortMessage(where.runId, where.stepId, where.attempt);
  host.aborts.set(abortKey, controller);
  const onJobAbort = () => controller.abort(jobSignal?.reason);
  jobSignal?.addEventListener('abort', onJobAbort, { once: true });
  let timer: NodeJS.Timeout | undefined;
  try {
    if (limit === null) return await work(controller.signal);
    // Nothing left of the limit (a step's wall clock spent before this attempt): it never runs.
    if (limit.ms <= 0) return { kind: 'failed', error: limit.error().toJSON() };
    const expired = new Promise<AttemptFailure>((resolve) => {
      const fire = () => {
        const error = limit.error();
        // Settled before the abort, so the race below ends with the limit, whatever the abort
        // makes the work do.
        resolve({ kind: 'failed', error: error.toJSON() });
        controller.abort(error);
      };
      // A timer holds at most MAX_TIMER_MS (about 24.8 days): longer limits are waited in legs.
      const deadline = performance.now() + limit.ms;
      const arm = () => {
        const left = deadline - performance.now();
        timer = setTimeout(left > MAX_TIMER_MS ? arm : fire, Math.min(left, MAX_TIMER_MS));
      };
      arm();
    });
    return await Promise.race([work(controller.signal), expired]);
  } finally {
    clearTimeout(timer);
    host.aborts.delete(abortKey);
    jobSignal?.removeEventListener('abort', onJobAbort);
  }
}

/**
 * What bounds one attempt of `step`: its `timeoutMs`, and what is left of its
 * `budgets.maxWallClockMs`, counted from the start of its first attempt (kept in the run's
 * counters), whichever ends first. Null when neither is set.
 */
export async function attemptLimit(
  host: UnitHost,
  runId: string,
  step: PlanStep,
  attempt: number,
): Promise<AttemptLimit | null> {
  const { core } = host;
  const { timeoutMs } = step;
  const timeout: AttemptLimit | null =
    timeoutMs === undefined
      ? null
      : { ms: timeoutMs, error: () => new StepTimeoutError(step.id, attempt, timeoutMs) };
  const wallClock = step.budgets?.maxWallClockMs;
  if (wallClock === undefined) return timeout;
  const now = core.clock();
  const startedAt = await core.stores.counters.stepStartedAt(runId, step.id, now);
  const left = startedAt + wallClock - now;
  if (timeout !== null && timeout.ms <= left) return timeout;
  return {
    ms: left,
    error: () =>
      new BudgetExceededError('maxWallClockMs', wallClock, core.clock() - startedAt, {
        stepId: step.id,
      }),
  };
}

/** How long a unit that met Redis trouble in its step's code waits before it runs again. */
const REDIS_TROUBLE_RETRY_MS = 500;

/**
 * What ends a job before its commit: a tool call whose lease another worker holds, or Redis
 * trouble that reached the step's code through the runtime (a tool call's ledger write that Redis
 * did not take, or that replicas did not acknowledge): come back later, without spending an
 * attempt (infrastructure trouble is never an attempt of the user's work); or a budget hit (the
 * run is stopped). Null otherwise.
 */
export async function endsEarly(
  host: UnitHost,
  env: SnapshotEnvelope<RunSnapshot>,
  result: StepResult | { kind: 'turn' },
  data: JobData,
): Promise<UnitOutcome | null> {
  if (result.kind === 'failed' && result.error.code === 'tool_call_busy') {
    const retryAfterMs = Math.max(50, result.error.retryAfterMs ?? 1000);
    return { retryAfterMs, unit: unitJobOf(data) };
  }
  if (result.kind === 'failed' && result.error.code === 'redis_unavailable') {
    host.core.log.warn(
      { runId: data.runId, stepId: data.stepId, error: result.error.message },
      'Redis trouble reached the step through a tool call: the attempt is run again later, not counted',
    );
    return { retryAfterMs: REDIS_TROUBLE_RETRY_MS, unit: unitJobOf(data) };
  }
  if (result.kind === 'budget') {
    await stopForBudget(host, data.runId, env, result.error.details as JsonValue);
    return 'budget';
  }
  return null;
}

/**
 * Tells the `onStepFailure` hook about the failed attempts a commit recorded (`events` as
 * committed; `applied` its result). A sync hook runs before this returns; an async one runs on
 * its own. Anything it throws is logged.
 */
export function notifyFailures(
  host: UnitHost,
  runId: string,
  events: readonly RunEvent[],
  applied: AppliedEvent,
  turn?: number,
): void {
  const { core } = host;
  const hook = core.onStepFailure;
  if (hook === undefined || !applied.committed) return;
  for (const e of events) {
    if (e.type !== 'step.failed') continue;
    const status = stepEntry(applied.envelope.snapshot, e.stepId)?.snapshot.value;
    const failure: StepFailureInfo = {
      runId,
      stepId: e.stepId,
      attempt: e.attempt,
      ...(turn === undefined ? {} : { turn }),
      code: e.error.code,
      message: e.error.message,
      retryable: e.error.retryable,
      // A fallback about to run counts as a retry of the step.
      willRetry: status === 'FAILED_RETRYABLE' || status === 'READY',
      error: e.error,
    };
    const logError = (error: unknown) =>
      core.log.warn(
        {
          runId,
          stepId: e.stepId,
          attempt: e.attempt,
          error: error instanceof Error ? error.message : String(error),
        },
        'the onStepFailure hook failed; ignored',
      );
    try {
      const result = hook(failure);
      if (result instanceof Promise) result.catch(logError);
    } catch (error) {
      logError(error);
    }
  }
}

/** Commit options that also record what the unit did. */
export async function recording(
  unit: Unit,
  options: CommitOptions | ((t: RunTransition) => CommitOptions) = {},
): Promise<(t: RunTransition) => HostCommitOptions> {
  const records = await unit.records();
  return (t) => ({ ...(typeof options === 'function' ? options(t) : options), records });
}

export const failed = (
  host: UnitHost,
  stepId: string,
  attempt: number,
  error: SerializedError,
): RunEvent => ({
  type: 'step.failed',
  stepId,
  attempt,
  error,
  jitterSeed: randomInt(0, 2 ** 32),
  at: host.core.clock(),
});

/**
 * Whether `unit` is work that the commit of `current` itself made due: a step attempt its
 * transition started, or the next turn of the granular step whose turn it committed. Only such a
 * unit may be chained: its job does not exist yet, so no other job can be executing it. The run's
 * only RUNNING step is not enough (a fan-out sibling is RUNNING in a job of its own).
 */
function plannedBy(t: RunTransition, current: JobData, unit: JobSpec): boolean {
  const { stepId, attempt, turn } = unit.data;
  if (
    t.planned.some((p) => p.type === 'step.execute' && p.stepId === stepId && p.attempt === attempt)
  ) {
    return true;
  }
  return (
    turn !== undefined &&
    current.turn !== undefined &&
    stepId === current.stepId &&
    attempt === current.attempt &&
    turn === current.turn + 1
  );
}

/**
 * An execution stopped at a tool call that waits for a person: commits the wait (the step goes
 * WAITING_APPROVAL showing the call) and nothing else. The decision makes the step READY again
 * with the same attempt, and its next execution is a unit of its own (`pause` in its job id).
 */
export async function pauseUnit(
  host: UnitHost,
  env: SnapshotEnvelope<RunSnapshot>,
  unit: Unit,
  data: JobData,
  call: CallToApprove,
  chain: Chain,
): Promise<string> {
  const { core } = host;
  const { runId } = data;
  const event: RunEvent = {
    type: 'tool.approvalRequested',
    stepId: data.stepId!,
    attempt: data.attempt!,
    callId: call.callId,
    tool: call.tool,
    args: call.args,
    ...(call.toolCallId === undefined ? {} : { toolCallId: call.toolCallId }),
    ...(call.turn === undefined ? {} : { turn: call.turn }),
    at: core.clock(),
  };
  const applied = await core.host.apply(
    runId,
    [...unit.started, event],
    env,
    await recording(unit),
  );
  await core.queues.enqueueDue(runId, applied.envelope, chain.self);
  return 'paused';
}

/** What a unit commits, and with what. */
export interface UnitCommit {
  /** The job's data of the unit. */
  data: JobData;
  /** The run as the unit was admitted with. */
  env: SnapshotEnvelope<RunSnapshot>;
  unit: Unit;
  /** The events, after the unit's `started`. */
  events: RunEvent[];
  chain: Chain;
  /** What else the commit writes (a turn's messages and last receipt). */
  base?: CommitOptions;
  /**
   * Told the unit the job goes on with, as the commit is sent (it may be told again if the commit
   * is retried after a conflict): what it sends then shares the commit's round trip.
   */
  onNext?: (next: JobSpec) => void;
}

/**
 * Commits a unit: its events with what it recorded, in one commit. When the chain may go on and
 * the transition leaves the run exactly one unit to do that this commit made due, the job is noted
 * as that unit's carrier, and `next` is the unit (for {@link nextUnit}); else `next` is null and
 * the caller leaves what became due to the queue. Failed attempts are told to `onStepFailure`.
 */
export async function commitUnit(
  host: UnitHost,
  c: UnitCommit,
): Promise<{ applied: AppliedEvent; next: JobSpec | null }> {
  const { core } = host;
  const { data, chain, base = {} } = c;
  const { runId } = data;
  let next: JobSpec | null = null;
  const options = (t: RunTransition): CommitOptions => {
    const sole = mayGoOn(chain) ? soleUnit(runId, t.snapshot) : null;
    next = sole !== null && plannedBy(t, data, sole) ? sole : null;
    if (next === null) return base;
    c.onNext?.(next);
    const { stepId, attempt, turn, pause } = next.data;
    const note = formatUnitNote(attempt!, pause ?? 0, core.clock(), turn, host.identity);
    return {
      ...base,
      carrier: carrierNote({ job: chain.self, unit: next.opts.jobId }),
      unitNote: { stepId: stepId!, note },
    };
  };
  const events = [...c.unit.started, ...c.events];
  if (c.env.snapshot.context.order.length >= WIDE_RUN_STEPS) {
    await chain.holdLock?.(WIDE_COMMIT_LOCK_MS);
  }
  // The unit's events are built here, an output checked as JSON by the execution: their shape is
  // not checked again (an output is walked once), but for a failure's error, which carries what
  // was thrown.
  const applied = await core.host.apply(
    runId,
    events,
    c.env,
    await recording(c.unit, options),
    events.every((e) => e.type !== 'step.failed'),
  );
  return { applied, next: applied.committed ? next : null };
}

/**
 * The unit a commit noted the job as carrier of, admitted against the run the commit left; `ended`
 * says how the unit that committed ended.
 */
export async function nextUnit(
  host: UnitHost,
  next: JobSpec,
  applied: AppliedEvent,
  chain: Chain,
  ended: string,
): Promise<UnitOutcome> {
  const admitted = await admitLoaded(host, next.data, applied.envelope, chain.self);
  return typeof admitted === 'string'
    ? admitted
    : { next, admitted: { ...admitted, noted: true }, ended };
}

/** A unit that runs nothing and records nothing besides its events. */
export const NO_RUN: Unit = {
  started: [],
  recorder: { toolCalled: () => {}, modelCalled: () => {}, modelRateLimited: () => {} },
  records: () => Promise.resolve([]),
};
