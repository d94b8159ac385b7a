import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants, mkdirSync } from 'node:fs';
import { createServer } from 'node:net';
import { delimiter, join, resolve } from 'node:path';
import { Redis } from 'ioredis';
import { RedisUnavailableError } from '../errors.js';

/** Options of {@link startEmbeddedRedis}. */
export interface EmbeddedRedisOptions {
  /** Where Redis keeps its append-only file. @defaultValue `.flujo/redis` of the working directory */
  dataDir?: string;
  /** `appendfsync` policy: `always` survives a Redis crash with no loss. @defaultValue `everysec` */
  appendfsync?: 'always' | 'everysec' | 'no';
  /** The `redis-server` binary. @defaultValue `FLUJO_REDIS_SERVER`, else `redis-server` on PATH */
  binary?: string;
  /** How long to wait for the server to answer PING. @defaultValue 10000 */
  startTimeoutMs?: number;
}

/** A redis-server started by this process, with AOF persistence in its data directory. */
export interface EmbeddedRedis {
  url: string;
  port: number;
  dataDir: string;
  pid: number;
  /** Stops the server (SHUTDOWN, so the AOF is flushed). */
  stop(): Promise<void>;
}

function findBinary(explicit: string | undefined): string {
  const named = explicit ?? process.env['FLUJO_REDIS_SERVER'];
  if (named !== undefined && named !== '') return named;
  for (const dir of (process.env['PATH'] ?? '')
    .split(delimiter)
    .concat('/usr/bin', '/usr/local/bin')) {
    const candidate = join(dir, 'redis-server');
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  throw new RedisUnavailableError(
    'No redis-server binary found for the embedded Redis. Install Redis (Debian: apt-get install redis-server), set FLUJO_REDIS_SERVER to its path, or pass a Redis URL (--redis or REDIS_URL).',
    { retryable: false },
  );
}

function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once('error', fail);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() =>
        typeof addr === 'object' && addr !== null ? ok(addr.port) : fail(new Error('no port')),
      );
    });
  });
}

async function waitForPing(url: string, child: ChildProcess, timeoutMs: number): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  let lastError: unknown;
  while (performance.now() < deadline) {
    if (child.exitCode !== null) break;
    const client = new Redis(url, {
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
    });
    client.on('error', () => {}); // refused while the server starts: expected, retried below
    try {
      await client.connect();
      if ((await client.ping()) === 'PONG') return;
    } catch (err) {
      lastError = err;
    } finally {
      client.disconnect();
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new RedisUnavailableError(
    `The embedded redis-server did not answer at ${url} (exit code ${String(child.exitCode)}).`,
    { cause: lastError },
  );
}

/**
 * Starts a private `redis-server` on a free loopback port with AOF on, its data in `dataDir`, so
 * that a run killed with its process resumes from disk with no set-up. The server is a child of
 * this process: stop it with `stop()`.
 */
export async function startEmbeddedRedis(
  options: EmbeddedRedisOptions = {},
): Promise<EmbeddedRedis> {
  const dataDir = resolve(options.dataDir ?? join('.flujo', 'redis'));
  mkdirSync(dataDir, { recursive: true });
  const binary = findBinary(options.binary);
  const port = await freePort();
  const args = [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--dir',
    dataDir,
    '--appendonly',
    'yes',
    '--appendfsync',
    options.appendfsync ?? 'everysec',
    '--save',
    '',
    '--daemonize',
    'no',
    '--logfile',
    join(dataDir, 'redis.log'),
  ];
  const child = spawn(binary, args, { stdio: 'ignore' });
  await new Promise<void>((ok, fail) => {
    child.once('spawn', () => ok());
    child.once('error', (err) =>
      fail(
        new RedisUnavailableError(`Could not start ${binary}: ${err.message}`, {
          cause: err,
          retryable: false,
        }),
      ),
    );
  });
  const url = `redis://127.0.0.1:${port}`;
  try {
    await waitForPing(url, child, options.startTimeoutMs ?? 10_000);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  return {
    url,
    port,
    dataDir,
    pid: child.pid ?? -1,
    async stop() {
      if (child.exitCode !== null) return;
      const exited = new Promise<void>((r) => child.once('exit', () => r()));
      const client = new Redis(url, { maxRetriesPerRequest: 0, retryStrategy: () => null });
      client.on('error', () => {});
      try {
        await client.call('SHUTDOWN');
      } catch {
        // SHUTDOWN closes the connection before answering.
      } finally {
        client.disconnect();
      }
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    },
  };
}
