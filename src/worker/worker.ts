import { randomInt } from 'node:crypto';
import { DelayedError, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import { executeStep } from '../actors/execute-step.js';
import { RunNotFoundError } from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import { runSteps, type RunSnapshot } from '../machines/kernel.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import type { RunEvent } from '../schemas/events.js';
import { abortMessage, type RuntimeCore } from './core.js';
import { JobName, type JobData } from './jobs.js';

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
  const connection: Redis = core.redis.duplicate({ maxRetriesPerRequest: null });
  connection.on('error', () => {});
  const aborts = new Map<string, AbortController>();
  const subscriber: Redis = core.redis.duplicate();
  subscriber.on('error', () => {});
  const abortChannel = core.abortChannel();
  subscriber.on('message', (_channel: string, message: string) => {
    aborts.get(message)?.abort(new Error('the run was cancelled'));
  });

  const processor = async (job: Job<JobData>, token?: string, signal?: AbortSignal) => {
    const { runId } = job.data;
    try {
      switch (job.name) {
        case JobName.step: {
          const outcome = await processStep(job.data, signal);
          if (typeof outcome === 'object') {
            // Another worker still holds a lease on one of the step's tool calls (it may be
            // alive, or its lease has not lapsed yet): come back later, without spending an attempt.
            await job.moveToDelayed(core.clock() + outcome.retryAfterMs, token);
            throw new DelayedError();
          }
          return outcome;
        }
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
    await core.enqueueDue(runId, applied.envelope.snapshot);
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

  async function processStep(
    data: JobData,
    jobSignal: AbortSignal | undefined,
  ): Promise<string | { retryAfterMs: number }> {
    const { runId } = data;
    const stepId = data.stepId!;
    const attempt = data.attempt!;
    let env = await core.host.load(runId);
    const all = runSteps(env.snapshot);
    const state = all.find((s) => s.stepId === stepId);
    // The guard: this attempt was already committed (or cancelled). Redelivered jobs are
    // harmless, and enqueueing what is due heals a crash between a commit and its enqueue.
    if (state === undefined || state.status !== 'RUNNING' || state.attempt !== attempt) {
      await core.enqueueDue(runId, env.snapshot);
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
    const used = all.reduce((n, s) => n + s.attempt, 0);
    if (budgets?.maxSteps !== undefined && used > budgets.maxSteps) {
      await stopForBudget(runId, env, { budget: 'maxSteps', limit: budgets.maxSteps, used });
      return 'budget';
    }

    const step = meta.plan.steps.find((s) => s.id === stepId)!;
    const depOutputs: Record<string, JsonValue> = {};
    for (const d of step.dependsOn) {
      const out = all.find((s) => s.stepId === d)?.output;
      if (out !== undefined && out !== null) depOutputs[d] = out;
    }
    const controller = new AbortController();
    const abortKey = abortMessage(runId, stepId, attempt);
    aborts.set(abortKey, controller);
    const onJobAbort = () => controller.abort(jobSignal?.reason);
    jobSignal?.addEventListener('abort', onJobAbort, { once: true });
    let result;
    try {
      result = await executeStep(
        {
          operators: core.operators,
          agents: core.agents,
          clientFor: core.clientFor,
          tools: core.tools,
          ledger: core.ledger,
          countToolCall: (id) => core.redis.hincrby(core.keys.counters(id), 'toolCalls', 1),
          maxToolCalls: budgets?.maxToolCalls,
          leaseMs,
        },
        {
          step,
          state,
          runId,
          tenantId: meta.tenantId,
          runInput: meta.input,
          depOutputs,
          signal: controller.signal,
        },
      );
    } finally {
      aborts.delete(abortKey);
      jobSignal?.removeEventListener('abort', onJobAbort);
    }

    if (result.kind === 'failed' && result.error.code === 'tool_call_busy') {
      return { retryAfterMs: Math.max(50, result.error.retryAfterMs ?? 1000) };
    }
    if (result.kind === 'budget') {
      await stopForBudget(runId, env, result.error.details as JsonValue);
      return 'budget';
    }
    const event: RunEvent =
      result.kind === 'succeeded'
        ? { type: 'step.succeeded', stepId, attempt, output: result.output, at: core.clock() }
        : {
            type: 'step.failed',
            stepId,
            attempt,
            error: result.error,
            jitterSeed: randomInt(0, 2 ** 32),
            at: core.clock(),
          };
    const applied = await core.host.apply(runId, event, env);
    env = applied.envelope;
    debugPoint(DebugPoint.afterCommit, stepId);
    await core.enqueueDue(runId, env.snapshot);
    return result.kind;
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
        else await core.enqueueDue(runId, env.snapshot);
      }
    } while (cursor !== '0');
  }

  return {
    ready: () => ready,
    async close() {
      await ready.catch(() => {});
      await worker.close();
      subscriber.disconnect();
      connection.disconnect();
    },
  };
}
