/**
 * The per-item commit cost of a map step, at 10 items and at 1,000: each item's start check and
 * commit (`MapStore.begin` and `MapStore.commit`, the Redis work of an item on its map's keys),
 * one item after the other as a worker does them, on maps of 10 items (100 maps a repetition) and
 * of 1,000 items (one map), so that each repetition commits 1,000 items of each size. The ratio of
 * the medians is what a map's size adds to each item's commit: 1.0 is flat.
 *
 *   npm run bench:map                 # starts a private redis-server (AOF on, fsync every second)
 *   REDIS_URL=redis://… npm run bench:map
 */
import { Redis } from 'ioredis';
import { createKeys } from '../src/persistence/keys.js';
import { createMapStore, type MapStore } from '../src/persistence/map-store.js';
import { startRedisServer, type TestRedisServer } from '../test/helpers/redis-server.js';
import { median, spread } from './stats.js';

const REPETITIONS = 7;
const ITEMS_PER_REPETITION = 1000;

/** An element as a list step might give it: a small document reference. */
const element = (i: number) =>
  JSON.stringify({ id: `doc-${i}`, url: `https://example.com/docs/${i}`, size: 1000 + i });

/** Commits every item of one map of `size` items (started here), in order; returns ms per item. */
async function commitMap(store: MapStore, runId: string, size: number): Promise<number> {
  const elements = Array.from({ length: size }, (_, i) => element(i));
  await store.start(runId, 'each', 1, { maxConcurrency: 8, mode: 'fail', elements });
  const output = JSON.stringify({ summary: 'a short summary of the document', words: 420 });
  const began = performance.now();
  for (let index = 0; index < size; index++) {
    const begun = await store.begin(runId, 'each', 1, index, 1);
    if (begun.kind !== 'run') throw new Error(`item ${index}: ${begun.kind}`);
    const done = await store.commit(runId, 'each', 1, {
      index,
      itemAttempt: 1,
      outcome: 'ok',
      payload: output,
    });
    if (done.kind !== 'ok' && done.kind !== 'finish')
      throw new Error(`item ${index}: ${done.kind}`);
  }
  return (performance.now() - began) / size;
}

/** Ms per item over {@link ITEMS_PER_REPETITION} items in maps of `size`. */
async function perItem(store: MapStore, size: number, rep: number): Promise<number> {
  const maps = ITEMS_PER_REPETITION / size;
  let total = 0;
  for (let m = 0; m < maps; m++) total += await commitMap(store, `r${rep}-${size}-${m}`, size);
  return total / maps;
}

async function main(): Promise<void> {
  const external = process.env['REDIS_URL'];
  let server: TestRedisServer | undefined;
  let url: string;
  if (external !== undefined && external !== '') {
    url = external;
    console.log('redis: REDIS_URL (an external server; its persistence settings apply)');
  } else {
    server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', 'everysec']);
    url = server.url;
    console.log(
      `redis: private redis-server on 127.0.0.1:${server.port} with --appendonly yes --appendfsync everysec`,
    );
  }
  const redis = new Redis(url);
  const prefix = `bench-map-${process.pid}`;
  const store = createMapStore(redis, createKeys(prefix));
  try {
    // Warm-up: scripts loaded, connections and JIT settled.
    await perItem(store, 10, -1);
    await perItem(store, 1000, -1);
    const small: number[] = [];
    const large: number[] = [];
    const ratios: number[] = [];
    for (let rep = 0; rep < REPETITIONS; rep++) {
      // Interleaved, so that a slow moment of the machine falls on both.
      const a = await perItem(store, 10, rep);
      const b = await perItem(store, 1000, rep);
      small.push(a);
      large.push(b);
      ratios.push(b / a);
    }
    const ms = (xs: number[]) => `median ${median(xs).toFixed(3)} ms (${spread(xs, 3)})`;
    console.log(`${REPETITIONS} repetitions of ${ITEMS_PER_REPETITION} item commits each size`);
    console.log(`map of 10 items:    per-item commit ${ms(small)}`);
    console.log(`map of 1000 items:  per-item commit ${ms(large)}`);
    console.log(
      `map 1000 vs 10 per-item commit cost ratio: ${(median(large) / median(small)).toFixed(2)} (per repetition ${spread(ratios)})`,
    );
  } finally {
    let cursor = '0';
    do {
      const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
      cursor = next;
      if (found.length > 0) await redis.del(...found);
    } while (cursor !== '0');
    await redis.quit();
    await server?.stop();
  }
}

await main();
