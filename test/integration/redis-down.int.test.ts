/**
 * Commands and runtime calls never hang on a Redis that refuses connections, accepts them and
 * never answers, or is paused (SIGSTOP): the `flujo` binary exits 6 with one line, the runtime
 * throws RedisUnavailableError, both within a bound. `flujo run` rides out an outage that
 * starts while a tool call is in flight: it finishes the run or exits 6, every time. A running
 * `flujo worker` waits out an outage, says so in one line when it starts and one when it ends,
 * and goes on.
 *
 * The outage trials repeat FLUJO_OUTAGE_TRIALS times each (10 by default), five at a time, each
 * on a redis-server, port and data directory of its own.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, parsePlan, RedisUnavailableError, type Runtime } from '../../src/index.js';
import { plan as outagePlan } from '../fixtures/jobs/outage.js';
import { runFlujo, startFlujo, type ChildResult } from '../helpers/cli.js';
import { killRedisServer, spawnRedisServer } from '../helpers/redis-server.js';

const OUTAGE = 'test/fixtures/jobs/outage.ts';
const TRIALS = Number(process.env['FLUJO_OUTAGE_TRIALS'] ?? '10');

/** `flujo <args>` with no REDIS_URL: each command names its Redis with `--redis`. */
const flujo = (args: string[], env: Record<string, string> = {}, timeoutMs?: number) =>
  runFlujo(args, { redis: 'none', user: 'tester', env, timeoutMs });

