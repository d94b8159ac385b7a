/**
 * The one key builder for every Redis key of the runtime. All keys of a run share the hash tag
 * `{<runId>}`, so Redis Cluster places them in one slot and a transaction may touch them together.
 * Usage accounting is the exception: it is checked against the run's and the tenant's limits in one
 * script, so every usage key (the run's too) lives in the tenant's hash tag `{t:<tenantId>}`.
 */
import { InputValidationError } from '../errors.js';
import { STEP_ID_PATTERN } from '../internal/ids.js';

/** The default key prefix. */
export const DEFAULT_KEY_PREFIX = 'flujo';

/** The longest run id accepted, in UTF-16 code units. */
export const RUN_ID_MAX_LENGTH = 200;

/** What a valid run id looks like: 1 to 200 characters, no `{` or `}` (they would break the hash tag). */
export const RUN_ID_PATTERN = /^[^{}]{1,200}$/;

/** The kinds of per-run keys, each the last segment of `<prefix>:{<runId>}:<kind>`. */
export const RunKeyKind = {
  /**
   * HASH: the snapshot envelope (`v`, `sv`, `u`, `c`) and the snapshot's parts (`run`, `plan`,
   * `s:<stepId>`; before schema version 4 the whole snapshot in `s`).
   */
  Snap: 'snap',
  /** HASH: step id → the step's output as JSON, written once, outside the snapshot. */
  Outputs: 'outputs',
  /**
   * STRING: written when a finished run is given its expiry, kept longer than the run: the run
   * was removed by retention (not never there). Holds the finish time and the retention.
   */
  Removed: 'removed',
  /** STREAM: the run's event log. */
  Events: 'events',
  /**
   * STREAM: the run's status changes alone (its `run.status` events, written with them by the same
   * commit, its newest few kept), so that a waiter for a status wakes on nothing else.
   */
  Status: 'status',
  /** The tool-call ledger. */
  Ledger: 'ledger',
  /** HASH: the model-response journal, field `<stepId>:<turn>`. */
  Journal: 'journal',
  /** LIST per step: a step's conversation history, `<prefix>:{<runId>}:history:<stepId>`. */
  History: 'history',
  /** HASH: the run's blob accounting: `bytes`, `count`, and per blob id its size. */
  Blobs: 'blobs',
  /** STRING per blob, `<prefix>:{<runId>}:blob:<blobId>`: the content; no TTL while the run lives (or the blobs' `retentionMs`). */
  Blob: 'blob',
  /** HASH: what the run was started with (plan, input, tenant, request key). */
  Meta: 'meta',
  /** HASH: usage counters checked against the run's budgets (tool calls, …). */
  Counters: 'counters',
  /** HASH: the fingerprint parts of each granular agent step, field `<stepId>`. */
  Fingerprints: 'fingerprints',
  /** Pub/sub channel (no key): a run's streamed reply text. */
  Chunks: 'chunks',
  /**
   * HASH: field `<stepId>` → `<attempt> <pause> <epochMs> <worker> <turn|-> <host> <pid>`, the
   * execution a worker started last for the step (a READY step's, or a turn's), not yet committed;
   * read by status, and by the next worker to tell a unit taken over.
   */
  Started: 'started',
  /** LIST: the runs that replay this one, one JSON `{ runId, mode, at }` per replay, oldest first. */
  Replays: 'replays',
  /** HASH: field `<stepId>` → the latest progress the step's operator reported (JSON). */
  Progress: 'progress',
  /**
   * HASH: the run's inbox of signals, append-only in send order: `n` (signals in all), `c:<name>`
   * (signals of that name), `s:<name>:<index>` (one signal as JSON), `i:<id>` (a signal id → its
   * `<index> <seq> <sha1 of payload> <name>`, so a retried send is a no-op).
   */
  Inbox: 'inbox',
  /**
   * HASH per map step, `<prefix>:{<runId>}:map:<stepId>`: its running attempt's state (`attempt`,
   * `total`, `next` index to dispatch, `done`, `failed`, `mode`, `end`), each item's element
   * (`i:<index>`, until it is committed), output (`o:<index>`), attempt (`a:<index>`) and a
   * failing item's error (`e:<index>`).
   */
  Map: 'map',
  /** SET per map step, `<prefix>:{<runId>}:map-inflight:<stepId>`: the indexes of its items dispatched and not committed. */
  MapInflight: 'map-inflight',
  /**
   * STRING with a TTL (a minute, renewed while it holds): why a worker put one of the run's units
   * back untried, JSON `{ reason, operator?, agent?, queue, host, pid, at }` (a worker that does not
   * know the step's operator or agent). Read by status.
   */
  Unrouted: 'unrouted',
  /**
   * HASH with a TTL (a minute, renewed while a unit waits): field `run` or `<stepId>` → JSON
   * `{ label, limit, since }`, a unit of the run waiting for a concurrency slot. Read by status.
   */
  SlotWaits: 'slot-waits',
} as const;
/** A value of {@link RunKeyKind}. */
export type RunKeyKind = (typeof RunKeyKind)[keyof typeof RunKeyKind];

