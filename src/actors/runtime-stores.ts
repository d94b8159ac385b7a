import { createDebounceStore, type DebounceStore } from '../persistence/debounces.js';
import { createSingletonKeys, type SingletonKeys } from '../persistence/singletons.js';
import type { Redis } from 'ioredis';
import { RunNotFoundError, RunRemovedError } from '../errors.js';
import type { RunSnapshot } from '../machines/kernel.js';
import { runSnapshotCodec } from '../machines/snapshot-migrations.js';
import { createSnapshotCodec } from '../persistence/codec.js';
import type { Keys } from '../persistence/keys.js';
import { createLedger, type Ledger } from '../persistence/ledger.js';
import { createFingerprintStore, type FingerprintStore } from '../persistence/fingerprint-store.js';
import { createHistoryStore, type HistoryStore } from '../persistence/history.js';
import { createModelJournal, type ModelJournal } from '../persistence/model-journal.js';
import {
  createBlobStore,
  DEFAULT_BLOB_RETENTION_MS,
  type BlobStore,
  type BlobStoreOptions,
} from '../persistence/blob-store.js';
import { createRetentionStore, type RetentionStore } from '../persistence/retention.js';
import {
  createCacheStore,
  type CacheStore,
  type CacheStoreOptions,
} from '../persistence/cache-store.js';
import { createQuotaStore, type QuotaStore } from '../persistence/quota-store.js';
import { createSnapshotStore, type SnapshotStore } from '../persistence/snapshot-store.js';
import { createRunIndex, type RunIndex } from '../persistence/run-index.js';
import { createActiveRuns, type ActiveRuns } from '../persistence/active-runs.js';
import { createRunEnd, type RunEnd } from '../persistence/run-end.js';
import { createRunCounters, type RunCounters } from '../persistence/run-counters.js';
import { createMapStore, type MapStore } from '../persistence/map-store.js';
import { createRequestKeys, type RequestKeys } from '../persistence/request-keys.js';
import { createUnitNotes, type UnitNotes } from '../persistence/unit-notes.js';
import { createInboxStore, type InboxStore } from '../persistence/inbox.js';
import { createConcurrencySlots, type ConcurrencySlots } from '../persistence/concurrency-store.js';
import type { ReplicaAck } from '../persistence/replicas.js';

/** The unit-notes field {@link RuntimeStores.acknowledgeRead} writes: not a step id (see STEP_ID_PATTERN). */
const READ_ACK_FIELD = '~read';
const WRITE_IF_THERE = `if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end return 0`;

/** What the stores are built with, besides the connection and the keys. */
export interface RuntimeStoresOptions {
  /** The runtime's clock, epoch ms. */
  clock: () => number;
  /** The clock the caller gave, if any: the quota store's own default otherwise. */
  givenClock: (() => number) | undefined;
  /** The blob store's options (`CoreOptions.blobs` but its `cacheBytes`). */
  blobs: Pick<BlobStoreOptions, 'retentionMs' | 'maxBytesPerRun'>;
  /** How long finished and failed runs are kept, as checked. */
  retention: { finishedRunsMs: number; failedRunsMs: number | null; tombstoneMs: number };
  /** How long a run that ended is noted for the sweeps to check (`CoreOptions.endedRunsCheckMs`), as checked. */
  endedRunsCheckMs: number;
  /** The step cache's limits, as checked. */
  cacheLimits: Pick<CacheStoreOptions, 'retentionMs' | 'digestRetentionMs' | 'maxEntryBytes'>;
  /** Writes acknowledged by replicas before the runtime acts on them, when asked for. */
  replicas: ReplicaAck | undefined;
}

/**
 * Every Redis store of a runtime, built from one connection and the keys: the runs' snapshots
 * and events, the ledger, the run list and the side stores of runs, the model journal and
 * histories, quotas, blobs, retention and the step cache. Making them sends no command.
 */
