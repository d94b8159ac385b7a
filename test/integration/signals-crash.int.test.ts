/**
 * Signals and timers across processes: worker children (test/fixtures/driver-child.ts) SIGKILLed
 * while signals arrive from other processes (the `flujo signal` command, and API senders, one of
 * them killed between its append and its wake-up). What is checked is what the operators really
 * ran (the children's echo file) and what the runs committed.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, runtimeCore, type Runtime } from '../../src/runtime.js';
import { pinnedNode, root, runFlujo, spawnChild } from '../helpers/cli.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';
import { spawnWorkerChild, type WorkerChild } from '../helpers/worker-child.js';
import { killRedisServer, spawnRedisServer } from '../helpers/redis-server.js';

// The `flujo` command uses the default queue name: so do the workers and senders here.
const QUEUE = 'runs';
const SENDER = join(root, 'test', 'fixtures', 'signal-sender.ts');

let redis: Redis;
let prefix: string;
let dir: string;
let effectFile: string;
let rt: Runtime;
const children = new Set<WorkerChild>();
const killed = new Set<number>();

const say = (text: string) => process.stdout.write(`${text}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function waitFor<T>(
  what: string,
  probe: () => Promise<T | undefined>,
  timeoutMs = 60_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

const worker = (o: { sweepMs?: number; url?: string } = {}) =>
  spawnWorkerChild(
    {
      REDIS_URL: o.url ?? redisUrl(),
      FLUJO_PREFIX: prefix,
      QUEUE_NAME: QUEUE,
      EFFECT_FILE: effectFile,
      CONCURRENCY: '8',
      RECOVERY_MS: '1000',
      SWEEP_MS: String(o.sweepMs ?? 1000),
    },
    children,
  );

async function kill(child: WorkerChild): Promise<void> {
  killed.add(child.pid);
  await child.kill();
}

interface Echo {
  runId: string;
  stepId: string;
  attempt: number;
  pid: number;
  deps: Record<string, unknown>;
}

/** What the `echo` operators ran, as their children recorded it. */
function echoes(): Echo[] {
  const file = `${effectFile}.echo`;
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [runId, stepId, attempt, pid, ...rest] = l.split(' ');
      return {
        runId: runId!,
        stepId: stepId!,
        attempt: Number(attempt),
        pid: Number(pid),
        deps: JSON.parse(rest.join(' ')) as Record<string, unknown>,
      };
    });
}

/** A sender process of the runtime API (see test/fixtures/signal-sender.ts). */
function sender(runIds: string[], numbers: number[], killAt = '') {
  return spawnChild(pinnedNode, ['--import', 'tsx', SENDER], {
    env: {
      ...process.env,
      REDIS_URL: redisUrl(),
      FLUJO_PREFIX: prefix,
      QUEUE_NAME: QUEUE,
      RUN_IDS: runIds.join(','),
      RUN_NUMBERS: numbers.join(','),
      SIGNAL_NAME: 'go',
      FLUJO_KILL_AT: killAt,
    },
    timeoutMs: 60_000,
  }).done;
}

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  await redis.quit();
});
beforeEach(async () => {
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-signals-'));
  effectFile = join(dir, 'effects.log');
  rt = createRuntime({ redis: redisUrl(), prefix, queueName: QUEUE });
  killed.clear();
});
afterEach(async () => {
  await Promise.all([...children].map((c) => c.kill()));
  await rt.close();
  await deletePrefix(redis, prefix);
  await deletePrefix(redis, `{${prefix}:q}`);
  await rm(dir, { recursive: true, force: true });
});

const PLAN: PlanInput = {
  name: 'signal-line',
  steps: [
    { id: 'a', kind: 'operator', operator: 'echo' },
    { id: 'w', kind: 'wait', for: { signal: 'go' }, dependsOn: ['a'] },
    { id: 'b', kind: 'operator', operator: 'echo', dependsOn: ['w'] },
  ],
};