/** Builders for every Redis key of the runtime under one prefix. */
export interface Keys {
  /** The prefix every key starts with. */
  readonly prefix: string;
  /** `<prefix>:{<runId>}:<kind>`. */
  runKey(runId: string, kind: RunKeyKind): string;
  /** The run's snapshot envelope (HASH). */
  snap(runId: string): string;
  /** The run's event stream (STREAM). */
  events(runId: string): string;
  /** The run's status changes (STREAM, see `RunKeyKind.Status`). */
  status(runId: string): string;
  /** The run's step outputs (HASH: step id → JSON). */
  outputs(runId: string): string;
  /** The run's retention tombstone (STRING, see `RunKeyKind.Removed`). */
  removed(runId: string): string;
  /**
   * The run's tool-call ledger: `<prefix>:{<runId>}:ledger`, or with a tenant
   * `<prefix>:{<runId>}:ledger:<tenantId>` (the tenant after the hash tag keeps the run in one slot).
   */
  ledger(runId: string, tenantId?: string): string;
  /** The run's model-response journal. */
  journal(runId: string): string;
  /**
   * A step's conversation history (LIST, append-only): `<prefix>:{<runId>}:history:<stepId>` (the
   * step after the hash tag keeps the run in one slot). `stepId` must match `STEP_ID_PATTERN`.
   */
  history(runId: string, stepId: string): string;
  /** The run's blob accounting (HASH: `bytes`, `count`, `<blobId>` → size); like each blob's. */
  blobs(runId: string): string;
  /**
   * One blob's content (STRING, kept with its run): `<prefix>:{<runId>}:blob:<blobId>`. `blobId` must
   * be a sha256 in lowercase hex (see `BLOB_ID_PATTERN`).
   */
  blob(runId: string, blobId: string): string;
  /** What the run was started with (HASH). */
  meta(runId: string): string;
  /** The run's usage counters (HASH). */
  counters(runId: string): string;
  /** The fingerprint parts of the run's granular agent steps (HASH). */
  fingerprints(runId: string): string;
  /** The executions workers started for READY steps (HASH, see `RunKeyKind.Started`). */
  started(runId: string): string;
  /** The runs that replay this one (LIST, see `RunKeyKind.Replays`). */
  replays(runId: string): string;
  /**
   * The tenant's quota and usage: `<prefix>:{t:<tenantId>}:quota` (HASH: `maxTokens` and
   * `maxMicroUsd`, absent = unlimited; `reservedTokens`, `reservedMicroUsd`, `spentTokens`,
   * `spentMicroUsd`).
   */
  tenantQuota(tenantId: string): string;
  /**
   * One run's usage: `<prefix>:{t:<tenantId>}:usage:<runId>`, in the tenant's hash tag (HASH: the
   * same counters, and the run's limits as its latest reservation gave them).
   */
  runUsage(tenantId: string, runId: string): string;
  /**
   * The tenant's usage reservations: `<prefix>:{t:<tenantId>}:reservations` (HASH: reservation id →
   * the record as JSON).
   */
  reservations(tenantId: string): string;
  /**
   * The reservation records of finished runs, due for removal from the tenant's reservations once
   * their run expired: `<prefix>:{t:<tenantId>}:reservations-expiring` (ZSET: score = when, member
   * = `{"runId":…,"ids":[…]}`).
   */
  expiringReservations(tenantId: string): string;
  /**
   * The reservation ids of one run in creation order (LIST):
   * `<prefix>:{t:<tenantId>}:reservations:<runId>`, in the tenant's hash tag.
   */
  runReservations(tenantId: string, runId: string): string;
  /**
   * The ids of the run's reservations not yet reconciled (SET):
   * `<prefix>:{t:<tenantId>}:open:<runId>`, in the tenant's hash tag.
   */
  openReservations(tenantId: string, runId: string): string;
  /** SET of runs that have not ended: a starting worker re-enqueues their work. Not run-scoped. */
  activeRuns(): string;
  /**
   * ZSET of the runs that ended lately, scored by when (epoch ms): `{<prefix>:active-runs}:ended`,
   * whose hash tag is the whole name of {@link activeRuns}, so both live in one Redis Cluster slot
   * and one script may move a run from one to the other.
   */
  endedRuns(): string;
  /**
   * One cached step output: `<prefix>:{t:<tenantId>}:cache:<hash>` (STRING, JSON; TTL = the
   * cache's retention, or an external entry's `ttlMs`).
   */
  cacheEntry(tenantId: string, hash: string): string;
  /**
   * The output hash a deterministic step stored: `<prefix>:{t:<tenantId>}:cache-digest:<hash>`
   * (STRING; kept longer than the entry, so a re-run after the entry expired is still checked).
   */
  cacheDigest(tenantId: string, hash: string): string;
  /** ZSET of every run by start time (the run list): `{<prefix>:runs}:index`. Not run-scoped. */
  runIndex(): string;
  /** HASH beside {@link Keys.runIndex}: what the list shows of each run. Not run-scoped. */
  runInfo(): string;
  /**
   * ZSET beside {@link Keys.runIndex}: the runs that ended, scored by when their keys expire; their
   * entries leave the list then. Not run-scoped.
   */
  runIndexExpiring(): string;
  /** The run's latest progress per step (HASH, see `RunKeyKind.Progress`). */
  progress(runId: string): string;
  /** The run's inbox of signals (HASH, see `RunKeyKind.Inbox`). */
  inbox(runId: string): string;
  /** A map step's state and items (HASH, see `RunKeyKind.Map`). */
  map(runId: string, stepId: string): string;
  /** A map step's items in flight (SET, see `RunKeyKind.MapInflight`). */
  mapInflight(runId: string, stepId: string): string;
  /** Why a worker put one of the run's units back untried (STRING, see `RunKeyKind.Unrouted`). */
  unrouted(runId: string): string;
  /** The run's units waiting for a concurrency slot (HASH, see `RunKeyKind.SlotWaits`). */
  slotWaits(runId: string): string;
  /**
   * The keys of one concurrency key value's slots, sharing the hash tag
   * `{<prefix>:conc:<scope>:<value>}` (scope and value URI-encoded): `holders` (ZSET, holder →
   * lease expiry), `waiters` (ZSET, holder → arrival time in µs), `wake` (HASH, waiter → the job
   * that wakes it).
   */
  slots(scope: string, value: string): { holders: string; waiters: string; wake: string };
  /**
   * ZSET of the live workers, scored by when their heartbeat lapses (epoch ms):
   * `{<prefix>:workers}:live`. The workers' keys share the hash tag `{<prefix>:workers}`.
   */
  workersLive(): string;
  /** STRING, JSON, with a TTL: one worker's latest heartbeat: `{<prefix>:workers}:w:<workerId>`. */
  workerBeat(workerId: string): string;
  /** HASH: queue name → the latest heartbeat of any worker on it (epoch ms): `{<prefix>:workers}:queues`. */
  workerQueues(): string;
  /** STRING: the run id a request key maps to, per tenant. Not run-scoped. */
  requestKey(tenantId: string, requestKey: string): string;
  /** The BullMQ key prefix: hash-tagged, so every queue key shares one Redis Cluster slot. */
  queuePrefix(): string;
  /**
   * The keys of one model rate limit (see `rate-limit-store.ts`), which share the hash tag
   * `{<prefix>:rate:<name>}`: `log`, a ZSET of the requests let through in the window (member:
   * grant id, score: epoch ms), and `state`, a HASH (`until`: blocked until, epoch ms, after a
   * 429; `tok`: tokens in the window; `t:<grant id>`: one request's tokens).
   */
  rateLimit(name: string): { log: string; state: string };
  /**
   * HASH of every schedule's definition (schedule id → JSON): `{<prefix>:schedules}:defs`. The
   * schedules' keys share the hash tag `{<prefix>:schedules}`, so one script may touch them together.
   */
  scheduleDefs(): string;
  /**
   * HASH: one schedule's firing state (`last`: the newest fire time handled, `lastRun`,
   * `lastRunAt`, `buffered`): `{<prefix>:schedules}:state:<scheduleId>`.
   */
  scheduleState(scheduleId: string): string;
  /** HASH: one schedule's recent fires (fire key → JSON): `{<prefix>:schedules}:fires:<scheduleId>`. */
  scheduleFires(scheduleId: string): string;
  /**
   * ZSET: the fire keys of {@link Keys.scheduleFires} by fire time, to keep the newest:
   * `{<prefix>:schedules}:fire-times:<scheduleId>`.
   */
  scheduleFireTimes(scheduleId: string): string;
  /**
   * HASH of a tenant's singleton keys (key → `<claimed at ms>|<runId>`, the live run that holds
   * it): `{<prefix>:singletons:<tenantId>}:held`, in a hash tag of its own.
   */
  singletons(tenantId: string): string;
  /**
   * HASH of a tenant's open debounce bursts (key → JSON `{ burst, first, due, start }`):
   * `{<prefix>:debounce:<tenantId>}:open`. Its hash tag is shared with {@link Keys.debounceFiring}.
   */
  debounceOpen(tenantId: string): string;
  /** HASH of the bursts whose run is being started (burst id → JSON): `{<prefix>:debounce:<tenantId>}:firing`. */
  debounceFiring(tenantId: string): string;
}

