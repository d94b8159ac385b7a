/**
 * A run's inbox: the signals sent to it, in send order, in one HASH in the run's hash slot (see
 * `RunKeyKind.Inbox`). A signal is appended by one script, which also refuses a run that does not
 * exist or has ended, makes a retried send with the same id a no-op (and refuses another payload
 * under that id), and records `signal.received` in the run's event stream, all or nothing. The
 * inbox is only stored here: which signal a wait step takes is the run's snapshot's business (its
 * per-name cursor, committed with the step).
 */
import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';

/** One signal as stored: its place in the inbox, its name, id and payload. */
export interface StoredSignal {
  /** Its place among all the run's signals (1-based). */
  seq: number;
  name: string;
  /** Its index among the signals of its name (0-based). */
  index: number;
  id: string | null;
  payload: unknown;
  at: number;
}

/** What an append came to. */
export type AppendResult =
  | { kind: 'appended' | 'duplicate'; index: number; seq: number }
  | { kind: 'missing' }
  | { kind: 'ended'; status: string }
  | { kind: 'conflict' };

/*
 * append: KEYS[1] snap, KEYS[2] status stream, KEYS[3] inbox, KEYS[4] events stream.
 * ARGV[1] name, ARGV[2] payload (JSON text), ARGV[3] id ('' for none), ARGV[4] at (epoch ms).
 * Returns {'missing'} | {'ended', status} | {'conflict'} | {'duplicate', index, seq} |
 * {'appended', index, seq}. Nothing is written unless it returns 'appended'. A known id is
 * answered first (the same send again gets its first answer, even once the run has ended).
 */
const APPEND_LUA = `
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local name, payload, id, at = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local digest = redis.sha1hex(payload)
if id ~= '' then
  local seen = redis.call('HGET', KEYS[3], 'i:' .. id)
  if seen then
    local index, seq, sha, was = string.match(seen, '^(%d+) (%d+) (%x+) (.+)$')
    if was == name and sha == digest then return {'duplicate', index, seq} end
    return {'conflict'}
  end
end
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last > 0 then
  local f = last[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'd' then
      local to = cjson.decode(f[i + 1])['to']
      if to == 'succeeded' or to == 'cancelled' then return {'ended', to} end
    end
  end
end
local index = redis.call('HINCRBY', KEYS[3], 'c:' .. name, 1) - 1
local seq = redis.call('HINCRBY', KEYS[3], 'n', 1)
local idJson = 'null'
if id ~= '' then
  idJson = cjson.encode(id)
  redis.call('HSET', KEYS[3], 'i:' .. id, index .. ' ' .. seq .. ' ' .. digest .. ' ' .. name)
end
local head = '{"seq":' .. seq .. ',"name":' .. cjson.encode(name) .. ',"index":' .. index ..
  ',"id":' .. idJson .. ',"at":' .. at
redis.call('HSET', KEYS[3], 's:' .. name .. ':' .. index, head .. ',"payload":' .. payload .. '}')
local v = redis.call('HGET', KEYS[1], 'v') or '0'
redis.call('XADD', KEYS[4], '*', 'v', v, 't', 'signal.received', 'd',
  '{"type":"signal.received",' .. string.sub(head, 2) .. ',"payload":' .. payload .. '}')
return {'appended', index, seq}
`;
const APPEND_COMMAND = 'flujoInboxAppend_v2';

/** The inbox of the runs of one prefix. */
export interface InboxStore {
  /** Appends a signal (see the module's doc); `payload` is its JSON text. */
  append(
    runId: string,
    signal: { name: string; payload: string; id: string | null; at: number },
  ): Promise<AppendResult>;
  /** The signal `name` number `index`, or null when it has not been sent (yet). */
  read(runId: string, name: string, index: number): Promise<StoredSignal | null>;
  /** How many signals of each name were sent to the run. */
  counts(runId: string, names: readonly string[]): Promise<Record<string, number>>;
}

/** Creates the {@link InboxStore} of `keys`' prefix on `redis`. */
export function createInboxStore(redis: Redis, keys: Keys): InboxStore {
  const commands = redis as unknown as Record<string, unknown>;
  if (commands[APPEND_COMMAND] === undefined) {
    redis.defineCommand(APPEND_COMMAND, { numberOfKeys: 4, lua: APPEND_LUA });
  }
  const append = commands[APPEND_COMMAND] as (...args: string[]) => Promise<string[]>;
  return {
    async append(runId, { name, payload, id, at }) {
      const reply = await append.call(
        redis,
        keys.snap(runId),
        keys.status(runId),
        keys.inbox(runId),
        keys.events(runId),
        name,
        payload,
        id ?? '',
        String(at),
      );
      const [kind, a, b] = reply;
      if (kind === 'appended' || kind === 'duplicate') {
        return { kind, index: Number(a), seq: Number(b) };
      }
      if (kind === 'ended') return { kind, status: String(a) };
      return { kind: kind === 'missing' ? 'missing' : 'conflict' };
    },
    async read(runId, name, index) {
      const raw = await redis.hget(keys.inbox(runId), `s:${name}:${index}`);
      return raw === null ? null : (JSON.parse(raw) as StoredSignal);
    },
    async counts(runId, names) {
      const out: Record<string, number> = {};
      if (names.length === 0) return out;
      const raw = await redis.hmget(keys.inbox(runId), ...names.map((n) => `c:${n}`));
      names.forEach((n, i) => (out[n] = Number(raw[i] ?? 0)));
      return out;
    },
  };
}
