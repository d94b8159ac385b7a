import { Queue } from 'bullmq';
import type { Cluster, Redis } from 'ioredis';
import { commitSpans } from '../observability/commit-spans.js';
import { createRunHost, type AppliedEvent, type RunHost } from './run-host.js';
import type { Operator, StreamedText } from './execute-step.js';
import type { RegisteredPolicy } from './policies.js';
import { replayOriginOf, type ReplayOrigin } from './replay-calls.js';
import { modelClients } from './run-agent.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import {
  InputValidationError,
  RunNotFoundError,
  RunRemovedError,
  type SerializedError,
} from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import type { RunSnapshot } from '../machines/kernel.js';
import { runSnapshotCodec } from '../machines/snapshot-migrations.js';
import { PlanCache } from '../plan/plan-cache.js';
import type { Plan } from '../plan/schema.js';
import { createSnapshotCodec } from '../persistence/codec.js';
import { createKeys, type Keys } from '../persistence/keys.js';
import { coalesceWrites, flushWrites } from '../persistence/write-coalescing.js';
import { checkRedisTimeout } from '../persistence/redis-errors.js';
import { asCommandClient, duplicateClient, openRedis } from '../persistence/connection.js';
import { createLedger, type Ledger } from '../persistence/ledger.js';
import { createFingerprintStore, type FingerprintStore } from '../persistence/fingerprint-store.js';
import { createHistoryStore, type HistoryStore } from '../persistence/history.js';
import { createModelJournal, type ModelJournal } from '../persistence/model-journal.js';
import { createDefaultLogger, type Logger } from '../logging.js';
import { parsePricing, type PricingTable } from '../llm/pricing.js';
import { createTokenCounter, type TokenCounter } from '../llm/tokens.js';
import {
  createBlobStore,
  DEFAULT_BLOB_RETENTION_MS,
  type BlobStore,
} from '../persistence/blob-store.js';
import {
  createRetentionStore,
  parseRetentionOptions,
  type RetentionOptions,
  type RetentionStore,
} from '../persistence/retention.js';
import {
  createCacheStore,
  resolveCacheLimits,
  type CacheStore,
} from '../persistence/cache-store.js';
import type { RunCacheOptions } from './step-cache.js';
import type { PlanStep } from '../plan/schema.js';
import { createQuotaStore, type QuotaStore } from '../persistence/quota-store.js';
import { createModelContext, type ModelContext } from './model-context.js';
import { createUsageMeter, type UsageMeter } from './usage-meter.js';
import { createSnapshotStore, type SnapshotStore } from '../persistence/snapshot-store.js';
import { createStreamWatcher, type StreamWatcher } from '../persistence/stream-watcher.js';
import { createRunIndex, type RunIndex } from '../persistence/run-index.js';
import { createActiveRuns, type ActiveRuns } from '../persistence/active-runs.js';
import { createRunCounters, type RunCounters } from '../persistence/run-counters.js';
import { createRequestKeys, type RequestKeys } from '../persistence/request-keys.js';
import { createUnitNotes, type UnitNotes } from '../persistence/unit-notes.js';
import { createRunChannels, type RunChannels } from '../persistence/run-channels.js';
import type { PlannedAction } from '../machines/types.js';
import type { RunEvent } from '../schemas/events.js';
import { createToolRegistry, type ToolRegistry } from '../tools/registry.js';
import {
  dueJobs,
  JobName,
  parseCarrierNote,
  deadlineJobId,
  plannedJobs,
  type JobData,
  type JobSpec,
} from './jobs.js';

/** What the `onStepFailure` hook is told about one failed attempt, after its commit. */
export interface StepFailureInfo {
  runId: string;
  stepId: string;
  /** The attempt that failed (1 for the first). */
  attempt: number;
  /** For a granular agent step: the turn (0-based) the attempt failed in. */
  turn?: number;
  /** The error's code, e.g. `timeout`, `budget_exceeded`, `invalid_input`. */
  code: string;
  message: string;
  /** Whether the error says the work may succeed if tried again. */
  retryable: boolean;
  /** Whether the step will be tried again (retryable, and attempts are left). */
  willRetry: boolean;
  /** The error as committed. */
  error: SerializedError;
}

