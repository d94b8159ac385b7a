/**
 * The run snapshot store: a versioned envelope per run in a Redis HASH, written with optimistic
 * compare-and-set (WATCH/MULTI/EXEC on a dedicated connection), with the run's events appended to
 * its stream in the same transaction.
 */
import type { Redis } from 'ioredis';
import {
  InputValidationError,
  InvariantError,
  RunAlreadyExistsError,
  RunNotFoundError,
  SnapshotConflictError,
  SnapshotCorruptError,
} from '../errors.js';
import {
  createSnapshotCodec,
  toJson,
  type SnapshotCodec,
  type SnapshotEnvelope,
  type SnapshotFields,
} from './codec.js';
import { ConnectionPool } from './connection-pool.js';
import { createKeys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';

/** An event recorded in a run's stream: any JSON object with a string `type`. */
export interface RunEventRecord {
  readonly type: string;
  readonly [field: string]: unknown;
}

/** An event read back from a run's stream. */
export interface StoredRunEvent {
  /** The stream entry id (`<ms>-<seq>`); pass it as `after` to read on. */
  id: string;
  /** The snapshot version the commit that wrote this event produced. */
  version: number;
  /** The event's `type`. */
  type: string;
  /** The whole event as it was committed. */
  data: RunEventRecord;
}

/** Options of {@link SnapshotStore.readEvents}. */
export interface ReadEventsOptions {
  /**
   * Read entries after this stream id (exclusive).
   * @defaultValue from the start of the stream
   */
  after?: string;
  /**
   * Read at most this many entries.
   * @defaultValue all
   */
  count?: number;
}

/** Options of {@link createSnapshotStore}. */
export interface SnapshotStoreOptions<S = unknown> {
  /** The client for reads; commits use connections duplicated from it. It stays the caller's to close. */
  redis: Redis;
  /**
   * The key prefix (see `createKeys`).
   * @defaultValue `'flujo'`
   */
  prefix?: string;
  /**
   * Encodes, decodes and migrates envelopes.
   * @defaultValue `createSnapshotCodec()` (schema version 1, no migrations)
   */
  codec?: SnapshotCodec<S>;
  /**
   * How many dedicated connections transactions may use at once (WATCH is per connection).
   * @defaultValue 4
   */
  poolSize?: number;
  /**
   * The clock for `updatedAt`, epoch milliseconds.
   * @defaultValue `Date.now`
   */
  clock?: () => number;
}

/** Persists run snapshots with compare-and-set and appends run events atomically with them. */
export interface SnapshotStore<S = unknown> {
  /**
   * Creates a run at version 0; throws `RunAlreadyExistsError` if the run id is taken. `meta`
   * (string fields: what the run was started with) is written in the same transaction.
   */
  create(
    runId: string,
    snapshot: S,
    events?: readonly RunEventRecord[],
    meta?: Readonly<Record<string, string>>,
  ): Promise<SnapshotEnvelope<S>>;
  /** The meta fields written at creation (empty when the run has none or does not exist). */
  loadMeta(runId: string): Promise<Record<string, string>>;
  /** The stored version alone (one small read), or null when the run does not exist. */
  version(runId: string): Promise<number | null>;
  /** Loads (and migrates) a run's envelope; throws `RunNotFoundError` when there is none. */
  load(runId: string): Promise<SnapshotEnvelope<S>>;
  /** Loads (and migrates) a run's envelope, or returns null when there is none. */
  tryLoad(runId: string): Promise<SnapshotEnvelope<S> | null>;
  /**
   * Writes `nextSnapshot` as version `expectedVersion + 1` and appends `events`, only if the stored
   * version is still `expectedVersion`; otherwise throws `SnapshotConflictError` and writes nothing.
   * After a `RedisUnavailableError` the commit may or may not have been applied: reload to know.
   */
  commit(
    runId: string,
    expectedVersion: number,
    nextSnapshot: S,
    events: readonly RunEventRecord[],
  ): Promise<SnapshotEnvelope<S>>;
  /** Reads a run's events in commit order. */
  readEvents(runId: string, options?: ReadEventsOptions): Promise<StoredRunEvent[]>;
  /** Closes the store's dedicated connections (not the caller's `redis`). */
  close(): Promise<void>;
}

const STREAM_ID = /^[0-9]+-[0-9]+$/;

function assertExpectedVersion(expectedVersion: number): void {
  if (!Number.isSafeInteger(expectedVersion) || expectedVersion < 0) {
    throw new InputValidationError('expected version', [
      { path: 'expectedVersion', message: `must be an integer ≥ 0, got ${expectedVersion}` },
    ]);
  }
}

/** `[type, json]` per event, validated before any I/O. */
function encodeEvents(events: readonly RunEventRecord[]): string[] {
  if (!Array.isArray(events)) {
    throw new InputValidationError('run events', [{ path: 'events', message: 'must be an array' }]);
  }
  const out = new Array<string>(events.length * 2);
  for (let i = 0; i < events.length; i++) {
    const event = events[i] as RunEventRecord;
    if (typeof event !== 'object' || event === null || Array.isArray(event)) {
      throw new InputValidationError('run event', [
        { path: `events[${i}]`, message: 'must be a JSON object with a string "type"' },
      ]);
    }
    if (typeof event.type !== 'string' || event.type === '') {
      throw new InputValidationError('run event', [
        { path: `events[${i}].type`, message: 'must be a non-empty string' },
      ]);
    }
    out[2 * i] = event.type;
    let json: string | undefined;
    try {
      json = JSON.stringify(event);
    } catch {
      // toJson below repeats the failure with a message that names the event
    }
    out[2 * i + 1] = json ?? toJson(event, `run event events[${i}]`);
  }
  return out;
}

function parseStoredVersion(runId: string, raw: string): number {
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new SnapshotCorruptError(runId, `field "v" (version) is not a non-negative integer`);
  }
  return n;
}

