/**
 * Conversation history: one append-only Redis LIST per run and step, one message per
 * element, as JSON. The run snapshot keeps a cursor (the history's length after its last commit),
 * never a copy. A message read back equals the message appended.
 *
 * Two ways to append:
 * - {@link HistoryStore.append}: standalone, atomic compare-and-append on the list's own length.
 * - {@link HistoryStore.appendOp}: the same compare-and-append as part of a snapshot commit, so an
 *   agent turn commits its messages and its snapshot (with the new cursor) in one atomic step. The
 *   keys share the run's hash tag, so this is valid on Redis Cluster too.
 */
import type { Redis } from 'ioredis';
import {
  HistoryConflictError,
  InputValidationError,
  InvariantError,
  SnapshotCorruptError,
} from '../errors.js';
import { chatMessageSchema, type ChatMessage } from '../schemas/messages.js';
import { zodIssuesToValidationIssues } from '../schemas/issues.js';
import { createKeys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';
import type { ListAppend } from './snapshot-store.js';

/** Options of {@link createHistoryStore}. */
export interface HistoryStoreOptions {
  /** The client to use. It stays the caller's to close. */
  redis: Redis;
  /**
   * The key prefix (see `createKeys`).
   * @defaultValue `'flujo'`
   */
  prefix?: string;
}

/** A range of a history, by message index: `from` inclusive, `to` exclusive (like `Array.slice`). */
export interface HistoryRange {
  /**
   * The first message to read.
   * @defaultValue 0
   */
  from?: number;
  /**
   * One past the last message to read (a cursor kept by the snapshot fits here).
   * @defaultValue the end of the history
   */
  to?: number;
}

/** Append-only message lists, one per run and step. */
export interface HistoryStore {
  /** The history's Redis key. */
  key(runId: string, stepId: string): string;
  /**
   * Appends `messages` only if the history holds exactly `expectedLength` messages, atomically;
   * returns the new length (the cursor the run snapshot keeps). Otherwise throws
   * `HistoryConflictError` (expected and actual length) and writes nothing. Validates every
   * message (`InputValidationError`) before any I/O.
   */
  append(
    runId: string,
    stepId: string,
    expectedLength: number,
    messages: readonly ChatMessage[],
  ): Promise<number>;
  /**
   * The append of `messages` for a snapshot commit (`SnapshotStore.commit(…, { appends })`): the
   * commit writes them only if the history still holds `expectedLength` messages, and otherwise
   * fails with `HistoryConflictError` and writes nothing (the snapshot neither). Validates every
   * message (`InputValidationError`) before any I/O.
   */
  appendOp(
    runId: string,
    stepId: string,
    expectedLength: number,
    messages: readonly ChatMessage[],
  ): ListAppend;
  /** Reads messages `[from, to)`, each validated. Throws `SnapshotCorruptError` for an unreadable one. */
  read(runId: string, stepId: string, range?: HistoryRange): Promise<ChatMessage[]>;
  /** How many messages the history holds (0 when it has none). */
  length(runId: string, stepId: string): Promise<number>;
}

/*
 * append: compare-and-append on a history list.
 *   KEYS[1]  the history list of the run and step
 *   ARGV[1]  the expected length
 *   ARGV[2…] the messages, JSON, in order
 *   Returns  {1, new length} when the length was ARGV[1] (and the messages were pushed), else
 *            {0, actual length} (nothing written)
 */
const APPEND_LUA = `
local len = redis.call('LLEN', KEYS[1])
if len ~= tonumber(ARGV[1]) then return {0, len} end
local n = #ARGV
local i = 2
while i <= n do
  local j = math.min(i + 999, n)
  len = redis.call('RPUSH', KEYS[1], unpack(ARGV, i, j))
  i = j + 1
end
return {1, len}
`;

/** Bump when the script changes meaning, so clients never mix versions under one command name. */
const HISTORY_SCRIPT_VERSION = 1;
const APPEND_COMMAND = `flujoHistory_append_v${HISTORY_SCRIPT_VERSION}`;

function assertCount(value: number, path: string): void {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new InputValidationError('history argument', [
      { path, message: `must be an integer ≥ 0, got ${value}` },
    ]);
  }
}

