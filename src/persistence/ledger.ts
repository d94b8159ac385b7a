/**
 * The tool-call ledger: one Redis HASH per run and tenant, one entry per tool call, moved between
 * states by Lua scripts so every check-and-write is atomic. A call whose receipt is recorded is
 * never run again; a call that started and lost its worker is IN_DOUBT until a re-run (idempotent
 * tools) or a person resolves it.
 *
 *   PREPARED → RUNNING → SUCCEEDED | FAILED;  RUNNING (lease expired) → IN_DOUBT
 *   FAILED (retryable) | IN_DOUBT (idempotent re-run) → RUNNING;  IN_DOUBT → SUCCEEDED | PREPARED (resolve)
 *   read-only calls, which take no lease: (none) → SUCCEEDED | FAILED (record)
 */
import type { Redis } from 'ioredis';
import { z } from 'zod';
import {
  InputValidationError,
  InvariantError,
  LedgerStateError,
  NonDeterminismError,
  ToolCallBusyError,
  ToolOutcomeUnknownError,
  type SerializedError,
} from '../errors.js';
import { assertPlainJson, type JsonValue } from '../internal/json.js';
import { serializedErrorSchema } from '../schemas/error.js';
import { createKeys } from './keys.js';
import { argsHash } from './ledger-ids.js';
import { LEDGER_SCRIPT_VERSION, LEDGER_SCRIPTS } from './ledger-lua.js';
import { classifyRedisError } from './redis-errors.js';
import type { ReplicaAck } from './replicas.js';

export { argsHash, ledgerCallId, type LedgerCallIdInput } from './ledger-ids.js';

/** The states of a ledger entry. */
export const LedgerState = {
  Prepared: 'PREPARED',
  Running: 'RUNNING',
  Succeeded: 'SUCCEEDED',
  Failed: 'FAILED',
  /** It started, its lease expired, and no outcome was recorded: the side effect may have happened. */
  InDoubt: 'IN_DOUBT',
} as const;
/** A value of {@link LedgerState}. */
export type LedgerState = (typeof LedgerState)[keyof typeof LedgerState];

/** How a person resolved a call in doubt. */
export interface LedgerResolution {
  by: string;
  at: number;
  as: 'succeeded' | 'retry';
}

/** One tool call as the ledger records it. */
export interface LedgerEntry {
  callId: string;
  runId: string;
  stepId: string;
  tenantId: string;
  /** The tool identity, `name@version`. */
  tool: string;
  argsHash: string;
  args: JsonValue;
  state: LedgerState;
  /** How many times the call was marked RUNNING: the run number that owns the lease. */
  runs: number;
  /** End of the lease, epoch ms; set only while RUNNING. */
  leaseUntil: number | null;
  receipt: JsonValue | null;
  error: SerializedError | null;
  createdAt: number;
  updatedAt: number;
  resolution: LedgerResolution | null;
  /** Creation order within the run and tenant, from 1. */
  seq: number;
}

/** What {@link Ledger.prepare} records. */
export interface PrepareCall {
  runId: string;
  stepId: string;
  tenantId: string;
  callId: string;
  /** The tool identity, `name@version`. */
  tool: string;
  /** The normalized (schema-parsed) arguments. */
  args: JsonValue;
}

/** The result of a write that only the owner of the current run number may make. */
export interface LedgerWriteResult {
  /** The entry after the call (unchanged when not applied). */
  entry: LedgerEntry;
  /** False when the caller's run number no longer owns the call (a stale worker). */
  applied: boolean;
}

/** A person's verdict on a call in doubt: it did happen (with this receipt), or run it again. */
export type LedgerResolutionInput = { succeeded: JsonValue } | { retry: true };

/** What {@link Ledger.record} writes: the receipt of a read-only call that ran, or its error. */
export type RecordedOutcome = { receipt: JsonValue } | { error: SerializedError };

/**
 * The receipt of a read-only call, to be written by a snapshot commit (see
 * `CommitOptions.ledgerRecords`) instead of a write of its own: what `Ledger.record` writes, as
 * the commit script takes it.
 */
export interface LedgerRecordOp {
  /** The ledger hash of the run and tenant. */
  key: string;
  callId: string;
  /** The new entry as JSON (SUCCEEDED, runs 1); its seq and times are set when written. */
  entry: string;
  tool: string;
  argsHash: string;
}

/** Options of {@link Ledger.markRunning}. */
export interface MarkRunningOptions {
  /**
   * Re-run a call in doubt (only for tools that are idempotent or honour the idempotency key).
   * @defaultValue false: an in-doubt call throws `ToolOutcomeUnknownError`
   */
  rerunInDoubt?: boolean;
}