/** What a rate limit's name may be: 1 to 200 characters, no `{` or `}` (they would break the hash tag). */
export const RATE_LIMIT_NAME_PATTERN = /^[^{}\s]{1,200}$/;

function assertRateLimitName(name: string): void {
  if (typeof name !== 'string' || !RATE_LIMIT_NAME_PATTERN.test(name)) {
    throw new InputValidationError('rate limit', [
      {
        path: 'name',
        message: `must be 1 to 200 characters without "{", "}" or spaces, got ${JSON.stringify(name)}`,
      },
    ]);
  }
}

/** Throws {@link InputValidationError} naming `field` unless `runId` is a valid run id. */
export function assertRunId(runId: unknown, field = 'runId'): asserts runId is string {
  const problem = runIdProblem(runId);
  if (problem !== undefined) {
    throw new InputValidationError('run id', [{ path: field, message: problem }]);
  }
}

/** Throws {@link InputValidationError} naming `field` unless `tenantId` is valid (same rules as a run id). */
export function assertTenantId(tenantId: unknown, field = 'tenantId'): asserts tenantId is string {
  const problem = runIdProblem(tenantId);
  if (problem !== undefined) {
    throw new InputValidationError('tenant id', [{ path: field, message: problem }]);
  }
}

/** The queue of a runtime created with no `queueName`. */
export const DEFAULT_QUEUE_NAME = 'runs';