/** Options shared by the runtime and its workers. */
export interface CoreOptions {
  /**
   * A Redis client (an ioredis `Redis` or `Cluster`) or a URL: `redis://…`, `rediss://…`, or a
   * cluster's `redis+cluster://user:pass@host:port,host:port` (`rediss+cluster://` for TLS). A
   * client stays the caller's to close.
   */
  redis: Redis | Cluster | string;
  /** Prefix of every Redis key. @defaultValue `'flujo'` */
  prefix?: string;
  /**
   * How long a call may wait for Redis, in ms: a runtime call that gets no answer in this time
   * (Redis down, paused, or a server that accepts connections and never answers) fails with a
   * retryable `RedisUnavailableError`. Clients the runtime opens from a URL also get it as their
   * connect and command timeout; workers reconnect until Redis is back. @defaultValue 2000
   */
  redisTimeoutMs?: number;
  /** Tenant of runs started without one. @defaultValue `'default'` */
  tenantId?: string;
  /** BullMQ queue name. @defaultValue `'runs'` */
  queueName?: string;
  /** The clock, epoch ms (tests may pin it). @defaultValue `Date.now` */
  clock?: () => number;
  /** Where the runtime logs. @defaultValue JSON lines on stderr from `warn` up (`FLUJO_LOG_LEVEL`) */
  logger?: Logger;
  /**
   * Prices per model, USD per million input and output tokens:
   * `{ models: { 'gpt-4o-mini': { inputPerMillion: 0.15, outputPerMillion: 0.6 } } }` (see also
   * `loadPricingFile`). @defaultValue no prices: calls cost 0 unless `strictPricing`
   */
  pricing?: PricingTable;
  /** A model without a price is refused with `PricingNotConfiguredError` before any request. @defaultValue false */
  strictPricing?: boolean;
  /** Output tokens reserved per model call when the agent sets no `settings.maxTokens`. @defaultValue 1024 */
  defaultOutputTokens?: number;
  /**
   * Called once per failed attempt of any step, right after the failure is committed, in the
   * worker that ran the attempt (not again when a redelivered job finds it committed; not at all
   * if that worker dies between the commit and the call). Not awaited: a promise it returns runs
   * on its own. Whatever it throws or rejects with is logged and changes nothing.
   */
  onStepFailure?: (failure: StepFailureInfo) => unknown;
  /**
   * The version of the policies the runtime applies, e.g. `'2026-11'`. Part of a granular agent
   * step's fingerprint: a run whose steps started under another version is not resumed (an
   * irrecoverable `ResumeError` naming `policyVersion`). @defaultValue none
   */
  policyVersion?: string;
  /** Storage of large tool results of granular steps. */
  blobs?: {
    /** How long a blob is kept after its last write, in ms. @defaultValue 7 days */
    retentionMs?: number;
    /** Most blob bytes one run may store. @defaultValue 256 MiB */
    maxBytesPerRun?: number;
    /** Bytes of blob content a worker keeps in memory between turns (0: none). @defaultValue 32 MiB */
    cacheBytes?: number;
  };
  /**
   * How long finished runs stay in Redis: `{ finishedRunsMs, failedRunsMs }`. When a run succeeds
   * or is cancelled, every key of it gets the `finishedRunsMs` expiry; asking for it once its keys
   * are gone throws `RunRemovedError`. A failed run is kept (no expiry) until it is resumed and
   * finishes, unless `failedRunsMs` is set: then it gets that expiry when it fails (a resumed run
   * keeps its keys again). Runs that wait or still work are kept.
   * @defaultValue `{ finishedRunsMs: 7 days }` (failed runs kept)
   */
  retention?: RetentionOptions;
  /** Storage of cached step outputs (`cachePolicy`), shared by the tenant's runs. */
  cache?: {
    /** How long an entry is kept after it is stored, in ms (an external one at most its `ttlMs`). @defaultValue 7 days */
    retentionMs?: number;
    /** How long a deterministic step's output hash is kept to check re-runs against, in ms. @defaultValue 90 days */
    digestRetentionMs?: number;
    /** The largest entry stored (its JSON, in UTF-8 bytes); a larger output is not cached. @defaultValue 1 MiB */
    maxEntryBytes?: number;
  };
}