/** The tool-call ledger. Every method is one atomic step on Redis. */
export interface Ledger {
  /**
   * Records a call as PREPARED, or returns its entry as it is. An expired RUNNING entry becomes
   * IN_DOUBT. Throws `NonDeterminismError` when the entry has another tool or other arguments.
   */
  prepare(call: PrepareCall): Promise<LedgerEntry>;
  /**
   * Takes the lease for a new run: returns the entry as RUNNING (you own run number `entry.runs`),
   * or as SUCCEEDED / FAILED (final error) when the call already has its outcome: do not run it.
   * Throws `ToolCallBusyError` for a live lease and `ToolOutcomeUnknownError` for a call in doubt.
   */
  markRunning(
    runId: string,
    tenantId: string,
    callId: string,
    leaseMs: number,
    options?: MarkRunningOptions,
  ): Promise<LedgerEntry>;
  /**
   * `prepare` then `markRunning` in one atomic step, for a call with nothing to check between
   * them. Returns the entry as RUNNING (you own run number `entry.runs`), or as SUCCEEDED /
   * FAILED (final error): do not run it. Throws as `prepare` and `markRunning` do.
   */
  begin(call: PrepareCall, leaseMs: number, options?: MarkRunningOptions): Promise<LedgerEntry>;
  /**
   * Records the outcome of a read-only call that ran without a lease (it has no effect a second
   * run could repeat, so it needs none). `applied` is false when the entry already had a receipt:
   * that receipt stands and is returned, so every run of the call reads the same one. Throws
   * `NonDeterminismError` when the entry has another tool or other arguments.
   */
  record(call: PrepareCall, outcome: RecordedOutcome): Promise<LedgerWriteResult>;
  /**
   * What {@link Ledger.record} would write for a read-only call's receipt, as a write a snapshot
   * commit of the same run makes (the ledger is in the run's hash tag), and the entry it writes.
   * Nothing is written here. Throws `InputValidationError` for a receipt that is not plain JSON.
   */
  recordOp(call: PrepareCall, receipt: JsonValue): { op: LedgerRecordOp; entry: LedgerEntry };
  /** Extends the lease, only while RUNNING with run number `runs`. */
  renewLease(
    runId: string,
    tenantId: string,
    callId: string,
    leaseMs: number,
    runs: number,
  ): Promise<LedgerWriteResult>;
  /** Records the receipt, only if run number `runs` still owns the call. */
  markSucceeded(
    runId: string,
    tenantId: string,
    callId: string,
    receipt: JsonValue,
    runs: number,
  ): Promise<LedgerWriteResult>;
  /** Records the error, only if run number `runs` still owns the call. */
  markFailed(
    runId: string,
    tenantId: string,
    callId: string,
    error: SerializedError,
    runs: number,
  ): Promise<LedgerWriteResult>;
  /** The entry, or null. */
  get(runId: string, tenantId: string, callId: string): Promise<LedgerEntry | null>;
  /** The entries of several calls in one round trip, in the order asked (null: none). */
  getMany(
    runId: string,
    tenantId: string,
    callIds: readonly string[],
  ): Promise<(LedgerEntry | null)[]>;
  /** Every entry of the run and tenant, in creation order. */
  list(runId: string, tenantId: string): Promise<LedgerEntry[]>;
  /**
   * Resolves a call in doubt (IN_DOUBT, or RUNNING with an expired lease): `succeeded` records the
   * receipt, `retry` makes it PREPARED so the step calls the tool again. Throws `LedgerStateError`
   * in any other state.
   */
  resolve(
    runId: string,
    tenantId: string,
    callId: string,
    resolution: LedgerResolutionInput,
    by: string,
  ): Promise<LedgerEntry>;
}

/** Options of {@link createLedger}. */
export interface LedgerOptions {
  /** The client; the ledger defines its Lua commands on it. It stays the caller's to close. */
  redis: Redis;
  /**
   * The key prefix (see `createKeys`).
   * @defaultValue `'flujo'`
   */
  prefix?: string;
  /**
   * The clock for leases and timestamps, epoch ms.
   * @defaultValue the Redis server's clock (one clock for every worker)
   */
  clock?: () => number;
  /**
   * Acknowledges a taken lease by replicas before `begin` or `markRunning` returns it, so that
   * the call's effect never runs on a lease a failover could lose (see `replicas.ts`).
   * @defaultValue none
   */
  replicas?: ReplicaAck;
}

