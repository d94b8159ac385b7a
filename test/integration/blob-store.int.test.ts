import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  BlobCapExceededError,
  BlobMissingError,
  ConfigurationError,
  InputValidationError,
  SnapshotCorruptError,
} from '../../src/errors.js';
import {
  blobIdOf,
  blobRef,
  createBlobStore,
  DEFAULT_BLOB_RETENTION_MS,
  missingBlobMarker,
  type BlobStore,
  type DegradedBlobInfo,
} from '../../src/persistence/blob-store.js';
import { createKeys, type Keys } from '../../src/persistence/keys.js';
import { caught } from '../helpers/caught.js';
import { connect, deletePrefix, readPrefix, testPrefix } from '../helpers/redis.js';

let redis: Redis;
let prefix: string;
let keys: Keys;
let blobs: BlobStore;

const R = 'run-1';
const HOUR = 3_600_000;
// 50 KB of mixed text: multi-byte characters make the UTF-8 size differ from the length.
const big = Array.from({ length: 2800 }, (_, i) => `row ${i}: é✓🚀 ${'x'.repeat(i % 7)}\n`).join(
  '',
);

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  await redis.quit();
});
beforeEach(() => {
  prefix = testPrefix();
  keys = createKeys(prefix);
  blobs = createBlobStore({ redis, prefix, retentionMs: HOUR });
});
afterEach(async () => {
  await deletePrefix(redis, prefix);
});