/** Throws if any `[err, value]` tuple of an EXEC reply carries an error. */
function checkExecReplies(
  runId: string,
  replies: [error: Error | null, result: unknown][],
  expected: number,
): void {
  if (replies.length !== expected) {
    throw new InvariantError(
      `EXEC of the commit of run "${runId}" returned ${replies.length} replies, expected ${expected}`,
    );
  }
  for (let i = 0; i < replies.length; i++) {
    const err = (replies[i] as [Error | null, unknown])[0];
    if (err !== null) {
      // Redis does not roll back: earlier commands of the transaction were applied.
      throw new InvariantError(
        `command ${i} (${i === 0 ? 'HSET snap' : 'XADD events'}) of the commit of run "${runId}" failed inside EXEC, the transaction was partially applied: ${err.message}`,
        { cause: err },
      );
    }
  }
}

/** Creates a Redis-backed {@link SnapshotStore}. */
export function createSnapshotStore<S = unknown>(
  options: SnapshotStoreOptions<S>,
): SnapshotStore<S> {
  const { redis } = options;
  const keys = createKeys(options.prefix);
  const codec = options.codec ?? createSnapshotCodec<S>();
  const clock = options.clock ?? Date.now;
  const poolSize = options.poolSize ?? 4;
  if (!Number.isSafeInteger(poolSize) || poolSize < 1) {
    throw new InputValidationError('snapshot store options', [
      { path: 'poolSize', message: `must be an integer ≥ 1, got ${poolSize}` },
    ]);
  }
  const pool = new ConnectionPool(redis, poolSize);

  const fail = (error: unknown, conn?: Redis): never => {
    throw conn === undefined
      ? classifyRedisError(error, redis)
      : classifyRedisError(error, conn, pool.lastError(conn));
  };

  /*
   * create: writes version 0 of a new run.
   *   Watched keys:  snap
   *   Reads:         EXISTS snap (sent with WATCH, one round trip)
   *   Written keys:  snap (HSET v sv s u), events (XADD * v t d, one per event), meta (HSET, if
   *                  given), in one MULTI/EXEC
   *   Returns:       the envelope at version 0
   *   Throws:        RunAlreadyExistsError when snap exists, or when EXEC aborts (only another
   *                  create can write a snap key that does not exist)
   */
  async function create(
    runId: string,
    snapshot: S,
    events: readonly RunEventRecord[] = [],
    meta: Readonly<Record<string, string>> = {},
  ): Promise<SnapshotEnvelope<S>> {
    const snapKey = keys.snap(runId);
    const eventsKey = keys.events(runId);
    const envelope: SnapshotEnvelope<S> = {
      schemaVersion: codec.schemaVersion,
      version: 0,
      snapshot,
      updatedAt: clock(),
    };
    const fields = codec.encode(envelope);
    const encoded = encodeEvents(events);
    const conn = pool.tryAcquire() ?? (await pool.acquire());
    let exists: number;
    try {
      exists = (await Promise.all([conn.watch(snapKey), conn.exists(snapKey)]))[1];
    } catch (error) {
      pool.discard(conn);
      return fail(error, conn);
    }
    if (exists !== 0) {
      pool.releaseAfter(conn, conn.unwatch());
      throw new RunAlreadyExistsError(runId);
    }
    let replies: [Error | null, unknown][] | null;
    const metaFields = Object.entries(meta).flat();
    try {
      const tx = transaction(conn, snapKey, eventsKey, fields, encoded);
      if (metaFields.length > 0) tx.hset(keys.meta(runId), ...metaFields);
      replies = await tx.exec();
    } catch (error) {
      pool.discard(conn);
      return fail(error, conn);
    }
    pool.release(conn);
    if (replies === null) throw new RunAlreadyExistsError(runId);
    checkExecReplies(runId, replies, 1 + encoded.length / 2 + (metaFields.length > 0 ? 1 : 0));
    return envelope;
  }

  /*
   * commit: compare-and-set of the snapshot plus the event appends, all or nothing.
   *   Watched keys:  snap
   *   Reads:         HGET snap v (sent with WATCH, one round trip)
   *   Written keys:  snap (HSET v sv s u), events (XADD * v t d, one per event), in one MULTI/EXEC
   *   Returns:       the envelope at version expectedVersion + 1
   *   Throws:        RunNotFoundError when snap is missing; SnapshotConflictError when v differs
   *                  from expectedVersion or EXEC aborts (a concurrent write touched snap)
   */
  async function commit(
    runId: string,
    expectedVersion: number,
    nextSnapshot: S,
    events: readonly RunEventRecord[],
  ): Promise<SnapshotEnvelope<S>> {
    const snapKey = keys.snap(runId);
    const eventsKey = keys.events(runId);
    assertExpectedVersion(expectedVersion);
    const envelope: SnapshotEnvelope<S> = {
      schemaVersion: codec.schemaVersion,
      version: expectedVersion + 1,
      snapshot: nextSnapshot,
      updatedAt: clock(),
    };
    const fields = codec.encode(envelope);
    const encoded = encodeEvents(events);
    const conn = pool.tryAcquire() ?? (await pool.acquire());
    let stored: string | null;
    try {
      stored = (await Promise.all([conn.watch(snapKey), conn.hget(snapKey, 'v')]))[1];
    } catch (error) {
      pool.discard(conn);
      return fail(error, conn);
    }
    if (stored !== String(expectedVersion)) {
      pool.releaseAfter(conn, conn.unwatch());
      if (stored === null) throw new RunNotFoundError(runId);
      throw new SnapshotConflictError(runId, expectedVersion, parseStoredVersion(runId, stored));
    }
    let replies: [Error | null, unknown][] | null;
    try {
      replies = await transaction(conn, snapKey, eventsKey, fields, encoded).exec();
    } catch (error) {
      pool.discard(conn);
      return fail(error, conn);
    }
    if (replies === null) {
      // EXEC cleared the WATCH: the connection is clean again.
      let actual: string | null;
      try {
        actual = await conn.hget(snapKey, 'v');
      } catch (error) {
        pool.discard(conn);
        return fail(error, conn);
      }
      pool.release(conn);
      if (actual === null) throw new RunNotFoundError(runId);
      throw new SnapshotConflictError(runId, expectedVersion, parseStoredVersion(runId, actual));
    }
    pool.release(conn);
    checkExecReplies(runId, replies, 1 + encoded.length / 2);
    return envelope;
  }

  async function tryLoad(runId: string): Promise<SnapshotEnvelope<S> | null> {
    const snapKey = keys.snap(runId);
    let fields: Record<string, string>;
    try {
      fields = await redis.hgetall(snapKey);
    } catch (error) {
      return fail(error);
    }
    return Object.keys(fields).length === 0 ? null : codec.decode(runId, fields);
  }

  async function version(runId: string): Promise<number | null> {
    let raw: string | null;
    try {
      raw = await redis.hget(keys.snap(runId), 'v');
    } catch (error) {
      return fail(error);
    }
    return raw === null ? null : parseStoredVersion(runId, raw);
  }

  async function loadMeta(runId: string): Promise<Record<string, string>> {
    try {
      return await redis.hgetall(keys.meta(runId));
    } catch (error) {
      return fail(error);
    }
  }

  async function load(runId: string): Promise<SnapshotEnvelope<S>> {
    const envelope = await tryLoad(runId);
    if (envelope === null) throw new RunNotFoundError(runId);
    return envelope;
  }

  async function readEvents(
    runId: string,
    readOptions: ReadEventsOptions = {},
  ): Promise<StoredRunEvent[]> {
    const eventsKey = keys.events(runId);
    const { after, count } = readOptions;
    if (after !== undefined && !STREAM_ID.test(after)) {
      throw new InputValidationError('read options', [
        { path: 'after', message: `must be a stream id like "1700000000000-0", got "${after}"` },
      ]);
    }
    if (count !== undefined && (!Number.isSafeInteger(count) || count < 1)) {
      throw new InputValidationError('read options', [
        { path: 'count', message: `must be an integer ≥ 1, got ${count}` },
      ]);
    }
    const start = after === undefined ? '-' : `(${after}`;
    let entries: [id: string, fields: string[]][];
    try {
      entries =
        count === undefined
          ? await redis.xrange(eventsKey, start, '+')
          : await redis.xrange(eventsKey, start, '+', 'COUNT', count);
    } catch (error) {
      return fail(error);
    }
    return entries.map(([id, flat]) => decodeEvent(runId, id, flat));
  }

  return {
    create,
    loadMeta,
    version,
    load,
    tryLoad,
    commit,
    readEvents,
    close: () => pool.close(),
  };
}

