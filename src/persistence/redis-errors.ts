/**
 * Classifies errors from ioredis, once, where they enter the runtime: connection-level failures
 * become a retryable {@link RedisUnavailableError}; everything else passes through unchanged.
 */
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
];

// Server replies that mean "this server cannot serve you right now", not "your command is wrong".
const TRANSIENT_REPLY_PREFIXES = ['LOADING', 'MASTERDOWN', 'CLUSTERDOWN', 'TRYAGAIN', 'READONLY'];

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

/** Where `redis` connects, for messages: `host:port`, a socket path or `sentinel <name>`; never credentials. */
export function describeRedisTarget(redis: Pick<Redis, 'options'> | undefined): string {
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
