/**
 * Model rate limits shared by every worker of a prefix: one sliding window per limited name (a
 * model, or a provider), kept in Redis under the name's own hash tag `{<prefix>:rate:<name>}`, so
 * each script touches one slot, also on Redis Cluster. A request is let through ("granted") only
 * when the requests and the tokens granted in the last window, with it, stay within the limits;
 * otherwise the script says how long until they would. A 429 that still comes blocks the name
 * until its `retry-after` has passed, for every worker. Times are the Redis server's clock
 * (`TIME`), one clock for every worker of a name.
 */
import type { Redis } from 'ioredis';
import { createKeys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';

/** Bump when a script changes meaning, so clients never mix versions under one command name. */
const RATE_SCRIPT_VERSION = 2;

const NOW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function int(n) return string.format('%d', n) end
`;

/*
 * acquire: grants a request, or says how long to wait.
 *   KEYS[1] the log (ZSET grant id → epoch ms)   KEYS[2] the state (HASH)
 *   ARGV[1] grant id   ARGV[2] requests per window or ''   ARGV[3] tokens per window or ''
 *   ARGV[4] the request's tokens   ARGV[5] the window, ms
 *   Returns {'go', now} | {'wait', ms, 'blocked' | 'requests' | 'tokens'}
 * A grant stays in the window while now - its time <= window; a request larger than the whole
 * tokens limit goes alone, once the window is empty.
 */
const ACQUIRE = `${NOW}
local window = tonumber(ARGV[5])
local blocked = tonumber(redis.call('HGET', KEYS[2], 'until') or '0')
if blocked > now then return {'wait', blocked - now, 'blocked'} end
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. int(now - window))
if #gone > 0 then
  local freed = 0
  for _, id in ipairs(gone) do
    freed = freed + tonumber(redis.call('HGET', KEYS[2], 't:' .. id) or '0')
    redis.call('HDEL', KEYS[2], 't:' .. id)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. int(now - window))
  if freed > 0 then redis.call('HINCRBY', KEYS[2], 'tok', int(-freed)) end
end
local rl = tonumber(ARGV[2])
local tl = tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
if rl then
  local n = redis.call('ZCARD', KEYS[1])
  if n >= rl then
    local e = redis.call('ZRANGE', KEYS[1], n - rl, n - rl, 'WITHSCORES')
    return {'wait', tonumber(e[2]) + window - now + 1, 'requests'}
  end
