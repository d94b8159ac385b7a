/**
 * The run snapshot store: a versioned envelope per run in a Redis HASH, written with optimistic
 * compare-and-set, with the run's events appended to its stream (and, for agent turns, messages
 * appended to a list) in the same atomic step. The compare-and-set runs as a Lua script on the
 * caller's connection (see `snapshot-lua.ts` for why not WATCH/MULTI/EXEC).
 *
 * With a codec that has a split layout, the snapshot is several fields of the HASH and a commit
 * writes only the fields that changed since the snapshot the caller read (`CommitOptions.previous`);
 * values the layout keeps apart (step outputs) go to the run's `outputs` HASH in the same script.
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
  type SnapshotDelta,
  type SnapshotEnvelope,
} from './codec.js';
import { createKeys, RunKeyKind } from './keys.js';
import type { LedgerRecordOp } from './ledger.js';
import { classifyRedisError, isConnectionError } from './redis-errors.js';
import type { ReplicaAck } from './replicas.js';
import { SNAPSHOT_SCRIPT_VERSION, SNAPSHOT_SCRIPTS } from './snapshot-lua.js';

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
  /** The client for every read and write (commits are scripts on it). It stays the caller's to close. */
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
   * The clock for `updatedAt`, epoch milliseconds.
   * @defaultValue `Date.now`
   */
  clock?: () => number;
  /**
   * Acknowledges creates and commits by replicas before they return (see `replicas.ts`).
   * @defaultValue none: a write returns once the master applied it
   */
  replicas?: ReplicaAck;
}

/**
 * Values to push onto a list of the same run in the commit, only if the list still has
 * `expectedLength` elements (an append-only log whose length the snapshot tracks).
 */
export interface ListAppend {
  /** The list's key; it must belong to the committing run (same hash tag). */
  key: string;
  expectedLength: number;
  values: readonly string[];
  /** The error to throw when the list's length differs (nothing is written then). */
  conflict?: (actualLength: number) => Error;
}

/** Options of {@link SnapshotStore.load} and {@link SnapshotStore.tryLoad}. */
export interface LoadOptions {
  /**
   * Read the values a split layout keeps outside the snapshot (step outputs) into it. Without
   * them, a load reads only the snapshot's small fields, however much the run produced; the
   * outputs are then read when needed with `readOutputs`.
   * @defaultValue true
   */
  outputs?: boolean;
}

