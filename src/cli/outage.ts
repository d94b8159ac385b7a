/**
 * Watches the CLI's Redis while a command executes runs: one PING per second on a connection of
 * its own. When Redis stops answering it says so once, when Redis answers again it says so once
 * (one line per outage, not one per retry), and when an outage lasts past its limit it calls
 * `onLimit` (the command then ends with exit 6 and the resume command).
 */
import { Redis } from 'ioredis';
import { redisClientOptions } from '../persistence/redis-errors.js';
import { isClusterUrl, openRedis } from '../persistence/connection.js';

/** `--redis-outage-limit MS` unless given: how long `flujo run` and `resume` wait for Redis. */
export const DEFAULT_OUTAGE_LIMIT_MS = 60_000;

/** Options of {@link watchRedis}. */
export interface WatchOptions {
  url: string;
  /** The server, for messages. */
  target: string;
  /** How long one PING may go unanswered. */
  timeoutMs: number;
  /** How long an outage may last before `onLimit`; Infinity: ride out any outage. */
  limitMs: number;
  /** Called once when an outage has lasted `limitMs`. */
  onLimit?: () => void;
  /** Where the lines go. @defaultValue stderr */
  say?: (line: string) => void;
  /** PING every this many ms. @defaultValue 1000 */
  everyMs?: number;
}

/** A running watch. */
export interface RedisWatch {
  /** Whether Redis answers now (as of the last PING). */
  readonly up: boolean;
  /** Stops watching and closes the connection. */
  stop(): void;
}

function shortReason(error: unknown): string {
  const e = error as NodeJS.ErrnoException;
  if (typeof e.code === 'string' && typeof e.syscall === 'string') return `${e.syscall} ${e.code}`;
  const message = e instanceof Error ? e.message : String(error);
  if (message.includes('timed out')) return 'no answer';
  if (message.includes('max retries') || message.includes('Connection is closed')) {
    return 'connection lost';
  }
  return message.split('\n')[0] ?? 'unknown error';
}

/** Starts watching (see the module comment). */
export function watchRedis(o: WatchOptions): RedisWatch {
  const say = o.say ?? ((line: string) => process.stderr.write(`${line}\n`));
  const client = isClusterUrl(o.url)
    ? openRedis(o.url, { timeoutMs: o.timeoutMs, reconnect: 'forever' })
    : new Redis(o.url, {
        ...redisClientOptions(o.timeoutMs, { reconnect: 'forever' }),
        maxRetriesPerRequest: 0,
      });
  client.on('error', () => {}); // a failed PING says it
  let downSince: number | null = null;
  let stopped = false;
  let limited = false;
  let timer: ReturnType<typeof setTimeout> | undefined;

  const check = async () => {
    const sent = performance.now();
    let ok: boolean;
    let why = '';
    try {
      ok = (await client.ping()) === 'PONG';
    } catch (error) {
      ok = false;
      why = shortReason(error);
    }
    if (stopped) return;
    const now = performance.now();
    if (ok && downSince !== null) {
      say(
        `flujo: Redis at ${o.target} answers again after ${((now - downSince) / 1000).toFixed(1)} s; going on`,
      );
      downSince = null;
    } else if (!ok && downSince === null) {
      downSince = sent;
      const limit = Number.isFinite(o.limitMs)
        ? `up to ${Math.round(o.limitMs / 1000)} s (--redis-outage-limit)`
        : 'until it is back';
      say(`flujo: Redis at ${o.target} does not answer (${why}); waiting for it ${limit}`);
    }
    if (!ok && downSince !== null && !limited && now - downSince >= o.limitMs) {
      limited = true;
      o.onLimit?.();
    }
    if (!stopped) timer = setTimeout(() => void check(), o.everyMs ?? 1000);
  };
  timer = setTimeout(() => void check(), o.everyMs ?? 1000);

  return {
    get up() {
      return downSince === null;
    },
    stop() {
      stopped = true;
      clearTimeout(timer);
      client.disconnect();
    },
  };
}

/** `--redis-outage-limit MS`: a whole number of milliseconds from 1000 to 86400000. */
export function parseOutageLimit(
  text: string | undefined,
  bad: (message: string) => never,
): number {
  if (text === undefined) return DEFAULT_OUTAGE_LIMIT_MS;
  const n = Number(text);
  if (!/^\d+$/.test(text) || n < 1000 || n > 86_400_000) {
    bad(
      `--redis-outage-limit "${text}" is not a whole number of milliseconds from 1000 to 86400000; pass e.g. --redis-outage-limit 60000`,
    );
  }
  return n;
}