end
if tl then
  local used = tonumber(redis.call('HGET', KEYS[2], 'tok') or '0')
  if used > 0 and used + tokens > tl then
    local need = used + tokens - tl
    local list = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
    local freed = 0
    for i = 1, #list, 2 do
      freed = freed + tonumber(redis.call('HGET', KEYS[2], 't:' .. list[i]) or '0')
      if freed >= need then return {'wait', tonumber(list[i + 1]) + window - now + 1, 'tokens'} end
    end
    return {'wait', tonumber(list[#list]) + window - now + 1, 'tokens'}
  end
end
redis.call('ZADD', KEYS[1], int(now), ARGV[1])
redis.call('HSET', KEYS[2], 't:' .. ARGV[1], tokens)
redis.call('HINCRBY', KEYS[2], 'tok', int(tokens))
redis.call('PEXPIRE', KEYS[1], window * 2)
if redis.call('PTTL', KEYS[2]) < window * 2 then redis.call('PEXPIRE', KEYS[2], window * 2) end
return {'go', now}
`;

/*
 * settle: replaces a grant's tokens (the estimate) with what the request really used.
 *   KEYS as acquire   ARGV[1] grant id   ARGV[2] tokens   Returns 1, or 0 when it left the window
 */
const SETTLE = `
local function int(n) return string.format('%d', n) end
local old = redis.call('HGET', KEYS[2], 't:' .. ARGV[1])
if not old then return 0 end
redis.call('HSET', KEYS[2], 't:' .. ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], 'tok', int(tonumber(ARGV[2]) - tonumber(old)))
return 1
`;

/*
 * release: takes a grant back (its request was never sent).
 *   KEYS as acquire   ARGV[1] grant id   Returns 1, or 0 when it was not there
 */
const RELEASE = `
local function int(n) return string.format('%d', n) end
local old = redis.call('HGET', KEYS[2], 't:' .. ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
if not old then return 0 end
redis.call('HDEL', KEYS[2], 't:' .. ARGV[1])
redis.call('HINCRBY', KEYS[2], 'tok', int(-tonumber(old)))
return 1
`;

/*
 * block: nobody is granted a request of the name for `ms` from now (a later end already set
 * stays).
 *   KEYS as acquire   ARGV[1] ms   ARGV[2] the window, ms   Returns ms until the block ends
 */
const BLOCK = `${NOW}
local ms = tonumber(ARGV[1])
local current = tonumber(redis.call('HGET', KEYS[2], 'until') or '0')
local ends = math.max(current, now + ms)
redis.call('HSET', KEYS[2], 'until', int(ends))
local keep = ends - now + tonumber(ARGV[2])
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
return ends - now
`;

const SCRIPTS = { acquire: ACQUIRE, settle: SETTLE, release: RELEASE, block: BLOCK } as const;
type ScriptName = keyof typeof SCRIPTS;

/** The limits of one name, per window. */
export interface WindowLimits {
  /** Requests per window. */
  requests?: number | undefined;
  /** Tokens per window. */
  tokens?: number | undefined;
}

/** What {@link RateLimitStore.acquire} answers. */
export type AcquireAnswer =
  | { go: true }
  | {
      go: false;
      /** How long until the request could go, in ms. */
      waitMs: number;
      /** What holds it: a 429's block, the requests, or the tokens in the window. */
      reason: 'blocked' | 'requests' | 'tokens';
    };

/** The shared windows of the model rate limits. */
export interface RateLimitStore {
  /** Grants request `id` (of `tokens` tokens) under `name`'s `limits`, or says how long to wait. */
  acquire(
    name: string,
    limits: WindowLimits,
    id: string,
    tokens: number,
    windowMs: number,
  ): Promise<AcquireAnswer>;
  /** Counts `tokens` for grant `id` in place of its estimate (when it is still in the window). */
  settle(name: string, id: string, tokens: number): Promise<void>;
  /** Takes grant `id` back: its request was not sent. */
  release(name: string, id: string): Promise<void>;
  /** Blocks `name` for `ms` from now, for every worker; returns how long the block lasts. */
  block(name: string, ms: number, windowMs: number): Promise<number>;
}

/** Creates the Redis-backed {@link RateLimitStore}. */
export function createRateLimitStore(options: { redis: Redis; prefix: string }): RateLimitStore {
  const { redis } = options;
  const keys = createKeys(options.prefix);
  const names = {} as Record<ScriptName, string>;
  for (const [name, lua] of Object.entries(SCRIPTS) as [ScriptName, string][]) {
    names[name] = `flujoRate_${name}_v${RATE_SCRIPT_VERSION}`;
    // ioredis runs EVALSHA and falls back to EVAL after a NOSCRIPT (e.g. a restarted server).
    redis.defineCommand(names[name], { numberOfKeys: 2, lua });
  }
  async function call(script: ScriptName, name: string, args: (string | number)[]) {
    const { log, state } = keys.rateLimit(name);
    const command = (redis as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>)[
      names[script]
    ]!;
    try {
      return await command.call(redis, log, state, ...args.map(String));
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
  }
  const whole = (n: number): number => Math.max(0, Math.ceil(n));
  return {
    async acquire(name, limits, id, tokens, windowMs) {
      const reply = (await call('acquire', name, [
        id,
        limits.requests ?? '',
        limits.tokens ?? '',
        whole(tokens),
        windowMs,
      ])) as [string, number, string?];
      if (reply[0] === 'go') return { go: true };
      return {
        go: false,
        waitMs: Math.max(1, Number(reply[1])),
        reason: reply[2] as 'blocked' | 'requests' | 'tokens',
      };
    },
    async settle(name, id, tokens) {
      await call('settle', name, [id, whole(tokens)]);
    },
    async release(name, id) {
      await call('release', name, [id]);
    },
    async block(name, ms, windowMs) {
      return Number(await call('block', name, [whole(ms), windowMs]));
    },
  };
}
