/**
 * The model journal: every model reply of an agent step is recorded before any tool of its turn
 * runs, so a worker that dies after the model call never re-asks the model and never produces
 * different tool calls for the same turn. One Redis HASH per run (the `journal` key, in the run's
 * hash tag and under the run's retention like its other keys):
 * - a granular turn: field `<stepId>:<turn>`, value the reply as JSON. The first recorded reply of
 *   a turn wins and is never overwritten; every later caller gets it back.
 * - an atomic step: one field per model call of an attempt, `<stepId>#<attempt>:<call>` (the
 *   call's index in the attempt, from 0), value `{ request, reply }`: the reply and the digest of
 *   the request it answered (see {@link ModelJournal.recordCall}).
 * - `<stepId>#<attempt>` (a JSON array of replies) is what an earlier release recorded when an
 *   atomic attempt paused for a tool call's approval; it is still read, never written.
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

/** One model call of an atomic step's attempt, as journaled. */
export interface JournaledCall {
  /**
   * The digest of the request the reply answered (see `requestDigest` in `execution/model-call.ts`);
   * null for a reply an earlier release recorded at a pause, which carries none.
   */
  request: string | null;
  reply: ModelReply;
}

/** What {@link ModelJournal.recordCall} returns. */
export interface RecordedCall extends RecordedReply {
  /** True when the call's field held the reply to another request, which this one replaced. */
  replaced: boolean;
}

/** Model replies per run, step and turn (or attempt and call), first writer wins. */
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
   * Records `reply` as the reply of model call `call` (0-based) of attempt `attempt` of the atomic
   * step `stepId`, answering the request whose digest is `request`. The first reply recorded for
   * a request wins: when the field already holds a reply to the same request, that one is
   * returned (`recorded: false`) and the caller goes on with it, as a racing granular turn does.
   * A field holding the reply to another request (the execution that recorded it sent other prior
   * messages: it is not the conversation this execution has) is replaced (`replaced: true`).
   * Validates before any I/O (`InputValidationError`).
   */
  recordCall(
    runId: string,
    stepId: string,
    attempt: number,
    call: number,
    request: string,
    reply: ModelReply,
  ): Promise<RecordedCall>;
  /**
   * The journaled calls `0 … count - 1` of the attempt, in one read (null for a call without a
   * record). Where an attempt paused under an earlier release, its replies recorded then fill the
   * calls that have no record of their own (with a null `request`).
   */
  attemptCalls(
    runId: string,
    stepId: string,
    attempt: number,
    count: number,
  ): Promise<(JournaledCall | null)[]>;
  /** The replies an earlier release recorded when the attempt paused (empty when none). */
  attemptReplies(runId: string, stepId: string, attempt: number): Promise<ModelReply[]>;
  /**
   * Deletes the replies of step `stepId` from turn `fromTurn` on (for tests and maintenance: a
   * live run relies on its journal). Returns how many were deleted.
   */
  drop(runId: string, stepId: string, fromTurn: number): Promise<number>;
  /** Every reply the run's journal holds, by step then turn (or attempt), in one read. */
  list(runId: string): Promise<JournaledReply[]>;
}

