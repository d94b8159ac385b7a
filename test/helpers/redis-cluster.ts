/**
 * A Redis Cluster owned by a test: 3 masters and 3 replicas on free loopback ports, from the
 * machine's `redis-server` (AOF with fsync always, no RDB), created with `redis-cli --cluster
 * create`. Stopped and its data removed by `stop()`.
 */
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { mkdtemp, mkdir, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { existsSync } from 'node:fs';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { findRedisServerBinary } from './redis-server.js';

const run = promisify(execFile);

/** One node of a test cluster. */
export interface ClusterNode {
  port: number;
  pid: number;
  role: 'master' | 'replica';
}

/** A running test cluster. */
export interface TestRedisCluster {
  /** Every node as `{ host, port }`, masters first: the seeds to give `new Cluster(seeds)`. */
  seeds: { host: string; port: number }[];
  /** The cluster URL form: `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…`. */
  url: string;
  nodes: ClusterNode[];
  /** Where its data lives (one folder per node). */
  dataDir: string;
  /**
   * Starts again a node that was killed, on its port with its data (its nodes.conf and AOF): it
   * rejoins the cluster (a master that was failed over comes back as a replica). Resolves once it
   * answers; `nodes` then holds its new pid.
   */
  restart(port: number): Promise<void>;
  stop(): Promise<void>;
}

/** Options of {@link startRedisCluster}. */
export interface TestClusterOptions {
  /** `cluster-node-timeout`: how long a node may not answer before it is failed over. @defaultValue 2000 */
  nodeTimeoutMs?: number;
  /** More `redis-server` arguments for every node. */
  args?: readonly string[];
}

/** `redis-cli` beside the `redis-server` found, else on PATH. */
function findRedisCli(): string {
  const beside = join(dirname(findRedisServerBinary()), 'redis-cli');
  return existsSync(beside) ? beside : 'redis-cli';
}

/** Free loopback ports whose cluster bus ports (port + 10000) are free too. */
async function freePorts(count: number): Promise<number[]> {
  const isFree = (port: number) =>
    new Promise<boolean>((resolve) => {
      const s = createServer();
      s.once('error', () => resolve(false));
      s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
    });
  const ports: number[] = [];
  while (ports.length < count) {
    const port = 20_000 + Math.floor(Math.random() * 35_000);
    if (ports.includes(port) || ports.includes(port + 10_000) || ports.includes(port - 10_000)) {
      continue;
    }
    if ((await isFree(port)) && (await isFree(port + 10_000))) ports.push(port);
  }
  return ports;
}

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 20_000) {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (await check().catch(() => false)) return;
    if (Date.now() > until) throw new Error(`test cluster: timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Starts a 3 masters + 3 replicas cluster on loopback (see the module comment). */
export async function startRedisCluster(
  options: TestClusterOptions = {},
): Promise<TestRedisCluster> {
  const binary = findRedisServerBinary();
  const cli = findRedisCli();
  const dataDir = await mkdtemp(join(tmpdir(), 'flujo-cluster-'));
  const ports = await freePorts(6);
  const children: ChildProcess[] = [];
  const stopAll = async () => {
    await Promise.all(
      children.map(
        (c) =>
          new Promise<void>((resolve) => {
            if (c.exitCode !== null || c.signalCode !== null) return resolve();
            c.once('exit', () => resolve());
            c.kill('SIGKILL');
          }),
      ),
    );
    await rm(dataDir, { recursive: true, force: true });
  };
  const startNode = (port: number): ChildProcess => {
    const dir = join(dataDir, String(port));
    const child = spawn(
      binary,
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--cluster-enabled',
        'yes',
        '--cluster-config-file',
        join(dir, 'nodes.conf'),
        '--cluster-node-timeout',
        String(options.nodeTimeoutMs ?? 2000),
        '--dir',
        dir,
        '--appendonly',
        'yes',
        '--appendfsync',
        'always',
        '--save',
        '',
        // A replica's first sync starts at once (the default waits 5 s for more replicas).
        '--repl-diskless-sync-delay',
        '0',
        '--daemonize',
        'no',
        '--logfile',
        join(dir, 'redis.log'),
        ...(options.args ?? []),
      ],
      { stdio: 'ignore' },
    );
    children.push(child);
    return child;
  };
  try {
    for (const port of ports) {
      await mkdir(join(dataDir, String(port)));
      startNode(port);
    }
    const ping = async (port: number) => {
      const c = new Redis({
        port,
        host: '127.0.0.1',
        lazyConnect: true,
        retryStrategy: () => null,
      });
      c.on('error', () => {});
      try {
        await c.connect();
        return (await c.ping()) === 'PONG';
      } finally {
        c.disconnect();
      }
    };
    await Promise.all(ports.map((p) => waitFor(`port ${p}`, () => ping(p))));
    await run(
      cli,
      [
        '--cluster',
        'create',
        ...ports.map((p) => `127.0.0.1:${p}`),
        '--cluster-replicas',
        '1',
        '--cluster-yes',
      ],
      { timeout: 30_000 },
    );
    const roles = new Map<number, 'master' | 'replica'>();
    await Promise.all(
      ports.map((port) =>
        waitFor(`node ${port} to see the cluster ok`, async () => {
          const c = new Redis({
            port,
            host: '127.0.0.1',
            lazyConnect: true,
            retryStrategy: () => null,
          });
          c.on('error', () => {});
          try {
            await c.connect();
            const info = await c.cluster('INFO');
            if (!info.includes('cluster_state:ok')) return false;
            const replication = await c.info('replication');
            if (replication.includes('role:master')) {
              if (!/connected_slaves:1\b/.test(replication)) return false;
              roles.set(port, 'master');
            } else {
              if (!replication.includes('master_link_status:up')) return false;
              roles.set(port, 'replica');
            }
            return true;
          } finally {
            c.disconnect();
          }
        }),
      ),
    );
    const nodes: ClusterNode[] = ports.map((port, i) => ({
      port,
      pid: children[i]!.pid!,
      role: roles.get(port)!,
    }));
    nodes.sort((a, b) => (a.role === b.role ? 0 : a.role === 'master' ? -1 : 1));
    const seeds = nodes.map((n) => ({ host: '127.0.0.1', port: n.port }));
    return {
      seeds,
      url: `redis+cluster://${seeds.map((s) => `${s.host}:${s.port}`).join(',')}`,
      nodes,
      dataDir,
      async restart(port) {
        const node = nodes.find((n) => n.port === port);
        if (node === undefined) throw new Error(`test cluster: no node on port ${port}`);
        node.pid = startNode(port).pid!;
        await waitFor(`port ${port}`, () => ping(port));
      },
      stop: stopAll,
    };
  } catch (error) {
    await stopAll();
    throw error;
  }
}
