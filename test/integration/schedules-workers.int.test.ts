/**
 * Schedules across `flujo worker` processes: two workers define the job module's schedule (every
 * 300 ms) and take its fires, one is SIGKILLed midway (after it recorded a fire, before it
 * created the fire's run); three workers on a 1 s schedule for 15 s, one SIGKILLed at 5 s. Each
 * fire starts one run, counted by the runs' derived ids and the operator's calls. Then `flujo
 * schedule` add, list, pause, resume, trigger and remove, and its refusals (exit 2, the field
 * named, nothing written).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, type Runtime, type ScheduleInfo } from '../../src/runtime.js';
import { runFlujo, startFlujo } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys, readPrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const JOB = 'test/fixtures/jobs/scheduled.ts';

let redis: Redis;
let scratch: string;
const prefixes: string[] = [];
const runtimes: Runtime[] = [];

function runtimeOn(prefix: string): Runtime {
  const runtime = createRuntime({ redis: redisUrl(), prefix });
  runtimes.push(runtime);
  return runtime;
}

beforeAll(() => {
  redis = connect();
  scratch = mkdtempSync(join(tmpdir(), 'flujo-schedules-'));
});
afterAll(async () => {
  for (const runtime of runtimes) await runtime.close();
  for (const prefix of prefixes) await deleteRuntimeKeys(prefix);
  redis.disconnect();
  rmSync(scratch, { recursive: true, force: true });
});

describe('schedules on flujo worker processes', { timeout: 120_000 }, () => {
  it('two workers, one SIGKILLed between recording a fire and starting its run: one run per fire, each run once', async () => {
    const prefix = testPrefix();
    prefixes.push(prefix);
    const calls = join(scratch, 'calls');
    const worker = (env: Record<string, string> = {}) =>
      startFlujo(['worker', JOB, '--concurrency', '4'], {
        prefix,
        env: { SCHEDULE_CALLS: calls, ...env },
      });
    // Worker a kills itself (SIGKILL) after it records its second started fire, before it
    // creates that fire's run.
    const a = worker({ FLUJO_KILL_AT: 'after-fire-recorded@2' });
    const b = worker();
    const ready = (w: typeof a) => w.out().includes('flujo worker: processing runs');
    await expect.poll(() => ready(a) && ready(b), { timeout: 30_000 }).toBe(true);
    const runtime = runtimeOn(prefix);
    const died = await a.done;
    expect(died.signal).toBe('SIGKILL');
    const killedAt = Date.now();
    await sleep(1500);
    await runtime.pauseSchedule('beat');
    const pausedAt = Date.now();
    await sleep(1500);
    b.child.kill('SIGTERM');
    await Promise.all([a.done, b.done]);
    const [info] = (await runtime.schedules()) as [ScheduleInfo];
    const started = info.fires.filter((f) => f.outcome === 'started');
    // Every fire from the first to the pause started a run: 300 ms apart, none twice or left out,
    // before the kill and after it.
    expect(started.length).toBe(info.fires.length);
    const times = started.map((f) => f.at).sort((x, y) => x - y);
    for (let i = 1; i < times.length; i++) expect(times[i]! - times[i - 1]!).toBe(300);
    expect(times[0]!).toBeLessThan(killedAt - 300);
    expect(times.at(-1)!).toBeGreaterThan(pausedAt - 700);
    // Fires went on after the kill: the pause came 1.5 s after it, and the fires due in its last
    // 700 ms may be handled after it on a loaded machine, which skips them (the schedule is
    // paused by then): from the first fire, more than 1.1 s of fires, so at least 5.
    expect(started.length).toBeGreaterThanOrEqual(5);
    for (const f of started) expect(f.runId).toBe(`schedule:beat:${f.at}`);
    const runIds = started.map((f) => f.runId!).sort();
    const runs = await runtime.list({ plan: 'scheduled' });
    expect(runs.map((r) => r.runId).sort()).toEqual(runIds);
    for (const run of runs) expect(run.status).toBe('succeeded');
    const called = readFileSync(calls, 'utf8')
      .split('\n')
      .filter((l) => l !== '');
    expect([...new Set(called)].sort()).toEqual(runIds);
    // A unit whose worker was killed while it ran may run once more on the other worker.
    expect(called.length - runIds.length).toBeLessThanOrEqual(1);
  });

  it('every 1 s for 15 s on three workers, one SIGKILLed at 5 s: 15 runs (±1), no fire time twice', async () => {
    const prefix = testPrefix();
    prefixes.push(prefix);
    const calls = join(scratch, 'calls-15s');
    const env = { SCHEDULE_CALLS: calls, SCHEDULE_EVERY_MS: '1000' };
    const workers = [0, 1, 2].map(() =>
      startFlujo(['worker', JOB, '--concurrency', '4'], { prefix, env }),
    );
    const ready = () => workers.every((w) => w.out().includes('flujo worker: processing runs'));
    await expect.poll(ready, { timeout: 30_000 }).toBe(true);
    const runtime = runtimeOn(prefix);
    const from = Date.now();
    await sleep(5000);
    workers[0]!.child.kill('SIGKILL');
    await sleep(10_000 - (Date.now() - from - 5000));
    await runtime.pauseSchedule('beat');
    const until = Date.now();
    await sleep(2500);
    for (const w of workers.slice(1)) w.child.kill('SIGTERM');
    await Promise.all(workers.map((w) => w.done));
    const [info] = (await runtime.schedules()) as [ScheduleInfo];
    const inWindow = info.fires.filter((f) => f.at > from && f.at <= until);
    expect(inWindow.length).toBeGreaterThanOrEqual(14);
    expect(inWindow.length).toBeLessThanOrEqual(16);
    expect(info.fires.every((f) => f.outcome === 'started')).toBe(true);
    expect(new Set(info.fires.map((f) => f.at)).size).toBe(info.fires.length);
    const runIds = info.fires.map((f) => f.runId!).sort();
    const runs = await runtime.list({ plan: 'scheduled' });
    expect(runs.map((r) => r.runId).sort()).toEqual(runIds);
    for (const run of runs) expect(run.status).toBe('succeeded');
    const called = readFileSync(calls, 'utf8')
      .split('\n')
      .filter((l) => l !== '');
    expect([...new Set(called)].sort()).toEqual(runIds);
    expect(called.length - runIds.length).toBeLessThanOrEqual(1);
  });

  it('flujo schedule add, list, pause, resume, trigger, remove; bad input exits 2 writing nothing', async () => {
    const prefix = testPrefix();
    prefixes.push(prefix);
    const flujo = (...args: string[]) => runFlujo(['schedule', ...args], { prefix });
    const added = await flujo('add', 'nightly', JOB, '--cron', '0 2 * * *', '--tz', 'Europe/Paris');
    expect(added.code, added.err).toBe(0);
    expect(added.out).toContain('nightly  active  cron "0 2 * * *" Europe/Paris  plan scheduled');
    const everything = async () => ({
      ...(await readPrefix(redis, `${prefix}:`)),
      ...(await readPrefix(redis, `{${prefix}:q}`)),
      ...(await readPrefix(redis, `{${prefix}:schedules}`)),
    });
    const before = await everything();
    const refused: [string[], RegExp][] = [
      [['add', 'x', JOB, '--cron', '99 * * * *'], /cron: "99 \* \* \* \*" does not parse/],
      [
        ['add', 'x', JOB, '--cron', '* * * * *', '--every', '1000'],
        /cron: give cron or everyMs, not both/,
      ],
      [['add', 'x', JOB, '--every', '1000', '--overlap', 'queue'], /overlap: must be one of/],
      [['add', 'x', JOB, '--cron', '* * * * *', '--tz', 'Nowhere/City'], /tz: unknown time zone/],
      [['add', 'x', JOB, '--every', '1000', '--catchup-window', '10'], /catchupWindowMs: must be/],
      [['add', 'x', JOB], /cron: missing/],
      [['pause', 'nope'], /id: no schedule "nope"/],
      [['frobnicate', 'x'], /unknown schedule command/],
      [
        ['add', 'x', 'test/fixtures/jobs/scheduled-bad.ts', '--every', '1000'],
        /schedules\.nightly: .*cron: "99 2 \* \* \*" does not parse/,
      ],
    ];
    for (const [args, message] of refused) {
      const result = await flujo(...args);
      expect(result.code, args.join(' ')).toBe(2);
      expect(result.err, args.join(' ')).toMatch(message);
    }
    expect(await everything()).toEqual(before);
    const paused = await flujo('pause', 'nightly', '--json');
    expect(JSON.parse(paused.out)).toMatchObject({ id: 'nightly', paused: true, nextFireAt: null });
    const resumed = await flujo('resume', 'nightly', '--json');
    expect(JSON.parse(resumed.out)).toMatchObject({ id: 'nightly', paused: false });
    const triggered = await flujo('trigger', 'nightly', '--json');
    const fire = JSON.parse(triggered.out) as { outcome: string; runId: string; manual: boolean };
    expect(fire).toMatchObject({ outcome: 'started', manual: true });
    expect(fire.runId).toMatch(/^schedule:nightly:manual-\d+$/);
    const listed = await flujo('list');
    expect(listed.out).toContain(`(trigger) started ${fire.runId}`);
    const json = JSON.parse((await flujo('list', '--json')).out) as ScheduleInfo[];
    expect(json.map((s) => [s.id, s.fires.length])).toEqual([['nightly', 1]]);
    expect((await flujo('remove', 'nightly')).code).toBe(0);
    expect((await flujo('list')).out.trim()).toBe('no schedules');
    // The triggered run exists (no worker ran it here).
    expect((await runtimeOn(prefix).list()).map((r) => r.runId)).toEqual([fire.runId]);
  });
});