const CALL_ID = /^[\x21-\x7e]{1,256}$/;

const storedEntrySchema = z.object({
  callId: z.string(),
  runId: z.string(),
  stepId: z.string(),
  tenantId: z.string(),
  tool: z.string(),
  argsHash: z.string(),
  args: z.string(),
  state: z.enum(Object.values(LedgerState) as [LedgerState, ...LedgerState[]]),
  runs: z.number().int().nonnegative(),
  leaseUntil: z.number().nullable(),
  receipt: z.string().nullable(),
  error: z.string().nullable(),
  createdAt: z.number(),
  updatedAt: z.number(),
  resolution: z
    .object({ by: z.string(), at: z.number(), as: z.enum(['succeeded', 'retry']) })
    .nullable(),
  seq: z.number().int().nonnegative(),
});

/** Reads a stored entry; user data (args, receipt, error) is JSON text inside it. */
function decodeEntry(raw: string): LedgerEntry {
  try {
    const stored = storedEntrySchema.parse(JSON.parse(raw));
    return {
      ...stored,
      args: JSON.parse(stored.args) as JsonValue,
      receipt: stored.receipt === null ? null : (JSON.parse(stored.receipt) as JsonValue),
      error: stored.error === null ? null : serializedErrorSchema.parse(JSON.parse(stored.error)),
    };
  } catch (cause) {
    // The raw entry holds user data: name the problem, not the contents.
    const reason = cause instanceof Error ? cause.message.split('\n')[0] : String(cause);
    throw new InvariantError(`a ledger entry is unreadable (${reason})`, { cause });
  }
}

function refuse(what: string, path: string, message: string): never {
  throw new InputValidationError(what, [{ path, message }]);
}

function checkCallId(callId: string): void {
  if (typeof callId !== 'string' || !CALL_ID.test(callId)) {
    refuse(
      'ledger call id',
      'callId',
      'must be 1 to 256 printable ASCII characters without spaces',
    );
  }
}

function checkPositiveInt(value: number, path: string): void {
  if (!Number.isSafeInteger(value) || value < 1) {
    refuse('ledger argument', path, `must be an integer ≥ 1, got ${value}`);
  }
}

type ScriptName = keyof typeof LEDGER_SCRIPTS;
type ScriptReply = [status: string, raw: string, now: string];