describe('signals across processes, workers killed', () => {
  it('50 runs a → wait(signal) → b: every b runs with its own payload, each signal taken once', async () => {
    const RUNS = 50;
    await Promise.all([worker(), worker()]);
    const runIds: string[] = [];
    for (let i = 0; i < RUNS; i++) runIds.push((await rt.start(PLAN, { i })).runId);
    const numbers = runIds.map((_, i) => i);

    // Workers are killed and replaced every 300 ms while the signals arrive.
    // Every 400 ms a worker is killed, and replacements are started (at most three workers, some
    // starting), so that at times no worker runs at all.
    let chaos = true;
    let kills = 0;
    let starting = 0;
    const chaosLoop = (async () => {
      while (chaos) {
        await sleep(400);
        if (!chaos) break;
        const ready = [...children].filter((c) => c.ready);
        const victim = ready[Math.floor(Math.random() * ready.length)];
        if (victim !== undefined && ready.length + starting > 1) {
          await kill(victim);
          kills++;
        }
        if (ready.length + starting < 3) {
          starting++;
          void worker()
            .catch(() => {})
            .finally(() => starting--);
        }
      }
    })();

    let t0: number | undefined;
    try {
      // Runs 0-9: the `flujo signal` command, two at a time (the machine is shared).
      const cli = (async () => {
        for (let i = 0; i < 10; i += 2) {
          const sent = await Promise.all(
            runIds.slice(i, i + 2).map((runId, k) =>
              runFlujo(
                [
                  'signal',
                  runId,
                  'go',
                  '--data',
                  JSON.stringify({ n: i + k }),
                  '--id',
                  `s-${runId}`,
                  '--redis-timeout',
                  '10000',
                ],
                {
                  prefix,
                },
              ),
            ),
          );
          for (const r of sent) expect(r.code, r.err).toBe(0);
        }
      })();
      // Runs 10-39: an API sender.
      const api = sender(runIds.slice(10, 40), numbers.slice(10, 40));
      // Runs 40-49: a sender killed after its first append (run 40's signal is in the inbox, and
      // nothing woke its wait: a worker's sweep or start-up recovery must), then the other nine
      // sent again, with the same ids, by another sender.
      const first = await sender(runIds.slice(40), numbers.slice(40), 'after-signal-append@1');
      expect(first.signal).toBe('SIGKILL');
      const retry = await sender(runIds.slice(41), numbers.slice(41));
      expect(retry.code, retry.err).toBe(0);
      expect((await api).code).toBe(0);
      await cli;

      t0 = Date.now();
      await waitFor('every run to succeed', async () => {
        const statuses = await Promise.all(runIds.map((id) => rt.status(id)));
        return statuses.every((s) => s.status === 'succeeded') ? true : undefined;
      }).catch(async (error: unknown) => {
        for (const id of runIds) {
          const r = await rt.status(id);
          if (r.status === 'succeeded') continue;
          say(
            `${id} ${r.status} ${r.steps.map((s) => `${s.stepId}:${s.status}`).join(' ')} ${JSON.stringify(r.waits)}`,
          );
        }
        throw error;
      });
    } finally {
      chaos = false;
      await chaosLoop;
    }
    // A send again of a delivered signal, after its run ended: its first answer, nothing more.
    const again = await sender([runIds[40]!, runIds[41]!], [40, 41]);
    expect(again.code, again.err).toBe(0);
    // A worker that still runs, for what follows (none may be left by the chaos).
    if (children.size === 0) await worker();
    say(
      `50 signal runs: ${kills} worker kills; all succeeded ${Date.now() - (t0 ?? 0)} ms after the last send`,
    );

    const all = echoes();
    let reruns = 0;
    for (const [i, runId] of runIds.entries()) {
      const bs = all.filter((e) => e.runId === runId && e.stepId === 'b');
      expect(bs.length, runId).toBeGreaterThanOrEqual(1);
      // Every execution of b saw its own run's signal, and only that one.
      for (const b of bs) expect(b.deps).toEqual({ w: { n: i } });
      // A second execution only where the worker that ran the first was killed before its commit.
      for (const b of bs.slice(0, -1)) expect(killed.has(b.pid)).toBe(true);
      reruns += bs.length - 1;
      const events = await runtimeCore(rt).stores.store.readEvents(runId);
      expect(events.filter((e) => e.type === 'signal.taken')).toHaveLength(1);
      expect(events.filter((e) => e.type === 'signal.received')).toHaveLength(1);
      expect(
        events.filter((e) => e.type === 'step.succeeded' && e.data['stepId'] === 'b'),
      ).toHaveLength(1);
      const report = await rt.status(runId);
      expect(report.steps.find((s) => s.stepId === 'w')!.output).toEqual({ n: i });
    }
    say(
      `b executions: ${all.filter((e) => e.stepId === 'b').length} for ${RUNS} runs (${reruns} run again after their worker was killed)`,
    );
  }, 180_000);

  it('a 3 s timer: every worker killed at 1 s and restarted at 2 s; it fires once, not before 3 s', async () => {
    const plan: PlanInput = {
      name: 'timer-line',
      steps: [
        { id: 't', kind: 'wait', for: { durationMs: 3000 } },
        { id: 'b', kind: 'operator', operator: 'echo', dependsOn: ['t'] },
      ],
    };
    await Promise.all([worker({ sweepMs: 500 }), worker({ sweepMs: 500 })]);
    const run = await rt.start(plan, null);
    const waiting = await waitFor('the timer to wait', async () => {
      const r = await rt.status(run.runId);
      return r.waits.length === 1 ? r : undefined;
    });
    const since = waiting.waits[0]!.since;
    expect(waiting.waits[0]!.dueAt).toBe(since + 3000);
    await sleep(Math.max(0, since + 1000 - Date.now()));
    await Promise.all([...children].map((c) => kill(c)));
    await sleep(Math.max(0, since + 2000 - Date.now()));
    await Promise.all([worker({ sweepMs: 500 }), worker({ sweepMs: 500 })]);
    const done = await waitFor('the run to succeed', async () => {
      const r = await rt.status(run.runId);
      return r.status === 'succeeded' ? r : undefined;
    });
    const out = done.steps[0]!.output as { firedAt: string; dueAt: string };
    const firedAt = Date.parse(out.firedAt);
    expect(firedAt).toBeGreaterThanOrEqual(since + 3000);
    say(`3 s timer: fired ${firedAt - since} ms after it started waiting`);
    const bs = echoes().filter((e) => e.stepId === 'b');
    expect(bs).toHaveLength(1);
    const events = await runtimeCore(rt).stores.store.readEvents(run.runId);
    expect(
      events.filter((e) => e.type === 'step.succeeded' && e.data['stepId'] === 't'),
    ).toHaveLength(1);
    expect(events.filter((e) => e.type === 'wait.started')).toHaveLength(1);
  }, 60_000);

  it('a 3 s timer: every worker and Redis (AOF always) killed at 1 s, restarted at 2 s; it fires once, not before 3 s', async () => {
    const port = await freePort();
    const redisDir = join(dir, 'redis');
    await mkdir(redisDir);
    let server: ChildProcess | undefined = await startRedis(port, redisDir);
    const url = `redis://127.0.0.1:${port}`;
    const own = createRuntime({ redis: url, prefix, redisTimeoutMs: 5000 });
    try {
      const plan: PlanInput = {
        name: 'timer-outage',
        steps: [
          { id: 't', kind: 'wait', for: { durationMs: 3000 } },
          { id: 'b', kind: 'operator', operator: 'echo', dependsOn: ['t'] },
        ],
      };
      await Promise.all([worker({ sweepMs: 500, url }), worker({ sweepMs: 500, url })]);
      const run = await own.start(plan, null);
      const waiting = await waitFor('the timer to wait', async () => {
        const r = await own.status(run.runId);
        return r.waits.length === 1 ? r : undefined;
      });
      const since = waiting.waits[0]!.since;
      await sleep(Math.max(0, since + 1000 - Date.now()));
      await Promise.all([...children].map((c) => kill(c)));
      await stopRedis(server);
      server = undefined;
      await sleep(Math.max(0, since + 2000 - Date.now()));
      server = await startRedis(port, redisDir);
      await Promise.all([worker({ sweepMs: 500, url }), worker({ sweepMs: 500, url })]);
      const done = await waitFor('the run to succeed', async () => {
        const r = await own.status(run.runId).catch(() => undefined);
        return r?.status === 'succeeded' ? r : undefined;
      });
      const firedAt = Date.parse((done.steps[0]!.output as { firedAt: string }).firedAt);
      expect(firedAt).toBeGreaterThanOrEqual(since + 3000);
      say(`3 s timer across a Redis restart: fired ${firedAt - since} ms after it started waiting`);
      expect(echoes().filter((e) => e.stepId === 'b' && e.runId === run.runId)).toHaveLength(1);
      const events = await runtimeCore(own).stores.store.readEvents(run.runId);
      expect(
        events.filter((e) => e.type === 'step.succeeded' && e.data['stepId'] === 't'),
      ).toHaveLength(1);
    } finally {
      await Promise.all([...children].map((c) => c.kill()));
      await own.close();
      await stopRedis(server);
    }
  }, 90_000);
});

/** A port no one listens on now. */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  await new Promise((r) => server.close(r));
  return port;
}

/** A redis-server of the test's own on `port`, appending every write to its AOF before answering. */
const startRedis = (port: number, dataDir: string): Promise<ChildProcess> =>
  spawnRedisServer(port, dataDir, ['--appendfsync', 'always', '--save', '']);

/** SIGKILL: the server has no chance to save anything but what its AOF holds. */
const stopRedis = killRedisServer;
