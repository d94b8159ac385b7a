import { spawn, type ChildProcess } from 'node:child_process';
import {
  accessSync,
  closeSync,
  constants,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { delimiter, dirname, join, resolve } from 'node:path';
import { Redis } from 'ioredis';
import { RedisUnavailableError } from '../errors.js';

/**
 * The project a process run in `cwd` belongs to: the nearest folder up that has a `.flujo`
 * folder, else the nearest that has a package.json, else `cwd` itself. Its `.flujo` holds the
 * embedded Redis and the jobs' data, so every subfolder of a project (the `flujo` command and
 * code that calls {@link ensureEmbeddedRedis}) uses the same ones.
 */
export function projectRoot(cwd: string = process.cwd()): string {
  let withPackage: string | undefined;
  for (let dir = resolve(cwd); ; dir = dirname(dir)) {
    if (existsSync(join(dir, '.flujo'))) return dir;
    if (withPackage === undefined && existsSync(join(dir, 'package.json'))) withPackage = dir;
    if (dirname(dir) === dir) return withPackage ?? resolve(cwd);
  }
}

/**
 * The embedded server's data directory for a process run in `cwd`: `.flujo/redis` of its
 * `projectRoot`.
 */
export const embeddedDataDir = (cwd: string = process.cwd()): string =>
  join(projectRoot(cwd), '.flujo', 'redis');

/** Options of {@link startEmbeddedRedis} and {@link ensureEmbeddedRedis}. */
export interface EmbeddedRedisOptions {
  /**
   * Where Redis keeps its append-only file. @defaultValue `.flujo/redis` of the project of `cwd`
   * (see `projectRoot`), as the `flujo` command does
   */
  dataDir?: string;
  /** The folder whose project is used when `dataDir` is not given. @defaultValue `process.cwd()` */
  cwd?: string;
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

/** A detached redis-server serving a data directory; it outlives the process that started it. */
export interface DetachedRedis {
  url: string;
  port: number;
  pid: number;
  dataDir: string;
  /** True when this call started it; false when a running one was reused. */
  started: boolean;
}

/** What `<dataDir>/server.json` records about the detached server of a data directory. */
export interface ServerInfo {
  pid: number;
  port: number;
}

/** The file that records the detached server of `dataDir`. */
export const SERVER_FILE = 'server.json';

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

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function oneShotClient(url: string, connectTimeout: number): Redis {
  const client = new Redis(url, {
    lazyConnect: true,
    connectTimeout,
    // A server that accepts connections and never answers (or is paused) fails in time too.
    commandTimeout: connectTimeout,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    retryStrategy: () => null,
  });
  client.on('error', () => {}); // refused while the server starts: expected, surfaced by callers
  return client;
}

async function waitForPing(url: string, child: ChildProcess, timeoutMs: number): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  let lastError: unknown;
  while (performance.now() < deadline) {
    if (child.exitCode !== null) break;
    const client = oneShotClient(url, 1000);
    try {
      await client.connect();
      if ((await client.ping()) === 'PONG') return;
    } catch (err) {
      lastError = err;
    } finally {
      client.disconnect();
    }
    await sleep(25);
  }
  throw new RedisUnavailableError(
    `The embedded redis-server did not answer at ${url} (exit code ${String(child.exitCode)}).`,
    { cause: lastError },
  );
}

function serverArgs(port: number, dataDir: string, options: EmbeddedRedisOptions): string[] {
  return [
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
}

/** Spawns redis-server on a free port and waits for its PING. */
async function spawnServer(
  dataDir: string,
  options: EmbeddedRedisOptions,
  detached: boolean,
): Promise<{ child: ChildProcess; port: number; url: string }> {
  const binary = findBinary(options.binary);
  const port = await freePort();
  const child = spawn(binary, serverArgs(port, dataDir, options), { stdio: 'ignore', detached });
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
  if (detached) child.unref();
  const url = `redis://127.0.0.1:${port}`;
  try {
    await waitForPing(url, child, options.startTimeoutMs ?? 10_000);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  return { child, port, url };
}

/**
 * Starts a private `redis-server` on a free loopback port with AOF on, its data in `dataDir`, so
 * that a run killed with its process resumes from disk with no set-up. The server is a child of
 * this process: stop it with `stop()`. When a detached server (see {@link ensureEmbeddedRedis})
 * already serves `dataDir`, that one is used instead and `stop()` leaves it running: two servers
 * must never share one append-only file.
 */
export async function startEmbeddedRedis(
  options: EmbeddedRedisOptions = {},
): Promise<EmbeddedRedis> {
  const dataDir = resolve(options.dataDir ?? embeddedDataDir(options.cwd));
  mkdirSync(dataDir, { recursive: true });
  const running = await findDetachedRedis(dataDir);
  if (running !== null) {
    return {
      url: running.url,
      port: running.port,
      dataDir,
      pid: running.pid,
      stop: async () => {},
    };
  }
  const { child, port, url } = await spawnServer(dataDir, options, false);
  return {
    url,
    port,
    dataDir,
    pid: child.pid ?? -1,
    async stop() {
      if (child.exitCode !== null) return;
      const exited = new Promise<void>((r) => child.once('exit', () => r()));
      await shutdown(url);
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    },
  };
}

async function shutdown(url: string): Promise<void> {
  const client = oneShotClient(url, 2000);
  try {
    await client.connect();
    await client.call('SHUTDOWN');
  } catch {
    // SHUTDOWN closes the connection before answering.
  } finally {
    client.disconnect();
  }
}

/** Reads `<dataDir>/server.json`, or null when there is none (or it is unreadable). */
export function readServerInfo(dataDir: string): ServerInfo | null {
  try {
    const info = JSON.parse(readFileSync(join(resolve(dataDir), SERVER_FILE), 'utf8')) as unknown;
    if (typeof info !== 'object' || info === null) return null;
    const { pid, port } = info as Record<string, unknown>;
    if (typeof pid !== 'number' || typeof port !== 'number') return null;
    return { pid, port };
  } catch {
    return null;
  }
}

function samePath(a: string, b: string): boolean {
  try {
    return realpathSync(a) === realpathSync(b);
  } catch {
    return resolve(a) === resolve(b);
  }
}

/**
 * The detached server recorded in `<dataDir>/server.json`, if it answers PING and serves that very
 * directory (a port reused by another server does not count); otherwise null.
 */
export async function findDetachedRedis(
  dataDir: string,
): Promise<Omit<DetachedRedis, 'started'> | null> {
  const dir = resolve(dataDir);
  const info = readServerInfo(dir);
  if (info === null) return null;
  const url = `redis://127.0.0.1:${info.port}`;
  const client = oneShotClient(url, 1000);
  try {
    await client.connect();
    if ((await client.ping()) !== 'PONG') return null;
    const reply = (await client.call('CONFIG', 'GET', 'dir')) as string[];
    if (reply[1] === undefined || !samePath(reply[1], dir)) return null;
    return { url, port: info.port, pid: info.pid, dataDir: dir };
  } catch {
    return null;
  } finally {
    client.disconnect();
  }
}

function tryLock(path: string, staleMs: number): boolean {
  try {
    closeSync(openSync(path, 'wx'));
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    try {
      if (Date.now() - statSync(path).mtimeMs > staleMs) rmSync(path, { force: true });
    } catch {
      // removed meanwhile
    }
    return false;
  }
}

/**
 * The redis-server of `dataDir` (AOF on), started DETACHED when none answers, so that it outlives
 * this process: the next process reuses it (`<dataDir>/server.json` records `{ pid, port }`), and a
 * process killed with SIGKILL loses nothing that Redis acknowledged. When the recorded server is
 * gone, a new one starts on the same directory and replays its append-only file. Concurrent
 * callers start at most one server (a lock file in `dataDir`). Stop it with
 * `stopEmbeddedRedis`. Without `dataDir` it is `.flujo/redis` of the project (see
 * `projectRoot`), from any of its subfolders: the server of the `flujo` command.
 */
export async function ensureEmbeddedRedis(
  options: EmbeddedRedisOptions = {},
): Promise<DetachedRedis> {
  const dataDir = resolve(options.dataDir ?? embeddedDataDir(options.cwd));
  mkdirSync(dataDir, { recursive: true });
  const timeoutMs = options.startTimeoutMs ?? 10_000;
  const lockPath = join(dataDir, 'start.lock');
  const deadline = performance.now() + timeoutMs + 5000;
  for (;;) {
    const running = await findDetachedRedis(dataDir);
    if (running !== null) return { ...running, started: false };
    if (tryLock(lockPath, timeoutMs + 5000)) break;
    if (performance.now() > deadline) {
      throw new RedisUnavailableError(
        `Another process is starting the embedded redis-server of ${dataDir} and it did not come up; remove ${lockPath} if no flujo command is running, then try again.`,
        { retryable: false },
      );
    }
    await sleep(50);
  }
  try {
    const again = await findDetachedRedis(dataDir);
    if (again !== null) return { ...again, started: false };
    const { child, port, url } = await spawnServer(dataDir, options, true);
    const pid = child.pid ?? -1;
    const tmp = join(dataDir, `${SERVER_FILE}.${process.pid}.tmp`);
    writeFileSync(tmp, `${JSON.stringify({ pid, port } satisfies ServerInfo)}\n`);
    renameSync(tmp, join(dataDir, SERVER_FILE));
    return { url, port, pid, dataDir, started: true };
  } finally {
    rmSync(lockPath, { force: true });
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  try {
    // An exited process that nobody reaped yet (a zombie) is not running.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return true; // no procfs: trust kill(pid, 0)
  }
}

/**
 * Stops the detached server of `dataDir` (SHUTDOWN, so the AOF is flushed; SIGKILL if it has not
 * exited after `timeoutMs`) and removes `server.json`. Returns what was stopped, or null when no
 * server of that directory was running.
 */
export async function stopEmbeddedRedis(
  dataDir: string = embeddedDataDir(),
  timeoutMs = 5000,
): Promise<ServerInfo | null> {
  const dir = resolve(dataDir);
  const running = await findDetachedRedis(dir);
  if (running === null) {
    rmSync(join(dir, SERVER_FILE), { force: true });
    return null;
  }
  await shutdown(running.url);
  const deadline = performance.now() + timeoutMs;
  while (running.pid > 0 && alive(running.pid) && performance.now() < deadline) await sleep(25);
  if (running.pid > 0 && alive(running.pid)) {
    try {
      process.kill(running.pid, 'SIGKILL');
    } catch {
      // exited meanwhile
    }
  }
  rmSync(join(dir, SERVER_FILE), { force: true });
  return { pid: running.pid, port: running.port };
}
