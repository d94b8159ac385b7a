import { describe, expect, it } from 'vitest';
import {
  InputValidationError,
  InvariantError,
  SnapshotCorruptError,
  SnapshotUnsupportedError,
} from '../../src/errors.js';
import {
  createSnapshotCodec,
  toJson,
  type SnapshotMigration,
} from '../../src/persistence/codec.js';

const step = (from: number, migrate: (s: unknown) => unknown = (s) => s): SnapshotMigration => ({
  from,
  to: from + 1,
  migrate,
});

const fields = (sv: number, snapshot: unknown, v = 3, u = 1_700_000_000_000) => ({
  v: String(v),
  sv: String(sv),
  s: JSON.stringify(snapshot),
  u: String(u),
});

describe('createSnapshotCodec: migration chain validation', () => {
  it('accepts an empty chain, a full chain and a chain given out of order', () => {
    expect(createSnapshotCodec().schemaVersion).toBe(1);
    expect(createSnapshotCodec({ schemaVersion: 3, migrations: [] }).oldestSchemaVersion).toBe(3);
    const codec = createSnapshotCodec({
      schemaVersion: 4,
      migrations: [step(3), step(1), step(2)],
    });
    expect(codec.oldestSchemaVersion).toBe(1);
    expect(
      createSnapshotCodec({ schemaVersion: 4, migrations: [step(3)] }).oldestSchemaVersion,
    ).toBe(3);
  });

  it.each([
    [
      'a gap',
      4,
      [step(1), step(3)],
      /gap in snapshot migrations: nothing migrates schema version 2/,
    ],
    [
      'a duplicate',
      3,
      [step(1), step(1), step(2)],
      /duplicate snapshot migration from schema version 1/,
    ],
    [
      'a chain that stops short',
      4,
      [step(1), step(2)],
      /end at schema version 3.*current schema version is 4/,
    ],
    [
      'a chain that overshoots',
      2,
      [step(1), step(2)],
      /end at schema version 3.*current schema version is 2/,
    ],
    [
      'a step that skips',
      3,
      [{ from: 1, to: 3, migrate: (s: unknown) => s }],
      /1 → 3 must go from/,
    ],
    ['a step from 0', 1, [step(0)], /0 → 1 must go from/],
    ['schemaVersion 0', 0, [], /schemaVersion must be an integer ≥ 1/],
    ['a fractional schemaVersion', 1.5, [], /schemaVersion must be an integer ≥ 1/],
  ] as const)('refuses %s with InvariantError', (_name, schemaVersion, migrations, message) => {
    const make = () => createSnapshotCodec({ schemaVersion, migrations });
    expect(make).toThrow(InvariantError);
    expect(make).toThrow(message);
    expect(make).toThrow(/^INVARIANT: /);
  });
});

