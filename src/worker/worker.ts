import { randomInt } from 'node:crypto';
import { DelayedError, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import {
  executeStep,
  executeTurn,
  type StepExecutionDeps,
  type StepResult,
  type TurnOutcome,
} from '../actors/execute-step.js';
import { MaxTurnsExceededError, RunNotFoundError, type SerializedError } from '../errors.js';
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
import type { CommitOptions } from '../persistence/snapshot-store.js';
import type { AppliedEvent } from '../actors/run-host.js';
import type { RunEvent } from '../schemas/events.js';
import { coalesceWrites } from '../persistence/write-coalescing.js';
import { abortMessage, type RunMeta, type RuntimeCore } from './core.js';
import { HistoryCache } from './history-cache.js';
import { carrierNote, JobName, soleUnit, unitJobOf, type JobData, type JobSpec } from './jobs.js';

/** What the steps `ids` produced (those that produced something), by step id. */
function outputsOf(snapshot: RunSnapshot, ids: readonly string[]): Record<string, JsonValue> {
  const out: Record<string, JsonValue> = {};
  for (const d of ids) {
    const output = snapshot.children[d]?.snapshot.context.output;
    if (output !== undefined && output !== null) out[d] = output;
  }
  return out;
}

const NOTHING: Promise<null> = Promise.resolve(null);

/** The job in which units run one after the other, and whether it may take one more. */
interface Chain {
  /** The job's id: the carrier named in the notes of its chained commits. */
  self: string;
  mayGoOn(): boolean;
}

/**
 * What a unit came to: how it ended (a word for the job's return value); the next unit to go on
 * with in the same job; or "come back later" for a tool call whose lease another worker holds.
 */
type UnitOutcome =
  string | { next: JobSpec; admitted: Admitted } | { retryAfterMs: number; unit: JobSpec };

/** A job's step attempt, admitted to run. */
interface Admitted {
  env: SnapshotEnvelope<RunSnapshot>;
  state: StepState;
  meta: RunMeta;
  step: PlanStep;
}

/** Options of a worker. */
export interface WorkerOptions {
  /** Units of work processed at once by this worker. @defaultValue 8 */
  concurrency?: number;
  /**
   * How soon a run whose worker died continues on another worker, in ms: the job lock lasts
   * half of it and the stalled check runs every quarter.
   * @defaultValue 2000
   */
  recoveryMs?: number;
  /** Lease of a running tool call in the ledger, renewed while it runs. @defaultValue 5000 */
  toolLeaseMs?: number;
  /** Re-enqueue the work of every unfinished run when the worker starts. @defaultValue true */
  recoverOnStart?: boolean;
  /**
   * How long one job may go on with its run's next units, in ms, before it hands the next one to
   * the queue. After a commit that leaves the run exactly one unit to do (the next step of a
   * line, the next turn of an agent), the job runs that unit itself instead of enqueueing it and
   * waiting for the queue to hand it out again: a step or turn then costs one commit, not a
   * commit, a queue add and a queue fetch. The job stays locked meanwhile, so a worker that dies
   * mid-chain is recovered exactly as one that died in a single unit. 0: one job per unit.
   * @defaultValue 1000
   */
  chainMs?: number;
}

/** A running worker. */
export interface FlujoWorker {
  /** Resolves once the worker listens and its start-up recovery is done. */
  ready(): Promise<void>;
  /** Stops taking work, lets running units finish, and closes its connections. */
  close(): Promise<void>;
}

/** Starts a BullMQ worker that drives the runtime's runs one unit of work at a time. */
export function startWorker(core: RuntimeCore, options: WorkerOptions = {}): FlujoWorker {
  const recoveryMs = options.recoveryMs ?? 2000;
  const leaseMs = options.toolLeaseMs ?? 5000;
  const connection: Redis = coalesceWrites(core.redis.duplicate({ maxRetriesPerRequest: null }));
  connection.on('error', () => {});
  const aborts = new Map<string, AbortController>();
  const subscriber: Redis = core.redis.duplicate();
  subscriber.on('error', () => {});
  const abortChannel = core.abortChannel();
  subscriber.on('message', (_channel: string, message: string) => {
    aborts.get(message)?.abort(new Error('the run was cancelled'));
  });

  const chainMs = options.chainMs ?? 1000;
  let closing = false;

  const processor = async (job: Job<JobData>, token?: string, signal?: AbortSignal) => {
    const { runId } = job.data;
    try {
      switch (job.name) {
        case JobName.step:
        case JobName.turn:
          return await processUnits(job, token, signal);
        case JobName.retry:
          await core.apply(runId, {
            type: 'retry.due',
            stepId: job.data.stepId!,
            attempt: job.data.attempt!,
            at: core.clock(),
          });
          return 'retry-due';
        case JobName.deadline:
          return await processDeadline(runId);
        default:
          return 'unknown-job';
      }
    } catch (error) {
      // A job for a run that no longer exists has nothing to do.
      if (error instanceof RunNotFoundError) return 'run-not-found';
      throw error;
    }
  };

  /**
   * Runs the job's unit, then, while the chain may go on, the units its commits leave as the
   * run's only work (see `chainMs`), each admitted like a job of its own but without reading the
   * run again: the job's own commit is the latest.
   */
  async function processUnits(
    job: Job<JobData>,
    token: string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<string> {
    const started = performance.now();
    const chain: Chain = {
      self: job.id!,
      mayGoOn: () => chainMs > 0 && !closing && performance.now() - started < chainMs,
    };
    let name = job.name;
    let data = job.data;
    let held: Admitted | undefined;
    for (;;) {
      const outcome =
        name === JobName.turn
          ? await processTurn(data, signal, chain, held)
          : await processStep(data, signal, chain, held);
      if (typeof outcome === 'string') return outcome;
      if ('next' in outcome) {
        ({ name, data } = outcome.next);
        held = outcome.admitted;
        continue;
      }
      // Another worker still holds a lease on one of the step's tool calls (it may be alive, or
      // its lease has not lapsed yet): come back later, without spending an attempt.
      const at = core.clock() + outcome.retryAfterMs;
      if (held === undefined) {
        await job.moveToDelayed(at, token);
        throw new DelayedError();
      }
      // A unit this job carried: it gets its own job, due then.
      await core.add([
        { ...outcome.unit, opts: { ...outcome.unit.opts, delay: outcome.retryAfterMs } },
      ]);
      return 'busy';
    }
  }

  async function stopForBudget(
    runId: string,
    env: SnapshotEnvelope<RunSnapshot>,
    detail: JsonValue,
  ): Promise<void> {
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

  async function processDeadline(runId: string): Promise<string> {
    const env = await core.store.load(runId);
    if (env.snapshot.status !== 'active' || env.snapshot.value === 'failed') return 'ended';
    const meta = await core.meta(runId);
    const limit = meta.plan.budgets?.maxWallClockMs ?? 0;
    await stopForBudget(runId, env, {
      budget: 'maxWallClockMs',
      limit,
      used: core.clock() - meta.createdAt,
    });
    return 'deadline';
  }

  // A granular step's committed history, kept per run and step between turns: it is append-only,
  // so a cached prefix stays true and only the messages after it are read.
  const histories = new HistoryCache(core, 512);
  const deps: StepExecutionDeps = {
    operators: core.operators,
    agents: core.agents,
    clientFor: core.clientFor,
    tools: core.tools,
    ledger: core.ledger,
    countToolCall: (id) => core.redis.hincrby(core.keys.counters(id), 'toolCalls', 1),
    maxToolCalls: undefined,
    leaseMs,
    journal: core.journal,
    fingerprints: core.fingerprints,
    readHistory: (runId, stepId, cursor) => histories.read(runId, stepId, cursor),
    onChunk: (chunk) => core.publishChunk(chunk),
    meter: core.meter,
    context: core.context,
    offload: (runId, content, threshold) => core.blobs.offload(runId, content, threshold),
  };

  /** The deps of one unit of the run: its budgets. */
  const depsFor = (meta: RunMeta): StepExecutionDeps => {
    const budgets = meta.plan.budgets;
    return {
      ...deps,
      maxToolCalls: budgets?.maxToolCalls,
      budget: {
        ...(budgets?.maxTokens === undefined ? {} : { maxTokens: budgets.maxTokens }),
        ...(budgets?.maxCostUsd === undefined ? {} : { maxCostUsd: budgets.maxCostUsd }),
      },
    };
  };

  /**
   * After a commit that ended the run: settles the usage reservations a worker that died left
   * open (none in the common case: one small read), so a finished run holds no open reservation.
   */
  async function afterCommit(runId: string, meta: RunMeta, status: string): Promise<void> {
    if (status !== 'succeeded' && status !== 'failed') return;
    await core.meter.settle({ tenantId: meta.tenantId, runId }, (r) =>
      core.journal.get(runId, r.stepId, r.turn),
    );
  }

  /**
   * The guard of every step and turn job: the attempt must still be RUNNING (else it was already
   * committed or cancelled: a redelivered job is harmless, and enqueueing what is due heals a crash
   * between a commit and its enqueue), and the run's budgets must allow it to go on. `self` is the
   * job's id (see `enqueueDue`).
   */
  async function admit(data: JobData, self: string): Promise<Admitted | string> {
    return admitLoaded(data, await core.host.load(data.runId), self);
  }

  /** {@link admit} of a unit of a run as `env` holds it. */
  async function admitLoaded(
    data: JobData,
    env: SnapshotEnvelope<RunSnapshot>,
    self: string,
  ): Promise<Admitted | string> {
    const { runId } = data;
    const child = env.snapshot.children[data.stepId!]?.snapshot;
    const state: StepState | undefined =
      child === undefined ? undefined : { ...child.context, status: child.value };
    if (state === undefined || state.status !== 'RUNNING' || state.attempt !== data.attempt) {
      await core.enqueueDue(runId, env, self);
      return 'already-done';
    }
    const meta = await core.meta(runId);
    const budgets = meta.plan.budgets;
    const now = core.clock();
    if (budgets?.maxWallClockMs !== undefined && now - meta.createdAt > budgets.maxWallClockMs) {
      await stopForBudget(runId, env, {
        budget: 'maxWallClockMs',
        limit: budgets.maxWallClockMs,
        used: now - meta.createdAt,
      });
      return 'budget';
    }
    if (budgets?.maxSteps !== undefined) {
      const used = runSteps(env.snapshot).reduce((n, s) => n + s.attempt, 0);
      if (used > budgets.maxSteps) {
        await stopForBudget(runId, env, { budget: 'maxSteps', limit: budgets.maxSteps, used });
        return 'budget';
      }
    }
    const step = meta.plan.steps.find((s) => s.id === data.stepId)!;
    return { env, state, meta, step };
  }

  /** Runs `work` as the attempt's execution: aborted by a run cancel or the job's own signal. */
  async function guarded<T>(
    runId: string,
    stepId: string,
    attempt: number,
    jobSignal: AbortSignal | undefined,
    work: (signal: AbortSignal) => Promise<T>,
  ): Promise<T> {
    const controller = new AbortController();
    const abortKey = abortMessage(runId, stepId, attempt);
    aborts.set(abortKey, controller);
    const onJobAbort = () => controller.abort(jobSignal?.reason);
    jobSignal?.addEventListener('abort', onJobAbort, { once: true });
    try {
      return await work(controller.signal);
    } finally {
      aborts.delete(abortKey);
      jobSignal?.removeEventListener('abort', onJobAbort);
    }
  }

  /**
   * What ends a job before its commit: a tool call whose lease another worker holds (come back
   * later, without spending an attempt), or a budget hit (the run is stopped). Null otherwise.
   */
  async function endsEarly(
    runId: string,
    env: SnapshotEnvelope<RunSnapshot>,
    result: StepResult | TurnOutcome,
    data: JobData,
  ): Promise<UnitOutcome | null> {
    if (result.kind === 'failed' && result.error.code === 'tool_call_busy') {
      const retryAfterMs = Math.max(50, result.error.retryAfterMs ?? 1000);
      return { retryAfterMs, unit: unitJobOf(data) };
    }
    if (result.kind === 'budget') {
      await stopForBudget(runId, env, result.error.details as JsonValue);
      return 'budget';
    }
    return null;
  }

  const failed = (stepId: string, attempt: number, error: SerializedError): RunEvent => ({
    type: 'step.failed',
    stepId,
    attempt,
    error,
    jitterSeed: randomInt(0, 2 ** 32),
    at: core.clock(),
  });

  /**
   * Commit options decided once the transition is known: when the chain may go on and the commit
   * leaves the run one unit to do, the job is noted as that unit's carrier, and `chained()` returns
   * the unit after the commit; else `chained()` is null and the caller enqueues what became due.
   */
  function chaining(
    runId: string,
    chain: Chain,
    base: CommitOptions = {},
  ): { options: (t: RunTransition) => CommitOptions; chained: () => JobSpec | null } {
    let next: JobSpec | null = null;
    return {
      options: (t) => {
        next = chain.mayGoOn() ? soleUnit(runId, t.snapshot) : null;
        return next === null
          ? base
          : { ...base, carrier: carrierNote({ job: chain.self, unit: next.opts.jobId }) };
      },
      chained: () => next,
    };
  }

  /** The outcome of a commit that noted the job as carrier of `next`: that unit, admitted. */
  async function goOn(next: JobSpec, applied: AppliedEvent, chain: Chain): Promise<UnitOutcome> {
    const admitted = await admitLoaded(next.data, applied.envelope, chain.self);
    return typeof admitted === 'string' ? admitted : { next, admitted };
  }

  async function processStep(
    data: JobData,
    jobSignal: AbortSignal | undefined,
    chain: Chain,
    held?: Admitted,
  ): Promise<UnitOutcome> {
    const admitted = held ?? (await admit(data, chain.self));
    if (typeof admitted === 'string') return admitted;
    const { env, state, meta, step } = admitted;
    const { runId } = data;
    const stepId = data.stepId!;
    const attempt = data.attempt!;
    const depOutputs = outputsOf(env.snapshot, step.dependsOn);
    const result = await guarded(runId, stepId, attempt, jobSignal, (signal) =>
      executeStep(depsFor(meta), {
        step,
        state,
        runId,
        tenantId: meta.tenantId,
        runInput: meta.input,
        depOutputs,
        signal,
      }),
    );
    const early = await endsEarly(runId, env, result, data);
    if (early !== null) return early;
    const event: RunEvent =
      result.kind === 'succeeded'
        ? { type: 'step.succeeded', stepId, attempt, output: result.output, at: core.clock() }
        : failed(stepId, attempt, result.error);
    const { options: commitOptions, chained } = chaining(runId, chain);
    const applied = await core.host.apply(runId, event, env, commitOptions);
    debugPoint(DebugPoint.afterCommit, stepId);
    const next = applied.committed ? chained() : null;
    if (next !== null) return goOn(next, applied, chain);
    await core.enqueuePlanned(runId, applied);
    await afterCommit(runId, meta, applied.transition.status);
    return result.kind;
  }

  /**
   * One turn of a granular agent step (DESIGN §3): the turn guard against the turns the snapshot
   * says are committed, the turn itself, then one commit of the turn's messages and its
   * `turn.committed` (with `step.succeeded` for a final answer, or `step.failed` when the turn was
   * the last one allowed), and the next unit.
   */
  async function processTurn(
    data: JobData,
    jobSignal: AbortSignal | undefined,
    chain: Chain,
    held?: Admitted,
  ): Promise<UnitOutcome> {
    // Asked for beside the guard's read (one round trip for both): a turn that runs needs it. A
    // turn this job goes on with has nothing journaled: its turn was committed a moment ago, by
    // this job, so no worker can have taken the next one (a racing worker's reply would still win
    // when this one is recorded: the journal keeps the first).
    const journaled =
      held === undefined ? core.journal.get(data.runId, data.stepId!, data.turn!) : NOTHING;
    journaled.catch(() => {});
    const admitted = held ?? (await admit(data, chain.self));
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
    const outcome = await guarded(runId, stepId, attempt, jobSignal, (signal) =>
      executeTurn(depsFor(meta), {
        step,
        state,
        runId,
        tenantId: meta.tenantId,
        runInput: meta.input,
        depOutputs: outputsOf(env.snapshot, step.dependsOn),
        turn,
        journaled,
        signal,
      }),
    );
    const early = await endsEarly(runId, env, outcome, data);
    if (early !== null || outcome.kind === 'budget') return early ?? 'budget';
    if (outcome.kind === 'failed') {
      // A failed turn commits nothing of itself: the step fails (or is retried) where it stood.
      const applied = await core.host.apply(runId, failed(stepId, attempt, outcome.error), env);
      await core.enqueueDue(runId, applied.envelope, chain.self);
      await afterCommit(runId, meta, applied.transition.status);
      return 'failed';
    }
    const { messages, fingerprint, final } = outcome.turn;
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
      events.push(failed(stepId, attempt, error));
    }
    const { options: commitOptions, chained } = chaining(runId, chain, {
      appends: [core.history.appendOp(runId, stepId, cursor, messages)],
    });
    const applied = await core.host.apply(runId, events, env, commitOptions);
    if (applied.committed) histories.committed(runId, stepId, cursor, messages);
    debugPoint(DebugPoint.afterCommit, `${stepId}:${turn}`);
    const next = applied.committed ? chained() : null;
    if (next !== null) return goOn(next, applied, chain);
    await core.enqueueDue(runId, applied.envelope, chain.self);
    await afterCommit(runId, meta, applied.transition.status);
    return final !== null ? 'succeeded' : 'turn';
  }

  const worker = new Worker<JobData>(core.queueName, processor, {
    connection,
    prefix: core.keys.queuePrefix(),
    concurrency: options.concurrency ?? 8,
    lockDuration: Math.max(200, Math.round(recoveryMs / 2)),
    stalledInterval: Math.max(100, Math.round(recoveryMs / 4)),
    // Redelivery is safe (the guard above); never give up on a unit because it stalled.
    maxStalledCount: 1_000_000,
    autorun: false,
  });
  worker.on('error', () => {});

  const ready = (async () => {
    await subscriber.subscribe(abortChannel);
    if (options.recoverOnStart ?? true) await recover();
    void worker.run().catch(() => {});
    await worker.waitUntilReady();
  })();

  async function recover(): Promise<void> {
    let cursor = '0';
    do {
      const [next, ids] = await core.redis.sscan(core.keys.activeRuns(), cursor, 'COUNT', 500);
      cursor = next;
      for (const runId of ids) {
        const env = await core.store.tryLoad(runId);
        if (env === null) await core.redis.srem(core.keys.activeRuns(), runId);
        else await core.enqueueDue(runId, env);
      }
    } while (cursor !== '0');
  }

  return {
    ready: () => ready,
    async close() {
      closing = true;
      await ready.catch(() => {});
      await worker.close();
      subscriber.disconnect();
      connection.disconnect();
    },
  };
}