/**
 * The queue a job module's runs go to when it names none: `plan.<plan name>`, each ":" (which a
 * queue name may not hold) replaced by `-`, cut to 200 characters.
 */
export function jobQueueName(planName: string): string {
  return `plan.${planName}`.replace(/:/g, '-').slice(0, 200);
}

/** What a queue name looks like: 1 to 200 characters, none of them ":" (BullMQ refuses it). */
export const QUEUE_NAME_PATTERN = /^[^:]{1,200}$/;

/** Throws {@link InputValidationError} naming `field` unless `name` is a valid queue name. */
export function assertQueueName(name: unknown, field = 'queue'): asserts name is string {
  if (typeof name !== 'string' || !QUEUE_NAME_PATTERN.test(name)) {
    throw new InputValidationError('queue name', [
      {
        path: field,
        message: `must be a string of 1 to 200 characters without ":", e.g. "runs", got ${JSON.stringify(name)}`,
      },
    ]);
  }
}

/** What a blob id looks like: the sha256 of the content, 64 lowercase hex digits. */
export const BLOB_ID_PATTERN = /^[0-9a-f]{64}$/;

/** A cache key hash: 64 lowercase hex digits, checked before it goes into a key. */
function cacheHash(hash: string): string {
  if (!BLOB_ID_PATTERN.test(hash)) {
    throw new InputValidationError('cache key', [
      { path: 'hash', message: `must be a sha256 in lowercase hex, got ${JSON.stringify(hash)}` },
    ]);
  }
  return hash;
}

