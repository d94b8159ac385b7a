/**
 * The small stores of a run's side keys: active runs, counters, request keys, unit notes,
 * progress, and the lookups of a run's own keys. Each against the suite's Redis.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createActiveRuns } from '../../src/persistence/active-runs.js';
import { createKeys, RunKeyKind } from '../../src/persistence/keys.js';
import { createRequestKeys } from '../../src/persistence/request-keys.js';
import { createRunChannels } from '../../src/persistence/run-channels.js';
import { createRunCounters } from '../../src/persistence/run-counters.js';
import {
  lastEventId,
  readMetaField,
  runExists,
  writeMetaField,
} from '../../src/persistence/run-lookups.js';
import { createUnitNotes } from '../../src/persistence/unit-notes.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';

describe('run side stores', () => {
  let redis: Redis;
  const prefix = testPrefix();
  const keys = createKeys(prefix);

  beforeAll(() => {
    redis = connect();
  });
  afterAll(async () => {
    await deletePrefix(redis, prefix);
    await deletePrefix(redis, `{${prefix}`);
    redis.disconnect();
  });

  it('active runs: added, walked page by page, removed', async () => {
    const active = createActiveRuns(redis, keys);
    const ids = Array.from({ length: 25 }, (_, i) => `run-${i}`);
    for (const id of ids) await active.add(id);
    await active.add('run-0'); // a repeat is a no-op
    const seen: string[] = [];
    await active.forEach((id) => {
      seen.push(id);
      return Promise.resolve();
    }, 7);
    expect(seen.sort()).toEqual([...ids].sort());
    await active.remove('run-3');
    await active.remove('never-there');
    expect(await redis.scard(keys.activeRuns())).toBe(24);
    expect(await redis.sismember(keys.activeRuns(), 'run-3')).toBe(0);
  });

  it('counters: tool calls per run and step; a step keeps its first start', async () => {
    const counters = createRunCounters(redis, keys);
    expect(await counters.countToolCall('r1', 'a')).toEqual({ run: 1, step: 1 });
    expect(await counters.countToolCall('r1', 'b')).toEqual({ run: 2, step: 1 });
    expect(await counters.countToolCall('r1', 'a')).toEqual({ run: 3, step: 2 });
    expect(await counters.stepStartedAt('r1', 'a', 1000)).toBe(1000);
    expect(await counters.stepStartedAt('r1', 'a', 5000)).toBe(1000);
    expect(await counters.stepStartedAt('r1', 'b', 5000)).toBe(5000);
  });

  it('request keys: the first claim wins; later claims learn its run', async () => {
    const requests = createRequestKeys(redis, keys);
    expect(await requests.owner('t1', 'order-1')).toBeNull();
    expect(await requests.claim('t1', 'order-1', 'run-a')).toBeNull();
    expect(await requests.claim('t1', 'order-1', 'run-b')).toBe('run-a');
    expect(await requests.owner('t1', 'order-1')).toBe('run-a');
    // Per tenant.
    expect(await requests.claim('t2', 'order-1', 'run-c')).toBeNull();
  });

  it('unit notes: a swap returns the note it replaced; read returns all', async () => {
    const notes = createUnitNotes(redis, keys);
    expect(await notes.swap('r2', 'a', '1 0 100 w1 - h 1')).toBeNull();
    expect(await notes.swap('r2', 'a', '1 0 200 w2 - h 2')).toBe('1 0 100 w1 - h 1');
    await notes.swap('r2', 'b', '2 0 300 w2 - h 2');
    expect(await notes.read('r2')).toEqual({ a: '1 0 200 w2 - h 2', b: '2 0 300 w2 - h 2' });
  });

  it('channels: the latest progress per step is kept and published', async () => {
    const channels = createRunChannels(redis, keys);
    const sub = redis.duplicate();
    const heard: string[] = [];
    sub.on('message', (_c: string, m: string) => heard.push(m));
    await sub.subscribe(channels.progressChannel('r3'));
    try {
      await channels.publishProgress('r3', 'a', '{"done":1}');
      await channels.publishProgress('r3', 'a', '{"done":2}');
      expect(await channels.readProgress('r3')).toEqual({ a: '{"done":2}' });
      await expect.poll(() => heard).toEqual(['{"done":1}', '{"done":2}']);
      expect(channels.abortChannel).toBe(`${prefix}:abort`);
      expect(channels.chunkChannel('r3')).toBe(keys.runKey('r3', RunKeyKind.Chunks));
    } finally {
      sub.disconnect();
    }
  });

  it('lookups: existence, the newest event, meta fields', async () => {
    expect(await runExists(redis, keys, 'r4')).toBe(false);
    await redis.set(keys.snap('r4'), 'x');
    expect(await runExists(redis, keys, 'r4')).toBe(true);
    expect(await lastEventId(redis, keys, 'r4')).toBeUndefined();
    await redis.xadd(keys.events('r4'), '5-0', 'e', '1');
    await redis.xadd(keys.events('r4'), '6-0', 'e', '2');
    expect(await lastEventId(redis, keys, 'r4')).toBe('6-0');
    expect(await readMetaField(redis, keys, 'r4', 'cliModule')).toBeNull();
    await writeMetaField(redis, keys, 'r4', 'cliModule', '/jobs/a.ts');
    expect(await readMetaField(redis, keys, 'r4', 'cliModule')).toBe('/jobs/a.ts');
  });
});
