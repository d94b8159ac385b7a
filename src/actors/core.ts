import type { Cluster, Redis } from 'ioredis';
import { commitSpans } from '../observability/commit-spans.js';
import { createRunHost, type AppliedEvent, type RunHost } from './run-host.js';
import { InputValidationError, type SerializedError } from '../errors.js';
import { assertQueueName, createKeys, DEFAULT_QUEUE_NAME } from '../persistence/keys.js';
import { coalesceWrites, flushWrites } from '../persistence/write-coalescing.js';
import { checkRedisTimeout } from '../persistence/redis-errors.js';
import { asCommandClient, duplicateClient, openRedis } from '../persistence/connection.js';
import { createDefaultLogger, type Logger } from '../logging.js';
import { parsePricing, type PricingTable } from '../llm/pricing.js';
import { parseRetentionOptions, type RetentionOptions } from '../persistence/retention.js';
import { checkEndedRunsWindow } from '../persistence/active-runs.js';
import { resolveCacheLimits } from '../persistence/cache-store.js';
import { createModelContext, type ModelContext } from '../execution/model-context.js';
import { createUsageMeter, type UsageMeter } from '../execution/usage-meter.js';
import {
  checkRateLimits,
  createModelRateLimiter,
  type ModelRateLimiter,
  type RateLimits,
} from '../execution/rate-limits.js';
import { createRateLimitStore } from '../persistence/rate-limit-store.js';
import type { RunEvent } from '../schemas/events.js';
import { journaledReplyOf } from './unit-start.js';
import { RuntimeMeta } from './runtime-meta.js';
import { RuntimeQueues } from './runtime-queues.js';
import { runEnded } from './child.js';
import { RuntimeRegistry } from './runtime-registry.js';
import { RuntimeStores } from './runtime-stores.js';
import {
  checkDurability,
  createReplicaAck,
  type CheckedDurability,
  type DurabilityOptions,
} from '../persistence/replicas.js';
import { planStep } from '../plan/graph.js';

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
  /**
   * Replicas that must have a write before the runtime acts on it: `{ replicas: 1 }` sends
   * `WAIT 1 timeoutMs` after every snapshot commit, run creation, tool-call lease, request key and
   * active-runs entry, on the connection that wrote it, and goes on (runs the effect, enqueues the
   * next unit) only once that many replicas acknowledged. A shortfall is tried three times, then
   * fails the write's caller with a retryable `ReplicasBehindError`; nothing is acted on.
   * @defaultValue none: a write counts once the master applied it
   */
  durability?: DurabilityOptions;
  /** Tenant of runs started without one. @defaultValue `'default'` */
  tenantId?: string;
  /**
   * BullMQ queue name: the queue of the runs this runtime starts (each run records it), of its
   * schedules' fires, and the one its workers take units from unless told others. Runs of
   * different job modules belong on different queues (see `jobQueueName`). @defaultValue `'runs'`
   */
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
   * Model rate limits, shared by every worker of the prefix through Redis, by model or provider:
   * `{ 'gpt-4o-mini': { requestsPerMinute: 500, tokensPerMinute: 200000 }, 'api.openai.com': {
   * requestsPerMinute: 3000 } }`. A name matches an agent's model exactly, a provider prefix of
   * it (`openai` for `openai/gpt-4o`), or the host of its `provider.baseURL`. A model call waits
   * in the worker until every limit it is under lets it through (each wait is recorded as a
   * `model.rate_limited` event); a 429 that still comes blocks its limits for every worker until
   * its `retry-after`. Each limit is a positive integer; give every process of the prefix the same
   * limits. @defaultValue none
   */
  rateLimits?: RateLimits;
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
  /**
   * How long after a run ended the workers' sweeps check that it stayed ended, in ms. A run that
   * ends is noted, beside the active runs, with the time it ended; each sweep (`sweepEveryMs`)
   * reads the status of every run noted within this window, and a run whose snapshot no longer
   * says it ended (on Redis Cluster, a failover of its slot to a replica that lagged took back its
   * last commits) is made active again and driven on. 0: runs that ended are not noted nor
   * checked. @defaultValue 15 minutes
   */
  endedRunsCheckMs?: number;
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