/** The MULTI of a commit: HSET the envelope, then one XADD per encoded event. */
function transaction(
  conn: Redis,
  snapKey: string,
  eventsKey: string,
  fields: SnapshotFields,
  encodedEvents: readonly string[],
): ReturnType<Redis['multi']> {
  const tx = conn
    .multi()
    .hset(snapKey, 'v', fields.v, 'sv', fields.sv, 's', fields.s, 'u', fields.u);
  for (let i = 0; i < encodedEvents.length; i += 2) {
    tx.xadd(
      eventsKey,
      '*',
      'v',
      fields.v,
      't',
      encodedEvents[i] as string,
      'd',
      encodedEvents[i + 1] as string,
    );
  }
  return tx;
}

function decodeEvent(runId: string, id: string, flat: readonly string[]): StoredRunEvent {
  let v: string | undefined;
  let t: string | undefined;
  let d: string | undefined;
  for (let i = 0; i + 1 < flat.length; i += 2) {
    const name = flat[i];
    const value = flat[i + 1];
    if (name === 'v') v = value;
    else if (name === 't') t = value;
    else if (name === 'd') d = value;
  }
  if (v === undefined || t === undefined || d === undefined) {
    throw new SnapshotCorruptError(runId, `event ${id} lacks one of the fields v, t, d`);
  }
  let data: unknown;
  try {
    data = JSON.parse(d);
  } catch (cause) {
    throw new SnapshotCorruptError(runId, `event ${id} is not JSON`, { cause });
  }
  const version = Number(v);
  if (!Number.isSafeInteger(version)) {
    throw new SnapshotCorruptError(runId, `event ${id} has a non-integer version "${v}"`);
  }
  return { id, version, type: t, data: data as RunEventRecord };
}
