import { describe, expect, it } from 'vitest';
import { InputValidationError } from '../../src/errors.js';
import {
  assertBlobId,
  assertRunId,
  BLOB_ID_PATTERN,
  createKeys,
  isRunId,
  RUN_ID_MAX_LENGTH,
  RUN_ID_PATTERN,
  RunKeyKind,
} from '../../src/persistence/keys.js';

/** CRC16-XMODEM, the checksum Redis Cluster uses for key slots. */
function crc16(input: string): number {
  let crc = 0;
  for (const byte of Buffer.from(input, 'utf8')) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++)
      crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc;
}

/** The Redis Cluster slot of a key, honouring the first non-empty `{hash tag}`. */
function keySlot(key: string): number {
  const open = key.indexOf('{');
  if (open !== -1) {
    const close = key.indexOf('}', open + 1);
    if (close > open + 1) key = key.slice(open + 1, close);
  }
  return crc16(key) % 16384;
}

describe('keys', () => {
  it('computes cluster slots like Redis does (vectors from the cluster spec and CLUSTER KEYSLOT docs)', () => {
    expect(crc16('123456789')).toBe(0x31c3);
    expect(keySlot('somekey')).toBe(11058);
    expect(keySlot('foo{hash_tag}')).toBe(2515);
  });

  it('puts every key of a run in one hash tag and one cluster slot', () => {
    const keys = createKeys('app');
    for (const runId of ['run-1', 'r:with:colons', 'ünïcödé-run', 'x'.repeat(RUN_ID_MAX_LENGTH)]) {
      const all = [
        keys.snap(runId),
        keys.events(runId),
        keys.ledger(runId),
        keys.journal(runId),
        keys.blobs(runId),
        keys.blob(runId, 'a'.repeat(64)),
        ...Object.values(RunKeyKind).map((kind) => keys.runKey(runId, kind)),
      ];
      const slots = new Set(all.map(keySlot));
      expect(slots.size).toBe(1);
      expect([...slots][0]).toBe(crc16(runId) % 16384);
    }
    expect(keys.snap('run-1')).toBe('app:{run-1}:snap');
    expect(keys.events('run-1')).toBe('app:{run-1}:events');
    expect(keys.runKey('run-1', 'ledger')).toBe('app:{run-1}:ledger');
  });

  it('puts every usage key of a tenant, its runs included, in the tenant hash tag', () => {
    const keys = createKeys('app');
    for (const tenantId of ['acme', 't:x', 'ünï']) {
      const all = [
        keys.tenantQuota(tenantId),
        keys.reservations(tenantId),
        keys.runUsage(tenantId, 'run-1'),
        keys.runUsage(tenantId, 'other:run'),
        keys.runReservations(tenantId, 'run-1'),
      ];
      expect(new Set(all.map(keySlot))).toEqual(new Set([crc16(`t:${tenantId}`) % 16384]));
    }
    expect(keys.tenantQuota('acme')).toBe('app:{t:acme}:quota');
    expect(keys.runUsage('acme', 'r1')).toBe('app:{t:acme}:usage:r1');
    expect(keys.reservations('acme')).toBe('app:{t:acme}:reservations');
    expect(keys.runReservations('acme', 'r1')).toBe('app:{t:acme}:reservations:r1');
    expect(() => keys.tenantQuota('a{b}')).toThrow(/tenantId/);
    expect(() => keys.runUsage('acme', '')).toThrow(/runId: must not be empty/);
    expect(() => keys.runReservations('acme', 'x}')).toThrow(InputValidationError);
  });

  it('builds blob keys from sha256 ids only', () => {
    const keys = createKeys('app');
    const id = '0123456789abcdef'.repeat(4);
    expect(keys.blob('r1', id)).toBe(`app:{r1}:blob:${id}`);
    expect(keys.blobs('r1')).toBe('app:{r1}:blobs');
    for (const bad of ['', 'A'.repeat(64), 'a'.repeat(63), 'a'.repeat(65), `${'a'.repeat(63)}g`]) {
      expect(BLOB_ID_PATTERN.test(bad)).toBe(false);
      expect(() => keys.blob('r1', bad)).toThrow(/blobId: must be a sha256/);
    }
    expect(() => assertBlobId(7, 'ref.id')).toThrow(/ref\.id/);
  });

  it('defaults the prefix to flujo', () => {
    expect(createKeys().snap('r')).toBe('flujo:{r}:snap');
    expect(createKeys().prefix).toBe('flujo');
  });

  it('refuses invalid prefixes naming the field', () => {
    for (const bad of ['', 'a{b', 'a}b']) {
      expect(() => createKeys(bad)).toThrow(InputValidationError);
      try {
        createKeys(bad);
      } catch (e) {
        expect((e as InputValidationError).issues[0]?.path).toBe('prefix');
      }
    }
  });

  it('refuses invalid run ids naming the field', () => {
    const keys = createKeys();
    for (const bad of ['', 'a{b}', 'x}', 'x'.repeat(RUN_ID_MAX_LENGTH + 1)]) {
      expect(isRunId(bad)).toBe(false);
      expect(RUN_ID_PATTERN.test(bad)).toBe(false);
      expect(() => keys.snap(bad)).toThrow(InputValidationError);
      expect(() => assertRunId(bad, 'input.runId')).toThrow(/input\.runId/);
    }
    expect(() => assertRunId(42)).toThrow(/runId: must be a string/);
    expect(isRunId('ok-run')).toBe(true);
    expect(RUN_ID_PATTERN.test('ok-run')).toBe(true);
  });
});
