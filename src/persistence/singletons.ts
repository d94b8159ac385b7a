/**
 * Singleton keys: `start(…, { singleton: { key } })` claims its key for the run it starts, so that
 * a tenant has at most one live run per key. One HASH per tenant, in a hash tag of its own
 * (`Keys.singletons`): every claim, swap and release is one script on one key, atomic whatever the
 * number of starting processes. A holder is `<claimed at ms>|<runId>`; the run releases it when
 * it ends (`RuntimeMeta.ended`), and a start that finds a holder whose run has ended (or never got
 * created) clears it with a compare-and-delete.
 */
import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';

/** A run that holds a singleton key, and when it claimed it. */
export interface SingletonHolder {
  runId: string;
  /** When the key was claimed for it (epoch ms). */
  at: number;
  /** The stored value, for a compare-and-delete. */
  raw: string;
}

/** What a claim came to. */
export type SingletonClaim =
  { claimed: true; previous: SingletonHolder | null } | { claimed: false; holder: SingletonHolder };

/** The singleton keys of one prefix. */
export interface SingletonKeys {
  /**
   * Claims `key` of `tenantId` for `runId` at `at`. With `replace`, the key is taken from its
   * holder (returned as `previous`); without, a key already held is left to its holder.
   */
  claim(
    tenantId: string,
    key: string,
    runId: string,
    at: number,
    replace: boolean,
  ): Promise<SingletonClaim>;
  /** The run that holds `key` of `tenantId`, or null. */
  holder(tenantId: string, key: string): Promise<SingletonHolder | null>;
  /** Releases `key` of `tenantId` if `runId` holds it; true when it did. */
  release(tenantId: string, key: string, runId: string): Promise<boolean>;
  /** Clears `key` of `tenantId` if its stored value is still `raw` (a holder found stale). */
  clear(tenantId: string, key: string, raw: string): Promise<boolean>;
}

const CLAIM = `
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and ARGV[3] ~= '1' then return {0, held} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {1, held or ''}
`;

// ARGV[2] is '|<runId>': the holder's value ends with it after its claim time (digits).
const RELEASE = `
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return 0 end
if string.sub(held, -string.len(ARGV[2])) ~= ARGV[2] then return 0 end
if not string.match(string.sub(held, 1, string.len(held) - string.len(ARGV[2])), '^%d+$') then
  return 0
end
return redis.call('HDEL', KEYS[1], ARGV[1])
`;

const CLEAR = `
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
`;

const COMMANDS = {
  claim: ['flujoSingleton_claim_v1', CLAIM],
  release: ['flujoSingleton_release_v1', RELEASE],
  clear: ['flujoSingleton_clear_v1', CLEAR],
} as const;

type Script = (...args: string[]) => Promise<unknown>;

/** Reads a stored holder `<at>|<runId>`. */
export function parseHolder(raw: string): SingletonHolder | null {
  const bar = raw.indexOf('|');
  if (bar <= 0) return null;
  return { runId: raw.slice(bar + 1), at: Number(raw.slice(0, bar)), raw };
}

/** Creates the {@link SingletonKeys} of `keys`' prefix on `redis`. */
export function createSingletonKeys(redis: Redis, keys: Keys): SingletonKeys {
  const commands = redis as unknown as Record<string, Script | undefined>;
  const script = ([name, lua]: readonly [string, string]): Script => {
    if (commands[name] === undefined) redis.defineCommand(name, { numberOfKeys: 1, lua });
    return (...args) => (commands[name] as Script).apply(redis, args);
  };
  const claim = script(COMMANDS.claim);
  const release = script(COMMANDS.release);
  const clear = script(COMMANDS.clear);
  return {
    async claim(tenantId, key, runId, at, replace) {
      const [won, held] = (await claim(
        keys.singletons(tenantId),
        key,
        `${at}|${runId}`,
        replace ? '1' : '0',
      )) as [number, string];
      const holder = held === '' ? null : parseHolder(held);
      if (won === 1) return { claimed: true, previous: holder };
      return { claimed: false, holder: holder ?? { runId: held, at: 0, raw: held } };
    },
    async holder(tenantId, key) {
      const raw = await redis.hget(keys.singletons(tenantId), key);
      return raw === null ? null : parseHolder(raw);
    },
    async release(tenantId, key, runId) {
      return (await release(keys.singletons(tenantId), key, `|${runId}`)) === 1;
    },
    async clear(tenantId, key, raw) {
      return (await clear(keys.singletons(tenantId), key, raw)) === 1;
    },
  };
}
