/**
 * The versioned snapshot envelope and its ordered migrations. Pure: no I/O. The snapshot itself is
 * opaque JSON here; the machines layer owns its shape (and may pass `parse` to check it on read).
 */
import {
  InputValidationError,
  InvariantError,
  SnapshotCorruptError,
  SnapshotUnsupportedError,
} from '../errors.js';

/** A run snapshot as persisted: the snapshot plus the CAS counter and its schema version. */
export interface SnapshotEnvelope<S = unknown> {
  /** The shape version of `snapshot`. */
  schemaVersion: number;
  /** The compare-and-set counter: 0 after create, +1 per commit. */
  version: number;
  /** The machine snapshot (plain JSON). */
  snapshot: S;
  /** When this version was written, epoch milliseconds. */
  updatedAt: number;
  /**
   * The driver's note on who carries the run's next unit of work (see the worker's chained
   * units), as the last commit that set one left it; opaque here. Absent when none was ever set.
   */
  carrier?: string;
  /**
   * Steps that succeeded and whose outputs this in-memory snapshot does not hold (it was loaded
   * without them): their output reads as null here whatever they produced. Set by a holder that
   * knows; absent, any succeeded step's null output may stand for one not loaded.
   */
  outputsMissing?: ReadonlySet<string>;
}

/**
 * The fields of the envelope's Redis HASH: `v` version, `sv` schemaVersion, `s` snapshot JSON,
 * `u` updatedAt, and `c` the carrier note when one was set.
 */
export interface SnapshotFields {
  v: string;
  sv: string;
  s: string;
  u: string;
  c?: string;
}

/** What a commit writes in a split layout (see {@link SnapshotLayout}). */
export interface SnapshotDelta {
  /** Fields of the snapshot's HASH to set, field → JSON (never `v`, `sv`, `s`, `u` or `c`). */
  parts: Record<string, string>;
  /** Values stored once outside the snapshot (step outputs), id → JSON. */
  outputs: Record<string, string>;
  /** Ids of stored outside values to remove. */
  dropOutputs: string[];
}

/**
 * A snapshot stored as several fields of its HASH, plus values kept outside it (a HASH of their
 * own), so that a commit writes only the fields that changed. Envelopes of older schema versions
 * (one `s` field) are still read, through the migrations.
 */
export interface SnapshotLayout<S> {
  /** What to write to go from `previous` (undefined: nothing known, write everything) to `next`. */
  delta(previous: S | undefined, next: S): SnapshotDelta;
  /** The stored form (as `parse` takes it) the fields and the outside values stand for. */
  join(
    fields: Readonly<Record<string, string>>,
    outside: Readonly<Record<string, string>>,
  ): unknown;
}

/** The envelope's own fields of the snapshot HASH; every other field is a part of a split layout. */
export const ENVELOPE_FIELDS: ReadonlySet<string> = new Set(['v', 'sv', 's', 'u', 'c']);

/** One step of the snapshot schema: turns a snapshot of schema `from` into one of schema `to` (= from + 1). */
export interface SnapshotMigration {
  /** The schema version this migration reads. */
  readonly from: number;
  /** The schema version it produces; always `from + 1`. */
  readonly to: number;
  /** Returns the upgraded snapshot. Must be pure; may mutate and return its argument. */
  migrate(snapshot: unknown): unknown;
}

/** Options of {@link createSnapshotCodec}. */
export interface SnapshotCodecOptions<S = unknown> {
  /**
   * The schema version this build writes.
   * @defaultValue 1
   */
  schemaVersion?: number;
  /**
   * The chain `n → n+1 → … → schemaVersion`, in any order; older envelopes are upgraded on read.
   * @defaultValue []
   */
  migrations?: readonly SnapshotMigration[];
  /**
   * Checks (and may narrow) a decoded, migrated snapshot; a throw marks the snapshot corrupt.
   * With `deflate`, it also turns the stored form back into the snapshot.
   * @defaultValue the identity (the snapshot is trusted as `S`)
   */
  parse?: (snapshot: unknown) => S;
  /**
   * Turns a snapshot into the form that is stored (the inverse of `parse`), e.g. without what can
   * be rebuilt.
   * @defaultValue the identity
   */
  deflate?: (snapshot: S) => unknown;
  /**
   * Stores the snapshot of this schema version split over several fields (see
   * {@link SnapshotLayout}); `parse` then takes what `join` returns.
   * @defaultValue one field `s` with the whole (deflated) snapshot
   */
  layout?: SnapshotLayout<S>;
}

