/**
 * The stream watcher through a Redis restart. The read that was blocked when the connection
 * dropped must not be sent again on the next connection (ioredis resends a pending command on
 * reconnect): there it would block under a client id the watcher does not know, so no change of
 * the watched set could unblock it, and a stream watched after the restart would wait until a
 * stream watched before it got an entry. So a stream watched after the restart, or while Redis is
 * away, is read as soon as it gets an entry, and those watched before still are. On a server of
 * its own, killed (SIGKILL) and started again on the same port with its data.
 */
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createStreamWatcher, type StreamWatcher } from '../../src/persistence/stream-watcher.js';
import { killRedisServer, spawnRedisServer } from '../helpers/redis-server.js';

let port: number;
let dir: string;
let server: ChildProcess | undefined;
let redis: Redis;
let watcher: StreamWatcher;

/** A free loopback port. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port: p } = s.address() as { port: number };
      s.close(() => resolve(p));
    });
  });
}

const startServer = (): Promise<ChildProcess> => spawnRedisServer(port, dir);

function killServer(): Promise<void> {
  const child = server;
  server = undefined;
  return killRedisServer(child);
}

/** The entries each key's watch got, by key. */
function watching(key: string, got: Map<string, string[]>): void {
  got.set(key, []);
  watcher.watch(key, '0-0', (entries) => {
    for (const [, fields] of entries) got.get(key)!.push(fields[1]!);
  });
}

beforeAll(async () => {
  port = await freePort();
  dir = mkdtempSync(join(tmpdir(), 'flujo-watcher-'));
  server = await startServer();
  redis = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
  redis.on('error', () => {});
  watcher = createStreamWatcher(redis);
});
afterAll(async () => {
  watcher.close();
  redis.disconnect();
  await killServer();
  rmSync(dir, { recursive: true, force: true });
});

describe('the stream watcher through a Redis restart', () => {
  it('reads a stream watched after the restart, or while Redis is away, at once; and those watched before', async () => {
    const got = new Map<string, string[]>();
    watching('{w}:before', got);
    await redis.xadd('{w}:before', '*', 'n', 'b1');
    await expect.poll(() => got.get('{w}:before'), { timeout: 5000 }).toEqual(['b1']);

    await killServer();
    // Watched while Redis is away.
    watching('{w}:away', got);
    await new Promise((r) => setTimeout(r, 300));
    server = await startServer();
    await redis.ping();
    // Watched once it is back.
    watching('{w}:after', got);
    await redis.xadd('{w}:after', '*', 'n', 'a1');
    await redis.xadd('{w}:away', '*', 'n', 'w1');
    // Nothing is added to the stream watched before: the reads must not wait on it.
    await expect.poll(() => got.get('{w}:after'), { timeout: 2000, interval: 20 }).toEqual(['a1']);
    await expect.poll(() => got.get('{w}:away'), { timeout: 2000, interval: 20 }).toEqual(['w1']);
    await redis.xadd('{w}:before', '*', 'n', 'b2');
    await expect
      .poll(() => got.get('{w}:before'), { timeout: 2000, interval: 20 })
      .toEqual(['b1', 'b2']);
  });
});
