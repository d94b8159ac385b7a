/**
 * Schedules on one process: each fire starts one run (its id derived from the schedule and the
 * fire time), overlap policies, pause / resume / remove / trigger, catch-up after a time with no
 * worker, and refused definitions that write nothing. Runs are counted by their ids and by the
 * operator's invocations, not by commits.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InputValidationError, PlanValidationError } from '../../src/errors.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime, type ScheduleInfo } from '../../src/runtime.js';
import { startUi } from '../../src/ui/server.js';
import { JobName } from '../../src/actors/jobs.js';
import { scheduleQueue, scheduleStore, schedulerId } from '../../src/worker/schedule-firing.js';
import { caught } from '../helpers/caught.js';
import { connect, deleteRuntimeKeys, readPrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const plan: PlanInput = {
  name: 'tick',
  steps: [{ id: 'work', kind: 'operator', operator: 'work' }],
};

/** Every operator call: its run and when it began and ended. */
interface Call {
  runId: string;
  start: number;
  end: number;
}

let redis: Redis;
const prefixes: string[] = [];
const opened: Runtime[] = [];

/** A runtime on a fresh prefix whose `work` operator lasts `ms` and logs its calls. */
function runtimeWith(ms: number): { runtime: Runtime; calls: Call[]; prefix: string } {
  const prefix = testPrefix();
  prefixes.push(prefix);
  const calls: Call[] = [];
  const runtime = createRuntime({ redis: redisUrl(), prefix }).operator(
    'work',
    async ({ runId }) => {
      const start = Date.now();
      if (ms > 0) await sleep(ms);
      calls.push({ runId, start, end: Date.now() });
      return { ok: true };
    },
  );
  opened.push(runtime);
  return { runtime, calls, prefix };
}

/** The schedule `id` as listed. */
async function listed(runtime: Runtime, id: string): Promise<ScheduleInfo> {
  const found = (await runtime.schedules()).find((s) => s.id === id);
  if (found === undefined) throw new Error(`schedule ${id} not listed`);
  return found;
}

/** The ids of the runs whose operator was called, each once at most (else a duplicate). */
function runIdsOf(calls: Call[]): string[] {
  return calls.map((c) => c.runId).sort();
}

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  for (const runtime of opened) await runtime.close();
  for (const prefix of prefixes) await deleteRuntimeKeys(prefix);
  redis.disconnect();
});