/** Throws {@link InputValidationError} naming `field` unless `blobId` is a valid blob id. */
export function assertBlobId(blobId: unknown, field = 'blobId'): asserts blobId is string {
  if (typeof blobId !== 'string' || !BLOB_ID_PATTERN.test(blobId)) {
    throw new InputValidationError('blob id', [
      {
        path: field,
        message: `must be a sha256 in lowercase hex (64 characters), got ${JSON.stringify(blobId)}`,
      },
    ]);
  }
}

/** Throws {@link InputValidationError} naming `field` unless `stepId` matches `STEP_ID_PATTERN`. */
export function assertStepId(stepId: unknown, field = 'stepId'): asserts stepId is string {
  if (typeof stepId !== 'string' || !STEP_ID_PATTERN.test(stepId)) {
    throw new InputValidationError('step id', [
      {
        path: field,
        message: `must be 1 to 128 letters, digits, "_", "." or "-", starting with a letter or digit, got ${JSON.stringify(stepId)}`,
      },
    ]);
  }
}

/** True when `runId` is a valid run id (see {@link RUN_ID_PATTERN}). */
export function isRunId(runId: unknown): runId is string {
  return runIdProblem(runId) === undefined;
}

function runIdProblem(runId: unknown): string | undefined {
  if (typeof runId !== 'string') return `must be a string, got ${typeof runId}`;
  if (runId.length === 0) return 'must not be empty';
  if (runId.length > RUN_ID_MAX_LENGTH) {
    return `must be at most ${RUN_ID_MAX_LENGTH} characters, got ${runId.length}`;
  }
  if (runId.includes('{') || runId.includes('}')) {
    return 'must not contain "{" or "}" (they delimit the Redis Cluster hash tag)';
  }
  return undefined;
}

/** A schedule id checked before it goes into a key (see `STEP_ID_PATTERN`). */
function scheduleKeyId(id: string): string {
  if (typeof id !== 'string' || !STEP_ID_PATTERN.test(id)) {
    throw new InputValidationError('schedule', [
      {
        path: 'id',
        message: `must be 1 to 128 letters, digits, "_", "." or "-", starting with a letter or digit, got ${JSON.stringify(id)}`,
      },
    ]);
  }
  return id;
}

