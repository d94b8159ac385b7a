import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { accessSync, constants } from 'node:fs';
import { spawn, type ChildProcess } from 'node:child_process';
import { RedisMemoryServer } from 'redis-memory-server';

/** Finds the machine's `redis-server` on PATH (or `REDISMS_SYSTEM_BINARY`); tests never download one. */
export function findRedisServerBinary(): string {
  const explicit = process.env['REDISMS_SYSTEM_BINARY'];
  if (explicit !== undefined && explicit !== '') return explicit;
  const dirs = (process.env['PATH'] ?? '').split(delimiter).concat(['/usr/bin', '/usr/local/bin']);
  for (const dir of dirs) {
    const candidate = join(dir, 'redis-server');
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // keep looking
    }
  }
  throw new Error(
    'redis-server not found on PATH (nor in /usr/bin or /usr/local/bin): the integration tests ' +
      'and the benches start their own. Install it (Debian or Ubuntu: apt-get install redis-server) or set ' +
      'REDISMS_SYSTEM_BINARY to its path. The unit tests need none: npx vitest run test/unit',
  );
}

/** A redis-server owned by a test: random port, its own data directory, stopped and removed at the end. */
export interface TestRedisServer {
  url: string;
  port: number;
  dataDir: string;
  stop(): Promise<void>;
}

/** Starts a private redis-server from the machine's binary. Extra `args` go on its command line. */
export async function startRedisServer(args: readonly string[] = []): Promise<TestRedisServer> {
  const dataDir = await mkdtemp(join(tmpdir(), 'flujo-redis-'));
  const server = new RedisMemoryServer({
    binary: { systemBinary: findRedisServerBinary() },
    instance: { ip: '127.0.0.1', args: ['--dir', dataDir, ...args] },
  });
  await server.start();
  const port = await server.getPort();
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    dataDir,
    async stop() {
      await server.stop();
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}

/**
 * A redis-server of a test's own on a fixed `port` (so a restart is the same URL), with its data in
 * `dir` and its AOF on; `args` go on its command line too. Resolves once it accepts connections.
 */
export function spawnRedisServer(
  port: number,
  dir: string,
  args: readonly string[] = [],
): Promise<ChildProcess> {
  const child = spawn(
    findRedisServerBinary(),
    ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--appendonly', 'yes', ...args],
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

/**
 * Kills a server of {@link spawnRedisServer} with SIGKILL (after SIGCONT, should it be paused): it
 * keeps only what its AOF holds. Resolves once it exited.
 */
export function killRedisServer(child: ChildProcess | undefined): Promise<void> {
  if (child === undefined || child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve();
  }
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGCONT');
    child.kill('SIGKILL');
  });
}