/**
 * The options of a runtime core that are checked before it connects to anything, as checked;
 * `InputValidationError` naming the fix for one that is refused.
 */
function checkOptions(options: CoreOptions) {
  if (options.onStepFailure !== undefined && typeof options.onStepFailure !== 'function') {
    throw new InputValidationError('runtime options', [
      {
        path: 'onStepFailure',
        message: 'must be a function, e.g. onStepFailure: (failure) => console.warn(failure)',
      },
    ]);
  }
  const policyVersion: unknown = options.policyVersion;
  if (policyVersion !== undefined && (typeof policyVersion !== 'string' || policyVersion === '')) {
    throw new InputValidationError('runtime options', [
      {
        path: 'policyVersion',
        message: 'must be a non-empty string, e.g. policyVersion: "2026-11"',
      },
    ]);
  }
  const retention = parseRetentionOptions(options.retention);
  const endedRunsCheckMs = checkEndedRunsWindow(options.endedRunsCheckMs, 'endedRunsCheckMs');
  const cacheLimits = resolveCacheLimits(options.cache ?? {});
  let redisTimeoutMs: number;
  try {
    redisTimeoutMs = checkRedisTimeout(options.redisTimeoutMs, 'redisTimeoutMs');
  } catch (error) {
    throw new InputValidationError('runtime options', [
      { path: 'redisTimeoutMs', message: (error as Error).message },
    ]);
  }
  const rateLimits =
    options.rateLimits === undefined ? undefined : checkRateLimits(options.rateLimits);
  return {
    rateLimits,
    durability: checkDurability(options.durability),
    onStepFailure: options.onStepFailure,
    policyVersion,
    retention,
    endedRunsCheckMs,
    cacheLimits,
    redisTimeoutMs,
  };
}

/**
 * The connections, stores and registries one runtime shares with its workers, by role: `stores`
 * (every Redis store), `queues` (the BullMQ queue, the jobs it is given, the live channels, the
 * stream watcher), `registry` (operators, agents, policies, tools, model clients, token
 * counters), `meta` (what each run was started with), plus the run host and the settings every
 * part shares. Its connections are made here: the client, the queue's duplicate, and the
 * subscriber the queues open on their first subscription (the stream watcher duplicates the client
 * for its blocking reads). Not exported from the package (not tagged internal: the declarations of
 * the worker's modules refer to it).
 */
export class RuntimeCore {
  /** The runtime's Redis client: the one given, or one opened from the URL given. */
  readonly redis: Redis;
  /** Whether {@link redis} was opened here (and so is closed here). */
  readonly ownsRedis: boolean;
  /** See `CoreOptions.redisTimeoutMs`. */
  readonly redisTimeoutMs: number;
  /** See `CoreOptions.durability`: undefined when no replica is waited for. */
  readonly durability: CheckedDurability | undefined;
  /** Every Redis store of the runtime. */
  readonly stores: RuntimeStores;
  /** The runs' metadata, kept once read. */
  readonly meta: RuntimeMeta;
  /** The runtime's run host: runs' snapshots advanced by events, with compare-and-set. */
  readonly host: RunHost;
  /** Where the runtime logs. */
  readonly log: Logger;
  /** The operators, agents, policies and tools registered, and what agents use. */
  readonly registry: RuntimeRegistry;
  /** Token reservations and usage of model calls, priced. */
  readonly meter: UsageMeter;
  /** Fits an agent's messages to its model's context window. */
  readonly context: ModelContext;
  /** See `CoreOptions.rateLimits`: undefined when there are none. */
  readonly rateLimits: ModelRateLimiter | undefined;
  /** The BullMQ queue, the jobs added to it, live channels and the stream watcher. */
  readonly queues: RuntimeQueues;
  readonly #queueConnection: Redis;
  /** Tenant of runs started without one. */
  readonly tenantId: string;
  /** The clock, epoch ms. */
  readonly clock: () => number;
  /** See `CoreOptions.onStepFailure`. */
  readonly onStepFailure: ((failure: StepFailureInfo) => unknown) | undefined;
  /** See `CoreOptions.policyVersion`. */
  readonly policyVersion: string | undefined;