/** Encodes and decodes snapshot envelopes of one schema version. */
export interface SnapshotCodec<S = unknown> {
  /** The schema version this codec writes. */
  readonly schemaVersion: number;
  /** The oldest schema version it can read (the start of the migration chain). */
  readonly oldestSchemaVersion: number;
  /** Serializes a snapshot to JSON; throws {@link InputValidationError} when it is not JSON. */
  encodeSnapshot(snapshot: S): string;
  /** The HASH fields of an envelope; `snapshotJson` skips re-serializing an already encoded snapshot. */
  encode(envelope: SnapshotEnvelope<S>, snapshotJson?: string): SnapshotFields;
  /** The split layout of the current schema version, if it has one. */
  readonly layout: SnapshotLayout<S> | undefined;
  /**
   * Decodes HASH fields into an envelope of the current schema, applying migrations in order;
   * `outside` holds the values a split layout keeps outside the snapshot.
   */
  decode(
    runId: string,
    fields: Readonly<Partial<SnapshotFields>> | Readonly<Record<string, string>>,
    outside?: Readonly<Record<string, string>>,
  ): SnapshotEnvelope<S>;
}

const NON_NEGATIVE_INT = /^(0|[1-9][0-9]*)$/;

function validateChain(schemaVersion: number, migrations: readonly SnapshotMigration[]): number {
  if (!Number.isSafeInteger(schemaVersion) || schemaVersion < 1) {
    throw new InvariantError(`snapshot schemaVersion must be an integer ≥ 1, got ${schemaVersion}`);
  }
  if (migrations.length === 0) return schemaVersion;
  const sorted = [...migrations].sort((a, b) => a.from - b.from);
  for (const m of sorted) {
    if (!Number.isSafeInteger(m.from) || m.from < 1 || m.to !== m.from + 1) {
      throw new InvariantError(
        `snapshot migration ${m.from} → ${m.to} must go from an integer n ≥ 1 to n + 1`,
      );
    }
  }
  for (let i = 1; i < sorted.length; i++) {
    const prev = sorted[i - 1] as SnapshotMigration;
    const cur = sorted[i] as SnapshotMigration;
    if (cur.from === prev.from) {
      throw new InvariantError(`duplicate snapshot migration from schema version ${cur.from}`);
    }
    if (cur.from !== prev.to) {
      throw new InvariantError(
        `gap in snapshot migrations: nothing migrates schema version ${prev.to} to ${prev.to + 1}`,
      );
    }
  }
  const last = sorted[sorted.length - 1] as SnapshotMigration;
  if (last.to !== schemaVersion) {
    throw new InvariantError(
      `snapshot migrations end at schema version ${last.to}, but the current schema version is ${schemaVersion}`,
    );
  }
  return (sorted[0] as SnapshotMigration).from;
}

/** Serializes a value to JSON; throws {@link InputValidationError} about `what` when it is not JSON. */
export function toJson(value: unknown, what: string): string {
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch (cause) {
    const reason = cause instanceof Error ? cause.message : String(cause);
    throw new InputValidationError(what, [{ path: '', message: `is not JSON: ${reason}` }], {
      cause,
    });
  }
  if (json === undefined) {
    throw new InputValidationError(what, [
      { path: '', message: `is not JSON (got ${typeof value})` },
    ]);
  }
  return json;
}

function intField(
  runId: string,
  fields: Readonly<Partial<SnapshotFields>>,
  name: keyof SnapshotFields,
  label: string,
): number {
  const raw = fields[name];
  if (raw === undefined)
    throw new SnapshotCorruptError(runId, `field "${name}" (${label}) is missing`);
  if (!NON_NEGATIVE_INT.test(raw)) {
    throw new SnapshotCorruptError(
      runId,
      `field "${name}" (${label}) is not a non-negative integer: ${JSON.stringify(raw.slice(0, 40))}`,
    );
  }
  const n = Number(raw);
  if (!Number.isSafeInteger(n)) {
    throw new SnapshotCorruptError(runId, `field "${name}" (${label}) is out of range`);
  }
  return n;
}