describe('codec encode/decode', () => {
  it('round trips an envelope through its hash fields', () => {
    const codec = createSnapshotCodec<{ a: number[]; b: string | null }>();
    const envelope = {
      schemaVersion: 1,
      version: 7,
      snapshot: { a: [1, 2], b: 'ü' },
      updatedAt: 42,
    };
    const encoded = codec.encode(envelope);
    expect(encoded).toEqual({ v: '7', sv: '1', s: '{"a":[1,2],"b":"ü"}', u: '42' });
    expect(codec.decode('r', encoded)).toEqual(envelope);
    expect(codec.encode(envelope, '{"pre":1}').s).toBe('{"pre":1}');
    // The carrier note, when there is one, is field c.
    const carried = { ...envelope, carrier: 'job unit' };
    expect(codec.encode(carried).c).toBe('job unit');
    expect(codec.decode('r', codec.encode(carried))).toEqual(carried);
    expect(codec.decode('r', { ...encoded, c: '' })).toEqual(envelope);
  });

  it('applies migrations in order for older envelopes and returns the current schemaVersion', () => {
    const seen: string[] = [];
    const codec = createSnapshotCodec({
      schemaVersion: 3,
      migrations: [
        step(2, (s) => {
          seen.push('2→3');
          const { name, ...rest } = s as { name: string };
          return { ...rest, title: name };
        }),
        step(1, (s) => {
          seen.push('1→2');
          return { ...(s as object), name: 'from-v1' };
        }),
      ],
    });
    expect(codec.decode('r', fields(1, { x: 1 }))).toEqual({
      schemaVersion: 3,
      version: 3,
      snapshot: { x: 1, title: 'from-v1' },
      updatedAt: 1_700_000_000_000,
    });
    expect(seen).toEqual(['1→2', '2→3']);
    seen.length = 0;
    expect(codec.decode('r', fields(2, { name: 'n' })).snapshot).toEqual({ title: 'n' });
    expect(seen).toEqual(['2→3']);
    seen.length = 0;
    expect(codec.decode('r', fields(3, { title: 't' })).snapshot).toEqual({ title: 't' });
    expect(seen).toEqual([]);
  });

  it('throws SnapshotUnsupportedError for a future schemaVersion', () => {
    const codec = createSnapshotCodec({ schemaVersion: 2, migrations: [step(1)] });
    const err = (() => {
      try {
        codec.decode('run-9', fields(3, {}));
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(err).toBeInstanceOf(SnapshotUnsupportedError);
    expect(err).toMatchObject({
      runId: 'run-9',
      schemaVersion: 3,
      supportedVersion: 2,
      retryable: false,
    });
  });

  it.each([
    ['snapshot not JSON', { v: '1', sv: '1', s: '{"a":', u: '1' }, /snapshot is not JSON/],
    ['snapshot missing', { v: '1', sv: '1', u: '1' }, /field "s" \(snapshot\) is missing/],
    ['version missing', { sv: '1', s: '{}', u: '1' }, /field "v" \(version\) is missing/],
    [
      'version not a number',
      { v: 'x', sv: '1', s: '{}', u: '1' },
      /field "v" \(version\) is not a non-negative integer/,
    ],
    ['negative version', { v: '-1', sv: '1', s: '{}', u: '1' }, /field "v"/],
    [
      'schemaVersion missing',
      { v: '1', s: '{}', u: '1' },
      /field "sv" \(schemaVersion\) is missing/,
    ],
    ['schemaVersion fractional', { v: '1', sv: '1.5', s: '{}', u: '1' }, /field "sv"/],
    ['updatedAt missing', { v: '1', sv: '1', s: '{}' }, /field "u" \(updatedAt\) is missing/],
    [
      'version out of range',
      { v: '99999999999999999999', sv: '1', s: '{}', u: '1' },
      /out of range/,
    ],
  ])('throws SnapshotCorruptError: %s', (_name, input, message) => {
    const codec = createSnapshotCodec();
    expect(() => codec.decode('run-c', input)).toThrow(SnapshotCorruptError);
    expect(() => codec.decode('run-c', input)).toThrow(message);
    expect(() => codec.decode('run-c', input)).toThrow(/run "run-c"/);
  });

  it('throws SnapshotCorruptError for a schemaVersion older than the migration chain', () => {
    const codec = createSnapshotCodec({ schemaVersion: 4, migrations: [step(3)] });
    expect(() => codec.decode('r', fields(2, {}))).toThrow(SnapshotCorruptError);
    expect(() => codec.decode('r', fields(2, {}))).toThrow(/predates the oldest migration/);
  });

  it('throws SnapshotCorruptError when a migration or parse fails, keeping the cause', () => {
    const boom = new Error('boom');
    const codec = createSnapshotCodec({
      schemaVersion: 2,
      migrations: [
        step(1, () => {
          throw boom;
        }),
      ],
    });
    expect(() => codec.decode('r', fields(1, {}))).toThrow(
      /migration of the snapshot from schema version 1 to 2 failed: boom/,
    );
    try {
      codec.decode('r', fields(1, {}));
    } catch (e) {
      expect((e as SnapshotCorruptError).cause).toBe(boom);
    }
    const strict = createSnapshotCodec<{ ok: true }>({
      parse: (s) => {
        if ((s as { ok?: unknown }).ok !== true) throw new Error('ok must be true');
        return s as { ok: true };
      },
    });
    expect(strict.decode('r', fields(1, { ok: true })).snapshot).toEqual({ ok: true });
    expect(() => strict.decode('r', fields(1, { ok: false }))).toThrow(
      /wrong shape: ok must be true/,
    );
  });

  it('refuses non-JSON snapshots on encode with InputValidationError', () => {
    const codec = createSnapshotCodec<unknown>();
    const circular: Record<string, unknown> = {};
    circular['self'] = circular;
    expect(() => codec.encodeSnapshot(circular)).toThrow(InputValidationError);
    expect(() => codec.encodeSnapshot(10n)).toThrow(/snapshot/);
    expect(() => codec.encodeSnapshot(undefined)).toThrow(/is not JSON \(got undefined\)/);
    expect(() => toJson(() => 1, 'event')).toThrow(/Invalid event/);
  });
});
