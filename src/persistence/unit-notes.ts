/**
 * The note a worker leaves beside a run when it starts a unit of work (a step attempt or a turn):
 * which execution, when, and by which worker. It is written with one command that is not waited
 * for, and returns the note it replaced, so a worker that takes over a unit whose previous worker
 * died learns who that was without a read of its own.
 */
import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';

/** Who runs a unit: the process, and an id that tells two workers of one process apart. */
export interface WorkerIdentity {
  host: string;
  pid: number;
  /** Unique per worker instance. */
  id: string;
}

/** A parsed note: `<attempt> <pauses> <at> <workerId> <turn|-> <host> <pid>`. */
export interface UnitNote {
  attempt: number;
  pauses: number;
  at: number;
  turn: number | null;
  worker: WorkerIdentity | null;
}

/** The note of an execution starting now. */
export function formatUnitNote(
  attempt: number,
  pauses: number,
  at: number,
  turn: number | undefined,
  worker: WorkerIdentity,
): string {
  return `${attempt} ${pauses} ${at} ${worker.id} ${turn ?? '-'} ${worker.host} ${worker.pid}`;
}

/** Parses a note; notes written before workers were named have only the first three fields. */
export function parseUnitNote(note: string | null | undefined): UnitNote | null {
  if (note === null || note === undefined) return null;
  const [attempt, pauses, at, id, turn, host, pid] = note.split(' ');
  if (attempt === undefined || pauses === undefined) return null;
  return {
    attempt: Number(attempt),
    pauses: Number(pauses),
    at: Number(at ?? 0),
    turn: turn === undefined || turn === '-' ? null : Number(turn),
    worker: id === undefined || host === undefined ? null : { id, host, pid: Number(pid ?? 0) },
  };
}

const SWAP = `
local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return old
`;
const SWAP_COMMAND = 'flujoUnitNoteSwap_v1';

/** Writes `field` of the hash `key` and returns the value it had (one command, atomic). */
export function unitNoteSwapper(
  redis: Redis,
): (key: string, field: string, note: string) => Promise<string | null> {
  const commands = redis as unknown as Record<string, unknown>;
  if (commands[SWAP_COMMAND] === undefined) {
    redis.defineCommand(SWAP_COMMAND, { numberOfKeys: 1, lua: SWAP });
  }
  const swap = commands[SWAP_COMMAND] as (...args: string[]) => Promise<string | null>;
  return (key, field, note) => swap.call(redis, key, field, note);
}

/** The unit notes of the runs of one prefix: one hash per run, a field per step. */
export interface UnitNotes {
  /** Writes the note of `stepId` and returns the note it replaced (one command, atomic). */
  swap(runId: string, stepId: string, note: string): Promise<string | null>;
  /** Every note of the run, by step id (raw; see {@link parseUnitNote}). */
  read(runId: string): Promise<Record<string, string>>;
}

/** Creates the {@link UnitNotes} of `keys`' prefix on `redis`. */
export function createUnitNotes(redis: Redis, keys: Keys): UnitNotes {
  const swap = unitNoteSwapper(redis);
  return {
    swap: (runId, stepId, note) => swap(keys.started(runId), stepId, note),
    read: (runId) => redis.hgetall(keys.started(runId)),
  };
}