/** Creates a codec for `schemaVersion`; throws {@link InvariantError} when the migration chain has gaps or duplicates. */
export function createSnapshotCodec<S = unknown>(
  options: SnapshotCodecOptions<S> = {},
): SnapshotCodec<S> {
  const schemaVersion = options.schemaVersion ?? 1;
  const byFrom = new Map<number, SnapshotMigration>();
  for (const m of options.migrations ?? []) byFrom.set(m.from, m);
  const oldestSchemaVersion = validateChain(schemaVersion, options.migrations ?? []);
  const parse = options.parse;

  const deflate = options.deflate;
  const encodeSnapshot = (snapshot: S): string =>
    toJson(deflate === undefined ? snapshot : deflate(snapshot), 'snapshot');

  const layout = options.layout;
  return {
    schemaVersion,
    oldestSchemaVersion,
    layout,
    encodeSnapshot,
    encode(envelope, snapshotJson) {
      return {
        v: String(envelope.version),
        sv: String(envelope.schemaVersion),
        s: snapshotJson ?? encodeSnapshot(envelope.snapshot),
        u: String(envelope.updatedAt),
        ...(envelope.carrier === undefined ? {} : { c: envelope.carrier }),
      };
    },
    decode(runId, fields, outside = {}) {
      const version = intField(runId, fields, 'v', 'version');
      const storedSchema = intField(runId, fields, 'sv', 'schemaVersion');
      const updatedAt = intField(runId, fields, 'u', 'updatedAt');
      if (storedSchema > schemaVersion) {
        throw new SnapshotUnsupportedError(runId, storedSchema, schemaVersion);
      }
      if (storedSchema < oldestSchemaVersion) {
        throw new SnapshotCorruptError(
          runId,
          `schema version ${storedSchema} predates the oldest migration of this release (from ${oldestSchemaVersion}); upgrade it with an older release first`,
        );
      }
      const raw = fields.s;
      let snapshot: unknown;
      if (raw === undefined && layout !== undefined && storedSchema === schemaVersion) {
        try {
          snapshot = layout.join(fields, outside);
        } catch (cause) {
          const reason = cause instanceof Error ? cause.message : String(cause);
          throw new SnapshotCorruptError(runId, `snapshot fields do not fit together: ${reason}`, {
            cause,
          });
        }
      } else if (raw === undefined) {
        throw new SnapshotCorruptError(runId, 'field "s" (snapshot) is missing');
      } else {
        try {
          snapshot = JSON.parse(raw);
        } catch (cause) {
          const reason = cause instanceof Error ? cause.message : String(cause);
          throw new SnapshotCorruptError(runId, `snapshot is not JSON (${reason})`, { cause });
        }
      }
      for (let from = storedSchema; from < schemaVersion; from++) {
        const m = byFrom.get(from) as SnapshotMigration;
        try {
          snapshot = m.migrate(snapshot);
        } catch (cause) {
          const reason = cause instanceof Error ? cause.message : String(cause);
          throw new SnapshotCorruptError(
            runId,
            `migration of the snapshot from schema version ${m.from} to ${m.to} failed: ${reason}`,
            { cause },
          );
        }
      }
      let parsed: S;
      if (parse === undefined) {
        parsed = snapshot as S;
      } else {
        try {
          parsed = parse(snapshot);
        } catch (cause) {
          const reason = cause instanceof Error ? cause.message : String(cause);
          throw new SnapshotCorruptError(runId, `snapshot has the wrong shape: ${reason}`, {
            cause,
          });
        }
      }
      const carrier = fields.c;
      return carrier === undefined || carrier === ''
        ? { schemaVersion, version, snapshot: parsed, updatedAt }
        : { schemaVersion, version, snapshot: parsed, updatedAt, carrier };
    },
  };
}
