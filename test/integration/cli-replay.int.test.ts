/**
 * `flujo replay` on the built binary (bin/flujo.js → dist, rebuilt when src/ changes) against the
 * suite's Redis, on its own key prefix.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runFlujo } from '../helpers/cli.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';
import { changedKeys, dumpAll } from '../helpers/dump.js';

const LINE = 'test/fixtures/jobs/line.ts';

const flujo = (args: string[], prefix: string) => runFlujo(args, { prefix, user: 'tester' });

describe('flujo replay', () => {
  let redis: Redis;
  const prefix = testPrefix();
  let runId: string;

  beforeAll(async () => {
    redis = connect();
    const r = await flujo(['run', LINE, '--json'], prefix);
    expect(r.code).toBe(0);
    runId = String((JSON.parse(r.lines[0]!) as { runId: string }).runId);
  });
  afterAll(async () => {
    await deletePrefix(redis, prefix);
    await deletePrefix(redis, `{${prefix}:q}`);
    redis.disconnect();
  });

  it('--mode reproduce prints the stored outcomes and the integrity check, and writes nothing', async () => {
    // Not even the queue's meta, which BullMQ writes when a queue is made.
    await redis.del(`{${prefix}:q}:runs:meta`);
    const before = await dumpAll(redis, prefix);
    const r = await flujo(['replay', runId, '--mode', 'reproduce'], prefix);
    expect(r.code).toBe(0);
    expect(r.lines[0]).toMatch(new RegExp(`^run ${runId} as stored: succeeded`));
    expect(r.lines.filter((l) => l.startsWith('  success'))).toHaveLength(3);
    expect(r.lines.at(-1)).toBe('integrity: ok (the stored events lead to the stored snapshot)');
    const json = await flujo(['replay', runId, '--mode', 'reproduce', '--json'], prefix);
    expect(JSON.parse(json.out)).toMatchObject({ mode: 'reproduce', integrity: { ok: true } });
    expect(changedKeys(before, await dumpAll(redis, prefix))).toEqual([]);
  });

  it('--mode replay --from prints the new run; resume runs it; status shows the lineage both ways', async () => {
    const r = await flujo(['replay', runId, '--mode', 'replay', '--from', 'b', '--json'], prefix);
    expect(r.code).toBe(0);
    const replayed = JSON.parse(r.out) as { runId: string; reusedSteps: string[] };
    expect(replayed).toMatchObject({ mode: 'replay', replayOf: runId, reusedSteps: ['a'] });
    const human = await flujo(['replay', runId, '--mode', 'regenerate'], prefix);
    expect(human.code).toBe(0);
    expect(human.lines[0]).toMatch(new RegExp(`^run \\S+ regenerates ${runId} \\(lineage `));
    const regenerated = /^run (\S+) /.exec(human.lines[0]!)![1]!;

    // Listed from its creation, before any worker took it up.
    const listed = await flujo(['list', '--json'], prefix);
    expect(listed.code, listed.err).toBe(0);
    const runs = JSON.parse(listed.out) as { runId: string; planName: string; status: string }[];
    expect(runs.map((r) => [r.runId, r.planName, r.status])).toEqual([
      [regenerated, 'line', 'running'],
      [replayed.runId, 'line', 'running'],
      [runId, 'line', 'succeeded'],
    ]);

    const resumed = await flujo(['resume', replayed.runId, LINE], prefix);
    expect(resumed.code).toBe(0);
    const status = await flujo(['status', replayed.runId], prefix);
    expect(status.code).toBe(0);
    expect(status.out).toContain(
      `lineage ${runId}: ${runId} → ${replayed.runId} (replay, from step b, reused a)`,
    );
    expect(status.lines.find((l) => l.trim().startsWith('a '))).toContain(`reused from ${runId}`);
    expect(status.lines.find((l) => l.trim().startsWith('b '))).not.toContain('reused');
    const original = await flujo(['status', runId], prefix);
    expect(original.lines.filter((l) => l.includes('replayed:'))).toHaveLength(2);
    expect(original.out).toContain(`replayed: ${runId} → ${replayed.runId} (replay,`);
  });

  it('refuses a missing or unknown mode and an unknown step (exit 2), writing nothing', async () => {
    const before = await dumpAll(redis, prefix);
    const none = await flujo(['replay', runId], prefix);
    expect(none.code).toBe(2);
    expect(none.err).toContain('--mode is required');
    const bad = await flujo(['replay', runId, '--mode', 'again'], prefix);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain('--mode "again" is not a mode');
    const step = await flujo(['replay', runId, '--mode', 'replay', '--from', 'zz'], prefix);
    expect(step.code).toBe(2);
    expect(step.err).toContain('has no step "zz"');
    const effects = await flujo(
      ['replay', runId, '--mode', 'reproduce', '--allow-effects'],
      prefix,
    );
    expect(effects.code).toBe(2);
    expect(effects.err).toContain('allowEffects');
    expect(changedKeys(before, await dumpAll(redis, prefix))).toEqual([]);
  });
});
