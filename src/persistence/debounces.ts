/**
 * Debounce bursts (`start(…, { debounce: { key, delayMs, maxDelayMs } })`): the starts of one key
 * within `delayMs` of each other are one burst, whose run starts once the burst went quiet for
 * `delayMs` (or `maxDelayMs` after its first start) with the last start's input. Per tenant, two
 * HASHes in one hash tag of their own (`Keys.debounceOpen`, `Keys.debounceFiring`): the open burst
 * of each key (`{ burst, first, due, start }`) and the bursts whose run is being started, so a
 * worker that dies while starting one leaves it to the job's next delivery.
 */
import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';

/** What a start added to a burst. */
export interface BurstPush {
  /** The burst's id: the run id its run gets. */
  burst: string;
  /** When the burst's run is due to start (epoch ms), as this start left it. */
  due: number;
  /** When the burst's first start came (epoch ms). */
  first: number;
}

/** What a burst's job finds. */
export type BurstTake =
  { kind: 'fire'; start: string } | { kind: 'wait'; due: number } | { kind: 'gone' };

/** The debounce bursts of one prefix. */
export interface DebounceStore {
  /**
   * Adds a start (`start`, JSON of what to start) to the open burst of `key`, or opens one with id
   * `newBurst`: its run is due `delayMs` from now, at most `maxDelayMs` (null: no cap) after the
   * burst's first start. A burst past its due time is closed: it starts with what it holds.
   */
  push(
    tenantId: string,
    key: string,
    p: { now: number; delayMs: number; maxDelayMs: number | null; start: string; newBurst: string },
  ): Promise<BurstPush>;
  /**
   * The job of burst `burst` of `key` at `now`: `fire` with the start to make (the burst moves to
   * the firing ones, where it stays until {@link fired}), `wait` until its due time, or `gone`
   * (no such burst: it started already).
   */
  take(tenantId: string, key: string, burst: string, now: number): Promise<BurstTake>;
  /** The run of burst `burst` was started: it leaves the firing ones. */
  fired(tenantId: string, burst: string): Promise<void>;
}

const PUSH = `
local now = tonumber(ARGV[2])
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local burst, first
if cur then
  local c = cjson.decode(cur)
  if now < c.due then
    burst = c.burst
    first = c.first
  else
    redis.call('HSET', KEYS[2], c.burst, cur)
  end
end
if not burst then
  burst = ARGV[6]
  first = now
end
local due = now + tonumber(ARGV[3])
local max = tonumber(ARGV[4])
if max >= 0 and first + max < due then due = first + max end
redis.call('HSET', KEYS[1], ARGV[1],
  cjson.encode({ burst = burst, first = first, due = due, start = ARGV[5] }))
return { burst, string.format('%d', due), string.format('%d', first) }
`;

const TAKE = `
local firing = redis.call('HGET', KEYS[2], ARGV[2])
if firing then return { 'fire', cjson.decode(firing).start } end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return { 'gone', '' } end
local c = cjson.decode(cur)
if c.burst ~= ARGV[2] then return { 'gone', '' } end
if tonumber(ARGV[3]) < c.due then return { 'wait', string.format('%d', c.due) } end
redis.call('HSET', KEYS[2], ARGV[2], cur)
redis.call('HDEL', KEYS[1], ARGV[1])
return { 'fire', c.start }
`;

type Script = (...args: string[]) => Promise<string[]>;

/** Creates the {@link DebounceStore} of `keys`' prefix on `redis`. */
export function createDebounceStore(redis: Redis, keys: Keys): DebounceStore {
  const commands = redis as unknown as Record<string, Script | undefined>;
  const script = (name: string, lua: string): Script => {
    if (commands[name] === undefined) redis.defineCommand(name, { numberOfKeys: 2, lua });
    return (...args) => (commands[name] as Script).apply(redis, args);
  };
  const push = script('flujoDebounce_push_v1', PUSH);
  const take = script('flujoDebounce_take_v1', TAKE);
  return {
    async push(tenantId, key, p) {
      const [burst, due, first] = await push(
        keys.debounceOpen(tenantId),
        keys.debounceFiring(tenantId),
        key,
        String(p.now),
        String(p.delayMs),
        String(p.maxDelayMs ?? -1),
        p.start,
        p.newBurst,
      );
      return { burst: burst!, due: Number(due), first: Number(first) };
    },
    async take(tenantId, key, burst, now) {
      const [kind, value] = await take(
        keys.debounceOpen(tenantId),
        keys.debounceFiring(tenantId),
        key,
        burst,
        String(now),
      );
      if (kind === 'fire') return { kind, start: value! };
      if (kind === 'wait') return { kind, due: Number(value) };
      return { kind: 'gone' };
    },
    async fired(tenantId, burst) {
      await redis.hdel(keys.debounceFiring(tenantId), burst);
    },
  };
}
