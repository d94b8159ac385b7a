/**
 * Classifies errors from ioredis, once, where they enter the runtime: connection-level failures
 * become a retryable {@link RedisUnavailableError}; everything else passes through unchanged.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Redis } from 'ioredis';
import { FlujoError, RedisUnavailableError } from '../errors.js';

const CONNECTION_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ETIMEDOUT',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'EHOSTDOWN',
  'ENETUNREACH',
  'ENETDOWN',
  'ERR_SOCKET_CLOSED',
  'ERR_STREAM_DESTROYED',
]);

const CONNECTION_NAMES = new Set(['MaxRetriesPerRequestError', 'ClusterAllFailedError']);

// ioredis messages for a connection that is closed, closing or never opened.
const CONNECTION_MESSAGES = [
  'Connection is closed',
  "Stream isn't writeable",
  'connect ETIMEDOUT',
  'Command timed out',
  'Command aborted due to connection close',
  'Socket timeout',
  'Reached the max retries per request limit',
  'None of startup nodes is available',
  // A Redis Cluster failing over, resharding or not yet ready: ioredis retries redirections and
  // refreshes its slots, and gives up with one of these when that did not settle in time.
  'Too many Cluster redirections',
  'Failed to refresh slots cache',
  "Cluster isn't ready",
];

// Server replies that mean "this server cannot serve you right now", not "your command is wrong".
// On a cluster, MOVED and ASK surface only when a slot moved again while ioredis followed it (a
// failover or a resharding): the same command succeeds once the client has the new slot map.
const TRANSIENT_REPLY_PREFIXES = [
  'LOADING',
  'MASTERDOWN',
  'CLUSTERDOWN',
  'TRYAGAIN',
  'READONLY',
  'MOVED',
  'ASK',
];

/** True when `error` says Redis is unreachable or temporarily unable to serve, not that a command is wrong. */
export function isConnectionError(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  if (error instanceof FlujoError) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code === 'string' && CONNECTION_CODES.has(code)) return true;
  if (CONNECTION_NAMES.has(error.name)) return true;
  const message = error.message;
  for (const m of CONNECTION_MESSAGES) if (message.includes(m)) return true;
  for (const p of TRANSIENT_REPLY_PREFIXES) if (message.startsWith(p + ' ')) return true;
  return false;
}

/** The nodes a Cluster client knows (or its startup nodes), as `host:port`, sorted. */
function nodesOf(cluster: ClusterLike): string[] {
  const seen = new Set<string>();
  try {
    for (const node of cluster.nodes('all')) {
      seen.add(`${node.options.host ?? 'localhost'}:${node.options.port ?? 6379}`);
    }
  } catch {
    // not connected yet: its startup nodes below
  }
  if (seen.size === 0) {
    for (const n of cluster.startupNodes) {
      if (typeof n === 'string') seen.add(n);
      else if (typeof n === 'number') seen.add(`localhost:${n}`);
      else seen.add(`${n.host ?? 'localhost'}:${n.port ?? 6379}`);
    }
  }
  return [...seen].sort();
}

/** What {@link describeRedisTarget} reads of an ioredis `Cluster`. */
interface ClusterLike {
  isCluster: true;
  options: { redisOptions?: { tls?: unknown } };
  nodes(role: 'all'): { options: { host?: string; port?: number } }[];
  startupNodes: (string | number | { host?: string; port?: number })[];
}

/**
 * Where `redis` connects, for messages: `host:port`, a socket path, `sentinel <name>`, or a
 * cluster and its nodes; never credentials.
 */
export function describeRedisTarget(redis: Pick<Redis, 'options'> | undefined): string {
  if ((redis as { isCluster?: unknown } | undefined)?.isCluster === true) {
    const cluster = redis as unknown as ClusterLike;
    const scheme = cluster.options.redisOptions?.tls == null ? 'redis' : 'rediss';
    return `${scheme}+cluster://${nodesOf(cluster).join(',')}`;
  }
  const o = redis?.options;
  if (o === undefined) return 'Redis';
  // ioredis fills unset options with null, whatever its types say.
  if (o.sentinels != null && o.sentinels.length > 0) return `sentinel master "${o.name ?? ''}"`;
  if (o.path != null && o.path !== '') return o.path;
  const scheme = o.tls == null ? 'redis' : 'rediss';
  return `${scheme}://${o.host ?? 'localhost'}:${o.port ?? 6379}`;
}

/**
 * Returns a retryable {@link RedisUnavailableError} for a connection-level failure, naming the
 * server (and the client's last connection error, when known); returns any other error (including
 * the runtime's own) unchanged.
 */