/** Returns the key builders for `prefix`; throws {@link InputValidationError} for an invalid prefix. */
export function createKeys(prefix: string = DEFAULT_KEY_PREFIX): Keys {
  if (typeof prefix !== 'string' || prefix.length === 0) {
    throw new InputValidationError('key prefix', [
      { path: 'prefix', message: 'must not be empty' },
    ]);
  }
  if (prefix.includes('{') || prefix.includes('}')) {
    throw new InputValidationError('key prefix', [
      {
        path: 'prefix',
        message: 'must not contain "{" or "}" (the run id is the Redis Cluster hash tag)',
      },
    ]);
  }
  const runKey = (runId: string, kind: RunKeyKind): string => {
    assertRunId(runId);
    return `${prefix}:{${runId}}:${kind}`;
  };
  // `t:` keeps a tenant's tag apart from a run with the same id (their suffixes differ as well).
  const tenantKey = (tenantId: string, kind: string): string => {
    assertTenantId(tenantId);
    return `${prefix}:{t:${tenantId}}:${kind}`;
  };
  return {
    prefix,
    runKey,
    snap: (runId) => runKey(runId, RunKeyKind.Snap),
    events: (runId) => runKey(runId, RunKeyKind.Events),
    status: (runId) => runKey(runId, RunKeyKind.Status),
    outputs: (runId) => runKey(runId, RunKeyKind.Outputs),
    removed: (runId) => runKey(runId, RunKeyKind.Removed),
    ledger: (runId, tenantId) => {
      const key = runKey(runId, RunKeyKind.Ledger);
      if (tenantId === undefined) return key;
      assertTenantId(tenantId);
      return `${key}:${tenantId}`;
    },
    journal: (runId) => runKey(runId, RunKeyKind.Journal),
    history: (runId, stepId) => {
      const key = runKey(runId, RunKeyKind.History);
      assertStepId(stepId);
      return `${key}:${stepId}`;
    },
    blobs: (runId) => runKey(runId, RunKeyKind.Blobs),
    blob: (runId, blobId) => {
      const key = runKey(runId, RunKeyKind.Blob);
      assertBlobId(blobId);
      return `${key}:${blobId}`;
    },
    meta: (runId) => runKey(runId, RunKeyKind.Meta),
    counters: (runId) => runKey(runId, RunKeyKind.Counters),
    fingerprints: (runId) => runKey(runId, RunKeyKind.Fingerprints),
    started: (runId) => runKey(runId, RunKeyKind.Started),
    replays: (runId) => runKey(runId, RunKeyKind.Replays),
    tenantQuota: (tenantId) => tenantKey(tenantId, 'quota'),
    runUsage: (tenantId, runId) => {
      const key = tenantKey(tenantId, 'usage');
      assertRunId(runId);
      return `${key}:${runId}`;
    },
    reservations: (tenantId) => tenantKey(tenantId, 'reservations'),
    expiringReservations: (tenantId) => tenantKey(tenantId, 'reservations-expiring'),
    runReservations: (tenantId, runId) => {
      const key = tenantKey(tenantId, 'reservations');
      assertRunId(runId);
      return `${key}:${runId}`;
    },
    openReservations: (tenantId, runId) => {
      const key = tenantKey(tenantId, 'open');
      assertRunId(runId);
      return `${key}:${runId}`;
    },
    cacheEntry: (tenantId, hash) => `${tenantKey(tenantId, 'cache')}:${cacheHash(hash)}`,
    cacheDigest: (tenantId, hash) => `${tenantKey(tenantId, 'cache-digest')}:${cacheHash(hash)}`,
    activeRuns: () => `${prefix}:active-runs`,
    endedRuns: () => `{${prefix}:active-runs}:ended`,
    runIndex: () => `{${prefix}:runs}:index`,
    runInfo: () => `{${prefix}:runs}:info`,
    runIndexExpiring: () => `{${prefix}:runs}:expiring`,
    progress: (runId) => runKey(runId, RunKeyKind.Progress),
    inbox: (runId) => runKey(runId, RunKeyKind.Inbox),
    map: (runId, stepId) => {
      assertStepId(stepId);
      return `${runKey(runId, RunKeyKind.Map)}:${stepId}`;
    },
    mapInflight: (runId, stepId) => {
      assertStepId(stepId);
      return `${runKey(runId, RunKeyKind.MapInflight)}:${stepId}`;
    },
    unrouted: (runId) => runKey(runId, RunKeyKind.Unrouted),
    slotWaits: (runId) => runKey(runId, RunKeyKind.SlotWaits),
    slots: (scope, value) => {
      const tag = `{${prefix}:conc:${encodeURIComponent(scope)}:${encodeURIComponent(value)}}`;
      return { holders: `${tag}:holders`, waiters: `${tag}:waiters`, wake: `${tag}:wake` };
    },
    workersLive: () => `{${prefix}:workers}:live`,
    workerBeat: (workerId) => `{${prefix}:workers}:w:${scheduleKeyId(workerId)}`,
    workerQueues: () => `{${prefix}:workers}:queues`,
    requestKey: (tenantId, requestKey) => {
      assertTenantId(tenantId);
      if (typeof requestKey !== 'string' || requestKey.length === 0 || requestKey.length > 512) {
        throw new InputValidationError('request key', [
          { path: 'requestKey', message: 'must be a string of 1 to 512 characters' },
        ]);
      }
      return `${prefix}:request:${tenantId}:${requestKey}`;
    },
    queuePrefix: () => `{${prefix}:q}`,
    rateLimit: (name) => {
      assertRateLimitName(name);
      const tag = `{${prefix}:rate:${name}}`;
      return { log: `${tag}:log`, state: `${tag}:state` };
    },
    scheduleDefs: () => `{${prefix}:schedules}:defs`,
    scheduleState: (id) => `{${prefix}:schedules}:state:${scheduleKeyId(id)}`,
    scheduleFires: (id) => `{${prefix}:schedules}:fires:${scheduleKeyId(id)}`,
    scheduleFireTimes: (id) => `{${prefix}:schedules}:fire-times:${scheduleKeyId(id)}`,
    singletons: (tenantId) => {
      assertTenantId(tenantId);
      return `{${prefix}:singletons:${tenantId}}:held`;
    },
    debounceOpen: (tenantId) => {
      assertTenantId(tenantId);
      return `{${prefix}:debounce:${tenantId}}:open`;
    },
    debounceFiring: (tenantId) => {
      assertTenantId(tenantId);
      return `{${prefix}:debounce:${tenantId}}:firing`;
    },
  };
}
