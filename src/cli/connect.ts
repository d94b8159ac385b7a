/**
 * Where the CLI's Redis is: `--redis URL` (a cluster's `redis+cluster://host:port,host:port` as
 * well), else `REDIS_URL`, else the embedded redis-server of
 * `.flujo/redis` in the project of the working directory (started detached, so it outlives the
 * command). Every connection is probed first and fails fast (connect timeout 2 s, no endless
 * retries).
 */
import { existsSync } from 'node:fs';
import { Redis } from 'ioredis';
import type { InputValidationError } from '../errors.js';
import { RunNotFoundError, RunRemovedError } from '../errors.js';
import { createRetentionStore } from '../persistence/retention.js';
import { createKeys, isRunId, type Keys } from '../persistence/keys.js';
import { readMetaField, runExists, writeMetaField } from '../persistence/run-lookups.js';
import {
  embeddedDataDir,
  ensureEmbeddedRedis,
  projectRoot,
  type DetachedRedis,
} from '../persistence/embedded-redis.js';
import { DEFAULT_REDIS_TIMEOUT_MS, withRedisDeadline } from '../persistence/redis-errors.js';
import { isClusterUrl, openRedis, parseClusterUrl } from '../persistence/connection.js';
import type { Runtime } from '../runtime.js';
import { createCliLogger } from './log.js';
import type { JobModule } from './job-module.js';
import { CliError, ExitCode, badInput } from './exit-codes.js';
import { maskRedisUrl } from './context.js';
import { flujoInvocation } from './render.js';

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
  /** The server's URL (to open more connections). */
  url: string;
  /** How long a Redis call may go unanswered (`--redis-timeout`), in ms. */
  timeoutMs: number;
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

// The project lookup is shared with `ensureEmbeddedRedis()`, so that code calling it from any
// folder of a project reaches the very server the `flujo` command uses.
export { embeddedDataDir, projectRoot };

let currentTarget = 'Redis';
let currentTimeoutMs = DEFAULT_REDIS_TIMEOUT_MS;
/** The server the CLI talks to (for the message of a lost connection). */
export const redisTarget = (): string => currentTarget;
/** The `--redis-timeout` of the command (for the message of a lost connection). */
export const redisTimeout = (): number => currentTimeoutMs;

/**
 * `--replicas N` and `--replicas-timeout MS`: the runtime's `durability`, or undefined when no
 * replica is waited for. Exits 2 for a value out of range, or a timeout without a replica count.
 */
export function parseDurability(
  replicas: string | undefined,
  timeout: string | undefined,
): { replicas: number; timeoutMs?: number } | undefined {
  if (replicas === undefined) {
    if (timeout !== undefined) {
      badInput('--replicas-timeout needs --replicas N (how many replicas to wait for)');
    }
    return undefined;
  }
  const n = Number(replicas);
  if (!/^\d+$/.test(replicas) || n > 16) {
    badInput(
      `--replicas "${replicas}" is not a whole number from 0 to 16; pass e.g. --replicas 1 (replicas that must have a write before the runtime acts on it)`,
    );
  }
  if (timeout === undefined) return { replicas: n };
  const ms = Number(timeout);
  if (!/^\d+$/.test(timeout) || ms < 1 || ms > 600_000) {
    badInput(
      `--replicas-timeout "${timeout}" is not a whole number of milliseconds from 1 to 600000; pass e.g. --replicas-timeout 1000`,
    );
  }
  return { replicas: n, timeoutMs: ms };
}