/** Validates `messages` and returns them as JSON, one string per message. */
export function encodeMessages(messages: readonly ChatMessage[]): string[] {
  if (!Array.isArray(messages)) {
    throw new InputValidationError('history messages', [
      { path: 'messages', message: 'must be an array' },
    ]);
  }
  return messages.map((message, i) => {
    const parsed = chatMessageSchema.safeParse(message);
    if (!parsed.success) {
      throw new InputValidationError(
        'history message',
        zodIssuesToValidationIssues(parsed.error.issues, `messages[${i}]`),
      );
    }
    return JSON.stringify(parsed.data);
  });
}

function decode(runId: string, stepId: string, index: number, raw: string): ChatMessage {
  const where = `history message ${index} of step "${stepId}"`;
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch (error) {
    throw new SnapshotCorruptError(runId, `${where} is not JSON`, { cause: error });
  }
  const parsed = chatMessageSchema.safeParse(json);
  if (!parsed.success) {
    const issues = zodIssuesToValidationIssues(parsed.error.issues)
      .map((i) => `${i.path === '' ? '(root)' : i.path}: ${i.message}`)
      .join('; ');
    throw new SnapshotCorruptError(runId, `${where} is not a chat message (${issues})`, {
      cause: parsed.error,
    });
  }
  return parsed.data;
}

/** Creates the Redis-backed {@link HistoryStore}. */
export function createHistoryStore(options: HistoryStoreOptions): HistoryStore {
  const { redis } = options;
  const keys = createKeys(options.prefix);
  // ioredis runs EVALSHA and falls back to EVAL after a NOSCRIPT (e.g. a restarted server).
  redis.defineCommand(APPEND_COMMAND, { numberOfKeys: 1, lua: APPEND_LUA });

  const keyOf = (runId: string, stepId: string): string => keys.history(runId, stepId);

  /*
   * append: compare-and-append.
   *   Written keys:  history (RPUSH, by the Lua script APPEND_LUA, only when LLEN == expected)
   *   Returns:       the new length
   *   Throws:        InputValidationError (before any I/O), HistoryConflictError (nothing
   *                  written), RedisUnavailableError (maybe written: read the length to know)
   */
  async function append(
    runId: string,
    stepId: string,
    expectedLength: number,
    messages: readonly ChatMessage[],
  ): Promise<number> {
    const key = keyOf(runId, stepId);
    assertCount(expectedLength, 'expectedLength');
    const encoded = encodeMessages(messages);
    const command = (
      redis as unknown as Record<string, (...a: string[]) => Promise<[number, number]>>
    )[APPEND_COMMAND]!;
    let reply: [number, number];
    try {
      reply = await command.call(redis, key, String(expectedLength), ...encoded);
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    const [ok, length] = reply;
    if (ok !== 1) throw new HistoryConflictError(runId, stepId, expectedLength, length);
    if (length !== expectedLength + encoded.length) {
      throw new InvariantError(
        `history of step "${stepId}" of run "${runId}" has ${length} messages after appending ${encoded.length} to ${expectedLength}`,
      );
    }
    return length;
  }

  function appendOp(
    runId: string,
    stepId: string,
    expectedLength: number,
    messages: readonly ChatMessage[],
  ): ListAppend {
    const key = keyOf(runId, stepId);
    assertCount(expectedLength, 'expectedLength');
    return {
      key,
      expectedLength,
      values: encodeMessages(messages),
      conflict: (actual) => new HistoryConflictError(runId, stepId, expectedLength, actual),
    };
  }

  /*
   * read: LRANGE history from (to - 1), each element decoded and validated.
   */
  async function read(
    runId: string,
    stepId: string,
    range: HistoryRange = {},
  ): Promise<ChatMessage[]> {
    const key = keyOf(runId, stepId);
    const from = range.from ?? 0;
    assertCount(from, 'from');
    if (range.to !== undefined) assertCount(range.to, 'to');
    if (range.to !== undefined && range.to <= from) return [];
    let raws: string[];
    try {
      raws = await redis.lrange(key, from, range.to === undefined ? -1 : range.to - 1);
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    return raws.map((raw, i) => decode(runId, stepId, from + i, raw));
  }

  async function length(runId: string, stepId: string): Promise<number> {
    const key = keyOf(runId, stepId);
    try {
      return await redis.llen(key);
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
  }

  return { key: keyOf, append, appendOp, read, length };
}