  constructor(options: CoreOptions) {
    // Checked before any connection is made: a refused option leaves nothing open.
    const checked = checkOptions(options);
    this.onStepFailure = checked.onStepFailure;
    this.policyVersion = checked.policyVersion;
    const { retention, cacheLimits, endedRunsCheckMs } = checked;
    this.redisTimeoutMs = checked.redisTimeoutMs;
    this.durability = checked.durability;
    this.ownsRedis = typeof options.redis === 'string';
    this.redis =
      typeof options.redis === 'string'
        ? coalesceWrites(openRedis(options.redis, { timeoutMs: this.redisTimeoutMs }))
        : asCommandClient(options.redis);
    if (this.ownsRedis) this.redis.on('error', () => {}); // surfaced by the failing command
    const keys = createKeys(options.prefix);
    this.tenantId = options.tenantId ?? 'default';
    this.clock = options.clock ?? Date.now;
    const { cacheBytes, ...blobOptions } = options.blobs ?? {};
    this.stores = new RuntimeStores(this.redis, keys, {
      clock: this.clock,
      givenClock: options.clock,
      blobs: blobOptions,
      retention,
      endedRunsCheckMs,
      cacheLimits,
      replicas:
        this.durability === undefined ? undefined : createReplicaAck(this.redis, this.durability),
    });
    this.meta = new RuntimeMeta(this.stores, this.tenantId);
    this.host = createRunHost({
      store: this.stores.store,
      onCommitted: commitSpans(async (runId) => {
        const meta = await this.meta.read(runId);
        return { ...meta, planName: meta.plan.name };
      }),
    });
    this.log = options.logger ?? createDefaultLogger();
    this.registry = new RuntimeRegistry(this.log);
    const pricing =
      options.pricing === undefined
        ? undefined
        : parsePricing(options.pricing, 'createRuntime({ pricing })');
    this.meter = createUsageMeter({
      quota: this.stores.quota,
      ...(pricing === undefined ? {} : { pricing }),
      strictPricing: options.strictPricing ?? false,
      ...(options.defaultOutputTokens === undefined
        ? {}
        : { defaultOutputTokens: options.defaultOutputTokens }),
      log: this.log,
      counterFor: (model) => this.registry.tokens(model),
      flush: () => flushWrites(this.redis),
    });
    const meter = this.meter;
    this.rateLimits =
      checked.rateLimits === undefined || Object.keys(checked.rateLimits).length === 0
        ? undefined
        : createModelRateLimiter({
            store: createRateLimitStore({ redis: this.redis, prefix: keys.prefix }),
            limits: checked.rateLimits,
            estimate: (agent, messages) => meter.estimateTokens(agent, messages),
            log: this.log,
          });
    // A run that ended with reservations open (a worker died mid-call): settled at its end.
    this.meta.settleOpen = (runId, meta) =>
      this.meter.settle({ tenantId: meta.tenantId, runId }, (r) => {
        const step = planStep(meta.plan, r.stepId);
        const mode = step?.kind === 'agent' && step.mode === 'granular' ? 'granular' : 'atomic';
        return journaledReplyOf(this, runId, mode, r);
      });
    this.context = createModelContext({
      counterFor: (model) => this.registry.tokens(model),
      blobs: this.stores.blobs,
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
    if (options.queueName !== undefined) assertQueueName(options.queueName, 'queueName');
    this.queues = new RuntimeQueues({
      redis: this.redis,
      queueConnection: this.#queueConnection,
      openSubscriber: () => duplicateClient(this.redis),
      keys,
      queueName: options.queueName ?? DEFAULT_QUEUE_NAME,
      clock: this.clock,
      meta: this.meta,
      finishedRunsMs: retention.finishedRunsMs,
    });
    this.queues.onEnded = (runId, snapshot) => runEnded(this, runId, snapshot);
  }

  /** Feeds an event to a run and enqueues what became due. */
  async apply(runId: string, event: RunEvent): Promise<AppliedEvent> {
    const applied = await this.host.apply(runId, event);
    await this.queues.enqueueDue(runId, applied.envelope);
    return applied;
  }

  /** Closes the queues, then every connection opened here; a client given stays open. */
  async close(): Promise<void> {
    await this.queues.close();
    // BullMQ does not close a connection it was given.
    this.#queueConnection.disconnect();
    await this.stores.close();
    if (this.ownsRedis) this.redis.disconnect();
  }
}
