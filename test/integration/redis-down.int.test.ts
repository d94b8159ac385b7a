/**
 * Commands and runtime calls never hang on a Redis that refuses connections, accepts them and
 * never answers, or is paused (SIGSTOP): the `flujo` binary exits 6 with one line, the runtime
 * throws RedisUnavailableError, both within a bound. And `flujo run` rides out an outage that
 * starts while a tool call is in flight: it finishes the run or exits 6, every time.
 *
 * The outage trials repeat FLUJO_OUTAGE_TRIALS times each (2 by default; e.g.
 * `FLUJO_OUTAGE_TRIALS=10 npx vitest run test/integration/redis-down.int.test.ts`).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, RedisUnavailableError } from '../../src/index.js';
import { runFlujo, type ChildResult } from '../helpers/cli.js';
import { findRedisServerBinary } from '../helpers/redis-server.js';

const OUTAGE = 'test/fixtures/jobs/outage.ts';
const TRIALS = Number(process.env['FLUJO_OUTAGE_TRIALS'] ?? '2');

/** `flujo <args>` with no REDIS_URL: each command names its Redis with `--redis`. */
const flujo = (args: string[], env: Record<string, string> = {}) =>
  runFlujo(args, { redis: 'none', user: 'tester', env });

/** A loopback port nothing listens on. */
async function refusedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
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
function startRedis(port: number, dir: string): Promise<ChildProcess> {
  const child = spawn(
    findRedisServerBinary(),
    ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--appendonly', 'yes'],
    { stdio: ['ignore', 'pipe', 'ignore'] },
  );
  return new Promise((resolve, reject) => {
    let seen = '';
    child.stdout.on('data', (d: Buffer) => {
      seen += d.toString();
      if (seen.includes('Ready to accept connections')) resolve(child);
    });
    child.once('exit', (code) => reject(new Error(`redis-server exited with ${String(code)}`)));
  });
}

function stopRedis(child: ChildProcess | undefined): Promise<void> {
  if (child === undefined || child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve();
  }
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGCONT');
    child.kill('SIGKILL');
  });
}

/** Every command that talks to Redis, with arguments that are valid (so only Redis can fail). */
const COMMANDS: string[][] = [
  ['status', 'run-1'],
  ['run', OUTAGE],
  ['events', 'run-1', '--follow'],
  ['approve', 'run-1', 'call', '--by', 'ana'],
  ['ledger', 'run-1'],
  ['ledger', 'resolve', 'run-1', 'c1', '--retry'],
  ['usage', 'run-1'],
];

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
      // time does not count; on an idle machine each command ends within 3 s in all.
      for (const args of COMMANDS) {
        const baseline = await flujo([...args, '--redis', url, '--redis-timeout', 'soon']);
        expect(baseline.code, baseline.err).toBe(2);
        const r = await flujo([...args, '--redis', url, '--redis-timeout', '1000']);
        expect(r.code, `${args.join(' ')}: ${r.err}`).toBe(6);
        expect(r.ms, args.join(' ')).toBeLessThan(baseline.ms + 1000 + 1000);
        const lines = r.err.trim().split('\n');
        expect(lines, args.join(' ')).toHaveLength(1);
        expect(lines[0]).toMatch(new RegExp(`^flujo ${args[0]}: cannot reach Redis at ${url}: `));
        expect(r.out).toBe('');
        // With the default timeout (2 s from the command's launch) the whole command ends within
        // 3 s, unless the machine is so loaded that failing on a bad option alone takes 1 s.
        const d = await flujo([...args, '--redis', url]);
        expect(d.code, `${args.join(' ')}: ${d.err}`).toBe(6);
        expect(d.ms, args.join(' ')).toBeLessThan(baseline.ms < 1000 ? 3000 : baseline.ms + 2500);
      }
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

describe('flujo run through a Redis outage while a tool call is in flight', () => {
  let port: number;
  let dir: string;
  let server: ChildProcess | undefined;

  beforeAll(async () => {
    port = await refusedPort();
  });

  afterAll(async () => {
    await stopRedis(server);
  });

  /** Runs the outage job; kills Redis once the tool runs, restarts it `downMs` later. */
  async function trial(
    downMs: number,
    extra: string[] = [],
  ): Promise<ChildResult & { effects: number }> {
    dir = mkdtempSync(join(tmpdir(), 'flujo-outage-'));
    const effects = join(dir, 'effects.txt');
    server = await startRedis(port, dir);
    const first = server;
    let restarted: Promise<ChildProcess> | undefined;
    const watcher = setInterval(() => {
      if (restarted !== undefined || !existsSync(effects)) return;
      first.kill('SIGKILL');
      restarted = new Promise((resolve, reject) => {
        setTimeout(() => void startRedis(port, dir).then(resolve, reject), downMs);
      });
    }, 20);
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
      );
      expect(restarted, `Redis was killed while the tool ran; ${r.out} ${r.err}`).toBeDefined();
      server = await restarted;
      const count = readFileSync(effects, 'utf8')
        .split('\n')
        .filter((l) => l !== '').length;
      return { ...r, effects: count };
    } finally {
      clearInterval(watcher);
      // A restart still pending (the command failed first) must not outlive the test.
      if (restarted !== undefined) server = await restarted.catch(() => server);
      await stopRedis(server);
      rmSync(dir, { recursive: true, force: true });
    }
  }

  for (const downMs of [3000, 8000]) {
    for (let i = 1; i <= TRIALS; i++) {
      it(`Redis back after ${downMs / 1000} s (trial ${i}): the run succeeds, one line per outage`, async () => {
        const r = await trial(downMs);
        expect(r.code, r.err).toBe(0);
        expect(r.out).toMatch(/^run \S+ succeeded$/m);
        // One line when Redis went away and one when it came back, whatever the retries.
        expect(r.err.match(/does not answer/g)).toHaveLength(1);
        expect(r.err.match(/answers again/g)).toHaveLength(1);
        expect(r.ms).toBeLessThan(downMs + 20_000);
        expect(r.effects).toBeGreaterThanOrEqual(1);
      }, 60_000);
    }
  }

  it('an outage past --redis-outage-limit ends the command with exit 6 and the resume command', async () => {
    const r = await trial(8000, ['--redis-outage-limit', '2000']);
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
