import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { coalesceWrites } from '../../src/persistence/write-coalescing.js';
import { startRedisServer, type TestRedisServer } from '../helpers/redis-server.js';

/** Read events the server handled so far (INFO stats `total_reads_processed`). */
async function readsProcessed(admin: Redis): Promise<number> {
  const info = await admin.info('stats');
  return Number(/total_reads_processed:(\d+)/.exec(info)?.[1]);
}

// A private server: the count of reads it processed is this file's alone.
describe('coalesced writes', () => {
  let server: TestRedisServer;
  let admin: Redis;

  beforeAll(async () => {
    server = await startRedisServer();
    admin = new Redis(server.url);
  });

  afterAll(async () => {
    admin.disconnect();
    await server.stop();
  });

  /** Sends 300 commands in one turn of the event loop; returns their replies and the server's reads. */
  async function burst(redis: Redis): Promise<{ replies: unknown[]; reads: number }> {
    await redis.ping();
    const before = await readsProcessed(admin);
    const sent: Promise<unknown>[] = [];
    for (let i = 0; i < 100; i++) {
      sent.push(redis.set(`k${i}`, `v${i}`), redis.incr('n'), redis.get(`k${i}`));
    }
    const replies = await Promise.all(sent);
    // The INFO command itself is one more read.
    return { replies, reads: (await readsProcessed(admin)) - before - 1 };
  }

  it('sends the commands of one turn in one write, in order, with the same replies', async () => {
    const plain = new Redis(server.url);
    const coalesced = coalesceWrites(new Redis(server.url));
    try {
      await plain.del('n');
      const a = await burst(plain);
      await plain.del('n');
      const b = await burst(coalesced);
      expect(b.replies).toEqual(a.replies);
      expect(b.replies.slice(0, 6)).toEqual(['OK', 1, 'v0', 'OK', 2, 'v1']);
      // One writev reaches the server as one read (or a few, when it exceeds the socket buffer).
      expect(b.reads).toBeLessThanOrEqual(3);
      expect(b.reads).toBeLessThan(a.reads);
    } finally {
      plain.disconnect();
      coalesced.disconnect();
    }
  });

  it('keeps working across a reconnect: commands wait in the offline queue and go out', async () => {
    const redis = coalesceWrites(new Redis(server.url, { maxRetriesPerRequest: null }));
    try {
      await redis.set('before', '1');
      redis.stream.destroy();
      const replies = await Promise.all([redis.set('after', '2'), redis.get('before')]);
      expect(replies).toEqual(['OK', '1']);
      expect(await redis.get('after')).toBe('2');
    } finally {
      redis.disconnect();
    }
  });
});
