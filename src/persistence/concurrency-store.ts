/**
 * Concurrency slots per key value: at most `limit` holders at once, each a lease (its expiry in
 * the `holders` ZSET), and the units over the limit waiting in arrival order (the `waiters` ZSET,
 * scored by when they came, with the job that wakes each in the `wake` HASH). Every operation is
 * one script over the keys of one key value, which share a hash tag (see `Keys.slots`): no script
 * touches two key values, so a cluster places each where its tag says. Times are the server's
 * (`TIME`), so workers' clocks do not matter.
 *
 * A slot that frees is handed to the waiter at the head at once (it becomes a holder, with the
 * hand-over lease, and is returned for its caller to wake): no later arrival takes it first, and a
 * wake-up that is lost costs the waiter time, not its turn.
 */
import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';

/** Pops waiters into holders while there is room; returns `holder, wake` pairs of those woken. */
const FILL = `
local function fill(limit, now, handover)
  local woken = {}
  while redis.call('ZCARD', KEYS[1]) < limit do
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)
    if #head == 0 then break end
    local h = head[1]
    redis.call('ZREM', KEYS[2], h)
    redis.call('ZADD', KEYS[1], now + handover, h)
    local w = redis.call('HGET', KEYS[3], h)
    if w then
      woken[#woken + 1] = h
      woken[#woken + 1] = w
    end
  end
  return woken
end
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return us, math.floor(us / 1000)
end
local function freeExpired(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  for _, g in ipairs(gone) do
    redis.call('ZREM', KEYS[1], g)
    redis.call('HDEL', KEYS[3], g)
  end
end
`;

/**
 * KEYS: holders, waiters, wake. ARGV: holder, limit, leaseMs, handoverMs, wake (the job that
 * wakes it), freeExpired (`1`: lapsed holders are freed; `0`: they are returned, for the caller
 * to check). Reply: `{ 1, waitedSince or '', woken }` when the holder holds a slot (renewed, or
 * taken), `{ 0, position, woken, lapsed }` when it waits (joined the waiters, if not already).
 */
const ACQUIRE_LUA = `${FILL}
local holder, limit, lease, handover = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local us, now = clock()
if redis.call('ZSCORE', KEYS[1], holder) then
  redis.call('ZADD', KEYS[1], now + lease, holder)
  local w = redis.call('HGET', KEYS[3], holder)
  if w then redis.call('HDEL', KEYS[3], holder) end
  return { 1, w or '', {} }
end
local lapsed = {}
if ARGV[6] == '1' then freeExpired(now) else lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now) end
if redis.call('ZCARD', KEYS[2]) == 0 and redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now + lease, holder)
  return { 1, '', {} }
end
local since = redis.call('ZSCORE', KEYS[2], holder)
if not since then
  since = us
  redis.call('ZADD', KEYS[2], us, holder)
end
redis.call('HSET', KEYS[3], holder, math.floor(tonumber(since) / 1000) .. ' ' .. ARGV[5])
local woken = fill(limit, now, handover)
if redis.call('ZSCORE', KEYS[1], holder) then
  local mine = {}
  for i = 1, #woken, 2 do
    if woken[i] ~= holder then
      mine[#mine + 1] = woken[i]
      mine[#mine + 1] = woken[i + 1]
    end
  end
  redis.call('ZADD', KEYS[1], now + lease, holder)
  local w = redis.call('HGET', KEYS[3], holder)
  redis.call('HDEL', KEYS[3], holder)
  return { 1, w or '', mine }
end
return { 0, redis.call('ZRANK', KEYS[2], holder), woken, lapsed }
`;

/**
 * KEYS: holders, waiters, wake. ARGV: holder, limit, handoverMs, freeExpired. Frees the holder's
 * slot (or its place among the waiters) and hands the room to the head waiters. Reply: woken.
 */
const RELEASE_LUA = `${FILL}
local us, now = clock()
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[4] == '1' then freeExpired(now) end
return fill(tonumber(ARGV[2]), now, tonumber(ARGV[3]))
`;

