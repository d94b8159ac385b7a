/**
 * Where the CLI's Redis is: `--redis URL`, else `REDIS_URL`, else the embedded redis-server of
 * `.flujo/redis` in the working directory (started detached, so it outlives the command). Every
 * connection is probed first and fails fast (connect timeout 2 s, no endless retries).
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { RunNotFoundError } from '../errors.js';
import { createKeys, isRunId, type Keys } from '../persistence/keys.js';
import { ensureEmbeddedRedis, type DetachedRedis } from '../persistence/embedded-redis.js';
import { createRuntime, type Runtime } from '../runtime.js';
import { createCliLogger } from './log.js';
import type { JobModule } from './job-module.js';
import { CliError, ExitCode, badInput } from './exit-codes.js';

/** How to reach Redis, from the command line and the environment. */
export interface RedisChoice {
  /** `--redis URL`. */
  redis?: string | undefined;
  /** `--prefix P`, else `FLUJO_PREFIX`. */
  prefix?: string | undefined;
}

/** An open connection to the CLI's Redis. */
export interface Connection {
  /** The server, for messages (no credentials). */
  target: string;
  prefix: string;
  keys: Keys;
  redis: Redis;
  /** Set when the embedded server is used. */
  embedded: DetachedRedis | undefined;
  /** The runtime over this connection, with the job module's operators and tools (created once). */
  runtime(job?: JobModule): Runtime;
  /** Throws `RunNotFoundError` (nothing written) unless the run exists. */
  requireRun(runId: string): Promise<void>;
  close(): Promise<void>;
}

/** The embedded server's data directory for `cwd`. */
export const embeddedDataDir = (cwd: string): string => join(cwd, '.flujo', 'redis');

let currentTarget = 'Redis';
/** The server the CLI talks to (for the message of a lost connection). */
export const redisTarget = (): string => currentTarget;

/** The key prefix: `--prefix`, else `FLUJO_PREFIX`, else `flujo`; checked before any connection. */
export function resolvePrefix(choice: RedisChoice, env: NodeJS.ProcessEnv): string {
  const prefix = choice.prefix ?? (env['FLUJO_PREFIX'] || undefined) ?? 'flujo';
  if (prefix === '' || prefix.includes('{') || prefix.includes('}')) {
    badInput(`--prefix "${prefix}" is not a key prefix; pass a non-empty prefix without { or }`);
  }
  return prefix;
}

/** Throws a bad-input error unless `runId` is a valid run id. */
export function checkRunId(runId: string | undefined, usage: string): string {
  if (runId === undefined || runId === '') badInput(`name the run id: \`${usage}\``);
  const given: string = runId;
  if (!isRunId(given)) {
    badInput(`"${runId}" is not a run id (1 to 200 characters, no { or }); check the run id`);
  }
  return runId;
}

function redisUrl(raw: string, source: string): { url: string; target: string } {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    badInput(`${source} "${raw}" is not a Redis URL; pass one like redis://127.0.0.1:6379`);
  }
  if (u.protocol !== 'redis:' && u.protocol !== 'rediss:') {
    badInput(`${source} "${raw}" is not a Redis URL; pass one like redis://127.0.0.1:6379`);
  }
  const path = u.pathname === '/' ? '' : u.pathname;
  return { url: raw, target: `${u.protocol}//${u.host}${path}` };
}

/** Why a connection failed, shortly: `connect ECONNREFUSED`, `NOAUTH Authentication required.` */
function reason(error: unknown): string {
  const e = error as NodeJS.ErrnoException | undefined;
  if (typeof e?.syscall === 'string' && typeof e.code === 'string') return `${e.syscall} ${e.code}`;
  return (e instanceof Error ? e.message : String(error)).split('\n')[0] ?? 'unknown error';
}

/** The one-line error for an unreachable Redis (exit 6). */
export function unreachable(target: string, error: unknown): CliError {
  return new CliError(
    `cannot reach Redis at ${target}: ${reason(error)}; start Redis or pass --redis URL`,
    ExitCode.redisUnavailable,
  );
}

async function probe(url: string, target: string): Promise<void> {
  const client = new Redis(url, {
    lazyConnect: true,
    connectTimeout: 2000,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    retryStrategy: () => null,
  });
  let last: unknown;
  client.on('error', (e: unknown) => (last = e));
  try {
    await client.connect();
    await client.ping();
  } catch (error) {
    throw unreachable(target, last ?? error);
  } finally {
    client.disconnect();
  }
}

/** Options of {@link connect}. */
export interface ConnectOptions extends RedisChoice {
  cwd: string;
  env: NodeJS.ProcessEnv;
  /** A long-running worker keeps reconnecting; other commands give up after a few seconds. */
  long?: boolean;
  /** The command is about this existing run: never start an empty embedded server for it. */
  existingRun?: string;
}

/** Connects to the CLI's Redis (starting the embedded one if needed). Throws CliError (exit 6). */
export async function connect(options: ConnectOptions): Promise<Connection> {
  const prefix = resolvePrefix(options, options.env);
  const keys = createKeys(prefix);
  const fromEnv = options.env['REDIS_URL'];
  let embedded: DetachedRedis | undefined;
  let url: string;
  let target: string;
  if (options.redis !== undefined) ({ url, target } = redisUrl(options.redis, '--redis'));
  else if (fromEnv !== undefined && fromEnv !== '')
    ({ url, target } = redisUrl(fromEnv, 'REDIS_URL'));
  else {
    const dataDir = embeddedDataDir(options.cwd);
    if (options.existingRun !== undefined && !existsSync(dataDir)) {
      badInput(
        `Run "${options.existingRun}" not found: there is no embedded Redis in ${dataDir}; run this in the directory where the run was started, or pass --redis URL`,
      );
    }
    embedded = await ensureEmbeddedRedis({ dataDir });
    if (embedded.started) {
      console.error(
        `flujo: started the embedded redis-server (pid ${embedded.pid}, port ${embedded.port}, data ${dataDir}); it keeps running for the next command, stop it with \`flujo redis stop\``,
      );
    }
    url = embedded.url;
    target = url;
  }
  currentTarget = target;
  await probe(url, target);

  const long = options.long === true;
  const redis = new Redis(url, {
    connectTimeout: 2000,
    maxRetriesPerRequest: 2,
    retryStrategy: (times: number) =>
      long ? Math.min(times * 200, 2000) : times > 10 ? null : Math.min(times * 100, 1000),
  });
  redis.on('error', () => {}); // surfaced by the command that fails
  let runtime: Runtime | undefined;
  return {
    target,
    prefix,
    keys,
    redis,
    embedded,
    runtime(job) {
      runtime ??= createRuntime({
        redis,
        prefix,
        logger: createCliLogger(),
        ...(job === undefined
          ? {}
          : {
              operators: job.operators,
              tools: job.tools,
              agents: job.agents,
              strictPricing: job.strictPricing,
              ...(job.pricing === undefined ? {} : { pricing: job.pricing }),
            }),
      });
      return runtime;
    },
    async requireRun(runId) {
      if ((await redis.exists(keys.snap(runId))) === 0) throw new RunNotFoundError(runId);
    },
    async close() {
      await runtime?.close().catch(() => {});
      await redis.quit().catch(() => redis.disconnect());
    },
  };
}