/** `--redis-timeout MS`: a whole number of milliseconds from 100 to 600000. @defaultValue 2000 */
export function parseRedisTimeout(text: string | undefined): number {
  if (text === undefined) return DEFAULT_REDIS_TIMEOUT_MS;
  const n = Number(text);
  if (!/^\d+$/.test(text) || n < 100 || n > 600_000) {
    badInput(
      `--redis-timeout "${text}" is not a whole number of milliseconds from 100 to 600000; pass e.g. --redis-timeout 5000`,
    );
  }
  return n;
}

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
  // A password is never printed.
  const shown = maskRedisUrl(raw);
  if (isClusterUrl(raw)) {
    try {
      const parsed = parseClusterUrl(raw);
      const scheme = parsed.tls ? 'rediss+cluster' : 'redis+cluster';
      const nodes = parsed.nodes.map((n) => (n.host.includes(':') ? `[${n.host}]` : n.host));
      const target = `${scheme}://${parsed.nodes.map((n, i) => `${nodes[i]}:${n.port}`).join(',')}`;
      return { url: raw, target };
    } catch (error) {
      badInput(
        `${source} "${shown}" is not a Redis URL: ${(error as InputValidationError).issues[0]?.message ?? ''}`,
      );
    }
  }
  try {
    u = new URL(raw);
  } catch {
    badInput(`${source} "${shown}" is not a Redis URL; pass one like redis://127.0.0.1:6379`);
  }
  if (u.protocol !== 'redis:' && u.protocol !== 'rediss:') {
    badInput(`${source} "${shown}" is not a Redis URL; pass one like redis://127.0.0.1:6379`);
  }
  const path = u.pathname === '/' ? '' : u.pathname;
  return { url: raw, target: `${u.protocol}//${u.host}${path}` };
}

/** Why a connection failed, shortly: `connect ECONNREFUSED`, `NOAUTH Authentication required.` */
function reason(error: unknown, timeoutMs: number): string {
  const e = error as NodeJS.ErrnoException | undefined;
  const message = e instanceof Error ? e.message : '';
  if (
    message.includes('Command timed out') ||
    message.includes('did not answer within') ||
    message.includes('connect ETIMEDOUT')
  ) {
    return `no answer within ${timeoutMs} ms (is it paused or overloaded? --redis-timeout MS waits longer)`;
  }
  if (message.includes('max retries per request') || message.includes('Connection is closed')) {
    return 'the connection was lost';
  }
  if (typeof e?.syscall === 'string' && typeof e.code === 'string') return `${e.syscall} ${e.code}`;
  return (e instanceof Error ? e.message : String(error)).split('\n')[0] ?? 'unknown error';
}

/** The one-line error for an unreachable Redis (exit 6). */
export function unreachable(
  target: string,
  error: unknown,
  timeoutMs = DEFAULT_REDIS_TIMEOUT_MS,
): CliError {
  return new CliError(
    `cannot reach Redis at ${target}: ${reason(error, timeoutMs)}; start Redis or pass --redis URL`,
    ExitCode.redisUnavailable,
  );
}

async function probe(
  url: string,
  target: string,
  timeoutMs: number,
  said = timeoutMs,
): Promise<void> {
  const client = isClusterUrl(url)
    ? openRedis(url, {
        timeoutMs,
        reconnect: 'briefly',
        lazyConnect: true,
        enableOfflineQueue: false,
      })
    : new Redis(url, {
        lazyConnect: true,
        connectTimeout: timeoutMs,
        commandTimeout: timeoutMs,
        maxRetriesPerRequest: 0,
        enableOfflineQueue: false,
        retryStrategy: () => null,
      });
  let last: unknown;
  client.on('error', (e: unknown) => (last = e));
  try {
    await withRedisDeadline(async () => {
      await client.connect();
      await client.ping();
    }, timeoutMs);
  } catch (error) {
    throw unreachable(target, last ?? error, said);
  } finally {
    client.disconnect();
  }
}

/** The field of a run's meta hash where the CLI keeps the job module that started the run. */
const MODULE_FIELD = 'cliModule';

/** Records the job module (absolute path) that started `runId`, for printed resume commands. */
export async function recordRunModule(conn: Connection, runId: string, file: string) {
  await writeMetaField(conn.redis, conn.keys, runId, MODULE_FIELD, file);
}

/** The job module recorded for `runId`, or null. */
export async function runModule(conn: Connection, runId: string): Promise<string | null> {
  return readMetaField(conn.redis, conn.keys, runId, MODULE_FIELD);
}