/** KEYS: holders. ARGV: holder, leaseMs. Extends a holder's lease; 0 when it holds no slot. */
const RENEW_LUA = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
`;

/** Which key value's slots: a scope (whose limit), its value, and the limit. */
export interface SlotRef {
  scope: string;
  value: string;
  limit: number;
}

/** How a holder's lease runs (see {@link ConcurrencySlots.acquire}). */
export interface SlotLease {
  /** A holder's lease, renewed while it holds the slot. */
  leaseMs: number;
  /** The lease of a waiter handed a slot, until it comes to take it. */
  handoverMs: number;
  /**
   * Whether a lapsed lease frees its slot at once (a step's slot: its holder renews it while it
   * runs), or is returned for the caller to check first (a run's slot, held for the run's life).
   */
  freeLapsed: boolean;
}

/** A waiter handed a slot: who, and the job that wakes it (as given to `acquire`). */
export interface Woken {
  holder: string;
  wake: string;
}

/** What {@link ConcurrencySlots.acquire} came to. */
export type Acquired =
  | { granted: true; waitedSince: number | null; woken: Woken[] }
  | { granted: false; position: number; woken: Woken[]; lapsed: string[] };

/** Slots of concurrency per key value (see the module's comment). */
export interface ConcurrencySlots {
  /**
   * Takes (or renews) a slot for `holder`, or puts it among the waiters (once) with `wake`, the
   * job to wake when a slot is handed to it. `woken` are other waiters this call handed a slot.
   */
  acquire(ref: SlotRef, holder: string, lease: SlotLease, wake: string): Promise<Acquired>;
  /** Gives back `holder`'s slot (or its place in line); returns the waiters handed a slot. */
  release(ref: SlotRef, holder: string, lease: SlotLease): Promise<Woken[]>;
  /** Extends `holder`'s lease; false when it holds no slot. */
  renew(ref: SlotRef, holder: string, leaseMs: number): Promise<boolean>;
  /** Whether `holder` holds a slot now. */
  holds(ref: SlotRef, holder: string): Promise<boolean>;
}

const pairs = (flat: unknown): Woken[] => {
  const list = (flat ?? []) as string[];
  const out: Woken[] = [];
  for (let i = 0; i + 1 < list.length; i += 2) {
    out.push({ holder: list[i]!, wake: splitWake(list[i + 1]!).wake });
  }
  return out;
};

/** The time a waiter came, from the `wake` field the scripts write (`<since> <wake>`). */
export function splitWake(field: string): { since: number; wake: string } {
  const space = field.indexOf(' ');
  return { since: Number(field.slice(0, space)), wake: field.slice(space + 1) };
}

type Script = (...args: string[]) => Promise<unknown>;

/** Creates the {@link ConcurrencySlots} of `keys`' prefix on `redis`. */
export function createConcurrencySlots(redis: Redis, keys: Keys): ConcurrencySlots {
  const commands = redis as unknown as Record<string, Script | undefined>;
  for (const [name, lua, n] of [
    ['flujoSlotAcquire', ACQUIRE_LUA, 3],
    ['flujoSlotRelease', RELEASE_LUA, 3],
    ['flujoSlotRenew', RENEW_LUA, 1],
  ] as const) {
    if (commands[name] === undefined) redis.defineCommand(name, { numberOfKeys: n, lua });
  }
  const call = (name: string, ...args: string[]) => commands[name]!.call(redis, ...args);
  const keysOf = (ref: SlotRef) => {
    const k = keys.slots(ref.scope, ref.value);
    return [k.holders, k.waiters, k.wake];
  };
  return {
    async acquire(ref, holder, lease, wake) {
      const reply = (await call(
        'flujoSlotAcquire',
        ...keysOf(ref),
        holder,
        String(ref.limit),
        String(lease.leaseMs),
        String(lease.handoverMs),
        wake,
        lease.freeLapsed ? '1' : '0',
      )) as [number, unknown, unknown, unknown?];
      if (Number(reply[0]) === 1) {
        const field = String(reply[1]);
        const waitedSince = field === '' ? null : splitWake(field).since;
        return { granted: true, waitedSince, woken: pairs(reply[2]) };
      }
      return {
        granted: false,
        position: Number(reply[1]),
        woken: pairs(reply[2]),
        lapsed: (reply[3] ?? []) as string[],
      };
    },
    async release(ref, holder, lease) {
      const reply = await call(
        'flujoSlotRelease',
        ...keysOf(ref),
        holder,
        String(ref.limit),
        String(lease.handoverMs),
        lease.freeLapsed ? '1' : '0',
      );
      return pairs(reply);
    },
    async renew(ref, holder, leaseMs) {
      const k = keys.slots(ref.scope, ref.value);
      return Number(await call('flujoSlotRenew', k.holders, holder, String(leaseMs))) === 1;
    },
    async holds(ref, holder) {
      return (await redis.zscore(keys.slots(ref.scope, ref.value).holders, holder)) !== null;
    },
  };
}