/** The abort-channel message naming one running attempt. */
export function abortMessage(runId: string, stepId: string, attempt: number): string {
  return `${runId}\n${stepId}\n${attempt}`;
}

/** What a run was started with, as stored beside it. */
export interface RunMeta {
  plan: Plan;
  input: JsonValue;
  tenantId: string;
  requestKey: string | null;
  /** The run's trace context (a W3C `traceparent`), or null for a run started without one. */
  trace: string | null;
  /**
   * The span the run's span is recorded under when the run ends ('' for none); null when its
   * span was recorded at its start.
   */
  traceCaller: string | null;
  createdAt: number;
  /** What the start said about cached step outputs. */
  cache: RunCacheOptions;
  /** What the run replays, when it is a replay of another run. */
  replay: ReplayOrigin | null;
}

const JOB_DEFAULTS = {
  // Completed ids are kept a while so that a re-add of the same unit is a no-op (a re-add after
  // that is harmless too: the job's guard finds the unit done); at most a day, at most 20 000.
  removeOnComplete: { age: 24 * 3600, count: 20_000 },
  removeOnFail: { age: 7 * 24 * 3600, count: 20_000 },
  // Our processor throws only for infrastructure trouble (step failures are events): retry it.
  attempts: 25,
  backoff: { type: 'exponential', delay: 100 },
};

/**
 * The connections, stores and registries one runtime shares with its workers. Not exported from the
 * package (not tagged internal: the declarations of the worker's modules refer to it).
 */
export class RuntimeCore {
  readonly redis: Redis;
  readonly ownsRedis: boolean;
  /** See `CoreOptions.redisTimeoutMs`. */
  readonly redisTimeoutMs: number;
  readonly keys: Keys;
  readonly store: SnapshotStore<RunSnapshot>;
  readonly host: RunHost;
  readonly ledger: Ledger;
  /** The run list. */
  readonly runs: RunIndex;
  /** The runs not finished yet (walked by a starting worker). */
  readonly activeRuns: ActiveRuns;
  /** Per-run counters that budgets read (tool calls, a step's first start). */
  readonly counters: RunCounters;
  /** Start requests' keys, claimed once per tenant. */
  readonly requestKeys: RequestKeys;
  /** The notes workers leave when they start a unit. */
  readonly unitNotes: UnitNotes;
  /** Aborts, streamed text and progress, published live. */
  readonly channels: RunChannels;
  readonly journal: ModelJournal;
  readonly history: HistoryStore;
  readonly fingerprints: FingerprintStore;
  readonly quota: QuotaStore;
  readonly blobs: BlobStore;
  readonly retention: RetentionStore;
  readonly cache: CacheStore;
  readonly meter: UsageMeter;
  readonly context: ModelContext;
  readonly log: Logger;
  readonly #counters = new Map<string, TokenCounter>();
  #queue: Queue | undefined;
  readonly #queueConnection: Redis;
  #watcher: StreamWatcher | undefined;
  #subscriber: Redis | undefined;
  readonly #listeners = new Map<string, Set<(message: string) => void>>();
  readonly queueName: string;
  readonly tenantId: string;
  readonly clock: () => number;
  readonly onStepFailure: ((failure: StepFailureInfo) => unknown) | undefined;
  readonly policyVersion: string | undefined;
  readonly operators = new Map<string, Operator>();
  /** The `version` an operator or agent was registered with, by name: part of its cache key. */
  readonly operatorVersions = new Map<string, string>();
  readonly agentVersions = new Map<string, string>();
  readonly policies = new Map<string, RegisteredPolicy>();
  readonly agents = new Map<string, AgentDefinition>();
  readonly clientFor = modelClients();
  readonly tools: ToolRegistry = createToolRegistry();
  readonly #metaCache = new Map<string, RunMeta>();
  readonly #metaLoads = new Map<string, Promise<RunMeta>>();
  /** Plans parsed by this process (started here, or read back from a run's meta), by their text. */
  readonly plans = new PlanCache(1000);