/** Options of {@link connect}. */
export interface ConnectOptions extends RedisChoice {
  cwd: string;
  env: NodeJS.ProcessEnv;
  /** `--redis-timeout MS`: how long any Redis call may go unanswered. @defaultValue 2000 */
  'redis-timeout'?: string | undefined;
  /** `--replicas N`: replicas that must acknowledge a write before the runtime acts on it. @defaultValue 0 */
  replicas?: string | undefined;
  /** `--replicas-timeout MS`: how long one wait for them may take. @defaultValue 1000 */
  'replicas-timeout'?: string | undefined;
  /**
   * The command executes runs (run, resume, worker): it keeps reconnecting through an outage;
   * other commands give up after the Redis timeout.
   */
  long?: boolean;
  /** The command is about this existing run: never start an empty embedded server for it. */
  existingRun?: string;
}

/** Connects to the CLI's Redis (starting the embedded one if needed). Throws CliError (exit 6). */
export async function connect(options: ConnectOptions): Promise<Connection> {
  const prefix = resolvePrefix(options, options.env);
  const timeoutMs = parseRedisTimeout(options['redis-timeout']);
  const durability = parseDurability(options.replicas, options['replicas-timeout']);
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
        `Run "${options.existingRun}" not found: there is no embedded Redis in ${dataDir}; run this in the project where the run was started, or pass --redis URL`,
      );
    }
    embedded = await ensureEmbeddedRedis({ dataDir });
    if (embedded.started) {
      console.error(
        `flujo: started the embedded redis-server (pid ${embedded.pid}, port ${embedded.port}, data ${dataDir}); it keeps running for the next command, stop it with \`${flujoInvocation()} redis stop\``,
      );
    }
    url = embedded.url;
    target = url;
  }
  currentTarget = target;
  currentTimeoutMs = timeoutMs;
  // By default the first answer is due within the timeout of the command's launch, so that a
  // command ends within about that long in all, however slow Node's start-up was; a timeout
  // given with --redis-timeout is waited in full. At least 500 ms are always given.
  const budget =
    options['redis-timeout'] === undefined
      ? Math.max(500, timeoutMs - Math.round(performance.now()))
      : timeoutMs;
  await probe(url, target, budget, timeoutMs);
  // Loaded once Redis answers: an unreachable Redis is reported without loading the runtime.
  const { createRuntime } = await import('../runtime.js');

  const long = options.long === true;
  const redis = openRedis(url, { timeoutMs, reconnect: long ? 'forever' : 'briefly' });
  redis.on('error', () => {}); // surfaced by the command that fails
  let runtime: Runtime | undefined;
  return {
    target,
    url,
    timeoutMs,
    prefix,
    keys,
    redis,
    embedded,
    runtime(job) {
      runtime ??= createRuntime({
        redis,
        prefix,
        redisTimeoutMs: timeoutMs,
        ...(durability === undefined ? {} : { durability }),
        logger: createCliLogger(),
        ...(job === undefined
          ? {}
          : {
              operators: job.operators,
              plans: job.plans,
              policies: job.policies,
              tools: job.tools,
              agents: job.agents,
              strictPricing: job.strictPricing,
              ...(job.pricing === undefined ? {} : { pricing: job.pricing }),
              ...(job.rateLimits === undefined ? {} : { rateLimits: job.rateLimits }),
              signals: { [job.plan.name]: job.signals },
              queueName: job.queue,
            }),
      });
      return runtime;
    },
    async requireRun(runId) {
      if (!(await runExists(redis, keys, runId))) {
        const removed = await createRetentionStore({ redis, keys }).removed(runId);
        throw removed === null
          ? new RunNotFoundError(runId)
          : new RunRemovedError(runId, removed.finishedAt, removed.retentionMs, {
              failed: removed.failed,
            });
      }
    },
    async close() {
      // A Redis that is gone must not hold the exit up: closing waits at most the timeout.
      const closing = (async () => {
        await runtime?.close().catch(() => {});
        await redis.quit().catch(() => redis.disconnect());
      })();
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([closing, new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
      clearTimeout(timer);
      redis.disconnect();
    },
  };
}