export function classifyRedisError(
  error: unknown,
  redis?: Pick<Redis, 'options'>,
  lastConnectionError?: Error,
): unknown {
  if (!isConnectionError(error)) return error;
  let reason = (error as Error).message;
  if (lastConnectionError !== undefined && lastConnectionError.message !== reason) {
    reason += `; last connection error: ${lastConnectionError.message}`;
  }
  return new RedisUnavailableError(
    `Redis at ${describeRedisTarget(redis)} is unavailable (${reason}). Check that the server is running and that REDIS_URL points at it.`,
    { cause: error },
  );
}

/** How long a Redis call may go unanswered before it fails with RedisUnavailableError, in ms. */
export const DEFAULT_REDIS_TIMEOUT_MS = 2000;

/** Checks a `redisTimeoutMs` value; returns the default when it is undefined. */
export function checkRedisTimeout(value: unknown, field: string): number {
  if (value === undefined) return DEFAULT_REDIS_TIMEOUT_MS;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 100 || value > 600_000) {
    throw new RangeError(
      `${field} must be a whole number of milliseconds from 100 to 600000, e.g. ${DEFAULT_REDIS_TIMEOUT_MS}`,
    );
  }
  return value;
}

/** The ioredis options that bound every wait on a client (see {@link redisClientOptions}). */
export interface BoundedRedisOptions {
  connectTimeout: number;
  commandTimeout: number | undefined;
  maxRetriesPerRequest: number | null;
  retryStrategy: (times: number) => number | null;
}

/**
 * ioredis options for a client whose every command is answered or fails within `timeoutMs`:
 * a connection attempt gives up after `timeoutMs`, a command with no reply fails with "Command
 * timed out" (a blocking connection, whose commands wait on purpose, gets no command timeout;
 * its queue or stream library bounds them), and the client reconnects with a backoff capped at
 * `timeoutMs`. `reconnect: 'forever'` is for clients that ride out an outage (workers, a
 * running command); `'briefly'` stops reconnecting after about `timeoutMs` so that a short
 * command ends.
 */
export function redisClientOptions(
  timeoutMs: number,
  o: { blocking?: boolean; reconnect?: 'forever' | 'briefly' } = {},
): BoundedRedisOptions {
  const cap = Math.max(100, Math.min(timeoutMs, 2000));
  const briefly = o.reconnect === 'briefly';
  return {
    connectTimeout: timeoutMs,
    commandTimeout: o.blocking === true ? undefined : timeoutMs,
    maxRetriesPerRequest: o.blocking === true ? null : 1,
    retryStrategy: (times: number) => {
      if (briefly && times * 100 > timeoutMs) return null;
      return Math.min(times * 100, cap);
    },
  };
}

/** Runs code that is not Redis's (a user hook) without spending the deadline of {@link withRedisDeadline}. */
export type Unbounded = <U>(work: () => U | Promise<U>) => Promise<U>;

const deadlines = new AsyncLocalStorage<Unbounded>();

/**
 * Calls `work` (a user hook) outside the deadline of the enclosing {@link withRedisDeadline}: the
 * time it takes does not count as waiting for Redis.
 */
export const outsideRedisDeadline: Unbounded = async (work) => {
  const unbounded = deadlines.getStore();
  return unbounded === undefined ? await work() : await unbounded(work);
};

/**
 * Runs `body`, failing with a retryable {@link RedisUnavailableError} naming the server when it
 * has waited `timeoutMs` without settling (time inside {@link outsideRedisDeadline}, a user hook,
 * does not count). Errors of `body` pass through {@link classifyRedisError}. What `body` wrote before the
 * deadline may or may not be in Redis.
 */
export async function withRedisDeadline<T>(
  body: () => Promise<T>,
  timeoutMs: number,
  redis?: Pick<Redis, 'options'>,
): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let expire: (error: Error) => void = () => {};
  let done = false;
  const arm = () => {
    clearTimeout(timer);
    if (done) return;
    timer = setTimeout(() => {
      // After the I/O of this turn of the event loop: a reply that arrived while the loop was
      // busy (loading modules, a CPU-bound operator) is not taken for silence.
      setImmediate(() =>
        expire(
          new RedisUnavailableError(
            `Redis at ${describeRedisTarget(redis)} did not answer within ${timeoutMs} ms. Check that the server is running and answering (not paused or overloaded), or raise redisTimeoutMs.`,
          ),
        ),
      );
    }, timeoutMs);
  };
  const deadline = new Promise<never>((_, reject) => (expire = reject));
  const unbounded: Unbounded = async (work) => {
    clearTimeout(timer);
    try {
      return await deadlines.exit(work);
    } finally {
      arm();
    }
  };
  arm();
  try {
    return await Promise.race([deadlines.run(unbounded, body), deadline]);
  } catch (error) {
    throw classifyRedisError(error, redis);
  } finally {
    done = true;
    clearTimeout(timer);
  }
}
