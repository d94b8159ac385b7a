/**
 * The CLI's views of runs, on the built package: `flujo list` (filters, JSON, a bad filter refused),
 * `flujo run` showing operators' progress live, `flujo status` with times per step, and `flujo
 * events` describing tool and worker events. Build first: `npx tsc -p tsconfig.build.json`.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runFlujo, type ChildResult } from '../helpers/cli.js';
import { deleteRuntimeKeys, testPrefix } from '../helpers/redis.js';

let prefix: string;

const flujo = (args: string[]) => runFlujo(args, { prefix });

const runIdOf = (r: ChildResult): string => /^run (\S+) /.exec(r.lines[0] ?? '')?.[1] ?? '';

beforeAll(() => {
  prefix = testPrefix();
});
afterAll(async () => {
  await deleteRuntimeKeys(prefix);
});

describe('flujo list, run, status, events', () => {
  let progressRun = '';
  let lineRun = '';

  it('flujo run shows the progress an operator reports, live, in order', async () => {
    const r = await flujo(['run', 'test/fixtures/jobs/progress.ts']);
    expect(r.code, r.err).toBe(0);
    progressRun = runIdOf(r);
    const progress = r.lines.filter((l) => l.includes('p: progress'));
    expect(progress.map((l) => l.slice(l.indexOf('progress')))).toEqual([
      'progress {"done":1,"of":2}',
      'progress {"done":2,"of":2}',
    ]);
    // Live: before the step's result is committed (its start is committed with it).
    const succeeded = r.lines.findIndex((l) => l.includes('p: RUNNING → SUCCEEDED'));
    expect(r.lines.indexOf(progress[1]!)).toBeLessThan(succeeded);
  }, 30_000);

  it('flujo status shows each step’s start, end and duration, and the latest progress', async () => {
    const line = await flujo(['run', 'test/fixtures/jobs/line.ts', '--input', '{"slowMs":30}']);
    expect(line.code, line.err).toBe(0);
    lineRun = runIdOf(line);
    const r = await flujo(['status', lineRun]);
    expect(r.code, r.err).toBe(0);
    for (const step of ['a', 'b', 'c']) {
      expect(r.out).toMatch(
        new RegExp(
          `\\n  ${step}\\s+SUCCEEDED\\s+attempt 1, \\d\\d:\\d\\d:\\d\\d\\.\\d{3} → \\d\\d:\\d\\d:\\d\\d\\.\\d{3} \\(\\d+ ms\\)`,
        ),
      );
    }
    const json = JSON.parse((await flujo(['status', lineRun, '--json'])).out) as {
      attempts: { stepId: string; durationMs: number; worker: string }[];
    };
    expect(json.attempts.map((a) => a.stepId)).toEqual(['a', 'b', 'c']);
    expect(json.attempts.every((a) => a.durationMs >= 30 && a.worker.includes(' pid '))).toBe(true);
    const p = await flujo(['status', progressRun]);
    expect(p.out).toContain('progress of p (attempt 1, ');
    expect(p.out).toContain('{"done":2,"of":2}');
    expect(p.out).not.toContain('{"done":1,"of":2}');
  }, 30_000);

  it('flujo events describes which worker ran each step and for how long', async () => {
    const r = await flujo(['events', lineRun]);
    expect(r.code, r.err).toBe(0);
    const ran = r.lines.filter((l) => / step\.ran /.test(l));
    expect(ran).toHaveLength(3);
    expect(ran[0]).toMatch(/a attempt 1: ran \d+ ms on \S+ pid \d+$/);
  });

  it('flujo list: newest first, filtered, as JSON; a bad filter is refused with exit 2', async () => {
    const all = await flujo(['list']);
    expect(all.code, all.err).toBe(0);
    expect(all.lines[0]).toMatch(/^RUN\s+PLAN\s+TENANT\s+STATUS\s+STARTED\s+DURATION\s+STEP$/);
    expect(all.lines.slice(1).map((l) => l.split(/\s+/).slice(0, 4))).toEqual([
      [lineRun, 'line', 'default', 'succeeded'],
      [progressRun, 'progress', 'default', 'succeeded'],
    ]);
    const json = JSON.parse((await flujo(['list', '--plan', 'progress', '--json'])).out) as {
      runId: string;
      durationMs: number;
    }[];
    expect(json.map((r) => r.runId)).toEqual([progressRun]);
    expect(json[0]!.durationMs).toBeGreaterThanOrEqual(300);
    const recent = await flujo(['list', '--since', '10m', '--limit', '1', '--json']);
    expect((JSON.parse(recent.out) as { runId: string }[]).map((r) => r.runId)).toEqual([lineRun]);
    const none = await flujo(['list', '--status', 'failed']);
    expect(none.lines).toEqual(['no runs']);
    const bad = await flujo(['list', '--status', 'done']);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain('--status must be one or more of running, waiting');
    const badTime = await flujo(['list', '--since', 'yesterday']);
    expect(badTime.code).toBe(2);
    expect(badTime.err).toContain('--since must be an ISO time');
  }, 30_000);
});
