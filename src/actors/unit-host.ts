/**
 * The per-run actor host of a worker: the whole life of one unit of work (a step attempt, or one
 * turn of a granular agent step), phase by phase, without BullMQ. A unit is admitted against the
 * run's snapshot (`admitUnit`), runs guarded by the run's aborts and its attempt's time limit
 * (`guardUnit`), executes (`runStepUnit`: the operator, agent loop or policy, through the step
 * cache; `runTurnUnit`: one journaled model call and its ledger-guarded tool calls), commits what
 * it came to with what it recorded (`commitUnit`), and then either hands the run's next unit to the
 * same job (`nextUnit`) or leaves what became due to the queue. Each phase returns what the unit
 * came to; the worker's shell maps jobs to these functions and acts on the outcome (a job moved
 * back to the queue for a busy tool call, the next unit of a chain).
 */
import { randomInt } from 'node:crypto';
import {
  BudgetExceededError,
  MaxTurnsExceededError,
  StepTimeoutError,
  type FlujoError,
  type SerializedError,
} from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import {
  runSteps,
  type RunSnapshot,
  type RunTransition,
  type StepState,
} from '../machines/kernel.js';
import type { AgentStep, PlanStep } from '../plan/schema.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import type { CommitOptions, RunEventRecord } from '../persistence/snapshot-store.js';
import type { Reservation } from '../persistence/quota-store.js';
import type { ModelReply } from '../llm/messages.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { formatUnitNote, parseUnitNote, type WorkerIdentity } from '../persistence/unit-notes.js';
import type { RunEvent } from '../schemas/events.js';
import { abortMessage, type RunMeta, type RuntimeCore, type StepFailureInfo } from './core.js';
import { HistoryCache } from './history-cache.js';
import {
  carrierNote,
  isDue,
  JobName,
  soleUnit,
  unitJobOf,
  type JobData,
  type JobSpec,
} from './jobs.js';
import type { CallToApprove } from './call-approval.js';
import {
  checkTaggedPolicies,
  executeStep,
  fallbackStep,
  executeTurn,
  type StepExecutionDeps,
  type StepResult,
  type TurnOutcome,
} from './execute-step.js';
import { replayedCalls } from './replay-calls.js';
import type { AppliedEvent, HostCommitOptions } from './run-host.js';
import { executeCached, type StepCacheDeps } from './step-cache.js';
import { reservationUnit } from './usage-meter.js';

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
}

/** Options of {@link createUnitHost}. */
export interface UnitHostOptions {
  /** Lease of a running tool call in the ledger, renewed while it runs. */
  leaseMs: number;
  /** Who runs the units. */
  identity: WorkerIdentity;
}