/** One reply as `ModelJournal.list` reads it. */
export interface JournaledReply {
  stepId: string;
  /** The granular turn (0-based) it answered, or null for an atomic step's reply. */
  turn: number | null;
  /** The atomic step's attempt whose reply (or replies) these are, or null for a granular turn. */
  attempt: number | null;
  /**
   * The atomic attempt's model call (0-based) the reply answered; null for a granular turn, and
   * for the replies an earlier release recorded when an atomic attempt paused.
   */
  call: number | null;
  /** The reply; for a paused attempt recorded by an earlier release, its replies in order. */
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

/*
 * record_call: the reply of one model call of an atomic attempt.
 *   KEYS[1]  the run's journal hash
 *   ARGV[1]  the field `<stepId>#<attempt>:<call>`
 *   ARGV[2]  the request's digest
 *   ARGV[3]  the record, JSON `{ request, reply }`
 *   Returns  { 1, ARGV[3] } when written over nothing, { 2, ARGV[3] } when it replaced the reply
 *            to another request, { 0, stored } when the field holds a reply to this request
 */
const RECORD_CALL_LUA = `
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if stored then
  local ok, record = pcall(cjson.decode, stored)
  if ok and type(record) == 'table' and record['request'] == ARGV[2] then
    return {0, stored}
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if stored then return {2, ARGV[3]} end
return {1, ARGV[3]}
`;

/** Bump when the script changes meaning, so clients never mix versions under one command name. */
const JOURNAL_SCRIPT_VERSION = 1;
const DROP_COMMAND = `flujoJournal_drop_v${JOURNAL_SCRIPT_VERSION}`;
const RECORD_CALL_COMMAND = `flujoJournal_recordCall_v${JOURNAL_SCRIPT_VERSION}`;

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

/** The journal field of model call `call` of an atomic step's attempt. */
export function callField(stepId: string, attempt: number, call: number): string {
  return `${stepId}#${attempt}:${call}`;
}

const DIGEST = /^[0-9a-f]{64}$/;

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

/** A journaled call of an atomic attempt: `{ request, reply }`. */
function decodeCall(
  runId: string,
  stepId: string,
  attempt: number,
  call: number,
  raw: string,
): JournaledCall {
  const where = `model journal entry of step "${stepId}" attempt ${attempt} call ${call}`;
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch (error) {
    throw new SnapshotCorruptError(runId, `${where} is not JSON`, { cause: error });
  }
  const record = json as { request?: unknown; reply?: unknown } | null;
  if (typeof record !== 'object' || record === null || typeof record.request !== 'string') {
    throw new SnapshotCorruptError(runId, `${where} is not a { request, reply } record`);
  }
  const reply = decode(runId, stepId, call, JSON.stringify(record.reply ?? null));
  return { request: record.request, reply };
}

/** The replies an earlier release recorded when an atomic attempt paused: a JSON array. */
function decodeReplies(runId: string, stepId: string, attempt: number, raw: string): ModelReply[] {
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

/** Creates the Redis-backed {@link ModelJournal}. */
export function createModelJournal(options: ModelJournalOptions): ModelJournal {
  const { redis } = options;
  const keys = createKeys(options.prefix);
  // ioredis runs EVALSHA and falls back to EVAL after a NOSCRIPT (e.g. a restarted server).
  redis.defineCommand(DROP_COMMAND, { numberOfKeys: 1, lua: DROP_LUA });
  redis.defineCommand(RECORD_CALL_COMMAND, { numberOfKeys: 1, lua: RECORD_CALL_LUA });

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
   * recordCall: the Lua script RECORD_CALL_LUA, atomically.
   *   Written keys:  journal (HSET field), unless the field holds a reply to the same request
   *   Returns:       the reply that stands for the call, whether this call wrote it, and whether
   *                  it replaced the reply to another request
   *   Throws:        InputValidationError (before any I/O), SnapshotCorruptError (the stored
   *                  record is unreadable), RedisUnavailableError
   */
  async function recordCall(
    runId: string,
    stepId: string,
    attempt: number,
    call: number,
    request: string,
    reply: ModelReply,
  ): Promise<RecordedCall> {
    const key = keys.journal(runId);
    assertStepId(stepId);
    assertTurn(attempt, 'attempt');
    assertTurn(call, 'call');
    if (!DIGEST.test(request)) {
      throw new InputValidationError('model journal argument', [
        { path: 'request', message: 'must be a SHA-256 digest (64 lowercase hex digits)' },
      ]);
    }
    const parsed = modelReplySchema.safeParse(reply);
    if (!parsed.success) {
      throw new InputValidationError(
        'model reply',
        zodIssuesToValidationIssues(parsed.error.issues, 'reply'),
      );
    }
    const field = callField(stepId, attempt, call);
    const command = (
      redis as unknown as Record<string, (...a: string[]) => Promise<[number, string]>>
    )[RECORD_CALL_COMMAND]!;
    let answer: [number, string];
    try {
      answer = await command.call(
        redis,
        key,
        field,
        request,
        JSON.stringify({ request, reply: parsed.data }),
      );
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    const [status, stored] = answer;
    if (status !== 0) return { reply: parsed.data, recorded: true, replaced: status === 2 };
    return {
      reply: decodeCall(runId, stepId, attempt, call, stored).reply,
      recorded: false,
      replaced: false,
    };
  }

  /*
   * attemptCalls: reads calls 0 … count - 1 of an attempt, and the paused attempt's replies an
   * earlier release recorded, in one read.
   *   Reads:    journal (HMGET fields)
   */
  async function attemptCalls(
    runId: string,
    stepId: string,
    attempt: number,
    count: number,
  ): Promise<(JournaledCall | null)[]> {
    assertStepId(stepId);
    assertTurn(attempt, 'attempt');
    assertTurn(count, 'count');
    const fields = Array.from({ length: count }, (_, call) => callField(stepId, attempt, call));
    let raws: (string | null)[];
    try {
      raws = await redis.hmget(keys.journal(runId), ...fields, `${stepId}#${attempt}`);
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    const legacy = raws.pop() ?? null;
    const paused = legacy === null ? [] : decodeReplies(runId, stepId, attempt, legacy);
    return raws.map((raw, call) => {
      if (raw !== null) return decodeCall(runId, stepId, attempt, call, raw);
      const reply = paused[call];
      return reply === undefined ? null : { request: null, reply };
    });
  }

  /*
   * attemptReplies: reads what an earlier release recorded when the attempt paused.
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
    return raw === null ? [] : decodeReplies(runId, stepId, attempt, raw);
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
      // Step ids hold neither '#' nor ':' (see STEP_ID_PATTERN).
      const attemptAt = field.indexOf('#');
      const turnAt = field.indexOf(':');
      if (attemptAt > 0) {
        const stepId = field.slice(0, attemptAt);
        const rest = field.slice(attemptAt + 1);
        const at = rest.indexOf(':');
        const attempt = Number(at < 0 ? rest : rest.slice(0, at));
        if (at < 0) {
          const replies = decodeReplies(runId, stepId, attempt, value);
          out.push({ stepId, turn: null, attempt, call: null, replies });
        } else {
          const call = Number(rest.slice(at + 1));
          const { reply } = decodeCall(runId, stepId, attempt, call, value);
          out.push({ stepId, turn: null, attempt, call, replies: [reply] });
        }
      } else if (turnAt > 0) {
        const stepId = field.slice(0, turnAt);
        const turn = Number(field.slice(turnAt + 1));
        const replies = [decode(runId, stepId, turn, value)];
        out.push({ stepId, turn, attempt: null, call: null, replies });
      }
    }
    // By step; a step's granular turns in order, its atomic attempts in order, each attempt's
    // calls in order (the replies a pause recorded under an earlier release before them).
    return out.sort(
      (a, b) =>
        a.stepId.localeCompare(b.stepId) ||
        (a.attempt ?? -1) - (b.attempt ?? -1) ||
        (a.turn ?? a.call ?? -1) - (b.turn ?? b.call ?? -1),
    );
  }

  return { record, get, replies, drop, recordCall, attemptCalls, attemptReplies, list };
}
