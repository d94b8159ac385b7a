import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { createRunHost, type AppliedEvent, type RunHost } from '../actors/run-host.js';
import type { Operator, StreamedText } from '../actors/execute-step.js';
import { modelClients } from '../actors/run-agent.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { InputValidationError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import type { RunSnapshot } from '../machines/kernel.js';
import { runSnapshotCodec } from '../machines/snapshot-migrations.js';
import { parsePlan } from '../plan/parse-plan.js';
import type { Plan } from '../plan/schema.js';
import { createSnapshotCodec } from '../persistence/codec.js';
import { createKeys, RunKeyKind, type Keys } from '../persistence/keys.js';
import { coalesceWrites } from '../persistence/write-coalescing.js';
import { createLedger, type Ledger } from '../persistence/ledger.js';
import { createFingerprintStore, type FingerprintStore } from '../persistence/fingerprint-store.js';
import { createHistoryStore, type HistoryStore } from '../persistence/history.js';
import { createModelJournal, type ModelJournal } from '../persistence/model-journal.js';
import { createDefaultLogger, type Logger } from '../logging.js';
import { parsePricing, type PricingTable } from '../llm/pricing.js';
import { createTokenCounter, type TokenCounter } from '../llm/tokens.js';
import { createBlobStore, type BlobStore } from '../persistence/blob-store.js';
import { createQuotaStore, type QuotaStore } from '../persistence/quota-store.js';
import { createModelContext, type ModelContext } from '../actors/model-context.js';
import { createUsageMeter, type UsageMeter } from '../actors/usage-meter.js';
import { createSnapshotStore, type SnapshotStore } from '../persistence/snapshot-store.js';
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

/** Options shared by the runtime and its workers. */
export interface CoreOptions {
  /** A Redis client or URL. A client stays the caller's to close. */
  redis: Redis | string;
  /** Prefix of every Redis key. @defaultValue `'flujo'` */
  prefix?: string;
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
  /** Storage of large tool results of granular steps. */
  blobs?: {
    /** How long a blob is kept after its last write, in ms. @defaultValue 7 days */
    retentionMs?: number;
    /** Most blob bytes one run may store. @defaultValue 256 MiB */
    maxBytesPerRun?: number;
    /** Bytes of blob content a worker keeps in memory between turns (0: none). @defaultValue 32 MiB */
    cacheBytes?: number;
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
  createdAt: number;
}

const JOB_DEFAULTS = {
  // Completed ids are kept a while so that a re-add of the same unit is a no-op.
  removeOnComplete: { count: 20_000 },
  removeOnFail: { count: 20_000 },
  // Our processor throws only for infrastructure trouble (step failures are events): retry it.
  attempts: 25,
  backoff: { type: 'exponential', delay: 100 },
};

/** @internal The connections, stores and registries one runtime shares with its workers. */
export class RuntimeCore {
  readonly redis: Redis;
  readonly ownsRedis: boolean;
  readonly keys: Keys;
  readonly store: SnapshotStore<RunSnapshot>;
  readonly host: RunHost;
  readonly ledger: Ledger;
  readonly journal: ModelJournal;
  readonly history: HistoryStore;
  readonly fingerprints: FingerprintStore;
  readonly quota: QuotaStore;
  readonly blobs: BlobStore;
  readonly meter: UsageMeter;
  readonly context: ModelContext;
  readonly log: Logger;
  readonly #counters = new Map<string, TokenCounter>();
  readonly queue: Queue;
  readonly #queueConnection: Redis;
  #blocking: Redis | undefined;
  #subscriber: Redis | undefined;
  readonly #listeners = new Map<string, Set<(message: string) => void>>();
  readonly queueName: string;
  readonly tenantId: string;
  readonly clock: () => number;
  readonly operators = new Map<string, Operator>();
  readonly agents = new Map<string, AgentDefinition>();
  readonly clientFor = modelClients();
  readonly tools: ToolRegistry = createToolRegistry();
  readonly #metaCache = new Map<string, RunMeta>();
  // Runs of one plan store the same plan text: validate it once.
  readonly #planCache = new Map<string, Plan>();

