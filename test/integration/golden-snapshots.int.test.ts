import { readFileSync } from 'node:fs';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { advanceRun, runStatus, runSteps, type RunSnapshot } from '../../src/machines/kernel.js';
import {
  RUN_SNAPSHOT_SCHEMA_VERSION,
  runSnapshotCodec,
} from '../../src/machines/snapshot-migrations.js';
import { createSnapshotCodec } from '../../src/persistence/codec.js';
import { createKeys } from '../../src/persistence/keys.js';
import { createSnapshotStore } from '../../src/persistence/snapshot-store.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';
import { e } from '../helpers/run-trace.js';

// Envelopes written by earlier releases, exactly as they sit in Redis. Each must still load and
// advance: a change to the snapshot's shape needs a migration in the store's codec, not a break.
const fixtures = [
  'v1/run-gated-diamond.json',
  'v2/run-gated-diamond.json',
  'v3/run-gated-diamond.json',
];

describe('golden run snapshots from earlier releases', () => {
  let redis: Redis;
  const prefix = testPrefix();
  beforeAll(() => {
    redis = connect();
  });
  afterAll(async () => {
    await deletePrefix(redis, prefix);
    redis.disconnect();
  });

  it.each(fixtures)('%s loads, keeps its state and advances', async (name) => {
    const fields = JSON.parse(
      readFileSync(new URL(`../fixtures/snapshots/${name}`, import.meta.url), 'utf8'),
    ) as Record<string, string>;
    const runId = `golden-${name.replace(/\W/g, '-')}`;
    await redis.hset(createKeys(prefix).snap(runId), fields);
    const codec = createSnapshotCodec<RunSnapshot>(runSnapshotCodec);
    const store = createSnapshotStore<RunSnapshot>({ redis, prefix, codec });
    try {
      const env = await store.load(runId);
      expect(env.version).toBe(2);
      // Migrated on read to the current schema.
      expect(env.schemaVersion).toBe(RUN_SNAPSHOT_SCHEMA_VERSION);
      expect(env.snapshot.context).toMatchObject({ stop: null, resumes: 0 });
      expect(runStatus(env.snapshot)).toBe('running');
      expect(runSteps(env.snapshot).map((s) => `${s.stepId}=${s.status}#${s.attempt}`)).toEqual([
        'a=SUCCEEDED#1',
        'b=WAITING_APPROVAL#0',
        'c=FAILED_RETRYABLE#1',
        'd=PENDING#0',
      ]);
      // It still takes events: the retry comes due, the gate is approved, everything finishes.
      let snap = env.snapshot;
      for (const ev of [e.due('c', 2), e.ok('c', 2), e.approve('b'), e.ok('b'), e.ok('d')]) {
        const t = advanceRun(snap, ev);
        expect(t.accepted).toBe(true);
        snap = t.snapshot;
      }
      expect(runStatus(snap)).toBe('succeeded');
      expect(runSteps(env.snapshot).every((s) => s.agent === null)).toBe(true);
      const next = await store.commit(runId, env.version, snap, [{ type: 'test.advanced' }]);
      expect(next.version).toBe(3);
      // Written back in the current stored form (a field per step, outputs apart), which reads
      // back as the same snapshot.
      const keys = createKeys(prefix);
      const stored = await redis.hgetall(keys.snap(runId));
      expect(stored['sv']).toBe(String(RUN_SNAPSHOT_SCHEMA_VERSION));
      expect(stored['s']).toBeUndefined();
      expect(JSON.parse(stored['s:d']!)).toHaveProperty('v', 'SUCCEEDED');
      expect(stored['s:a']).not.toContain('rows');
      expect(JSON.parse((await redis.hget(keys.outputs(runId), 'a'))!)).toEqual(
        runSteps(snap).find((s) => s.stepId === 'a')!.output,
      );
      const snapshotBytes = Object.entries(stored)
        .filter(([f]) => !['v', 'sv', 'u', 'c'].includes(f))
        .reduce((n, [f, v]) => n + f.length + v.length, 0);
      expect(snapshotBytes).toBeLessThan(JSON.stringify(snap).length / 2);
      expect((await store.load(runId)).snapshot).toEqual(JSON.parse(JSON.stringify(snap)));
      // The next commit writes only what changed: here, nothing but the run's own field.
      const again = await store.commit(runId, next.version, snap, [], { previous: snap });
      expect(again.version).toBe(4);
      expect((await store.load(runId)).snapshot).toEqual(JSON.parse(JSON.stringify(snap)));
    } finally {
      await store.close();
    }
  });
});
