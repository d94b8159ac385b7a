/**
 * Where schedules live in Redis: their definitions, each one's firing state and its recent fires,
 * all under the hash tag `{<prefix>:schedules}` (one Redis Cluster slot), so that the script that
 * records a fire's outcome and moves the state on does both at once.
 */
import type { Redis } from 'ioredis';
import type { Keys } from '../persistence/keys.js';
import type { ScheduleDefinition } from './schedule-definition.js';

/** What came of one fire. */
export type FireOutcome = 'started' | 'skipped' | 'buffered' | 'missed' | 'failed';

/** One fire of a schedule, as recorded. */
export interface ScheduleFire {
  /** Its key: the fire time in epoch ms, or `manual-<ms>` for `triggerSchedule`. */
  key: string;
  /** The fire time (for a trigger, when it was asked), epoch ms. */
  at: number;
  outcome: FireOutcome;
  /** The run it started (`started`), or will start (`buffered`). */
  runId?: string;
  /** Why it was skipped, or why its start failed. */
  reason?: string;
  /** True for a fire of `triggerSchedule`. */
  manual?: boolean;
  /** When the outcome was decided, epoch ms. */
  decidedAt: number;
}

/** A schedule's firing state. */
export interface ScheduleState {
  /** The newest fire time handled (every fire at or before it has its outcome), epoch ms. */
  last: number;
  /** The run of the newest started fire, or ''. */
  lastRun: string;
  /** When that run's fire was decided, epoch ms. */
  lastRunAt: number;
  /** The key of the fire waiting for the previous run to end (`buffer_one`), or ''. */
  buffered: string;
}

/** How many fires of each schedule are kept, newest first. */
export const KEPT_FIRES = 50;

/*
 * record: KEYS state, fires, fire-times, defs. ARGV: 1 fire key, 2 fire time, 3 record JSON,
 * 4 expected lastRun, 5 expected buffered, 6 new lastRun ('' keep, '-' clear), 7 new buffered
 * ('' keep, '-' clear), 8 overwrite ('1': replace a recorded outcome), 9 fires kept, 10 compare
 * ('1': refuse unless lastRun and buffered are the expected ones), 11 clear lastRun if it is this
 * run, 12 now, 13 the schedule id. Returns {'removed'} (no such schedule: nothing written),
 * {'existing', json} (the fire was decided already), {'stale'} or {'recorded', json}.
 */
const RECORD_LUA = `
if redis.call('HEXISTS', KEYS[4], ARGV[13]) == 0 then return {'removed'} end
if ARGV[8] ~= '1' then
  local existing = redis.call('HGET', KEYS[2], ARGV[1])
  if existing then return {'existing', existing} end
end
local lastRun = redis.call('HGET', KEYS[1], 'lastRun') or ''
if ARGV[10] == '1' then
  local buffered = redis.call('HGET', KEYS[1], 'buffered') or ''
  if lastRun ~= ARGV[4] or buffered ~= ARGV[5] then return {'stale'} end
end
if ARGV[6] == '-' then redis.call('HSET', KEYS[1], 'lastRun', '')
elseif ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'lastRun', ARGV[6], 'lastRunAt', ARGV[12]) end
if ARGV[7] == '-' then redis.call('HSET', KEYS[1], 'buffered', '')
elseif ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'buffered', ARGV[7]) end
if ARGV[11] ~= '' and lastRun == ARGV[11] then redis.call('HSET', KEYS[1], 'lastRun', '') end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
local n = redis.call('ZCARD', KEYS[3])
local keep = tonumber(ARGV[9])
if n > keep then
  local old = redis.call('ZRANGE', KEYS[3], 0, n - keep - 1)
  redis.call('HDEL', KEYS[2], unpack(old))
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, n - keep - 1)
end
return {'recorded', ARGV[3]}`;
const RECORD_COMMAND = 'flujoSchedule_record_v2';

/* advance: KEYS state, defs. ARGV 1 a fire time, 2 the schedule id: `last` becomes the fire
 * time if it is newer (nothing for a schedule removed meanwhile). */
const ADVANCE_LUA = `
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then return 0 end
local last = tonumber(redis.call('HGET', KEYS[1], 'last') or '0')
if tonumber(ARGV[1]) > last then redis.call('HSET', KEYS[1], 'last', ARGV[1]) end
return 1`;
const ADVANCE_COMMAND = 'flujoSchedule_advance_v2';

type Script = (...args: string[]) => Promise<unknown>;

/** The script `name` on `redis`, registered once per client. */
function script(redis: Redis, name: string, lua: string, keys: number): Script {
  const commands = redis as unknown as Record<string, Script | undefined>;
  if (commands[name] === undefined) redis.defineCommand(name, { numberOfKeys: keys, lua });
  const fn = commands[name] as Script;
  return (...args) => fn.apply(redis, args);
}

/** What a record asks of the state besides writing the fire's outcome. */
export interface RecordChange {
  /** Refuse (`stale`) unless the state's lastRun and buffered are these. */
  expect?: { lastRun: string; buffered: string };
  /** Replace an outcome recorded for the fire. @defaultValue false: keep it, and return it */
  overwrite?: boolean;
  /** The new lastRun (`null`: clear it). */
  lastRun?: string | null;
  /** The new buffered fire (`null`: clear it). */
  buffered?: string | null;
  /** Clear lastRun if it is this run. */
  clearRun?: string;
}

