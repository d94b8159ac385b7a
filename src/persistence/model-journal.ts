/**
 * The model journal: every model reply of a granular agent turn is recorded
 * before any tool of that turn runs, so a worker that dies after the model call never re-asks the
 * model and never produces different tool calls for the same turn. One Redis HASH per run (the
 * `journal` key), field `<stepId>:<turn>`, value the reply as JSON. The first recorded reply of a
 * turn wins and is never overwritten; every later caller gets it back.
 */
import type { Redis } from 'ioredis';
import { InputValidationError, InvariantError, SnapshotCorruptError } from '../errors.js';
import { modelReplySchema, type ModelReply } from '../schemas/messages.js';
import { zodIssuesToValidationIssues } from '../schemas/issues.js';
import { assertStepId, createKeys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';

/** Options of {@link createModelJournal}. */
export interface ModelJournalOptions {
  /** The client to use. It stays the caller's to close. */
  redis: Redis;
  /**
   * The key prefix (see `createKeys`).
   * @defaultValue `'flujo'`
   */
  prefix?: string;
}

/** What {@link ModelJournal.record} returns. */
export interface RecordedReply {
  /** The journaled reply of the turn: the caller's when `recorded`, else the one recorded first. */
  reply: ModelReply;
  /** True when this call recorded the reply; false when the turn already had one. */
  recorded: boolean;
}

/** Model replies per run, step and turn, first writer wins. */
export interface ModelJournal {
  /**
   * Records `reply` as the reply of turn `turn` of step `stepId` unless the turn already has one,
   * and returns the journaled reply. Validates `reply` (`InputValidationError`) before any I/O.
   * Throws `SnapshotCorruptError` when the stored reply is unreadable.
   */
  record(runId: string, stepId: string, turn: number, reply: ModelReply): Promise<RecordedReply>;
  /** The journaled reply of the turn, or null. Throws `SnapshotCorruptError` when it is unreadable. */
  get(runId: string, stepId: string, turn: number): Promise<ModelReply | null>;
  /** The replies of turns `0 … count - 1` of the step, in one read (null for a turn without one). */
  replies(runId: string, stepId: string, count: number): Promise<(ModelReply | null)[]>;
  /**
   * Records the model replies an atomic agent step's attempt got so far, in order, when the
   * attempt pauses for a tool call's approval: the execution that resumes replays them, reaches
   * the same call and asks the model nothing it was already asked. One field per attempt,
   * `<stepId>#<attempt>`, rewritten by each pause of the attempt (each holds the last as prefix).
   */
  recordAttempt(
    runId: string,
    stepId: string,
    attempt: number,
    replies: readonly ModelReply[],
  ): Promise<void>;
  /** The replies {@link recordAttempt} recorded for the attempt (empty when none). */
  attemptReplies(runId: string, stepId: string, attempt: number): Promise<ModelReply[]>;
  /**
   * Deletes the replies of step `stepId` from turn `fromTurn` on (for tests and maintenance: a
   * live run relies on its journal). Returns how many were deleted.
   */
  drop(runId: string, stepId: string, fromTurn: number): Promise<number>;
  /** Every reply the run's journal holds, by step then turn (or attempt), in one read. */
  list(runId: string): Promise<JournaledReply[]>;
}

/** One reply as {@link ModelJournal.list} reads it. */
export interface JournaledReply {
  stepId: string;
  /** The granular turn (0-based) it answered, or null for an atomic step's paused attempt. */
  turn: number | null;
  /** The atomic step's attempt whose replies these are, or null for a granular turn. */
  attempt: number | null;
  /** The turn's reply; for an atomic attempt, its replies in order. */
  replies: ModelReply[];
}

/*
 * drop: deletes the journal fields `<stepId>:<turn>` with turn ≥ fromTurn.
 *   KEYS[1]  the run's journal hash
 *   ARGV[1]  `<stepId>:` (the field prefix; step ids never contain ':')
 *   ARGV[2]  fromTurn
 *   Returns  the number of fields deleted
 */
const DROP_LUA = `
local prefix = ARGV[1]
local from = tonumber(ARGV[2])
local n = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, #prefix) == prefix then
    local rest = string.sub(field, #prefix + 1)
    if string.match(rest, '^%d+$') and tonumber(rest) >= from then
      n = n + redis.call('HDEL', KEYS[1], field)
    end
  end
end
return n
`;

/** Bump when the script changes meaning, so clients never mix versions under one command name. */
const JOURNAL_SCRIPT_VERSION = 1;
const DROP_COMMAND = `flujoJournal_drop_v${JOURNAL_SCRIPT_VERSION}`;

function assertTurn(turn: number, path = 'turn'): void {
  if (!Number.isSafeInteger(turn) || turn < 0) {
    throw new InputValidationError('model journal argument', [
      { path, message: `must be an integer ≥ 0, got ${turn}` },
    ]);
  }
}

/** The journal field of a turn. */
export function journalField(stepId: string, turn: number): string {
  return `${stepId}:${turn}`;
}

function decode(runId: string, stepId: string, turn: number, raw: string): ModelReply {
  const where = `model journal entry of step "${stepId}" turn ${turn}`;
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch (error) {
    throw new SnapshotCorruptError(runId, `${where} is not JSON`, { cause: error });
  }
  const parsed = modelReplySchema.safeParse(json);
  if (!parsed.success) {
    const issues = zodIssuesToValidationIssues(parsed.error.issues)
      .map((i) => `${i.path === '' ? '(root)' : i.path}: ${i.message}`)
      .join('; ');
    throw new SnapshotCorruptError(runId, `${where} is not a model reply (${issues})`, {
      cause: parsed.error,
    });
  }
  return parsed.data;
}

/** Creates the Redis-backed {@link ModelJournal}. */
export function createModelJournal(options: ModelJournalOptions): ModelJournal {
  const { redis } = options;
  const keys = createKeys(options.prefix);
  // ioredis runs EVALSHA and falls back to EVAL after a NOSCRIPT (e.g. a restarted server).
  redis.defineCommand(DROP_COMMAND, { numberOfKeys: 1, lua: DROP_LUA });

  /*
   * record: first writer wins per (run, step, turn).
   *   Written keys:  journal (HSETNX field reply)
   *   Reads:         journal (HGET field), only when HSETNX wrote nothing: an entry is never
   *                  overwritten, so what it reads is the reply that won
   *   Returns:       { reply: the stored reply, recorded: HSETNX said 1 }
   *   Throws:        InputValidationError (before any I/O), SnapshotCorruptError (stored reply
   *                  unreadable), RedisUnavailableError
   */
  async function record(
    runId: string,
    stepId: string,
    turn: number,
    reply: ModelReply,
  ): Promise<RecordedReply> {
    const key = keys.journal(runId);
    assertStepId(stepId);
    assertTurn(turn);
    const parsed = modelReplySchema.safeParse(reply);
    if (!parsed.success) {
      throw new InputValidationError(
        'model reply',
        zodIssuesToValidationIssues(parsed.error.issues, 'reply'),
      );
    }
    const field = journalField(stepId, turn);
    const encoded = JSON.stringify(parsed.data);
    let stored: string | null;
    try {
      if ((await redis.hsetnx(key, field, encoded)) === 1) {
        return { reply: parsed.data, recorded: true };
      }
      stored = await redis.hget(key, field);
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    if (stored === null) {
      throw new InvariantError(
        `the journal of run "${runId}" holds no reply for step "${stepId}" turn ${turn} right after HSETNX refused to write one`,
      );
    }
    return { reply: decode(runId, stepId, turn, stored), recorded: false };
  }

  /*
   * get: reads one turn's reply.
   *   Reads:    journal (HGET field)
   *   Returns:  the reply, or null when the turn has none
   *   Throws:   SnapshotCorruptError, RedisUnavailableError
   */
  async function get(runId: string, stepId: string, turn: number): Promise<ModelReply | null> {
    const key = keys.journal(runId);
    assertStepId(stepId);
    assertTurn(turn);
    let raw: string | null;
    try {
      raw = await redis.hget(key, journalField(stepId, turn));
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    return raw === null ? null : decode(runId, stepId, turn, raw);
  }

  /*
   * drop: deletes a step's replies from a turn on.
   *   Written keys:  journal (HDEL, by the Lua script DROP_LUA, atomically)
   *   Returns:       how many replies were deleted
   */
  async function drop(runId: string, stepId: string, fromTurn: number): Promise<number> {
    const key = keys.journal(runId);
    assertStepId(stepId);
    assertTurn(fromTurn, 'fromTurn');
    const command = (redis as unknown as Record<string, (...a: string[]) => Promise<number>>)[
      DROP_COMMAND
    ]!;
    try {
      return await command.call(redis, key, `${stepId}:`, String(fromTurn));
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
  }

  /*
   * replies: reads turns 0 … count - 1.
   *   Reads:    journal (HMGET fields)
   */
  async function replies(
    runId: string,
    stepId: string,
    count: number,
  ): Promise<(ModelReply | null)[]> {
    const key = keys.journal(runId);
    assertStepId(stepId);
    assertTurn(count, 'count');
    if (count === 0) return [];
    const fields = Array.from({ length: count }, (_, turn) => journalField(stepId, turn));
    let raws: (string | null)[];
    try {
      raws = await redis.hmget(key, ...fields);
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    return raws.map((raw, turn) => (raw === null ? null : decode(runId, stepId, turn, raw)));
  }

  /*
   * recordAttempt: one field `<stepId>#<attempt>` (step ids never hold '#', so it never meets a
   * turn's field), the replies as a JSON array.
   *   Written keys:  journal (HSET field)
   */
  async function recordAttempt(
    runId: string,
    stepId: string,
    attempt: number,
    list: readonly ModelReply[],
  ): Promise<void> {
    assertStepId(stepId);
    assertTurn(attempt, 'attempt');
    const parsed = list.map((reply, i) => {
      const r = modelReplySchema.safeParse(reply);
      if (!r.success) {
        throw new InputValidationError(
          'model reply',
          zodIssuesToValidationIssues(r.error.issues, `replies[${i}]`),
        );
      }
      return r.data;
    });
    try {
      await redis.hset(keys.journal(runId), `${stepId}#${attempt}`, JSON.stringify(parsed));
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
  }

  /*
   * attemptReplies: reads what recordAttempt wrote.
   *   Reads:    journal (HGET field)
   */
  async function attemptReplies(
    runId: string,
    stepId: string,
    attempt: number,
  ): Promise<ModelReply[]> {
    assertStepId(stepId);
    assertTurn(attempt, 'attempt');
    let raw: string | null;
    try {
      raw = await redis.hget(keys.journal(runId), `${stepId}#${attempt}`);
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    if (raw === null) return [];
    let json: unknown;
    try {
      json = JSON.parse(raw);
    } catch (error) {
      throw new SnapshotCorruptError(
        runId,
        `model journal entry of step "${stepId}" attempt ${attempt} is not JSON`,
        { cause: error },
      );
    }
    if (!Array.isArray(json)) {
      throw new SnapshotCorruptError(
        runId,
        `model journal entry of step "${stepId}" attempt ${attempt} is not a list of replies`,
      );
    }
    return json.map((r, turn) => decode(runId, stepId, turn, JSON.stringify(r)));
  }

  /*
   * list: reads the whole journal.
   *   Reads:    journal (HGETALL)
   *   Returns:  fields `<stepId>:<turn>` and `<stepId>#<attempt>`, decoded and sorted
   *   Throws:   SnapshotCorruptError, RedisUnavailableError
   */
  async function list(runId: string): Promise<JournaledReply[]> {
    let raw: Record<string, string>;
    try {
      raw = await redis.hgetall(keys.journal(runId));
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    const out: JournaledReply[] = [];
    for (const [field, value] of Object.entries(raw)) {
      const turnAt = field.lastIndexOf(':');
      const attemptAt = field.lastIndexOf('#');
      if (attemptAt > turnAt) {
        const stepId = field.slice(0, attemptAt);
        const attempt = Number(field.slice(attemptAt + 1));
        out.push({
          stepId,
          turn: null,
          attempt,
          replies: await attemptReplies(runId, stepId, attempt),
        });
      } else if (turnAt > 0) {
        const stepId = field.slice(0, turnAt);
        const turn = Number(field.slice(turnAt + 1));
        out.push({ stepId, turn, attempt: null, replies: [decode(runId, stepId, turn, value)] });
      }
    }
    return out.sort(
      (a, b) =>
        a.stepId.localeCompare(b.stepId) || (a.turn ?? a.attempt ?? 0) - (b.turn ?? b.attempt ?? 0),
    );
  }

  return { record, get, replies, drop, recordAttempt, attemptReplies, list };
}