export class RuntimeStores {
  /** The names of every Redis key of the runtime. */
  readonly keys: Keys;
  /** Runs' snapshots, events, outputs and meta, committed with compare-and-set. */
  readonly store: SnapshotStore<RunSnapshot>;
  /** The tool-call ledger. */
  readonly ledger: Ledger;
  /** The run list. */
  readonly runs: RunIndex;
  /** The runs not finished yet (walked by a starting worker). */
  readonly activeRuns: ActiveRuns;
  /** Per-run counters that budgets read (tool calls, a step's first start). */
  readonly counters: RunCounters;
  /** Start requests' keys, claimed once per tenant. */
  readonly requestKeys: RequestKeys;
  /** Singleton keys: the live run that holds each, per tenant. */
  readonly singletons: SingletonKeys;
  /** Debounce bursts: the open one of each key, and those whose run is being started. */
  readonly debounces: DebounceStore;
  /** The notes workers leave when they start a unit. */
  readonly unitNotes: UnitNotes;
  /** The runs' inboxes of signals. */
  readonly inbox: InboxStore;
  /** Concurrency slots per key value (a plan's or a step's `concurrency`). */
  readonly slots: ConcurrencySlots;
  /** The items of map steps, beside their runs. */
  readonly maps: MapStore;
  /** The model replies of agent turns, journaled before they are used. */
  readonly journal: ModelJournal;
  /** The message histories of granular agent steps. */
  readonly history: HistoryStore;
  /** The fingerprints granular agent steps started under. */
  readonly fingerprints: FingerprintStore;
  /** Token reservations and usage, per run and per tenant. */
  readonly quota: QuotaStore;
  /** Large tool results of granular steps. */
  readonly blobs: BlobStore;
  /** The expiry of finished runs' keys, and what was removed. */
  readonly retention: RetentionStore;
  /** A run's end: its expiry, the active runs, the run list, its open reservations. */
  readonly runEnd: RunEnd;
  /** Cached step outputs (`cachePolicy`), shared by a tenant's runs. */
  readonly cache: CacheStore;

  readonly #redis: Redis;
  readonly #replicas: ReplicaAck | undefined;
  readonly #clock: () => number;

  constructor(redis: Redis, keys: Keys, options: RuntimeStoresOptions) {
    const { clock, replicas } = options;
    this.#redis = redis;
    this.#replicas = replicas;
    this.#clock = clock;
    this.keys = keys;
    this.store = createSnapshotStore<RunSnapshot>({
      redis,
      prefix: keys.prefix,
      codec: createSnapshotCodec<RunSnapshot>(runSnapshotCodec),
      clock,
      ...(replicas === undefined ? {} : { replicas }),
    });
    this.ledger = createLedger({
      redis,
      prefix: keys.prefix,
      clock,
      ...(replicas === undefined ? {} : { replicas }),
    });
    this.runs = createRunIndex(redis, keys, clock);
    this.activeRuns = createActiveRuns(redis, keys, {
      endedWindowMs: options.endedRunsCheckMs,
      clock,
      ...(replicas === undefined ? {} : { replicas }),
    });
    this.counters = createRunCounters(redis, keys);
    this.requestKeys = createRequestKeys(redis, keys, replicas);
    this.singletons = createSingletonKeys(redis, keys);
    this.debounces = createDebounceStore(redis, keys);
    this.unitNotes = createUnitNotes(redis, keys);
    this.inbox = createInboxStore(redis, keys);
    this.slots = createConcurrencySlots(redis, keys);
    this.maps = createMapStore(redis, keys, replicas);
    const stores = { redis, prefix: keys.prefix };
    this.journal = createModelJournal(stores);
    this.history = createHistoryStore(stores);
    this.fingerprints = createFingerprintStore(stores);
    this.quota = createQuotaStore({
      ...stores,
      ...(options.givenClock ? { clock: options.givenClock } : {}),
    });
    this.blobs = createBlobStore({ ...stores, ...options.blobs });
    this.retention = createRetentionStore({
      redis,
      keys,
      finishedRunsMs: options.retention.finishedRunsMs,
      failedRunsMs: options.retention.failedRunsMs,
      tombstoneMs: options.retention.tombstoneMs,
      blobRetentionMs: options.blobs.retentionMs ?? DEFAULT_BLOB_RETENTION_MS,
      clock,
    });
    this.runEnd = createRunEnd({
      redis,
      keys,
      retention: this.retention,
      activeRuns: this.activeRuns,
      runs: this.runs,
      clock,
    });
    this.cache = createCacheStore({ ...stores, ...options.cacheLimits });
  }

  /**
   * Before the runtime acts on a run's state it read rather than wrote (a redelivered job that
   * finds its unit committed and enqueues what is due, a sweep, a start tried again): with
   * `durability`, the replicas must have that state too. A write of this connection to the run's
   * master (a field of its unit notes that no step id can be) then a `WAIT` covers every earlier
   * write to that master, whoever made it. Nothing without `durability`.
   */
  async acknowledgeRead(runId: string): Promise<void> {
    if (this.#replicas === undefined) return;
    const key = this.keys.started(runId);
    // Only into notes that exist: a run removed by retention gets no key without an expiry.
    await this.#redis.eval(WRITE_IF_THERE, 1, key, READ_ACK_FIELD, String(this.#clock()));
    await this.#replicas.ack(key);
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

  /** Closes what the stores hold of their own (the snapshot store's); the connection stays open. */
  async close(): Promise<void> {
    await this.store.close();
  }
}