/** The first port the kernel hands out on its own (to `listen(0)` and to client sockets). */
function ephemeralLow(): number {
  try {
    const low = Number(
      readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').split(/\s+/)[0],
    );
    return Number.isInteger(low) && low > 12_000 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

/**
 * `count` distinct loopback ports nothing listens on, all held at once so no two are alike, and
 * below the ephemeral range: while a test's Redis is down, no client socket of this machine is
 * given its port, so nothing else holds it when Redis restarts on it, and a client retrying it
 * never connects to itself (a socket whose own port is the one it dials does, on loopback).
 */
async function refusedPorts(count: number): Promise<number[]> {
  const low = ephemeralLow();
  const servers: Server[] = [];
  while (servers.length < count) {
    const server = createServer();
    const port = 10_000 + Math.floor(Math.random() * (low - 10_000));
    const free = await new Promise<boolean>((resolve) => {
      server.once('error', () => resolve(false));
      server.listen(port, '127.0.0.1', () => resolve(true));
    });
    if (free) servers.push(server);
  }
  const ports = servers.map((server) => (server.address() as { port: number }).port);
  for (const server of servers) await new Promise((r) => server.close(r));
  return ports;
}

/** A loopback port nothing listens on. */
const refusedPort = async (): Promise<number> => (await refusedPorts(1))[0]!;

/** Calls `body` on every item, at most `limit` at a time; resolves once all are done. */
async function eachLimited<T>(
  items: readonly T[],
  limit: number,
  body: (item: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  const lane = async () => {
    while (next < items.length) await body(items[next++]!);
  };
  const lanes = Array.from({ length: Math.min(limit, items.length) }, lane);
  const results = await Promise.allSettled(lanes);
  const failed = results.find((r) => r.status === 'rejected');
  if (failed !== undefined) throw failed.reason;
}

/** A TCP server that accepts connections and never answers; counts the connections. */
async function silentServer(): Promise<{ server: Server; port: number; sockets: Socket[] }> {
  const sockets: Socket[] = [];
  const server = createServer((socket) => {
    sockets.push(socket);
    socket.on('error', () => {});
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as { port: number }).port, sockets };
}

/** A redis-server of the test's own on `port` (a fixed port, so a restart is the same URL). */
const startRedis = (port: number, dir: string): Promise<ChildProcess> =>
  spawnRedisServer(port, dir);
const stopRedis = killRedisServer;

/**
 * Every command that talks to Redis, with arguments that are valid (so only Redis can fail). The
 * long-running ones (`worker`, `ui`) fail too when Redis does not answer as they start; a running
 * worker waits out an outage instead (tested below). `validate`, `init` and `redis stop` never
 * talk to a Redis of the user's.
 */
const COMMANDS: string[][] = [
  ['run', OUTAGE],
  ['resume', 'run-1', OUTAGE],
  ['worker', OUTAGE],
  ['status', 'run-1'],
  ['list'],
  ['events', 'run-1', '--follow'],
  ['trace', 'run-1'],
  ['inspect', 'run-1', '--json'],
  ['approve', 'run-1', 'call', '--by', 'ana'],
  ['reject', 'run-1', 'call', '--by', 'ana'],
  ['skip', 'run-1', 'call', '--reason', 'stuck', '--by', 'ana'],
  ['cancel', 'run-1', '--by', 'ana'],
  ['ledger', 'run-1'],
  ['ledger', 'resolve', 'run-1', 'c1', '--retry'],
  ['usage', 'run-1'],
  ['replay', 'run-1', '--mode', 'reproduce'],
  ['ui', '--port', '0'],
];

/** How many commands of {@link COMMANDS} run at once (each one waits on Redis, not on the CPU). */
const COMMANDS_AT_ONCE = 4;

describe('a Redis that refuses, never answers, or is paused', () => {
  let silent: Awaited<ReturnType<typeof silentServer>>;
  let paused: ChildProcess;
  let pausedPort: number;
  let refused: number;
  const dir = mkdtempSync(join(tmpdir(), 'flujo-down-'));

  beforeAll(async () => {
    silent = await silentServer();
    refused = await refusedPort();
    pausedPort = await refusedPort();
    paused = await startRedis(pausedPort, dir);
    paused.kill('SIGSTOP');
  });

  afterAll(async () => {
    for (const s of silent.sockets) s.destroy();
    silent.server.close();
    await stopRedis(paused);
    rmSync(dir, { recursive: true, force: true });
  });

  const targets = () => ({
    refused: `redis://127.0.0.1:${refused}`,
    silent: `redis://127.0.0.1:${silent.port}`,
    paused: `redis://127.0.0.1:${pausedPort}`,
  });

  for (const kind of ['refused', 'silent', 'paused'] as const) {
    it(`every command exits 6 with one line within 3 s (${kind})`, async () => {
      const url = targets()[kind];
      // The bound is the Redis timeout (1 s) plus what the same command takes to fail without
      // Redis (a bad option, refused before connecting), so that a loaded machine's start-up
      // time does not count; on an idle machine each command ends within 3 s in all. A few
      // commands run at once, each measured against its own baseline.
      await eachLimited(COMMANDS, COMMANDS_AT_ONCE, async (args) => {
        const baseline = await flujo([...args, '--redis', url, '--redis-timeout', 'soon']);
        expect(baseline.code, baseline.err).toBe(2);
        const r = await flujo([...args, '--redis', url, '--redis-timeout', '1000']);
        expect(r.code, `${args.join(' ')}: ${r.err}`).toBe(6);
        // 1.5 s of slack: a loaded machine slows the two commands unevenly.
        expect(r.ms, args.join(' ')).toBeLessThan(baseline.ms + 1000 + 1500);
        const lines = r.err.trim().split('\n');
        expect(lines, args.join(' ')).toHaveLength(1);
        expect(lines[0]).toMatch(new RegExp(`^flujo ${args[0]}: cannot reach Redis at ${url}: `));
        expect(r.out).toBe('');
        // With the default timeout (2 s from the command's launch) the whole command ends within
        // 3 s, unless the machine is so loaded that failing on a bad option alone takes 1 s.
        const d = await flujo([...args, '--redis', url]);
        expect(d.code, `${args.join(' ')}: ${d.err}`).toBe(6);
        expect(d.ms, args.join(' ')).toBeLessThan(baseline.ms < 1000 ? 3000 : baseline.ms + 2500);
      });
    }, 90_000);

    it(`the runtime throws RedisUnavailableError within the timeout (${kind})`, async () => {
      const url = targets()[kind];
      // A runtime over a URL, and one over a client of the caller's with no timeouts of its own.
      const client = new Redis(url, { lazyConnect: true });
      client.on('error', () => {});
      for (const redis of [url, client]) {
        const runtime = createRuntime({ redis, prefix: 'down', redisTimeoutMs: 500 });
        try {
          const calls: [string, () => Promise<unknown>][] = [
            ['status', () => runtime.status('run-1')],
            [
              'start',
              () =>
                runtime.start({ name: 'p', steps: [{ id: 'a', kind: 'operator', operator: 'a' }] }),
            ],
            ['approve', () => runtime.approve('run-1', 'a', { by: 'ana' })],
            ['ledger', () => runtime.ledger('run-1')],
            ['usage', () => runtime.usage('run-1')],
          ];
          for (const [name, call] of calls) {
            const started = performance.now();
            const error = await call().then(
              () => undefined,
              (e: unknown) => e,
            );
            const ms = performance.now() - started;
            expect(error, name).toBeInstanceOf(RedisUnavailableError);
            expect((error as RedisUnavailableError).code).toBe('redis_unavailable');
            expect(ms, name).toBeLessThan(1500);
          }
        } finally {
          await runtime.close();
        }
      }
      client.disconnect();
    }, 60_000);
  }

  it('a bad --redis-timeout is refused before connecting (exit 2)', async () => {
    const r = await flujo([
      'status',
      'run-1',
      '--redis',
      targets().silent,
      '--redis-timeout',
      '2s',
    ]);
    expect(r.code).toBe(2);
    expect(r.err).toContain('--redis-timeout "2s"');
    expect(r.err).toContain('--redis-timeout 5000');
  });

  it('a bad redisTimeoutMs is refused before any connection', () => {
    const before = silent.sockets.length;
    expect(() => createRuntime({ redis: targets().silent, redisTimeoutMs: -1 })).toThrow(
      /redisTimeoutMs must be a whole number of milliseconds/,
    );
    expect(silent.sockets.length).toBe(before);
  });
});

/**
 * Kills the redis-server `first` once `effects` exists (a tool call has started) and starts a new
 * one on the same port and data directory `downMs` later. `restarted` is the new server, once
 * the kill happened; `stop()` ends the watch.
 */
function killWhenToolRuns(
  first: ChildProcess,
  port: number,
  dir: string,
  effects: string,
  downMs: number,
) {
  let restarted: Promise<ChildProcess> | undefined;
  const watcher = setInterval(() => {
    if (restarted !== undefined || !existsSync(effects)) return;
    first.kill('SIGKILL');
    restarted = new Promise((resolve, reject) => {
      setTimeout(() => void startRedis(port, dir).then(resolve, reject), downMs);
    });
  }, 20);
  return {
    get restarted() {
      return restarted;
    },
    stop: () => clearInterval(watcher),
  };
}

/** The lines of the effect file: one per execution of the tool. */
const effectCount = (file: string): number =>
  readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '').length;

describe('flujo run through a Redis outage while a tool call is in flight', () => {
  // One port per trial, all distinct: trials run five at a time (it.concurrent, vitest's default
  // maxConcurrency), each with a redis-server and a data directory of its own, and none may take
  // a port another trial's Redis is down from.
  let ports: number[];
  const portOf = (downMs: number, i: number) => ports[(downMs === 3000 ? 0 : TRIALS) + i - 1]!;

  beforeAll(async () => {
    ports = await refusedPorts(2 * TRIALS + 1);
  });

  /** Runs the outage job; kills Redis once the tool runs, restarts it `downMs` later. */
  async function trial(
    port: number,
    downMs: number,
    extra: string[] = [],
  ): Promise<ChildResult & { effects: number }> {
    const dir = mkdtempSync(join(tmpdir(), 'flujo-outage-'));
    const effects = join(dir, 'effects.txt');
    let server: ChildProcess | undefined = await startRedis(port, dir);
    const kill = killWhenToolRuns(server, port, dir, effects, downMs);
    try {
      const r = await flujo(
        [
          'run',
          OUTAGE,
          '--redis',
          `redis://127.0.0.1:${port}`,
          '--input',
          '{"toolMs":1000}',
          ...extra,
        ],
        { FLUJO_EFFECT_FILE: effects },
        // A command that hangs is stopped (SIGTERM), so that the test fails with its output.
        downMs + 35_000,
      );
      expect(
        kill.restarted,
        `Redis was killed while the tool ran; ${r.out} ${r.err}`,
      ).toBeDefined();
      server = await kill.restarted!.catch((error: unknown) => {
        throw new Error(
          `Redis did not start again on port ${port} (${String(error)}); flujo run exited ${String(r.code)}: ${r.err}`,
        );
      });
      return { ...r, effects: effectCount(effects) };
    } finally {
      kill.stop();
      // A restart still pending (the command failed first) must not outlive the test.
      if (kill.restarted !== undefined) server = await kill.restarted.catch(() => server);
      await stopRedis(server);
      rmSync(dir, { recursive: true, force: true });
    }
  }

  for (const downMs of [3000, 8000]) {
    for (let i = 1; i <= TRIALS; i++) {
      it.concurrent(
        `Redis back after ${downMs / 1000} s (trial ${i}): the run succeeds, one line per outage`,
        async ({ expect }) => {
          const r = await trial(portOf(downMs, i), downMs);
          expect(r.code, r.err).toBe(0);
          expect(r.out).toMatch(/^run \S+ succeeded$/m);
          // One line when Redis went away and one when it came back, whatever the retries.
          expect(r.err.match(/does not answer/g)).toHaveLength(1);
          expect(r.err.match(/answers again/g)).toHaveLength(1);
          expect(r.ms).toBeLessThan(downMs + 20_000);
          expect(r.effects).toBeGreaterThanOrEqual(1);
        },
        60_000,
      );
    }
  }

  // Alone (not concurrent): its bound on the time is tight.
  it('an outage past --redis-outage-limit ends the command with exit 6 and the resume command', async () => {
    const port = ports.at(-1)!;
    const r = await trial(port, 8000, ['--redis-outage-limit', '2000']);
    expect(r.code, r.err).toBe(6);
    const runId = /^run (\S+) /.exec(r.out)?.[1];
    expect(runId).toBeDefined();
    const last = r.err.trim().split('\n').at(-1)!;
    expect(last).toContain('has not answered for 2 s (--redis-outage-limit)');
    expect(last).toContain(`flujo resume ${runId} ${OUTAGE} --redis redis://127.0.0.1:${port}`);
    // The limit, then at most the Redis timeout for the worker and again for the connection.
    expect(r.ms).toBeLessThan(8000 + 5000);
  }, 60_000);
});

describe('flujo worker through a Redis outage', () => {
  it('logs one line when Redis stops answering and one when it is back, finishes the call in flight, and takes new runs', async () => {
    const port = await refusedPort();
    const url = `redis://127.0.0.1:${port}`;
    const dir = mkdtempSync(join(tmpdir(), 'flujo-worker-outage-'));
    const effects = join(dir, 'effects.txt');
    let server: ChildProcess | undefined = await startRedis(port, dir);
    const kill = killWhenToolRuns(server, port, dir, effects, 3000);
    const worker = startFlujo(['worker', OUTAGE, '--redis', url, '--concurrency', '2'], {
      redis: 'none',
      env: { FLUJO_EFFECT_FILE: effects },
      timeoutMs: 60_000,
    });
    // A runtime of the test's own starts runs (the worker has the operators; these never run).
    const stub = { call: () => null, after: () => null };
    const runtimes: Runtime[] = [];
    const open = () => {
      const runtime = createRuntime({ redis: url, operators: stub });
      runtimes.push(runtime);
      return runtime;
    };
    const settle = async (runtime: Runtime, runId: string) => {
      for (let i = 0; i < 300; i++) {
        const { status } = await runtime.status(runId);
        if (status !== 'running') return status;
        await new Promise((r) => setTimeout(r, 100));
      }
      return 'running';
    };
    try {
      for (let i = 0; i < 300 && !worker.out().includes('processing runs'); i++) {
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(worker.out(), worker.err()).toContain('flujo worker: processing runs on');
      // A run whose tool call is in flight when Redis dies; Redis is back 3 s later.
      const before = open();
      const inFlight = await before.start(parsePlan(outagePlan), {
        toolMs: 1000,
      });
      await before.close();
      for (let i = 0; i < 600 && kill.restarted === undefined; i++) {
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(kill.restarted, worker.err()).toBeDefined();
      server = await kill.restarted;
      for (let i = 0; i < 200 && !worker.err().includes('answers again'); i++) {
        await new Promise((r) => setTimeout(r, 50));
      }
      const after = open();
      expect(await settle(after, inFlight.runId), worker.err()).toBe('succeeded');
      // A run started once Redis is back is taken too.
      const next = await after.start(parsePlan(outagePlan), {
        toolMs: 10,
      });
      expect(await settle(after, next.runId), worker.err()).toBe('succeeded');
      expect(effectCount(effects)).toBeGreaterThanOrEqual(2);
      worker.child.kill('SIGTERM');
      const r = await worker.done;
      expect(r.code, r.err).toBe(0);
      // One line per outage, whatever the retries: the worker waits without a limit.
      expect(r.err.match(/does not answer/g), r.err).toHaveLength(1);
      expect(r.err).toMatch(
        new RegExp(
          `flujo: Redis at ${url} does not answer \\(.*\\); waiting for it until it is back`,
        ),
      );
      expect(r.err.match(/answers again/g), r.err).toHaveLength(1);
    } finally {
      kill.stop();
      worker.child.kill('SIGKILL');
      for (const runtime of runtimes) await runtime.close().catch(() => {});
      if (kill.restarted !== undefined) server = await kill.restarted.catch(() => server);
      await stopRedis(server);
      rmSync(dir, { recursive: true, force: true });
    }
  }, 90_000);
});