describe('schedules', () => {
  it('everyMs 300 with two workers for 2 s: one run per fire, its id derived from the fire time', async () => {
    const { runtime, calls } = runtimeWith(0);
    const other = createRuntime({ redis: redisUrl(), prefix: prefixes.at(-1)! }).operator(
      'work',
      ({ runId }) => {
        calls.push({ runId, start: Date.now(), end: Date.now() });
        return { ok: true };
      },
    );
    opened.push(other);
    const workers = [runtime.createWorker(), other.createWorker()];
    await Promise.all(workers.map((w) => w.ready()));
    await runtime.schedule('beat', { everyMs: 300, plan, overlap: 'allow_all' });
    await sleep(2100);
    await runtime.pauseSchedule('beat');
    await sleep(500);
    await Promise.all(workers.map((w) => w.close()));
    const info = await listed(runtime, 'beat');
    const started = info.fires.filter((f) => f.outcome === 'started');
    expect(started.length).toBeGreaterThanOrEqual(5);
    expect(started.length).toBeLessThanOrEqual(8);
    for (const fire of started) {
      expect(fire.at % 300).toBe(0);
      expect(fire.runId).toBe(`schedule:beat:${fire.at}`);
    }
    // Every fire once, and every started fire's run ran its operator once.
    expect(new Set(info.fires.map((f) => f.at)).size).toBe(info.fires.length);
    expect(runIdsOf(calls)).toEqual(started.map((f) => f.runId!).sort());
    const runs = await runtime.list({ plan: 'tick' });
    expect(runs.map((r) => r.runId).sort()).toEqual(started.map((f) => f.runId!).sort());
  });

  it("overlap 'skip' with a 1 s operator: skipped fires recorded, never two runs at once", async () => {
    const { runtime, calls } = runtimeWith(1000);
    const worker = runtime.createWorker();
    await worker.ready();
    await runtime.schedule('slow', { everyMs: 300, plan, overlap: 'skip' });
    await sleep(3200);
    await runtime.pauseSchedule('slow');
    await sleep(1300);
    await worker.close();
    const info = await listed(runtime, 'slow');
    const started = info.fires.filter((f) => f.outcome === 'started');
    const skipped = info.fires.filter((f) => f.outcome === 'skipped');
    expect(started.length).toBeGreaterThanOrEqual(2);
    expect(started.length).toBeLessThanOrEqual(4);
    expect(skipped.length).toBeGreaterThanOrEqual(5);
    for (const s of skipped)
      expect(s.reason).toMatch(/previous run schedule:slow:\d+ is still going/);
    expect(runIdsOf(calls)).toEqual(started.map((f) => f.runId!).sort());
    const sorted = [...calls].sort((a, b) => a.start - b.start);
    for (let i = 1; i < sorted.length; i++) {
      expect(sorted[i]!.start).toBeGreaterThanOrEqual(sorted[i - 1]!.end);
    }
  });

  it("overlap 'buffer_one': one fire waits and starts when the previous run ends", async () => {
    const { runtime, calls } = runtimeWith(700);
    const worker = runtime.createWorker();
    await worker.ready();
    await runtime.schedule('buf', { everyMs: 300, plan, overlap: 'buffer_one' });
    await sleep(2500);
    await runtime.pauseSchedule('buf');
    await sleep(2500);
    await worker.close();
    const info = await listed(runtime, 'buf');
    const started = info.fires.filter((f) => f.outcome === 'started');
    const skipped = info.fires.filter((f) => f.outcome === 'skipped');
    expect(info.fires.filter((f) => f.outcome === 'buffered')).toEqual([]);
    expect(started.length).toBeGreaterThanOrEqual(3);
    expect(skipped.length).toBeGreaterThanOrEqual(2);
    expect(runIdsOf(calls)).toEqual(started.map((f) => f.runId!).sort());
    const sorted = [...calls].sort((a, b) => a.start - b.start);
    for (let i = 1; i < sorted.length; i++) {
      expect(sorted[i]!.start).toBeGreaterThanOrEqual(sorted[i - 1]!.end);
    }
    // A started fire that waited began after its fire time's next one.
    expect(started.some((f) => f.decidedAt - f.at > 300)).toBe(true);
  });

  it('pause, resume, trigger and remove', async () => {
    const { runtime, calls, prefix } = runtimeWith(0);
    const worker = runtime.createWorker();
    await worker.ready();
    const defined = await runtime.schedule('p', { cron: '0 0 1 1 *', plan, input: { n: 1 } });
    expect(defined.paused).toBe(false);
    expect(defined.nextFireAt).toBeGreaterThan(Date.now());
    const paused = await runtime.pauseSchedule('p');
    expect(paused.paused).toBe(true);
    expect(paused.nextFireAt).toBeNull();
    // A redefinition keeps it paused.
    expect((await runtime.schedule('p', { cron: '0 0 1 1 *', plan })).paused).toBe(true);
    const fire = await runtime.triggerSchedule('p');
    expect(fire).toMatchObject({ outcome: 'started', manual: true });
    expect(fire.runId).toBe(`schedule:p:${fire.key}`);
    const run = await runtime.attach(fire.runId!);
    expect((await run.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
    const resumed = await runtime.resumeSchedule('p');
    expect(resumed.paused).toBe(false);
    expect(resumed.nextFireAt).toBeGreaterThan(Date.now());
    expect(resumed.fires.map((f) => f.key)).toEqual([fire.key]);
    await runtime.removeSchedule('p');
    expect(await runtime.schedules()).toEqual([]);
    expect(await readPrefix(redis, `{${prefix}:schedules}`)).toEqual({});
    const q = runtime.core.queues.queue;
    expect(await q.getJobSchedulers()).toEqual([]);
    for (const call of [runtime.pauseSchedule('p'), runtime.triggerSchedule('p')]) {
      const error = await caught(call);
      expect(error).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues[0]!.path).toBe('id');
    }
    await worker.close();
    expect(calls.map((c) => c.runId)).toEqual([fire.runId]);
  });

  it('after a time with no worker: fires within catchupWindowMs run once each, older ones are missed', async () => {
    const { runtime, calls } = runtimeWith(0);
    await runtime.schedule('late', {
      everyMs: 300,
      plan,
      overlap: 'allow_all',
      catchupWindowMs: 1000,
    });
    await sleep(3000);
    const back = Date.now();
    const worker = runtime.createWorker();
    await worker.ready();
    await runtime.pauseSchedule('late');
    await sleep(500);
    await worker.close();
    const info = await listed(runtime, 'late');
    const missed = info.fires.filter((f) => f.outcome === 'missed');
    const started = info.fires.filter((f) => f.outcome === 'started');
    expect(missed.length).toBeGreaterThanOrEqual(5);
    expect(started.length).toBeGreaterThanOrEqual(3);
    for (const f of missed) expect(f.at).toBeLessThan(back - 1000 + 300);
    for (const f of started) expect(f.at).toBeGreaterThanOrEqual(back - 1000 - 300);
    // Every fire of the time with no worker is recorded, once, on the every-300-ms grid.
    const times = info.fires.map((f) => f.at).sort((a, b) => a - b);
    for (let i = 1; i < times.length; i++) expect(times[i]! - times[i - 1]!).toBe(300);
    expect(runIdsOf(calls)).toEqual(started.map((f) => f.runId!).sort());
  });

  it("a BullMQ job scheduler whose jobs drift off the rule's grid fires on the grid only", async () => {
    // A worker that upserts the job scheduler late (after the start time it computed) gets jobs
    // named by BullMQ's own clock, off the every-1-s grid by up to a second. Such a job time is
    // no fire of the schedule: it only makes the worker catch up the fires due by then.
    const { runtime, calls } = runtimeWith(0);
    await runtime.schedule('drift', { everyMs: 1000, plan, overlap: 'allow_all' });
    const off = Math.floor(Date.now() / 1000) * 1000 + 1000 + 437;
    const queue = scheduleQueue(runtime.core, {});
    await queue.removeJobScheduler(schedulerId('drift'));
    await queue.upsertJobScheduler(
      schedulerId('drift'),
      { every: 1000, startDate: off },
      { name: JobName.schedule, data: { scheduleId: 'drift' } },
    );
    const worker = runtime.createWorker();
    await worker.ready();
    await sleep(3600);
    await runtime.pauseSchedule('drift');
    await sleep(300);
    await worker.close();
    const info = await listed(runtime, 'drift');
    const started = info.fires.filter((f) => f.outcome === 'started');
    expect(started.length).toBeGreaterThanOrEqual(3);
    expect(started.length).toBeLessThanOrEqual(5);
    for (const fire of info.fires) expect(fire.at % 1000).toBe(0);
    expect(runIdsOf(calls)).toEqual(started.map((f) => f.runId!).sort());
  });

  it('a redefinition keeps the last fire handled, unless its rule changed', async () => {
    const { runtime } = runtimeWith(0);
    const store = scheduleStore(runtime.core);
    await runtime.schedule('r', { cron: '0 0 1 1 *', plan });
    const first = (await store.state('r')).last;
    await sleep(20);
    await runtime.schedule('r', { cron: '0 0 1 1 *', plan, input: { n: 2 } });
    expect((await store.state('r')).last).toBe(first);
    const changed = Date.now();
    await runtime.schedule('r', { everyMs: 60_000, plan });
    expect((await store.state('r')).last).toBeGreaterThanOrEqual(changed);
    expect((await listed(runtime, 'r')).input).toBeNull();
  });

  it('a fire whose start the runtime refuses is recorded failed, with the reason, and frees the schedule', async () => {
    const { runtime } = runtimeWith(0);
    const needsFallback: PlanInput = {
      name: 'fb',
      steps: [{ id: 'work', kind: 'operator', operator: 'work', fallback: { operator: 'spare' } }],
    };
    await runtime.schedule('fb', { cron: '0 0 1 1 *', plan: needsFallback });
    const fire = await runtime.triggerSchedule('fb');
    expect(fire.outcome).toBe('failed');
    const info = await listed(runtime, 'fb');
    expect(info.fires).toHaveLength(1);
    expect(info.fires[0]).toMatchObject({ key: fire.key, outcome: 'failed' });
    expect(info.fires[0]!.reason).toContain('no operator "spare" is registered');
    expect(info.lastRunId).toBeNull();
    expect(await runtime.list()).toEqual([]);
  });

  it('the web view lists the schedules with their newest fires, each run linked', async () => {
    const { runtime } = runtimeWith(0);
    const ui = await startUi(runtime, { port: 0 });
    try {
      const empty = await (await fetch(`${ui.url}schedules`)).text();
      expect(empty).toContain('No schedules.');
      await runtime.schedule('morning', { cron: '0 7 * * 1-5', tz: 'Europe/Paris', plan });
      await runtime.schedule('often', { everyMs: 60_000, plan, overlap: 'allow_all' });
      await runtime.pauseSchedule('often');
      const fire = await runtime.triggerSchedule('morning');
      const response = await fetch(`${ui.url}schedules`);
      expect(response.status).toBe(200);
      const html = await response.text();
      expect(html).toContain('<a href="/schedules">schedules</a>');
      const rows = html.split('<tr data-schedule=').slice(1);
      expect(rows.map((r) => r.slice(1, r.indexOf('"', 1)))).toEqual(['morning', 'often']);
      expect(rows[0]).toContain('cron <span class="mono">0 7 * * 1-5</span> Europe/Paris');
      expect(rows[0]).toContain('data-status="active"');
      expect(rows[0]).toContain(
        `<a class="mono" href="/runs/${encodeURIComponent(fire.runId!)}">${fire.runId}</a>`,
      );
      expect(rows[0]).toContain('(trigger)');
      expect(rows[1]).toContain('every 60000 ms');
      expect(rows[1]).toContain('data-status="paused"');
    } finally {
      await ui.close();
    }
  });

  it('a cron schedule (every second, in a time zone): missed fires after a time with no worker, then each second once', async () => {
    const { runtime, calls } = runtimeWith(0);
    await runtime.schedule('secs', {
      cron: '* * * * * *',
      tz: 'Asia/Kolkata',
      plan,
      overlap: 'allow_all',
      catchupWindowMs: 1500,
    });
    await sleep(3500);
    const back = Date.now();
    const worker = runtime.createWorker();
    await worker.ready();
    await sleep(2200);
    await runtime.pauseSchedule('secs');
    const until = Date.now();
    await sleep(500);
    await worker.close();
    const info = await listed(runtime, 'secs');
    const times = info.fires.map((f) => f.at).sort((a, b) => a - b);
    for (const t of times) expect(t % 1000).toBe(0);
    for (let i = 1; i < times.length; i++) expect(times[i]! - times[i - 1]!).toBe(1000);
    expect(times.at(-1)!).toBeGreaterThan(until - 2000);
    const missed = info.fires.filter((f) => f.outcome === 'missed');
    const started = info.fires.filter((f) => f.outcome === 'started');
    expect(missed.length).toBeGreaterThanOrEqual(1);
    for (const f of missed) expect(f.at).toBeLessThan(back - 1500 + 1000);
    expect(started.length).toBeGreaterThanOrEqual(3);
    expect(missed.length + started.length).toBe(info.fires.length);
    expect(runIdsOf(calls)).toEqual(started.map((f) => f.runId!).sort());
  });

  it('a refused definition names the field and writes nothing', async () => {
    const { runtime, prefix } = runtimeWith(0);
    await runtime.schedule('kept', { cron: '0 0 1 1 *', plan });
    const everything = async () => ({
      ...(await readPrefix(redis, `${prefix}:`)),
      ...(await readPrefix(redis, `{${prefix}:q}`)),
      ...(await readPrefix(redis, `{${prefix}:schedules}`)),
    });
    const before = await everything();
    const cases: [string, unknown, string, RegExp][] = [
      ['a', { cron: 'every day', plan }, 'cron', /5 .* or 6/],
      ['a', { cron: '61 * * * *', plan }, 'cron', /does not parse/],
      ['a', { cron: '* * * * *', everyMs: 1000, plan }, 'cron', /not both/],
      ['a', { plan }, 'cron', /missing/],
      ['a', { cron: '* * * * *', tz: 'Mars/Base', plan }, 'tz', /unknown time zone/],
      ['a', { everyMs: 50, plan }, 'everyMs', /at least 100/],
      ['a', { everyMs: 1000, plan, overlap: 'queue' }, 'overlap', /skip.*buffer_one.*allow_all/],
      ['a', { everyMs: 1000, plan, catchupWindowMs: -1 }, 'catchupWindowMs', /at least 1000/],
      ['a', { everyMs: 1000 }, 'plan', /missing/],
      ['a', { everyMs: 1000, plan, input: { f: () => 1 } }, 'input.f', /./],
      ['a', { everyMs: 1000, plan, every: 5 }, 'every', /unknown option/],
      ['no spaces', { everyMs: 1000, plan }, 'id', /letters, digits/],
    ];
    for (const [id, options, path, message] of cases) {
      const error = await caught(runtime.schedule(id, options as never));
      expect(error, path).toBeInstanceOf(InputValidationError);
      const issue = (error as InputValidationError).issues.find((i) => i.path === path);
      expect(issue?.message, path).toMatch(message);
    }
    const badPlan = await caught(
      runtime.schedule('a', { everyMs: 1000, plan: { name: 'x' } as never }),
    );
    expect(badPlan).toBeInstanceOf(PlanValidationError);
    expect(await everything()).toEqual(before);
    expect((await runtime.schedules()).map((s) => s.id)).toEqual(['kept']);
  });
});