/** What a record came to. */
export type RecordResult =
  | { kind: 'recorded' | 'existing'; fire: ScheduleFire }
  | { kind: 'stale'; fire?: undefined }
  | { kind: 'removed'; fire?: undefined };

const change = (value: string | null | undefined) =>
  value === undefined ? '' : value === null ? '-' : value;

/** The schedules of one key prefix, in Redis. */
export class ScheduleStore {
  readonly #redis: Redis;
  readonly #keys: Keys;

  constructor(redis: Redis, keys: Keys) {
    this.#redis = redis;
    this.#keys = keys;
  }

  /** The definition of schedule `id`, or null. */
  async get(id: string): Promise<ScheduleDefinition | null> {
    const raw = await this.#redis.hget(this.#keys.scheduleDefs(), id);
    return raw === null ? null : (JSON.parse(raw) as ScheduleDefinition);
  }

  /** Every schedule's definition, by id. */
  async all(): Promise<ScheduleDefinition[]> {
    const raw = await this.#redis.hgetall(this.#keys.scheduleDefs());
    return Object.values(raw)
      .map((text) => JSON.parse(text) as ScheduleDefinition)
      .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /**
   * Writes the definition; its state's `last` is set to `since` unless it has one (`reset`:
   * always, as a resume does), so no fire before `since` is caught up.
   */
  async put(def: ScheduleDefinition, since: number, reset = false): Promise<void> {
    const state = this.#keys.scheduleState(def.id);
    const multi = this.#redis.multi().hset(this.#keys.scheduleDefs(), def.id, JSON.stringify(def));
    if (reset) multi.hset(state, 'last', String(since));
    else multi.hsetnx(state, 'last', String(since));
    await multi.exec();
  }

  /** Removes the schedule's definition, state and fires; false when there was none. */
  async remove(id: string): Promise<boolean> {
    const k = this.#keys;
    const results = await this.#redis
      .multi()
      .hdel(k.scheduleDefs(), id)
      .del(k.scheduleState(id), k.scheduleFires(id), k.scheduleFireTimes(id))
      .exec();
    return results?.[0]?.[1] === 1;
  }

  /** The schedule's firing state. */
  async state(id: string): Promise<ScheduleState> {
    const raw = await this.#redis.hgetall(this.#keys.scheduleState(id));
    return {
      last: Number(raw['last'] ?? 0),
      lastRun: raw['lastRun'] ?? '',
      lastRunAt: Number(raw['lastRunAt'] ?? 0),
      buffered: raw['buffered'] ?? '',
    };
  }

  /** The outcome recorded for one fire, or null. */
  async fire(id: string, key: string): Promise<ScheduleFire | null> {
    const raw = await this.#redis.hget(this.#keys.scheduleFires(id), key);
    return raw === null ? null : (JSON.parse(raw) as ScheduleFire);
  }

  /** The schedule's kept fires, newest first. */
  async fires(id: string): Promise<ScheduleFire[]> {
    const keys = await this.#redis.zrevrange(this.#keys.scheduleFireTimes(id), 0, -1);
    if (keys.length === 0) return [];
    const raw = await this.#redis.hmget(this.#keys.scheduleFires(id), ...keys);
    return raw.flatMap((text) => (text === null ? [] : [JSON.parse(text) as ScheduleFire]));
  }

  /**
   * Records a fire's outcome and changes the state as `how` says, atomically (nothing for a
   * schedule removed meanwhile: `removed`): unless `overwrite`,
   * a fire already decided keeps its outcome (returned as `existing`); with `expect`, a state
   * that moved on meanwhile refuses the record (`stale`: decide again from the new state).
   */
  async record(
    id: string,
    fire: ScheduleFire,
    how: RecordChange,
    now: number,
  ): Promise<RecordResult> {
    const k = this.#keys;
    const run = script(this.#redis, RECORD_COMMAND, RECORD_LUA, 4);
    const reply = (await run(
      k.scheduleState(id),
      k.scheduleFires(id),
      k.scheduleFireTimes(id),
      k.scheduleDefs(),
      fire.key,
      String(fire.at),
      JSON.stringify(fire),
      how.expect?.lastRun ?? '',
      how.expect?.buffered ?? '',
      change(how.lastRun),
      change(how.buffered),
      how.overwrite === true ? '1' : '',
      String(KEPT_FIRES),
      how.expect === undefined ? '' : '1',
      how.clearRun ?? '',
      String(now),
      id,
    )) as [string, string?];
    if (reply[0] === 'stale') return { kind: 'stale' };
    if (reply[0] === 'removed') return { kind: 'removed' };
    return {
      kind: reply[0] as 'recorded' | 'existing',
      fire: JSON.parse(reply[1]!) as ScheduleFire,
    };
  }

  /** Moves the state's `last` to `at` if that is newer (and the schedule still exists). */
  async advance(id: string, at: number): Promise<void> {
    const run = script(this.#redis, ADVANCE_COMMAND, ADVANCE_LUA, 2);
    await run(this.#keys.scheduleState(id), this.#keys.scheduleDefs(), String(at), id);
  }
}
