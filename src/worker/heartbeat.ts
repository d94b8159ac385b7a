/**
 * Workers' heartbeats: each worker writes, every `heartbeatMs`, a key of its own with a TTL of three
 * beats (who it is, the queues it takes units from, the operators and agents it knows, the units it
 * is running), scores itself in the set of live workers by when that beat lapses, and notes the
 * beat's time against each of its queues. A worker that dies stops beating: its key expires, and
 * the listing skips a member whose beat lapsed. All under the hash tag `{<prefix>:workers}`.
 */
import type { Redis } from 'ioredis';
import type { Keys } from '../persistence/keys.js';

/** What a live worker said in its latest heartbeat. */
export interface WorkerInfo {
  /** The worker's id (random, per worker). */
  id: string;
  host: string;
  pid: number;
  /** The BullMQ queues it takes units from. */
  queues: string[];
  /** The operators it knows, by name. */
  operators: string[];
  /** The agents it knows, by name. */
  agents: string[];
  /** The units it was running at its latest beat. */
  inFlight: number;
  /** When it started (epoch ms). */
  startedAt: number;
  /** Its latest beat (epoch ms). */
  beatAt: number;
  /** When its heartbeat lapses unless it beats again (epoch ms). */
  expiresAt: number;
}

/** Writes one heartbeat of `info` (see the module's comment); `ttlMs` is how long it holds. */
export async function beat(
  redis: Redis,
  keys: Keys,
  info: Omit<WorkerInfo, 'expiresAt'>,
  ttlMs: number,
): Promise<void> {
  const expiresAt = info.beatAt + ttlMs;
  const record: WorkerInfo = { ...info, expiresAt };
  const queueBeats = info.queues.flatMap((q) => [q, String(info.beatAt)]);
  await Promise.all([
    redis.set(keys.workerBeat(info.id), JSON.stringify(record), 'PX', ttlMs),
    redis.zadd(keys.workersLive(), expiresAt, info.id),
    // Beats older than a minute past their lapse are dropped from the set as workers beat.
    redis.zremrangebyscore(keys.workersLive(), '-inf', info.beatAt - 60_000),
    queueBeats.length > 0 ? redis.hset(keys.workerQueues(), ...queueBeats) : undefined,
  ]);
}

/** Removes a worker's heartbeat (a worker that closes). */
export async function endBeats(redis: Redis, keys: Keys, workerId: string): Promise<void> {
  await Promise.all([
    redis.del(keys.workerBeat(workerId)),
    redis.zrem(keys.workersLive(), workerId),
  ]);
}

/** The live workers (a heartbeat that has not lapsed at `now`), by host, then pid. */
export async function liveWorkers(redis: Redis, keys: Keys, now: number): Promise<WorkerInfo[]> {
  const ids = await redis.zrangebyscore(keys.workersLive(), now, '+inf');
  if (ids.length === 0) return [];
  const records = await redis.mget(...ids.map((id) => keys.workerBeat(id)));
  const workers: WorkerInfo[] = [];
  for (const r of records) {
    if (r === null) continue;
    const w = JSON.parse(r) as WorkerInfo;
    if (w.expiresAt >= now) workers.push(w);
  }
  return workers.sort((a, b) => a.host.localeCompare(b.host) || a.pid - b.pid);
}

/** The latest heartbeat of any worker on each queue that ever had one (epoch ms), by queue name. */
export async function queueBeats(redis: Redis, keys: Keys): Promise<Record<string, number>> {
  const raw = await redis.hgetall(keys.workerQueues());
  return Object.fromEntries(Object.entries(raw).map(([q, at]) => [q, Number(at)]));
}