describe('blob store', () => {
  it('round-trips a 50 KB string under its sha256', async () => {
    const size = Buffer.byteLength(big, 'utf8');
    expect(big.length).toBeGreaterThan(50_000);
    expect(size).toBeGreaterThan(big.length);
    const id = blobIdOf(big);
    expect(await blobs.put(R, big)).toEqual({ id, size, ref: blobRef(id, size) });
    expect(await blobs.get(R, id)).toBe(big);
    expect(await blobs.mustGet(R, id, 'fetch')).toBe(big);
    expect(await readPrefix(redis, prefix)).toEqual({
      [keys.blob(R, id)]: { string: big },
      [keys.blobs(R)]: { hash: { bytes: String(size), count: '1', [id]: String(size) } },
    });
    expect(await blobs.get('run-2', id)).toBeNull();
  });

  it('stores the same content once: bytes and count are not counted again', async () => {
    const first = await blobs.put(R, 'alpha');
    expect(await blobs.put(R, 'alpha')).toEqual(first);
    expect(await redis.hgetall(keys.blobs(R))).toEqual({ bytes: '5', count: '1', [first.id]: '5' });
    const second = await blobs.put(R, 'beta ✓');
    expect(second.size).toBe(8);
    expect(await redis.hgetall(keys.blobs(R))).toEqual({
      bytes: '13',
      count: '2',
      [first.id]: '5',
      [second.id]: '8',
    });
    // Another run accounts for itself.
    await blobs.put('run-2', 'alpha');
    expect(await redis.hgetall(keys.blobs('run-2'))).toEqual({
      bytes: '5',
      count: '1',
      [first.id]: '5',
    });
  });

  it('sets the retention as TTL on blob and accounting, and refreshes both on every put', async () => {
    const { id } = await blobs.put(R, 'alpha');
    const blobKey = keys.blob(R, id);
    for (const key of [blobKey, keys.blobs(R)]) {
      const ttl = await redis.pttl(key);
      expect(ttl).toBeGreaterThan(HOUR - 5_000);
      expect(ttl).toBeLessThanOrEqual(HOUR);
    }
    // As if most of the retention had passed.
    await redis.pexpire(blobKey, 1_000);
    await redis.pexpire(keys.blobs(R), 1_000);
    await blobs.put(R, 'alpha');
    expect(await redis.pttl(blobKey)).toBeGreaterThan(HOUR - 5_000);
    expect(await redis.pttl(keys.blobs(R))).toBeGreaterThan(HOUR - 5_000);
    // A put of other content refreshes the accounting too, not the other blob.
    await redis.pexpire(blobKey, 1_000);
    await redis.pexpire(keys.blobs(R), 1_000);
    await blobs.put(R, 'beta');
    expect(await redis.pttl(blobKey)).toBeLessThanOrEqual(1_000);
    expect(await redis.pttl(keys.blobs(R))).toBeGreaterThan(HOUR - 5_000);
    // By default a blob has no expiry of its own: it goes with its run (the run's retention).
    const kept = createBlobStore({ redis, prefix });
    const { id: g } = await kept.put('run-3', 'gamma');
    expect(await redis.pttl(keys.blob('run-3', g))).toBe(-1);
    expect(await redis.pttl(keys.blobs('run-3'))).toBe(-1);
    await kept.put('run-3', 'gamma');
    expect(await redis.pttl(keys.blob('run-3', g))).toBe(-1);
    await redis.del(keys.blob('run-3', g));
    expect((await kept.put('run-3', 'gamma')).id).toBe(g);
    expect(await redis.get(keys.blob('run-3', g))).toBe('gamma');
    expect(await redis.pttl(keys.blob('run-3', g))).toBe(-1);
    expect(DEFAULT_BLOB_RETENTION_MS).toBeNull();
  });

  it('puts an expired blob back without counting it twice', async () => {
    const { id } = await blobs.put(R, 'alpha');
    await redis.del(keys.blob(R, id));
    expect(await blobs.get(R, id)).toBeNull();
    await blobs.put(R, 'alpha');
    expect(await blobs.get(R, id)).toBe('alpha');
    expect(await redis.pttl(keys.blob(R, id))).toBeGreaterThan(HOUR - 5_000);
    expect(await redis.hgetall(keys.blobs(R))).toEqual({ bytes: '5', count: '1', [id]: '5' });
  });

  it('refuses a blob past the cap and writes nothing', async () => {
    const capped = createBlobStore({ redis, prefix, retentionMs: HOUR, maxBytesPerRun: 100 });
    const sixty = await capped.put(R, 'a'.repeat(60));
    await redis.pexpire(keys.blobs(R), 50_000);
    const before = await readPrefix(redis, prefix);
    const e = await caught(capped.put(R, 'b'.repeat(41)));
    expect(e).toBeInstanceOf(BlobCapExceededError);
    expect((e as BlobCapExceededError).details).toEqual({
      runId: R,
      maxBytesPerRun: 100,
      size: 41,
      storedBytes: 60,
    });
    expect((e as Error).message).toContain('maxBytesPerRun');
    expect(await readPrefix(redis, prefix)).toEqual(before);
    expect(await redis.pttl(keys.blobs(R))).toBeLessThanOrEqual(50_000);
    expect(await redis.exists(keys.blob(R, blobIdOf('b'.repeat(41))))).toBe(0);
    // Up to the cap exactly is fine; content already stored is fine at the cap.
    await capped.put(R, 'c'.repeat(40));
    expect(await capped.put(R, 'a'.repeat(60))).toEqual(sixty);
    expect(await redis.hget(keys.blobs(R), 'bytes')).toBe('100');
    expect(await caught(capped.put(R, 'd'))).toBeInstanceOf(BlobCapExceededError);
    // Another run has its own budget.
    expect((await capped.put('run-2', 'd')).size).toBe(1);
  });

  it('a missing blob fails fast, naming the blob and the step', async () => {
    const id = blobIdOf('never stored');
    const e = await caught(blobs.mustGet(R, id, 'fetch'));
    expect(e).toBeInstanceOf(BlobMissingError);
    expect((e as BlobMissingError).details).toEqual({ runId: R, stepId: 'fetch', blobId: id });
    expect((e as Error).message).toContain(`Blob ${id} needed by step "fetch" of run "run-1"`);
    expect(await blobs.get(R, id)).toBeNull();

    const kept = await blobs.put(R, 'kept');
    const text = `a ${kept.ref} b ${blobRef(id, 12)} c`;
    const e2 = await caught(blobs.rehydrate(R, text, { stepId: 'fetch' }));
    expect(e2).toBeInstanceOf(BlobMissingError);
    expect((e2 as BlobMissingError).blobId).toBe(id);
  });

  it('rehydrates every reference, and in degraded replay puts the marker for missing ones', async () => {
    const one = await blobs.put(R, big);
    const two = await blobs.put(R, '{"rows":[1,2,3]}');
    const gone = await blobs.put(R, 'gone soon');
    await redis.del(keys.blob(R, gone.id));
    const text = `[${one.ref}|${two.ref}|${one.ref}]`;
    expect(await blobs.rehydrate(R, text, { stepId: 's1' })).toBe(
      `[${big}|{"rows":[1,2,3]}|${big}]`,
    );
    expect(await blobs.rehydrate(R, 'plain text', { stepId: 's1' })).toBe('plain text');

    const seen: DegradedBlobInfo[] = [];
    const withGone = `${two.ref} then ${gone.ref} and again ${gone.ref}`;
    const marker = missingBlobMarker(gone.id, 9);
    expect(
      await blobs.rehydrate(R, withGone, {
        stepId: 's1',
        degraded: true,
        onDegraded: (info) => seen.push(info),
      }),
    ).toBe(`{"rows":[1,2,3]} then ${marker} and again ${marker}`);
    expect(seen).toEqual([{ runId: R, stepId: 's1', blobId: gone.id, size: 9, marker }]);
    expect(marker).toBe(`[blob ${gone.id} (9 bytes) is no longer available]`);
    expect(await caught(blobs.rehydrate(R, withGone, { stepId: 's1' }))).toBeInstanceOf(
      BlobMissingError,
    );
  });

  it('detects corrupt content on read, also in degraded replay', async () => {
    const { id, ref } = await blobs.put(R, 'the truth');
    await redis.set(keys.blob(R, id), 'a lie');
    const e = await caught(blobs.get(R, id));
    expect(e).toBeInstanceOf(SnapshotCorruptError);
    expect((e as Error).message).toContain(`blob ${id} does not match its sha256`);
    expect(await caught(blobs.mustGet(R, id, 's1'))).toBeInstanceOf(SnapshotCorruptError);
    expect(await caught(blobs.rehydrate(R, ref, { stepId: 's1', degraded: true }))).toBeInstanceOf(
      SnapshotCorruptError,
    );
    // A reference whose size disagrees with the content was altered.
    const ok = await blobs.put(R, 'twelve bytes');
    const e2 = await caught(blobs.rehydrate(R, blobRef(ok.id, 13), { stepId: 's1' }));
    expect((e2 as Error).message).toContain(`gives blob ${ok.id} 13 bytes, but it has 12`);
  });

  it('offload keeps small content inline and stores the rest; rehydrate undoes it', async () => {
    expect(await blobs.offload(R, 'small', 5)).toBe('small');
    expect(await readPrefix(redis, prefix)).toEqual({});
    const ref = await blobs.offload(R, 'é'.repeat(3), 5); // 6 bytes, 3 characters
    expect(ref).toBe(blobRef(blobIdOf('ééé'), 6));
    const offloaded = await blobs.offload(R, big, 20_480);
    expect(offloaded).toBe(blobRef(blobIdOf(big), Buffer.byteLength(big)));
    // Small text that looks like a reference is stored too, so it is never taken for one.
    const sneaky = `see ${blobRef('f'.repeat(64), 3)}`;
    const wrapped = await blobs.offload(R, sneaky, 20_480);
    expect(wrapped).not.toBe(sneaky);
    for (const [text, out] of [
      ['small', 'small'],
      [ref, 'ééé'],
      [offloaded, big],
      [wrapped, sneaky],
    ]) {
      expect(await blobs.rehydrate(R, text!, { stepId: 's1' })).toBe(out);
    }
    expect(await caught(blobs.offload(R, 'x', -1))).toBeInstanceOf(InputValidationError);
  });

  it('refuses bad options and input, naming the field', async () => {
    for (const [options, field] of [
      [{ retentionMs: 0 }, 'retentionMs'],
      [{ retentionMs: 1.5 }, 'retentionMs'],
      [{ maxBytesPerRun: -1 }, 'maxBytesPerRun'],
    ] as const) {
      let e: unknown;
      try {
        createBlobStore({ redis, prefix, ...options });
      } catch (error) {
        e = error;
      }
      expect(e).toBeInstanceOf(ConfigurationError);
      expect((e as ConfigurationError).details).toEqual({ field });
      expect((e as Error).message).toContain(field);
    }
    const lone = await caught(blobs.put(R, 'bad \ud800 text'));
    expect((lone as InputValidationError).issues[0]?.path).toBe('content');
    expect(await caught(blobs.get(R, 'not-a-sha'))).toBeInstanceOf(InputValidationError);
    expect(await caught(blobs.mustGet(R, blobIdOf('x'), 'bad step'))).toBeInstanceOf(
      InputValidationError,
    );
    expect(await caught(blobs.put('a{b}', 'x'))).toBeInstanceOf(InputValidationError);
    expect(await readPrefix(redis, prefix)).toEqual({});
  });
});