/** The composition root of a worker's units: every hook named once, from the runtime's core. */
export function createUnitHost(core: RuntimeCore, options: UnitHostOptions): UnitHost {
  // A granular step's committed history, kept per run and step between turns: it is append-only,
  // so a cached prefix stays true and only the messages after it are read.
  const histories = new HistoryCache(core, 512);
  return {
    core,
    histories,
    identity: options.identity,
    aborts: new Map(),
    execution: {
      operators: core.operators,
      policies: core.policies,
      agents: core.agents,
      clientFor: core.clientFor,
      tools: core.tools,
      ledger: core.ledger,
      countToolCall: (runId, stepId) => core.counters.countToolCall(runId, stepId),
      maxToolCalls: undefined,
      leaseMs: options.leaseMs,
      journal: core.journal,
      fingerprints: core.fingerprints,
      readHistory: (runId, stepId, cursor) => histories.read(runId, stepId, cursor),
      onChunk: (chunk) => core.publishChunk(chunk),
      meter: core.meter,
      context: core.context,
      storeResult: (runId, content, thresholdBytes) =>
        core.blobs.offload(runId, content, thresholdBytes),
      policyVersion: core.policyVersion,
      onProgress: (where, info) =>
        core.publishProgress(where.runId, where.stepId, where.attempt, info),
    },
    stepCache: {
      cache: core.cache,
      clock: core.clock,
      identityOf: (step) => core.identityOf(step),
      onError: (error, stepId) =>
        core.log.warn(
          { stepId, error: error instanceof Error ? error.message : String(error) },
          'the step cache failed; the step runs uncached',
        ),
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
  return controller !== undefined;
}

/** The job in which units run one after the other, and how long it may take more. */
export interface Chain {
  /** The job's id: the carrier named in the notes of its chained commits. */
  self: string;
  /** Until when (`performance.now()`) the job may take one more unit. */
  until: number;
  /** Aborted when the worker closes: it then takes no more units. */
  closing?: AbortSignal;
}

/** Whether the chain may take one more unit now. */
const mayGoOn = (chain: Chain): boolean =>
  chain.closing?.aborted !== true && performance.now() < chain.until;

/**
 * What a unit came to: how it ended (a word for the job's return value: `succeeded`, `failed`,
 * `paused`, `already-done`, `budget`, …); the next unit to go on with in the same job, admitted,
 * and how this one `ended`; or "come back later" for a tool call whose lease another worker holds.
 */
export type UnitOutcome =
  | string
  | { next: JobSpec; admitted: Admitted; ended: string }
  | { retryAfterMs: number; unit: JobSpec };

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
  /** Hooks that record the unit's tool and model calls. */
  observers: Pick<StepExecutionDeps, 'onToolCall' | 'onModelCall'>;
  /** Its takeover (when it runs again what a dead worker started), its calls, and its run. */
  records(): Promise<RunEventRecord[]>;
}

const NOTHING: Promise<null> = Promise.resolve(null);

/** The longest delay a Node timer takes (2^31 - 1 ms); a longer one fires at once. */
const MAX_TIMER_MS = 2_147_483_647;

/**
 * What the steps `ids` produced, by step id: those that produced something, and `null` for a step
 * that was skipped (its dependents run, and see that it gave nothing). A snapshot is loaded
 * without the outputs (they are stored once, beside it): those of steps that succeeded are read
 * here, in one round trip, unless the run held in memory has them.
 */
async function outputsOf(
  core: RuntimeCore,
  runId: string,
  env: SnapshotEnvelope<RunSnapshot>,
  ids: readonly string[],
): Promise<Record<string, JsonValue>> {
  const out: Record<string, JsonValue> = {};
  const stored: string[] = [];
  const missing = env.outputsMissing;
  for (const d of ids) {
    const child = env.snapshot.children[d]?.snapshot;
    const output = child?.context.output;
    if (output !== undefined && output !== null) out[d] = output;
    else if (child?.value === 'SKIPPED') out[d] = null;
    // A null output held in memory from the step's own commit: it produced nothing.
    else if (child?.value === 'SUCCEEDED' && (missing === undefined || missing.has(d))) {
      stored.push(d);
    }
  }
  if (stored.length > 0) {
    const read = await core.store.readOutputs(runId, stored);
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
function agentUnit(
  host: UnitHost,
  meta: RunMeta,
  step: PlanStep,
  state: StepState,
  turn?: number,
): AgentUnit | undefined {
  const fallback = state.fallback?.active === true ? fallbackStep(step) : null;
  const runs = fallback ?? step;
  if (runs.kind !== 'agent') return undefined;
  const agent = host.core.agents.get(runs.agent);
  if (agent === undefined) return undefined;
  return { tenantId: meta.tenantId, agent, mode: turn === undefined ? 'atomic' : 'granular' };
}

/** In a run that replays another: where the step's tool calls find the original's receipts. */
function replayOf(host: UnitHost, runId: string, meta: RunMeta, step: PlanStep) {
  const { core } = host;
  const blobs = { store: core.blobs, runId };
  const replay = replayedCalls(core.ledger, meta.replay, meta.tenantId, step, blobs);
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
  await core.publishAborts(runId, applied.transition.planned);
  await core.enqueueDue(runId, applied.envelope);
}

/** A deadline job: stops the run for its `maxWallClockMs` unless it ended. */
export async function runDeadline(host: UnitHost, runId: string): Promise<string> {
  const { core } = host;
  const env = await core.store.load(runId, { outputs: false });
  if (env.snapshot.status !== 'active' || env.snapshot.value === 'failed') return 'ended';
  const meta = await core.meta(runId);
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
 * After a commit that ended the run: settles the usage reservations a worker that died left
 * open (none in the common case: one small read), so a finished run holds no open reservation.
 */
async function afterCommit(
  host: UnitHost,
  runId: string,
  meta: RunMeta,
  status: string,
): Promise<void> {
  if (status !== 'succeeded' && status !== 'failed') return;
  const { core } = host;
  core.runs.ended(runId, status, core.clock()).catch(() => {}); // healed by the list if lost
  await core.meter.settle({ tenantId: meta.tenantId, runId }, (r) => {
    const step = meta.plan.steps.find((s) => s.id === r.stepId);
    const mode = step?.kind === 'agent' && step.mode === 'granular' ? 'granular' : 'atomic';
    return journaledReplyOf(core, runId, mode, r);
  });
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
  const child = env.snapshot.children[data.stepId!]?.snapshot;
  const state: StepState | undefined =
    child === undefined ? undefined : { ...child.context, status: child.value };
  if (
    state === undefined ||
    !isDue(state.status) ||
    state.attempt !== data.attempt ||
    (state.pauses ?? 0) !== (data.pause ?? 0)
  ) {
    await core.enqueueDue(runId, env, self);
    return 'already-done';
  }
  const meta = await core.meta(runId);
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
    const used = runSteps(env.snapshot).reduce((n, s) => n + s.attempt, 0);
    if (used > budgets.maxSteps) {
      await stopForBudget(host, runId, env, { budget: 'maxSteps', limit: budgets.maxSteps, used });
      return 'budget';
    }
  }
  const step = meta.plan.steps.find((s) => s.id === data.stepId)!;
  return { env, state, meta, step };
}

/**
 * Runs `work` as the attempt's execution: aborted by a run cancel or the job's own signal, and,
 * with a `limit`, when the limit's time is up. Then the attempt is over: it fails with the
 * limit's error at once, and whatever `work` still produces is discarded (a late success is
 * never committed; a tool still running loses its lease and lapses into doubt).
 */
export async function guardUnit<T extends StepResult | TurnOutcome>(
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
  const startedAt = await core.counters.stepStartedAt(runId, step.id, now);
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

/**
 * What ends a job before its commit: a tool call whose lease another worker holds (come back
 * later, without spending an attempt), or a budget hit (the run is stopped). Null otherwise.
 */
async function endsEarly(
  host: UnitHost,
  env: SnapshotEnvelope<RunSnapshot>,
  result: StepResult | TurnOutcome,
  data: JobData,
): Promise<UnitOutcome | null> {
  if (result.kind === 'failed' && result.error.code === 'tool_call_busy') {
    const retryAfterMs = Math.max(50, result.error.retryAfterMs ?? 1000);
    return { retryAfterMs, unit: unitJobOf(data) };
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
function notifyFailures(
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
    const status = applied.envelope.snapshot.children[e.stepId]?.snapshot.value;
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

/**
 * The start of an execution of a READY step. Not a commit of its own (a commit per step would
 * cost about as much as the step's own commit): the worker notes it beside the run with one
 * write it does not wait for, which status reads to show the step RUNNING, and returns the
 * `step.started` (READY → RUNNING, stamped now) that it commits with the execution's first
 * result, so the event stream records the interval the attempt ran. Nothing decides on the
 * note: which execution may run is still only the job's guard against the snapshot. The write
 * returns the note it replaced: the same execution noted by another worker is a unit taken over.
 * The unit's tool and model calls and its run (worker, duration) are recorded in its commit.
 */
export function startUnit(
  host: UnitHost,
  state: StepState,
  runId: string,
  stepId: string,
  turn?: number,
  noted = false,
  agent?: AgentUnit,
): Unit {
  const { core, identity } = host;
  const at = core.clock();
  const began = performance.now();
  const { attempt } = state;
  const pauses = state.pauses ?? 0;
  const where = { stepId, attempt, ...(turn === undefined ? {} : { turn }) };
  // The note is also written for every turn: a turn taken over is a unit of its own. A unit
  // that a commit of this job handed to it was noted by that commit: no other worker has run it.
  const previous =
    !noted && (state.status === 'READY' || turn !== undefined)
      ? core.unitNotes
          .swap(runId, stepId, formatUnitNote(attempt, pauses, at, turn, identity))
          .catch(() => null)
      : NOTHING;
  const done: RunEventRecord[] = [];
  const worker = { host: identity.host, pid: identity.pid };
  return {
    started: state.status === 'READY' ? [{ type: 'step.started', stepId, attempt, at }] : [],
    observers: {
      onToolCall: (c) => done.push({ type: 'tool.called', ...where, ...c, at: core.clock() }),
      onModelCall: (c) => done.push({ type: 'model.called', ...where, ...c, at: core.clock() }),
    },
    async records() {
      const before = parseUnitNote(await previous);
      const out: RunEventRecord[] = [];
      // This unit was started before and never committed (a commit of it would have kept it
      // from running again): that execution died, lost its job's lock, or came back later.
      const again =
        before !== null &&
        before.attempt === attempt &&
        before.pauses === pauses &&
        before.turn === (turn ?? null);
      // Noted by another worker: it died (or lost its job's lock), and this worker runs the unit
      // again.
      if (again && before.worker != null && before.worker.id !== identity.id) {
        out.push({
          type: turn === undefined ? 'step.takenOver' : 'turn.takenOver',
          ...where,
          previousWorker: { host: before.worker.host, pid: before.worker.pid },
          previousStartedAt: before.at,
          worker,
          at,
        });
      }
      // The model calls those executions made are recorded here, since their commit never came.
      if (again && agent !== undefined) {
        const observed = new Set(done.map((d) => d['reservationId']));
        const unit = { runId, stepId, attempt, pauses, ...(turn === undefined ? {} : { turn }) };
        out.push(...(await uncommittedCalls(host, agent, unit, observed)));
      }
      out.push(...done, {
        type: turn === undefined ? 'step.ran' : 'turn.ran',
        ...where,
        worker,
        startedAt: at,
        durationMs: Math.round((performance.now() - began) * 1000) / 1000,
        at: core.clock(),
      });
      return out;
    },
  };
}

/** What the records of an agent step's unit need: the run's tenant, the step's model. */
export interface AgentUnit {
  tenantId: string;
  agent: AgentDefinition;
  mode: 'atomic' | 'granular';
}

/**
 * The reply the journal holds for the model call of reservation `r` of a step of mode `mode`:
 * a granular turn's, or, for an atomic attempt's call (its attempt named in the reservation's
 * id), that call's; null when there is none.
 */
async function journaledReplyOf(
  core: RuntimeCore,
  runId: string,
  mode: 'atomic' | 'granular',
  r: Reservation,
): Promise<ModelReply | null> {
  if (mode === 'granular') return core.journal.get(runId, r.stepId, r.turn);
  const unit = reservationUnit(r.id);
  if (unit === null) return null;
  const calls = await core.journal.attemptCalls(runId, r.stepId, unit.attempt, r.turn + 1);
  return calls[r.turn]?.reply ?? null;
}

/**
 * The `model.called` records of the model calls that earlier executions of this unit made and
 * never committed (they stopped before their commit): its reservations (the reservation ids name
 * the attempt and pause that made them, and a granular turn's reservations its turn) that this
 * execution did not make. Those still open are settled first (a reply in the journal for it: its
 * usage; sent and unanswered: the baseline; never sent: nothing). A reservation that sent no
 * request is released, not a call, and has no record. Read only for a unit that ran before.
 */
async function uncommittedCalls(
  host: UnitHost,
  agent: AgentUnit,
  unit: { runId: string; stepId: string; attempt: number; pauses: number; turn?: number },
  observed: ReadonlySet<unknown>,
): Promise<RunEventRecord[]> {
  const { core } = host;
  const { runId, stepId, attempt, pauses, turn } = unit;
  const theirs = (r: Reservation): boolean => {
    if (r.stepId !== stepId || observed.has(r.id)) return false;
    if (turn !== undefined && r.turn !== turn) return false;
    const made = reservationUnit(r.id);
    return made !== null && made.attempt === attempt && made.pause === pauses;
  };
  try {
    let list = (await core.quota.list(agent.tenantId, runId)).filter(theirs);
    if (list.some((r) => r.outcome === null)) {
      const where = { tenantId: agent.tenantId, runId, stepId, agent: agent.agent };
      await core.meter.settle(where, (r) => journaledReplyOf(core, runId, agent.mode, r));
      list = (await core.quota.list(agent.tenantId, runId)).filter(theirs);
    }
    const where = { stepId, attempt, ...(turn === undefined ? {} : { turn }) };
    return list
      .filter((r) => (r.outcome === 'usage' || r.outcome === 'baseline') && r.charged !== null)
      .map((r) => {
        const charged = r.charged!;
        const end = r.reconciledAt ?? r.createdAt;
        return {
          type: 'model.called',
          ...where,
          reservationId: r.id,
          model: agent.agent.model,
          turn: r.turn,
          charged: r.outcome as 'usage' | 'baseline',
          inputTokens: charged.inputTokens,
          outputTokens: charged.outputTokens,
          costUsd: charged.microUsd / 1_000_000,
          durationMs: Math.max(0, end - (r.sentAt ?? r.createdAt)),
          // Made by an execution of the unit that never committed; recorded by this one.
          uncommitted: true,
          at: end,
        };
      });
  } catch (error) {
    // The record of the unit is not worth failing its commit for.
    core.log.warn(
      { runId, stepId, attempt, error: error instanceof Error ? error.message : String(error) },
      'could not read the model calls of an earlier execution of the unit',
    );
    return [];
  }
}

/** Commit options that also record what the unit did. */
async function recording(
  unit: Unit,
  options: CommitOptions | ((t: RunTransition) => CommitOptions) = {},
): Promise<(t: RunTransition) => HostCommitOptions> {
  const records = await unit.records();
  return (t) => ({ ...(typeof options === 'function' ? options(t) : options), records });
}

const failed = (
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
async function pauseUnit(
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
  await core.enqueueDue(runId, applied.envelope, chain.self);
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
  const admitted = held ?? (await admitUnit(host, data, chain.self));
  if (typeof admitted === 'string') return admitted;
  const { env, state, meta, step } = admitted;
  const { runId } = data;
  const stepId = data.stepId!;
  const attempt = data.attempt!;
  const depOutputs = await outputsOf(core, runId, env, step.dependsOn);
  const limit = await attemptLimit(host, runId, step, attempt);
  const unit = startUnit(
    host,
    state,
    runId,
    stepId,
    undefined,
    admitted.noted,
    agentUnit(host, meta, step, state),
  );
  const where = { step, state, runId, tenantId: meta.tenantId, runInput: meta.input, depOutputs };
  const deps = executionDepsFor(host, meta);
  const result = await guardUnit(host, { runId, stepId, attempt }, jobSignal, limit, (signal) =>
    executeCached(
      host.stepCache,
      {
        ...where,
        options: meta.cache,
        beforeHit: () => checkTaggedPolicies(deps, { ...where, signal }),
      },
      () =>
        executeStep(
          { ...deps, ...unit.observers },
          { ...where, signal, ...replayOf(host, runId, meta, step) },
        ),
    ),
  );
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
  if (next !== null) return nextUnit(host, next, applied, chain, result.kind);
  await core.enqueuePlanned(runId, applied);
  await afterCommit(host, runId, meta, applied.transition.status);
  return result.kind;
}

/**
 * One turn of a granular agent step, whole: the turn guard against the turns the snapshot says
 * are committed, the turn itself (its journaled model call and ledger-guarded tool calls), then
 * one commit of the turn's messages and its `turn.committed` (with `step.succeeded` for a final
 * answer, or `step.failed` when the turn was the last one allowed), and the next unit.
 */
export async function runTurnUnit(
  host: UnitHost,
  data: JobData,
  chain: Chain,
  jobSignal?: AbortSignal,
  held?: Admitted,
): Promise<UnitOutcome> {
  if (held === undefined) return turnUnit(host, data, chain, jobSignal);
  try {
    return await turnUnit(host, data, chain, jobSignal, held);
  } finally {
    // A turn this job went on with may have had its reservation sent with the commit before it:
    // released if the turn ended without its model call taking it.
    await host.core.meter.release(data.runId, data.stepId!, data.turn!);
  }
}

async function turnUnit(
  host: UnitHost,
  data: JobData,
  chain: Chain,
  jobSignal?: AbortSignal,
  held?: Admitted,
): Promise<UnitOutcome> {
  const { core } = host;
  // Asked for beside the guard's read (one round trip for both): a turn that runs needs it. A
  // turn this job goes on with has nothing journaled: its turn was committed a moment ago, by
  // this job, so no worker can have taken the next one (a racing worker's reply would still win
  // when this one is recorded: the journal keeps the first).
  const journaled =
    held === undefined ? core.journal.get(data.runId, data.stepId!, data.turn!) : NOTHING;
  journaled.catch(() => {});
  const admitted = held ?? (await admitUnit(host, data, chain.self));
  if (typeof admitted === 'string') return admitted;
  const { env, state, meta } = admitted;
  const step = admitted.step as AgentStep;
  const { runId } = data;
  const stepId = data.stepId!;
  const attempt = data.attempt!;
  const turn = data.turn!;
  const stored = state.agent?.turns ?? 0;
  if (stored !== turn) {
    // stored > turn: the turn is committed (a worker died after its commit): nothing runs and
    // nothing is reserved; the next unit is enqueued. stored < turn: a gap, which is never
    // appended over; the work resumes from the committed turn.
    if (stored < turn) {
      core.log.warn(
        { runId, stepId, attempt, turn, committedTurns: stored, error: 'resume_error' },
        'turn job ahead of the committed turns: resuming from the committed turn',
      );
    }
    await core.enqueueDue(runId, env, chain.self);
    return stored > turn ? 'turn-committed' : 'turn-gap';
  }
  const limit = await attemptLimit(host, runId, step, attempt);
  const depOutputs = await outputsOf(core, runId, env, step.dependsOn);
  const unit = startUnit(
    host,
    state,
    runId,
    stepId,
    turn,
    admitted.noted,
    agentUnit(host, meta, step, state, turn),
  );
  const outcome = await guardUnit(host, { runId, stepId, attempt }, jobSignal, limit, (signal) =>
    executeTurn(
      { ...executionDepsFor(host, meta), ...unit.observers },
      {
        step,
        state,
        runId,
        tenantId: meta.tenantId,
        runInput: meta.input,
        depOutputs,
        turn,
        journaled,
        signal,
        receiptsWithCommit: true,
        // Only a job that may go on with the next turn sends its reservation ahead.
        aheadOfNext: mayGoOn(chain),
        ...replayOf(host, runId, meta, step),
      },
    ),
  );
  // A reservation sent ahead for this turn and not taken by its model call (the turn failed
  // before it, or took its reply from the journal) is released before anything is committed.
  if (held !== undefined) await core.meter.release(runId, stepId, turn);
  const early = await endsEarly(host, env, outcome, data);
  if (early !== null || outcome.kind === 'budget') return early ?? 'budget';
  // The turn commits nothing of itself: once the call is decided, it is taken again from its
  // journaled reply (the calls before the held one return their receipts).
  if (outcome.kind === 'paused') return pauseUnit(host, env, unit, data, outcome.call, chain);
  if (outcome.kind === 'failed') {
    // A failed turn commits nothing of itself: the step fails (or is retried) where it stood.
    const failure = failed(host, stepId, attempt, outcome.error);
    const applied = await core.host.apply(
      runId,
      [...unit.started, failure],
      env,
      await recording(unit),
    );
    notifyFailures(host, runId, [failure], applied, turn);
    await core.enqueueDue(runId, applied.envelope, chain.self);
    await afterCommit(host, runId, meta, applied.transition.status);
    return 'failed';
  }
  const { messages, fingerprint, final, receipts, ahead } = outcome.turn;
  const cursor = state.agent?.cursor ?? 0;
  const at = core.clock();
  const events: RunEvent[] = [
    {
      type: 'turn.committed',
      stepId,
      attempt,
      turn,
      cursor: cursor + messages.length,
      fingerprint,
      at,
    },
  ];
  if (final !== null) {
    events.push({
      type: 'step.succeeded',
      stepId,
      attempt,
      output: final as unknown as JsonValue,
      at,
    });
  } else if (turn + 1 >= step.maxTurns) {
    // The last allowed turn is committed; the loop may not go on.
    const error = new MaxTurnsExceededError(stepId, step.maxTurns).toJSON();
    events.push(failed(host, stepId, attempt, error));
  }
  // The next turn's reservation, sent beside this commit when this job takes the next turn: right
  // after it in the same write (the commit is sent once its options are taken), so the commit's
  // own answer does not wait on the reservation.
  const onNext =
    ahead === undefined || final !== null
      ? undefined
      : (next: JobSpec) => {
          if (next.data.stepId === stepId && next.data.turn === turn + 1) {
            queueMicrotask(() => ahead.reserve());
          }
        };
  // Whatever this unit does not hand on to the next turn, its reservation is released.
  let handedOn = false;
  try {
    const { applied, next } = await commitUnit(host, {
      data,
      env,
      unit,
      events,
      chain,
      base: {
        appends: [core.history.appendOp(runId, stepId, cursor, messages)],
        // The last read-only call's receipt, written with the turn: one write fewer per turn.
        ...(receipts.length === 0 ? {} : { ledgerRecords: receipts }),
      },
      ...(onNext === undefined ? {} : { onNext }),
    });
    if (applied.committed) host.histories.committed(runId, stepId, cursor, messages);
    notifyFailures(host, runId, events, applied, turn);
    debugPoint(DebugPoint.afterCommit, `${stepId}:${turn}`);
    const ended = final !== null ? 'succeeded' : 'turn';
    if (next !== null) {
      const going = await nextUnit(host, next, applied, chain, ended);
      handedOn = typeof going !== 'string';
      return going;
    }
    await core.enqueueDue(runId, applied.envelope, chain.self);
    await afterCommit(host, runId, meta, applied.transition.status);
    return ended;
  } finally {
    if (!handedOn && onNext !== undefined) await core.meter.release(runId, stepId, turn + 1);
  }
}

/** Runs the unit a job (or a chain) names: a turn of a granular step, or a step attempt. */
export function runUnit(
  host: UnitHost,
  name: string,
  data: JobData,
  chain: Chain,
  jobSignal?: AbortSignal,
  held?: Admitted,
): Promise<UnitOutcome> {
  return name === JobName.turn
    ? runTurnUnit(host, data, chain, jobSignal, held)
    : runStepUnit(host, data, chain, jobSignal, held);
}
