import type { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { SnapshotConflictError } from '../../src/errors.js';
import { createSnapshotStore, type SnapshotStore } from '../../src/persistence/snapshot-store.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';

const WRITERS = 16;
/** Each writer makes exactly this many commit attempts (wins plus conflicts), not this many wins. */
const ATTEMPTS = 200;
const RUN = 'contended';

interface Snap {
  writer: number;
  n: number;
}
interface Win {
  writer: number;
  n: number;
  version: number;
}

describe('CAS race: many writers, one run', () => {
  let prefix: string;
  let admin: Redis;
  const clients: Redis[] = [];
  const stores: SnapshotStore<Snap>[] = [];

  beforeEach(async () => {
    prefix = testPrefix();
    admin = connect();
    for (let w = 0; w < WRITERS; w++) {
      const redis = connect();
      clients.push(redis);
      stores.push(createSnapshotStore<Snap>({ redis, prefix }));
    }
    await Promise.all(clients.map((c) => c.ping()));
  });

  afterEach(async () => {
    for (const s of stores.splice(0)) await s.close();
    for (const c of clients.splice(0)) await c.quit();
    await deletePrefix(admin, prefix);
    await admin.quit();
  });

  it(`${WRITERS} writers × ${ATTEMPTS} attempts: one winner per version, events exactly once`, async () => {
    await (stores[0] as SnapshotStore<Snap>).create(RUN, { writer: -1, n: -1 });
    const wins: Win[] = [];
    let losses = 0;

    const writer = async (w: number, store: SnapshotStore<Snap>): Promise<void> => {
      for (let n = 0; n < ATTEMPTS; n++) {
        const loaded = await store.load(RUN);
        const version = loaded.version + 1;
        try {
          const committed = await store.commit(RUN, loaded.version, { writer: w, n }, [
            { type: 'test.committed', writer: w, n, version },
          ]);
          expect(committed.version).toBe(version);
          wins.push({ writer: w, n, version });
        } catch (e) {
          if (!(e instanceof SnapshotConflictError)) throw e;
          expect(e.expectedVersion).toBe(loaded.version);
          expect(e.actualVersion).toBeGreaterThan(loaded.version);
          losses++;
        }
      }
    };
    await Promise.all(stores.map((s, w) => writer(w, s)));

    const total = wins.length;
    expect(total + losses).toBe(WRITERS * ATTEMPTS);
    expect(losses).toBeGreaterThan(0);
    expect(total).toBeGreaterThan(0);

    // Exactly one winner per version, versions 1..N without gaps.
    const versions = wins.map((x) => x.version).sort((a, b) => a - b);
    expect(new Set(versions).size).toBe(total);
    expect(versions).toEqual(Array.from({ length: total }, (_, i) => i + 1));

    // The stored run is at version N and holds the last winner's snapshot.
    const final = await (stores[0] as SnapshotStore<Snap>).load(RUN);
    expect(final.version).toBe(total);
    const last = wins.find((x) => x.version === total) as Win;
    expect(final.snapshot).toEqual({ writer: last.writer, n: last.n });

    // Every winner's event is in the stream exactly once, in version order; no loser's event is.
    const events = await (stores[0] as SnapshotStore<Snap>).readEvents(RUN);
    expect(events).toHaveLength(total);
    expect(events.map((e) => e.version)).toEqual(versions);
    const seen = new Map<string, number>();
    for (const e of events) {
      expect(e.type).toBe('test.committed');
      const data = e.data as unknown as Win & { type: string };
      expect(data.version).toBe(e.version);
      const id = `${data.writer}/${data.n}`;
      seen.set(id, (seen.get(id) ?? 0) + 1);
    }
    expect(seen.size).toBe(total);
    for (const win of wins) expect(seen.get(`${win.writer}/${win.n}`)).toBe(1);
  }, 30_000);
});