  constructor(options: CoreOptions) {
    // Checked before any connection is made: a refused option leaves nothing open.
    if (options.onStepFailure !== undefined && typeof options.onStepFailure !== 'function') {
      throw new InputValidationError('runtime options', [
        {
          path: 'onStepFailure',
          message: 'must be a function, e.g. onStepFailure: (failure) => console.warn(failure)',
        },
      ]);
    }
    this.onStepFailure = options.onStepFailure;
    const policyVersion: unknown = options.policyVersion;
    if (
      policyVersion !== undefined &&
      (typeof policyVersion !== 'string' || policyVersion === '')
    ) {
      throw new InputValidationError('runtime options', [
        {
          path: 'policyVersion',
          message: 'must be a non-empty string, e.g. policyVersion: "2026-11"',
        },
      ]);
    }
    this.policyVersion = policyVersion;
    const retention = parseRetentionOptions(options.retention);
    const cacheLimits = resolveCacheLimits(options.cache ?? {});
    try {
      this.redisTimeoutMs = checkRedisTimeout(options.redisTimeoutMs, 'redisTimeoutMs');
    } catch (error) {
      throw new InputValidationError('runtime options', [
        { path: 'redisTimeoutMs', message: (error as Error).message },
      ]);
    }
    this.ownsRedis = typeof options.redis === 'string';
    this.redis =
      typeof options.redis === 'string'
        ? coalesceWrites(openRedis(options.redis, { timeoutMs: this.redisTimeoutMs }))
        : asCommandClient(options.redis);
    if (this.ownsRedis) this.redis.on('error', () => {}); // surfaced by the failing command
    this.keys = createKeys(options.prefix);
    this.tenantId = options.tenantId ?? 'default';
    this.clock = options.clock ?? Date.now;
    this.queueName = options.queueName ?? 'runs';
    this.store = createSnapshotStore<RunSnapshot>({
      redis: this.redis,
      prefix: this.keys.prefix,
      codec: createSnapshotCodec<RunSnapshot>(runSnapshotCodec),
      clock: this.clock,
    });
    this.host = createRunHost({
      store: this.store,
      onCommitted: commitSpans(async (runId) => {
        const meta = await this.meta(runId);
        return { ...meta, planName: meta.plan.name };
      }),
    });
    this.ledger = createLedger({ redis: this.redis, prefix: this.keys.prefix, clock: this.clock });
    this.runs = createRunIndex(this.redis, this.keys);
    this.activeRuns = createActiveRuns(this.redis, this.keys);
    this.counters = createRunCounters(this.redis, this.keys);
    this.requestKeys = createRequestKeys(this.redis, this.keys);
    this.unitNotes = createUnitNotes(this.redis, this.keys);
    this.channels = createRunChannels(this.redis, this.keys);
    const stores = { redis: this.redis, prefix: this.keys.prefix };
    this.journal = createModelJournal(stores);
    this.history = createHistoryStore(stores);
    this.fingerprints = createFingerprintStore(stores);
    this.log = options.logger ?? createDefaultLogger();
    this.quota = createQuotaStore({
      ...stores,
      ...(options.clock ? { clock: options.clock } : {}),
    });
    const { cacheBytes, ...blobOptions } = options.blobs ?? {};
    this.blobs = createBlobStore({ ...stores, ...blobOptions });
    this.retention = createRetentionStore({
      redis: this.redis,
      keys: this.keys,
      finishedRunsMs: retention.finishedRunsMs,
      failedRunsMs: retention.failedRunsMs,
      blobRetentionMs: blobOptions.retentionMs ?? DEFAULT_BLOB_RETENTION_MS,
      clock: this.clock,
    });
    this.cache = createCacheStore({ ...stores, ...cacheLimits });
    const pricing =
      options.pricing === undefined
        ? undefined
        : parsePricing(options.pricing, 'createRuntime({ pricing })');
    this.meter = createUsageMeter({
      quota: this.quota,
      ...(pricing === undefined ? {} : { pricing }),
      strictPricing: options.strictPricing ?? false,
      ...(options.defaultOutputTokens === undefined
        ? {}
        : { defaultOutputTokens: options.defaultOutputTokens }),
      log: this.log,
      counterFor: (model) => this.tokens(model),
      flush: () => flushWrites(this.redis),
    });
    this.context = createModelContext({
      counterFor: (model) => this.tokens(model),
      blobs: this.blobs,
      log: this.log,
      ...(cacheBytes === undefined ? {} : { blobCacheBytes: cacheBytes }),
    });
    this.#queueConnection = coalesceWrites(
      duplicateClient(this.redis, {
        maxRetriesPerRequest: null,
        ...(this.ownsRedis ? { commandTimeout: this.redisTimeoutMs } : {}),
      }),
    );
    this.#queueConnection.on('error', () => {});
  }

  /**
   * The runtime's queue, made on first use: BullMQ writes the queue's meta when it makes one, so a
   * runtime that only reads (status, reproduce) writes nothing.
   */
  get queue(): Queue {
    if (this.#queue === undefined) {
      this.#queue = new Queue(this.queueName, {
        connection: this.#queueConnection,
        prefix: this.keys.queuePrefix(),
        defaultJobOptions: JOB_DEFAULTS,
      });
      this.#queue.on('error', () => {});
    }
    return this.#queue;
  }

  /** The run's plan, input and tenant (cached: they never change). */
  async meta(runId: string): Promise<RunMeta> {
    const cached = this.#metaCache.get(runId);
    if (cached !== undefined) return cached;
    // One read for the callers that ask at once (a unit's guard and a status report, say).
    let loading = this.#metaLoads.get(runId);
    if (loading === undefined) {
      loading = this.store
        .loadMeta(runId)
        .then((raw) => {
          if (raw['plan'] === undefined) {
            throw new InputValidationError('run meta', [
              { path: 'plan', message: `run "${runId}" has no stored plan` },
            ]);
          }
          return this.rememberMeta(runId, raw, this.plans.parse(raw['plan']));
        })
        .finally(() => this.#metaLoads.delete(runId));
      this.#metaLoads.set(runId, loading);
    }
    return loading;
  }

  /**
   * Keeps the meta of a run as stored (`raw`, its fields), with its plan parsed: what {@link meta}
   * reads back, kept by the process that started the run so that its workers need not read it.
   */
  rememberMeta(runId: string, raw: Readonly<Record<string, string>>, plan: Plan): RunMeta {
    const meta: RunMeta = {
      plan,
      input: JSON.parse(raw['input'] ?? 'null') as JsonValue,
      tenantId: raw['tenantId'] ?? this.tenantId,
      requestKey: raw['requestKey'] ?? null,
      trace: raw['trace'] ?? null,
      traceCaller: raw['traceCaller'] ?? null,
      createdAt: Number(raw['createdAt'] ?? 0),
      cache: {
        allowCacheHit: raw['allowCacheHit'] === '1',
        refresh: raw['refreshCache'] === '1',
      },
      replay: replayOriginOf(raw),
    };
    if (this.#metaCache.size > 10_000) this.#metaCache.clear();
    this.#metaCache.set(runId, meta);
    return meta;
  }

  /**
   * The code identity of a step's primary, part of its cache key: the operator or agent name and
   * the version it was registered with (for an agent also its model, prompt, settings and tools).
   */
  identityOf(step: PlanStep): JsonValue {
    if (step.kind === 'agent') {
      const agent = this.agents.get(step.agent);
      return {
        kind: 'agent',
        name: step.agent,
        version: this.agentVersions.get(step.agent) ?? null,
        model: agent?.model ?? null,
        systemPrompt: agent?.systemPrompt ?? null,
        settings: (agent?.settings ?? null) as JsonValue,
        tools: agent?.tools.map((t) => t.identity) ?? [],
      };
    }
    const name = step.kind === 'operator' ? step.operator : step.kind;
    return { kind: step.kind, name, version: this.operatorVersions.get(name) ?? null };
  }

  /** The token counter of a model (one per model, shared by usage and context). */
  tokens(model: string): TokenCounter {
    let counter = this.#counters.get(model);
    if (counter === undefined) {
      counter = createTokenCounter(model, {
        onHeuristic: (info) => this.log.info({ model: info.model }, info.reason),
      });
      this.#counters.set(model, counter);
    }
    return counter;
  }

  /**
   * Adds every job the run's snapshot says is due (ids make repeats harmless), but for a unit that
   * a chained job still carries (see the worker): that job runs it, so it gets no job of its own
   * while the carrier is active. `self` is the id of the calling job: a carrier that was
   * redelivered (its worker died mid-chain) hands the unit it carried to a job of its own.
   */
  async enqueueDue(
    runId: string,
    envelope: { snapshot: RunSnapshot; carrier?: string },
    self?: string,
  ): Promise<void> {
    const { snapshot } = envelope;
    let jobs = dueJobs(runId, snapshot, this.clock());
    const carried = parseCarrierNote(envelope.carrier);
    if (carried !== null && carried.job !== self) {
      const i = jobs.findIndex((j) => j.opts.jobId === carried.unit);
      // Active includes a carrier whose worker died and whose lock has not lapsed yet: the stalled
      // check hands it back to the queue, and its guard (here, as `self`) gives the unit its job.
      if (i >= 0 && (await this.queue.getJobState(carried.job)) === 'active') {
        jobs = jobs.filter((_, k) => k !== i);
      }
    }
    if (jobs.length > 0) await this.add(jobs);
    if (snapshot.status !== 'active' || snapshot.value === 'failed') await this.ended(runId);
  }

  /**
   * A run that ended (succeeded, failed, cancelled): its keys get their expiry (none for a failed
   * run without `retention.failedRunsMs`: it is kept until resumed), then it leaves the active
   * runs either way (a failed run that is resumed joins them again). In that order: a crash in
   * between leaves it active, so the next worker start (or a redelivered job) comes here again and
   * finishes the job.
   */
  async ended(runId: string): Promise<void> {
    const meta = await this.meta(runId);
    await this.retention.expireFinished(runId, {
      tenantId: meta.tenantId,
      stepIds: meta.plan.steps.map((s) => s.id),
      requestKey: meta.requestKey === '' ? null : meta.requestKey,
    });
    await this.activeRuns.remove(runId);
  }

  /** A resumed run: it keeps its keys again (no expiry). */
  async resumed(runId: string): Promise<void> {
    const meta = await this.meta(runId);
    await this.retention.keep(runId, {
      tenantId: meta.tenantId,
      stepIds: meta.plan.steps.map((s) => s.id),
      requestKey: meta.requestKey === '' ? null : meta.requestKey,
    });
  }

  /** The error for a run that is not there: removed by retention, or never there. */
  async notFound(runId: string): Promise<RunNotFoundError> {
    const removed = await this.retention.removed(runId);
    return removed === null
      ? new RunNotFoundError(runId)
      : new RunRemovedError(runId, removed.finishedAt, removed.retentionMs, {
          failed: removed.failed,
        });
  }

  /**
   * After a commit: adds the units its transition planned (a refused event changed nothing, so
   * then what the snapshot says is due is added, as after any guard).
   */
  async enqueuePlanned(runId: string, applied: AppliedEvent): Promise<void> {
    const { snapshot } = applied.envelope;
    if (!applied.committed) return this.enqueueDue(runId, applied.envelope);
    const jobs = plannedJobs(runId, snapshot, applied.transition.planned, this.clock());
    if (jobs.length > 0) await this.add(jobs);
    if (snapshot.status !== 'active' || snapshot.value === 'failed') await this.ended(runId);
  }

  /** Adds jobs in one round trip. */
  async add(jobs: JobSpec[]): Promise<void> {
    // One job (the common case) needs no pipeline, which costs more than the script call itself.
    if (jobs.length === 1) {
      const [j] = jobs as [JobSpec];
      await this.queue.add(j.name, j.data, j.opts);
      return;
    }
    await this.queue.addBulk(jobs.map((j) => ({ name: j.name, data: j.data, opts: j.opts })));
  }

  /** Feeds an event to a run and enqueues what became due. */
  async apply(runId: string, event: RunEvent): Promise<AppliedEvent> {
    const applied = await this.host.apply(runId, event);
    await this.enqueueDue(runId, applied.envelope);
    return applied;
  }

  /** Schedules the run's wall-clock deadline, if its plan has one. */
  async scheduleDeadline(runId: string, plan: Plan, createdAt: number): Promise<void> {
    const max = plan.budgets?.maxWallClockMs;
    if (max === undefined) return;
    const data: JobData = { runId };
    await this.add([
      {
        name: JobName.deadline,
        data,
        opts: { jobId: deadlineJobId(runId), delay: Math.max(0, createdAt + max - this.clock()) },
      },
    ]);
  }

  /** Tells workers to abort the attempts a transition planned to abort (cancel, budget stop). */
  async publishAborts(runId: string, planned: readonly PlannedAction[]): Promise<void> {
    for (const p of planned) {
      if (p.type === 'step.abort') {
        await this.channels.publishAbort(abortMessage(runId, p.stepId, p.attempt));
      }
    }
  }

  /** Publishes a piece of a streaming reply to the run's chunk channel (live only, not stored). */
  publishChunk(chunk: StreamedText): void {
    const message = JSON.stringify({ ...chunk, at: this.clock() });
    // Best effort: a lost chunk costs a viewer some live text; the final message is committed.
    this.channels.publishChunk(chunk.runId, message).catch(() => {});
  }

  /**
   * Calls `listener` with each chunk message published for the run, until the returned function
   * is called. One subscriber connection serves every listener of the runtime.
   */
  async subscribeChunks(runId: string, listener: (message: string) => void): Promise<() => void> {
    return this.subscribe(this.chunkChannel(runId), listener);
  }

  /** Calls `listener` with each message of a run's progress channel (see `publishProgress`). */
  async subscribeProgress(runId: string, listener: (message: string) => void): Promise<() => void> {
    return this.subscribe(this.channels.progressChannel(runId), listener);
  }

  /**
   * Records the latest progress an operator reported for its step (one hash field, overwritten)
   * and publishes it to the run's progress channel. Best effort, not awaited: progress is for
   * people watching, never part of the run's history.
   */
  publishProgress(runId: string, stepId: string, attempt: number, info: JsonValue): void {
    const message = JSON.stringify({ runId, stepId, attempt, info, at: this.clock() });
    this.channels.publishProgress(runId, stepId, message).catch(() => {});
  }

  /** Calls `listener` with each message of `channel` until the returned function is called. */
  async subscribe(channel: string, listener: (message: string) => void): Promise<() => void> {
    if (this.#subscriber === undefined) {
      const subscriber = duplicateClient(this.redis);
      subscriber.on('error', () => {});
      subscriber.on('message', (from: string, message: string) => {
        for (const l of this.#listeners.get(from) ?? []) l(message);
      });
      this.#subscriber = subscriber;
    }
    let listeners = this.#listeners.get(channel);
    if (listeners === undefined) {
      listeners = new Set();
      this.#listeners.set(channel, listeners);
      await this.#subscriber.subscribe(channel);
    }
    listeners.add(listener);
    return () => {
      const set = this.#listeners.get(channel);
      if (set === undefined) return;
      set.delete(listener);
      if (set.size === 0) {
        this.#listeners.delete(channel);
        this.#subscriber?.unsubscribe(channel).catch(() => {});
      }
    };
  }

  /** The pub/sub channel on which a run's streamed reply text is published. */
  chunkChannel(runId: string): string {
    return this.channels.chunkChannel(runId);
  }

  /** The pub/sub channel on which aborts of running attempts are announced. */
  abortChannel(): string {
    return this.channels.abortChannel;
  }

  /** Waits for new events of runs on one dedicated connection, created on first use. */
  watcher(): StreamWatcher {
    this.#watcher ??= createStreamWatcher(this.redis);
    return this.#watcher;
  }

  async close(): Promise<void> {
    this.#watcher?.close();
    this.#watcher = undefined;
    this.#subscriber?.disconnect();
    this.#subscriber = undefined;
    await this.#queue?.close();
    // BullMQ does not close a connection it was given.
    this.#queueConnection.disconnect();
    await this.store.close();
    if (this.ownsRedis) this.redis.disconnect();
  }
}