/** Creates the Redis-backed {@link Ledger}. */
export function createLedger(options: LedgerOptions): Ledger {
  const { redis, clock, replicas } = options;
  const keys = createKeys(options.prefix);
  const names = {} as Record<ScriptName, string>;
  for (const [name, lua] of Object.entries(LEDGER_SCRIPTS) as [ScriptName, string][]) {
    names[name] = `flujoLedger_${name}_v${LEDGER_SCRIPT_VERSION}`;
    // ioredis runs EVALSHA and falls back to EVAL after a NOSCRIPT (e.g. a restarted server).
    redis.defineCommand(names[name], { numberOfKeys: 1, lua });
  }

  async function run(
    name: ScriptName,
    runId: string,
    tenantId: string,
    callId: string,
    args: string[],
  ): Promise<{ status: string; entry: LedgerEntry | null; now: number }> {
    const key = keys.ledger(runId, tenantId);
    checkCallId(callId);
    const command = (redis as unknown as Record<string, (...a: string[]) => Promise<ScriptReply>>)[
      names[name]
    ]!;
    let reply: ScriptReply;
    try {
      const now = clock === undefined ? '' : String(clock());
      reply = await command.call(redis, key, callId, ...args, now);
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
    const [status, raw, now] = reply;
    return { status, entry: raw === '' ? null : decodeEntry(raw), now: Number(now) };
  }

  /** A lease just taken, once the replicas asked for have it (the effect comes next). */
  const leased = async (entry: LedgerEntry): Promise<LedgerEntry> => {
    if (replicas !== undefined && entry.state === LedgerState.Running) {
      await replicas.ack(keys.ledger(entry.runId, entry.tenantId));
    }
    return entry;
  };

  const missing = (runId: string, tenantId: string, callId: string, hint: string): never => {
    throw new LedgerStateError(
      runId,
      callId,
      null,
      `No ledger entry for call ${callId} of run "${runId}" (tenant "${tenantId}"). ${hint}`,
    );
  };

  async function write(
    name: 'renewLease' | 'finish',
    runId: string,
    tenantId: string,
    callId: string,
    runs: number,
    args: string[],
  ): Promise<LedgerWriteResult> {
    checkPositiveInt(runs, 'runs');
    const { status, entry } = await run(name, runId, tenantId, callId, args);
    if (entry === null) return missing(runId, tenantId, callId, 'Call prepare first.');
    return { entry, applied: status === 'applied' };
  }

  /**
   * The new entry a call would get (PREPARED, or as `over` says), and its args hash; refuses an
   * empty step or tool.
   */
  function freshEntry(
    call: PrepareCall,
    over: Record<string, unknown> = {},
  ): { fresh: string; hash: string } {
    const { runId, stepId, tenantId, callId, tool, args } = call;
    for (const [field, value] of [
      ['stepId', stepId],
      ['tool', tool],
    ] as const) {
      if (typeof value !== 'string' || value === '')
        refuse('tool call', field, 'must not be empty');
    }
    const hash = argsHash(args);
    const fresh = {
      callId, runId, stepId, tenantId, tool, argsHash: hash, args: JSON.stringify(args),
      state: LedgerState.Prepared, runs: 0, leaseUntil: null, receipt: null, error: null,
      createdAt: 0, updatedAt: 0, resolution: null, seq: 0, ...over,
    }; // prettier-ignore
    return { fresh: JSON.stringify(fresh), hash };
  }

  /** The entry of a running-or-recorded reply; throws for busy, in doubt, mismatch, missing. */
  function runningOrRecorded(
    reply: { status: string; entry: LedgerEntry | null; now: number },
    call: { runId: string; tenantId: string; callId: string; tool: string; hash?: string },
  ): LedgerEntry {
    const { status, entry, now } = reply;
    const { runId, tenantId, callId } = call;
    if (entry === null) return missing(runId, tenantId, callId, 'Call prepare first.');
    if (status === 'mismatch') {
      throw new NonDeterminismError(
        runId,
        callId,
        { tool: entry.tool, argsHash: entry.argsHash },
        { tool: call.tool, argsHash: call.hash ?? '' },
      );
    }
    if (status === 'busy') {
      const remaining = Math.max(0, (entry.leaseUntil ?? now) - now);
      throw new ToolCallBusyError(runId, callId, entry.tool, remaining);
    }
    if (status === 'in_doubt') {
      const { stepId, tool } = entry;
      throw new ToolOutcomeUnknownError({ runId, stepId, callId, tool, tenantId });
    }
    return entry;
  }

  return {
    async begin(call, leaseMs, beginOptions = {}) {
      const { runId, tenantId, callId, tool } = call;
      checkPositiveInt(leaseMs, 'leaseMs');
      const { fresh, hash } = freshEntry(call);
      const rerun = beginOptions.rerunInDoubt === true ? '1' : '0';
      const args = [fresh, tool, hash, String(leaseMs), rerun];
      const reply = await run('begin', runId, tenantId, callId, args);
      return leased(runningOrRecorded(reply, { runId, tenantId, callId, tool, hash }));
    },

    async record(call, outcome) {
      const { runId, tenantId, callId, tool } = call;
      let entry: Record<string, unknown>;
      if ('receipt' in outcome) {
        assertPlainJson(outcome.receipt, 'tool receipt', 'receipt');
        entry = { state: LedgerState.Succeeded, receipt: JSON.stringify(outcome.receipt) };
      } else {
        const checked = serializedErrorSchema.safeParse(outcome.error);
        if (!checked.success) {
          refuse('tool error', 'error', 'must be a SerializedError (FlujoError#toJSON())');
        }
        entry = { state: LedgerState.Failed, error: JSON.stringify(checked.data) };
      }
      const { fresh, hash } = freshEntry(call, { ...entry, runs: 1 });
      const reply = await run('record', runId, tenantId, callId, [fresh, tool, hash]);
      const checked = runningOrRecorded(reply, { runId, tenantId, callId, tool, hash });
      return { entry: checked, applied: reply.status === 'recorded' };
    },

    recordOp(call, receipt) {
      const { runId, tenantId, callId, tool } = call;
      checkCallId(callId);
      assertPlainJson(receipt, 'tool receipt', 'receipt');
      const over = { state: LedgerState.Succeeded, receipt: JSON.stringify(receipt), runs: 1 };
      const { fresh, hash } = freshEntry(call, over);
      const key = keys.ledger(runId, tenantId);
      return {
        op: { key, callId, entry: fresh, tool, argsHash: hash },
        entry: decodeEntry(fresh),
      };
    },

    async prepare(call) {
      const { runId, tenantId, callId, tool } = call;
      const { fresh, hash } = freshEntry(call);
      const scriptArgs = [fresh, tool, hash];
      const { status, entry } = await run('prepare', runId, tenantId, callId, scriptArgs);
      if (entry === null) throw new InvariantError(`prepare of call ${callId} returned no entry`);
      if (status === 'mismatch') {
        throw new NonDeterminismError(
          runId,
          callId,
          { tool: entry.tool, argsHash: entry.argsHash },
          { tool, argsHash: hash },
        );
      }
      return entry;
    },

    async markRunning(runId, tenantId, callId, leaseMs, markOptions = {}) {
      checkPositiveInt(leaseMs, 'leaseMs');
      const rerun = markOptions.rerunInDoubt === true ? '1' : '0';
      const reply = await run('markRunning', runId, tenantId, callId, [String(leaseMs), rerun]);
      return leased(runningOrRecorded(reply, { runId, tenantId, callId, tool: '' }));
    },

    renewLease: async (runId, tenantId, callId, leaseMs, runs) => {
      checkPositiveInt(leaseMs, 'leaseMs');
      return write('renewLease', runId, tenantId, callId, runs, [String(leaseMs), String(runs)]);
    },

    markSucceeded: async (runId, tenantId, callId, receipt, runs) => {
      assertPlainJson(receipt, 'tool receipt', 'receipt');
      return write('finish', runId, tenantId, callId, runs, [
        LedgerState.Succeeded,
        JSON.stringify(receipt),
        String(runs),
      ]);
    },

    markFailed: async (runId, tenantId, callId, error, runs) => {
      const checked = serializedErrorSchema.safeParse(error);
      if (!checked.success) {
        refuse('tool error', 'error', 'must be a SerializedError (FlujoError#toJSON())');
      }
      return write('finish', runId, tenantId, callId, runs, [
        LedgerState.Failed,
        JSON.stringify(checked.data),
        String(runs),
      ]);
    },

    async get(runId, tenantId, callId) {
      const key = keys.ledger(runId, tenantId);
      checkCallId(callId);
      try {
        const raw = await redis.hget(key, callId);
        return raw === null ? null : decodeEntry(raw);
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
    },

    async getMany(runId, tenantId, callIds) {
      const key = keys.ledger(runId, tenantId);
      for (const callId of callIds) checkCallId(callId);
      if (callIds.length === 0) return [];
      try {
        const raws = await redis.hmget(key, ...callIds);
        return raws.map((raw) => (raw === null ? null : decodeEntry(raw)));
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
    },

    async list(runId, tenantId) {
      const key = keys.ledger(runId, tenantId);
      let raws: string[];
      try {
        raws = await redis.hvals(key);
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
      return raws.map(decodeEntry).sort((a, b) => a.seq - b.seq);
    },

    async resolve(runId, tenantId, callId, resolution, by) {
      if (typeof by !== 'string' || by === '') {
        refuse('ledger resolution', 'by', 'must name who resolved it');
      }
      let as: 'succeeded' | 'retry';
      let receipt = '';
      if ('succeeded' in resolution) {
        assertPlainJson(resolution.succeeded, 'receipt', 'succeeded');
        as = 'succeeded';
        receipt = JSON.stringify(resolution.succeeded);
      } else if (resolution.retry === true) {
        as = 'retry';
      } else {
        const expected = 'must be { succeeded: <receipt> } or { retry: true }';
        return refuse('ledger resolution', '', expected);
      }
      const reply = await run('resolve', runId, tenantId, callId, [as, receipt, by]);
      const { status, entry, now } = reply;
      if (entry === null) {
        return missing(runId, tenantId, callId, 'Check the run id, tenant id and call id.');
      }
      if (status !== 'applied') {
        throw new LedgerStateError(
          runId,
          callId,
          entry.state,
          `Cannot resolve call ${callId} of run "${runId}": it is ${entry.state}${stateHint(entry, now)}. Only a call in doubt (IN_DOUBT, or RUNNING with an expired lease) can be resolved.`,
        );
      }
      return entry;
    },
  };
}

function stateHint(entry: LedgerEntry, now: number): string {
  switch (entry.state) {
    case LedgerState.Running:
      return ` and its worker holds the lease for ${Math.max(0, (entry.leaseUntil ?? now) - now)} ms more`;
    case LedgerState.Succeeded:
      return ', its receipt is recorded';
    case LedgerState.Failed:
      return ', its error is recorded';
    case LedgerState.Prepared:
      return ', it has not started: the next run of its step calls the tool';
    default:
      return '';
  }
}