/** Options of {@link SnapshotStore.commit}. */
export interface CommitOptions {
  /** List appends committed with the snapshot, all or nothing. @defaultValue none */
  appends?: readonly ListAppend[];
  /**
   * Receipts of read-only tool calls written to the run's ledger with the snapshot, all or
   * nothing (see `Ledger.recordOp`). @defaultValue none
   */
  ledgerRecords?: readonly LedgerRecordOp[];
  /**
   * A note stored beside the snapshot in the same write (the envelope's `carrier`): who carries
   * the run's next unit of work. @defaultValue the stored note is left as it is
   */
  carrier?: string;
  /**
   * A unit note written in the same write (see the unit notes): the note of the unit that this
   * commit hands to the job that makes it, so that unit's start need not write one.
   * @defaultValue none
   */
  unitNote?: { stepId: string; note: string };
  /**
   * The snapshot stored at the expected version, as the caller read it: with a split layout, only
   * the fields that differ from it are written. @defaultValue unknown: every field is written
   */
  previous?: unknown;
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
  /**
   * The stored version and the `updatedAt` of the commit that wrote it (one small read), or null
   * when the run does not exist: together they tell a state apart from another of the same version
   * (a version can come back with other contents after a failover took commits back).
   */
  stamp(runId: string): Promise<{ version: number; updatedAt: number } | null>;
  /** Loads (and migrates) a run's envelope; throws `RunNotFoundError` when there is none. */
  load(runId: string, options?: LoadOptions): Promise<SnapshotEnvelope<S>>;
  /** Loads (and migrates) a run's envelope, or returns null when there is none. */
  tryLoad(runId: string, options?: LoadOptions): Promise<SnapshotEnvelope<S> | null>;
  /**
   * Writes `nextSnapshot` as version `expectedVersion + 1` and appends `events`, only if the stored
   * version is still `expectedVersion` (and each list of `options.appends` has its expected length);
   * otherwise throws `SnapshotConflictError` (or the append's conflict error) and writes nothing.
   * After a `RedisUnavailableError` the commit may or may not have been applied: reload to know.
   */
  commit(
    runId: string,
    expectedVersion: number,
    nextSnapshot: S,
    events: readonly RunEventRecord[],
    options?: CommitOptions,
  ): Promise<SnapshotEnvelope<S>>;
  /**
   * The values a split layout keeps outside the snapshot (step outputs), parsed, by id; an id
   * with no stored value is left out.
   */
  readOutputs(runId: string, ids: readonly string[]): Promise<Record<string, unknown>>;
  /** One field of the snapshot's HASH as stored (e.g. a split layout's `run` part), or null. */
  field(runId: string, name: string): Promise<string | null>;
  /** Reads a run's events in commit order. */
  readEvents(runId: string, options?: ReadEventsOptions): Promise<StoredRunEvent[]>;
  /** Releases the store (it holds no connection of its own; the caller's `redis` stays open). */
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

/** Creates a Redis-backed {@link SnapshotStore}. */
export function createSnapshotStore<S = unknown>(
  options: SnapshotStoreOptions<S>,
): SnapshotStore<S> {
  const { redis, replicas } = options;
  const keys = createKeys(options.prefix);
  const codec = options.codec ?? createSnapshotCodec<S>();
  const clock = options.clock ?? Date.now;
  const scripts = defineScripts(redis);

  const fail = (error: unknown): never => {
    throw classifyRedisError(error, redis);
  };

  /*
   * create: writes version 0 of a new run (script CREATE).
   *   Reads:         EXISTS snap
   *   Written keys:  snap (HSET v sv u and the snapshot: its parts, or s), outputs (HSET, a split
   *                  layout's outside values), events (XADD * v t d, one per event; a status
   *                  change also to status, its newest kept), meta (HSET, if given), atomically,
   *                  only when snap did not exist
   *   Returns:       the envelope at version 0
   *   Throws:        RunAlreadyExistsError when snap exists (nothing written)
   */
  async function create(
    runId: string,
    snapshot: S,
    events: readonly RunEventRecord[] = [],
    meta: Readonly<Record<string, string>> = {},
  ): Promise<SnapshotEnvelope<S>> {
    const snapKey = keys.snap(runId);
    const envelope: SnapshotEnvelope<S> = {
      schemaVersion: codec.schemaVersion,
      version: 0,
      snapshot,
      updatedAt: clock(),
    };
    const fields = codec.encode(envelope, codec.layout === undefined ? undefined : '');
    const delta: SnapshotDelta =
      codec.layout === undefined
        ? { parts: { s: fields.s }, outputs: {}, dropOutputs: [] }
        : codec.layout.delta(undefined, snapshot);
    const parts = Object.entries(delta.parts).flat();
    const outputs = Object.entries(delta.outputs).flat();
    const encoded = encodeEvents(events);
    const metaFields = Object.entries(meta).flat();
    let created: number;
    try {
      created = await scripts.create(
        snapKey,
        keys.events(runId),
        keys.meta(runId),
        keys.outputs(runId),
        keys.status(runId),
        fields.sv,
        fields.u,
        String(parts.length),
        ...parts,
        String(outputs.length),
        ...outputs,
        String(encoded.length / 2),
        ...encoded,
        String(metaFields.length),
        ...metaFields,
      );
    } catch (error) {
      return fail(scriptError(error, 'create', runId));
    }
    if (created !== 1) throw new RunAlreadyExistsError(runId);
    if (replicas !== undefined) await replicas.ack(snapKey);
    return envelope;
  }

  /*
   * commit: compare-and-set of the envelope plus the event appends and list appends (script COMMIT).
   *   Reads:         HGET snap v (and sv for a partial write); LLEN of each list to append to
   *   Written keys:  snap (HSET v sv u, c when a carrier is given, and the changed parts, or s),
   *                  outputs (HSET new outputs, HDEL cleared ones), the unit note when given
   *                  (HSET started), events (XADD * v t d, one per event; a status change
   *                  also to status, its newest kept), each list (RPUSH), each ledger receipt (HSET, as the ledger's
   *                  record script writes it), atomically, only when the version and every
   *                  length are as expected. A partial write over fields of an older schema
   *                  version is refused by the script and sent again whole.
   *   Returns:       the envelope at version expectedVersion + 1 (its carrier only when given)
   *   Throws:        RunNotFoundError (no snap); SnapshotConflictError (v differs); the append's
   *                  conflict error (a list's length differs); nothing written in each case
   */
  async function commit(
    runId: string,
    expectedVersion: number,
    nextSnapshot: S,
    events: readonly RunEventRecord[],
    commitOptions: CommitOptions = {},
  ): Promise<SnapshotEnvelope<S>> {
    const snapKey = keys.snap(runId);
    const eventsKey = keys.events(runId);
    assertExpectedVersion(expectedVersion);
    const appends = commitOptions.appends ?? [];
    const listKeys = checkAppends(keys.runKey(runId, RunKeyKind.Snap), appends);
    const records = commitOptions.ledgerRecords ?? [];
    checkLedgerRecords(keys.runKey(runId, RunKeyKind.Ledger), records);
    const { carrier, unitNote } = commitOptions;
    if (carrier !== undefined && (typeof carrier !== 'string' || carrier === '')) {
      throw new InputValidationError('commit options', [
        { path: 'carrier', message: 'must be a non-empty string when given' },
      ]);
    }
    const envelope: SnapshotEnvelope<S> = {
      schemaVersion: codec.schemaVersion,
      version: expectedVersion + 1,
      snapshot: nextSnapshot,
      updatedAt: clock(),
      ...(carrier === undefined ? {} : { carrier }),
    };
    const layout = codec.layout;
    const fields = codec.encode(envelope, layout === undefined ? undefined : '');
    const encoded = encodeEvents(events);
    const previous = commitOptions.previous as S | undefined;
    const argsFor = (mode: 'p' | 'f' | 'w', delta: SnapshotDelta): string[] => {
      const parts = Object.entries(delta.parts).flat();
      const outputs = Object.entries(delta.outputs).flat();
      const args: string[] = [
        String(5 + listKeys.length + records.length),
        snapKey,
        eventsKey,
        keys.outputs(runId),
        keys.started(runId),
        keys.status(runId),
        ...listKeys,
        ...records.map((r) => r.key),
        String(expectedVersion),
        fields.v,
        fields.sv,
        fields.u,
        carrier ?? '',
        mode,
        unitNote?.stepId ?? '',
        unitNote?.note ?? '',
        String(parts.length),
        ...parts,
        String(outputs.length),
        ...outputs,
        String(delta.dropOutputs.length),
        ...delta.dropOutputs,
        String(encoded.length / 2),
        ...encoded,
        String(records.length),
        ...records.flatMap((r) => [r.callId, r.entry, r.tool, r.argsHash]),
      ];
      for (const a of appends) {
        args.push(String(a.expectedLength), String(a.values.length), ...a.values);
      }
      return args;
    };
    let reply: CommitReply;
    try {
      if (layout === undefined) {
        reply = await scripts.commit(
          ...argsFor('w', { parts: { s: fields.s }, outputs: {}, dropOutputs: [] }),
        );
      } else {
        const partial = previous !== undefined;
        reply = await scripts.commit(
          ...argsFor(partial ? 'p' : 'f', layout.delta(previous, nextSnapshot)),
        );
        // Stored in an older schema version's fields: written whole this once.
        if (reply[0] === 3) {
          reply = await scripts.commit(...argsFor('f', layout.delta(undefined, nextSnapshot)));
        }
      }
    } catch (error) {
      return fail(scriptError(error, 'commit', runId));
    }
    switch (reply[0]) {
      case 1:
        if (replicas !== undefined) await replicas.ack(snapKey);
        return envelope;
      case 0:
        throw new SnapshotConflictError(
          runId,
          expectedVersion,
          parseStoredVersion(runId, String(reply[1])),
        );
      case -1:
        throw new RunNotFoundError(runId);
      case 2: {
        const append = appends[Number(reply[1])] as ListAppend;
        const actual = Number(reply[2]);
        throw (
          append.conflict?.(actual) ??
          new InvariantError(
            `list ${append.key} of run "${runId}" has ${actual} elements, expected ${append.expectedLength}; nothing was committed`,
          )
        );
      }
      default:
        throw new InvariantError(
          `the commit script of run "${runId}" replied ${JSON.stringify(reply)}`,
        );
    }
  }

  async function tryLoad(
    runId: string,
    loadOptions: LoadOptions = {},
  ): Promise<SnapshotEnvelope<S> | null> {
    const snapKey = keys.snap(runId);
    let fields: Record<string, string>;
    let outputs: Record<string, string> = {};
    try {
      if (codec.layout === undefined || loadOptions.outputs === false) {
        fields = await redis.hgetall(snapKey);
      } else {
        // In this order in one round trip: an output is written with (or before) the snapshot
        // field that names it, and never changed after, so every output the fields need is read.
        const replies = await redis.pipeline().hgetall(snapKey).hgetall(keys.outputs(runId)).exec();
        if (replies === null) throw new Error('a Redis pipeline was discarded');
        const [[e1, f], [e2, o]] = replies as [[Error | null, unknown], [Error | null, unknown]];
        if (e1 !== null) throw e1;
        if (e2 !== null) throw e2;
        fields = f as Record<string, string>;
        outputs = o as Record<string, string>;
      }
    } catch (error) {
      return fail(error);
    }
    return Object.keys(fields).length === 0 ? null : codec.decode(runId, fields, outputs);
  }

  async function readOutputs(
    runId: string,
    ids: readonly string[],
  ): Promise<Record<string, unknown>> {
    const out: Record<string, unknown> = {};
    if (ids.length === 0) return out;
    let values: (string | null)[];
    try {
      values = await redis.hmget(keys.outputs(runId), ...ids);
    } catch (error) {
      return fail(error);
    }
    ids.forEach((id, i) => {
      const text = values[i];
      if (text === null || text === undefined) return;
      try {
        out[id] = JSON.parse(text);
      } catch (cause) {
        throw new SnapshotCorruptError(runId, `the stored output of step "${id}" is not JSON`, {
          cause,
        });
      }
    });
    return out;
  }

  async function field(runId: string, name: string): Promise<string | null> {
    try {
      return await redis.hget(keys.snap(runId), name);
    } catch (error) {
      return fail(error);
    }
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

  async function stamp(runId: string): Promise<{ version: number; updatedAt: number } | null> {
    let raw: (string | null)[];
    try {
      raw = await redis.hmget(keys.snap(runId), 'v', 'u');
    } catch (error) {
      return fail(error);
    }
    const [v, u] = raw;
    if (v === null || v === undefined) return null;
    return { version: parseStoredVersion(runId, v), updatedAt: Number(u ?? 0) };
  }

  async function loadMeta(runId: string): Promise<Record<string, string>> {
    try {
      return await redis.hgetall(keys.meta(runId));
    } catch (error) {
      return fail(error);
    }
  }

  async function load(runId: string, loadOptions?: LoadOptions): Promise<SnapshotEnvelope<S>> {
    const envelope = await tryLoad(runId, loadOptions);
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
    stamp,
    load,
    tryLoad,
    commit,
    readOutputs,
    field,
    readEvents,
    close: () => Promise.resolve(),
  };
}

/**
 * `{1}` written, `{0, v}` version differs, `{-1}` no run, `{2, index, length}` a list differs,
 * `{3}` the stored fields are of another schema version.
 */
type CommitReply = [status: number, detail?: string | number, length?: number];
type Script<R> = (...args: string[]) => Promise<R>;

/** Registers the scripts on `redis` (once per client) and returns callers for them. */
function defineScripts(redis: Redis): { create: Script<number>; commit: Script<CommitReply> } {
  const create = `flujoSnapshot_create_v${SNAPSHOT_SCRIPT_VERSION}`;
  const commit = `flujoSnapshot_commit_v${SNAPSHOT_SCRIPT_VERSION}`;
  const commands = redis as unknown as Record<string, Script<never> | undefined>;
  // ioredis runs EVALSHA and falls back to EVAL after a NOSCRIPT (e.g. a restarted server).
  if (commands[create] === undefined) {
    redis.defineCommand(create, { numberOfKeys: 5, lua: SNAPSHOT_SCRIPTS.create });
  }
  if (commands[commit] === undefined) {
    // The number of keys varies with the list appends: it is the first argument of each call.
    redis.defineCommand(commit, { lua: SNAPSHOT_SCRIPTS.commit });
  }
  return {
    create: (...args) => (commands[create] as Script<number>).apply(redis, args),
    commit: (...args) => (commands[commit] as Script<CommitReply>).apply(redis, args),
  };
}

/**
 * A script failure that is not about the connection is a bug or a key of the wrong type. Redis
 * keeps the writes a script made before it failed, so the message says the commit may be partial.
 */
function scriptError(error: unknown, script: string, runId: string): unknown {
  if (isConnectionError(error)) return error;
  const message = error instanceof Error ? error.message : String(error);
  return new InvariantError(
    `the ${script} script of run "${runId}" failed inside Redis and may have been partially applied: ${message}`,
    { cause: error },
  );
}

/** Checks ledger receipts before any I/O: each in the run's ledger (its slot), fields set. */
function checkLedgerRecords(ledgerKey: string, records: readonly LedgerRecordOp[]): void {
  const given: unknown = records;
  if (!Array.isArray(given)) {
    throw new InputValidationError('commit options', [
      { path: 'ledgerRecords', message: 'must be an array' },
    ]);
  }
  records.forEach((r, i) => {
    if (typeof r.key !== 'string' || (r.key !== ledgerKey && !r.key.startsWith(`${ledgerKey}:`))) {
      throw new InputValidationError('commit options', [
        {
          path: `ledgerRecords[${i}].key`,
          message: `must be the run's ledger (${ledgerKey}, or it with a tenant after a colon), got ${JSON.stringify(r.key)}`,
        },
      ]);
    }
    for (const field of ['callId', 'entry', 'tool', 'argsHash'] as const) {
      if (typeof r[field] !== 'string' || r[field] === '') {
        throw new InputValidationError('commit options', [
          { path: `ledgerRecords[${i}].${field}`, message: 'must be a non-empty string' },
        ]);
      }
    }
  });
}

/** Checks list appends before any I/O and returns their keys. */
function checkAppends(snapKey: string, appends: readonly ListAppend[]): string[] {
  const given: unknown = appends;
  if (!Array.isArray(given)) {
    throw new InputValidationError('commit options', [
      { path: 'appends', message: 'must be an array' },
    ]);
  }
  // Every key of one commit shares the run's hash tag, so the script stays in one Cluster slot.
  const runPrefix = snapKey.slice(0, snapKey.lastIndexOf(':') + 1);
  return appends.map((a, i) => {
    if (typeof a.key !== 'string' || !a.key.startsWith(runPrefix)) {
      throw new InputValidationError('commit options', [
        {
          path: `appends[${i}].key`,
          message: `must be a key of the same run (starting "${runPrefix}")`,
        },
      ]);
    }
    if (!Number.isSafeInteger(a.expectedLength) || a.expectedLength < 0) {
      throw new InputValidationError('commit options', [
        {
          path: `appends[${i}].expectedLength`,
          message: `must be an integer ≥ 0, got ${a.expectedLength}`,
        },
      ]);
    }
    if (!Array.isArray(a.values) || a.values.some((v: unknown) => typeof v !== 'string')) {
      throw new InputValidationError('commit options', [
        { path: `appends[${i}].values`, message: 'must be an array of strings' },
      ]);
    }
    return a.key;
  });
}

/** A raw entry of a run's event stream (its id, its flat field list) as a {@link StoredRunEvent}. */
export function decodeEvent(runId: string, id: string, flat: readonly string[]): StoredRunEvent {
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