  constructor(options: CoreOptions) {
    this.ownsRedis = typeof options.redis === 'string';
    this.redis =
      typeof options.redis === 'string'
        ? coalesceWrites(new Redis(options.redis, { maxRetriesPerRequest: 3, lazyConnect: false }))
        : options.redis;
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
    this.host = createRunHost({ store: this.store });
    this.ledger = createLedger({ redis: this.redis, prefix: this.keys.prefix, clock: this.clock });
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
    });
    this.context = createModelContext({
      counterFor: (model) => this.tokens(model),
      blobs: this.blobs,
      log: this.log,
      ...(cacheBytes === undefined ? {} : { blobCacheBytes: cacheBytes }),
    });
    this.#queueConnection = coalesceWrites(this.redis.duplicate({ maxRetriesPerRequest: null }));
    this.#queueConnection.on('error', () => {});
    this.queue = new Queue(this.queueName, {
      connection: this.#queueConnection,
      prefix: this.keys.queuePrefix(),
      defaultJobOptions: JOB_DEFAULTS,
    });
    this.queue.on('error', () => {});
  }

  /** The run's plan, input and tenant (cached: they never change). */
  async meta(runId: string): Promise<RunMeta> {
    const cached = this.#metaCache.get(runId);
    if (cached !== undefined) return cached;
    const raw = await this.store.loadMeta(runId);
    if (raw['plan'] === undefined) {
      throw new InputValidationError('run meta', [
        { path: 'plan', message: `run "${runId}" has no stored plan` },
      ]);
    }
    let plan = this.#planCache.get(raw['plan']);
    if (plan === undefined) {
      plan = parsePlan(raw['plan']);
      if (this.#planCache.size > 1000) this.#planCache.clear();
      this.#planCache.set(raw['plan'], plan);
    }
    const meta: RunMeta = {
      plan,
      input: JSON.parse(raw['input'] ?? 'null') as JsonValue,
      tenantId: raw['tenantId'] ?? this.tenantId,
      requestKey: raw['requestKey'] ?? null,
      createdAt: Number(raw['createdAt'] ?? 0),
    };
    if (this.#metaCache.size > 10_000) this.#metaCache.clear();
    this.#metaCache.set(runId, meta);
    return meta;
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
    if (snapshot.status !== 'active' || snapshot.value === 'failed') {
      await this.redis.srem(this.keys.activeRuns(), runId);
    }
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
    if (snapshot.status !== 'active' || snapshot.value === 'failed') {
      await this.redis.srem(this.keys.activeRuns(), runId);
    }
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
        await this.redis.publish(this.abortChannel(), abortMessage(runId, p.stepId, p.attempt));
      }
    }
  }

  /** Publishes a piece of a streaming reply to the run's chunk channel (live only, not stored). */
  publishChunk(chunk: StreamedText): void {
    const message = JSON.stringify({ ...chunk, at: this.clock() });
    // Best effort: a lost chunk costs a viewer some live text; the final message is committed.
    this.redis.publish(this.chunkChannel(chunk.runId), message).catch(() => {});
  }

  /**
   * Calls `listener` with each chunk message published for the run, until the returned function
   * is called. One subscriber connection serves every listener of the runtime.
   */
  async subscribeChunks(runId: string, listener: (message: string) => void): Promise<() => void> {
    const channel = this.chunkChannel(runId);
    if (this.#subscriber === undefined) {
      const subscriber = this.redis.duplicate();
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
    return this.keys.runKey(runId, RunKeyKind.Chunks);
  }

  /** The pub/sub channel on which aborts of running attempts are announced. */
  abortChannel(): string {
    return `${this.keys.prefix}:abort`;
  }

  /** The connection for blocking stream reads (XREAD BLOCK), created on first use. */
  blocking(): Redis {
    if (this.#blocking === undefined) {
      this.#blocking = this.redis.duplicate({ maxRetriesPerRequest: null });
      this.#blocking.on('error', () => {});
    }
    return this.#blocking;
  }

  async close(): Promise<void> {
    this.#blocking?.disconnect();
    this.#blocking = undefined;
    this.#subscriber?.disconnect();
    this.#subscriber = undefined;
    await this.queue.close();
    // BullMQ does not close a connection it was given.
    this.#queueConnection.disconnect();
    await this.store.close();
    if (this.ownsRedis) this.redis.disconnect();
  }
}
