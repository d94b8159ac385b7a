/**
 * Usage reservations and quotas: before a model call its estimate is reserved
 * against the run's budget and the tenant's quota in one atomic step; after it, the reservation is
 * reconciled exactly once, with the provider's usage, the baseline input when the request went out
 * and no reply came (never refunded), or zero when nothing was sent.
 *
 *   reserved → sent → reconciled;  reserved → reconciled
 *
 * Money is integer micro-USD (1 USD = 1,000,000) everywhere here: no floats reach Redis. Every key
 * is in the tenant's hash tag (see `keys.ts`), so a script sees both the run and the tenant.
 */
import type { Redis } from 'ioredis';
import { z } from 'zod';
import {
  InputValidationError,
  InvariantError,
  ReservationNotFoundError,
  UsageLimitExceededError,
  type UsageLimitInfo,
} from '../errors.js';
import { assertRunId, assertStepId, assertTenantId, createKeys } from './keys.js';
import { QUOTA_SCRIPT_VERSION, QUOTA_SCRIPTS } from './quota-lua.js';
import { classifyRedisError } from './redis-errors.js';

/** The states of a reservation. */
export const ReservationState = {
  Reserved: 'reserved',
  /** The request went out: from now on at least the baseline is charged. */
  Sent: 'sent',
  Reconciled: 'reconciled',
} as const;
/** A value of {@link ReservationState}. */
export type ReservationState = (typeof ReservationState)[keyof typeof ReservationState];

/**
 * The largest figure (tokens or micro-USD) one estimate or outcome may carry: Redis's Lua JSON
 * encoder writes numbers with 14 significant digits, so larger ones would be rounded in a record.
 */
export const MAX_USAGE_AMOUNT = 1_000_000_000_000;
/** The largest integer a record keeps exactly (14 digits), for times and turns. */
const MAX_RECORD_INTEGER = 99_999_999_999_999;

/** What one model call is expected to use. */
export interface UsageEstimate {
  inputTokens: number;
  /** The output buffer. */
  outputTokens: number;
  /** The estimated cost of input and output, micro-USD. */
  microUsd: number;
  /**
   * The cost of the input alone, micro-USD: charged when the request was sent and no reply came.
   * @defaultValue `microUsd` (without the input price the whole estimate is charged, never less)
   */
  baselineMicroUsd?: number;
}

/** A run's limits, from its plan's budgets. Omitted = unlimited. */
export interface RunUsageLimits {
  maxTokens?: number;
  /** `budgets.maxCostUsd` in micro-USD. */
  maxMicroUsd?: number;
}

/** What {@link QuotaStore.reserve} records. */
export interface ReserveRequest {
  /** Unique per tenant; reserving an existing id returns that reservation unchanged. */
  reservationId: string;
  tenantId: string;
  runId: string;
  stepId: string;
  turn: number;
  estimate: UsageEstimate;
  runLimits?: RunUsageLimits;
  /** The step's own limits (its `budgets`), over every reservation of the step in the run. */
  stepLimits?: RunUsageLimits;
  /** Epoch ms to record; defaults to the store's clock. */
  at?: number;
}

/** How a call ended, for `QuotaStore.reconcile`. */
export type ReconcileOutcome =
  /** The provider's reply reported usage: the truth, even above the estimate. */
  | { kind: 'usage'; inputTokens: number; outputTokens: number; microUsd: number }
  /** The request was sent and no reply came (timeout, crash): the baseline input is charged. */
  | { kind: 'baseline' }
  /** Nothing was sent: nothing is charged (the baseline, if the reservation was marked sent). */
  | { kind: 'none' };
/** A value of `ReconcileOutcome['kind']`. */
export type ReconcileKind = ReconcileOutcome['kind'];

/** What a reconciled reservation was charged. */
export interface UsageCharge {
  inputTokens: number;
  outputTokens: number;
  /** `inputTokens + outputTokens`. */
  tokens: number;
  microUsd: number;
}

/** One reservation as stored. */
export interface Reservation {
  id: string;
  tenantId: string;
  runId: string;
  stepId: string;
  turn: number;
  state: ReservationState;
  /** The estimate, with `baselineMicroUsd` filled in. */
  estimate: Required<UsageEstimate>;
  /** `inputTokens + outputTokens` of the estimate. */
  reservedTokens: number;
  reservedMicroUsd: number;
  /** Set when reconciled. */
  charged: UsageCharge | null;
  /** How it was charged; `'baseline'` for a `'none'` that came after `markSent`. */
  outcome: ReconcileKind | null;
  /** What the reconcile call asked for (differs from `outcome` only in that case). */
  requestedOutcome: ReconcileKind | null;
  createdAt: number;
  sentAt: number | null;
  reconciledAt: number | null;
  /** Creation order within the run, from 1. */
  seq: number;
}

/** What `QuotaStore.reconcile` returns. */
export interface ReconcileResult {
  /** The reservation after the call. */
  reservation: Reservation;
  /** True for the one call that reconciled it; false for every later one (nothing changed). */
  applied: boolean;
}

/** A tenant's limits; null = unlimited. */
export interface TenantQuota {
  maxTokens: number | null;
  maxMicroUsd: number | null;
}

/** A change of a tenant's limits: a number sets it, null removes it, omitted keeps it. */
export interface TenantQuotaUpdate {
  maxTokens?: number | null;
  maxMicroUsd?: number | null;
}

/** The counters of a run or a tenant, with its limits (null = unlimited). */
export interface UsageTotals extends TenantQuota {
  reservedTokens: number;
  reservedMicroUsd: number;
  spentTokens: number;
  spentMicroUsd: number;
}

/**
 * A reservation returned by `reserve` carries, under this symbol, how many other reservations of
 * its run were open when it was made (absent when none): a sign that a worker died mid-call.
 */
export const OTHERS_OPEN: unique symbol = Symbol('othersOpen');

/** How many other reservations of the run were open when `reservation` was made. */
export function othersOpen(reservation: Reservation): number {
  return (reservation as unknown as Record<symbol, number | undefined>)[OTHERS_OPEN] ?? 0;
}

/** Usage reservations and quotas in Redis. Every write is one atomic step. */
export interface QuotaStore {
  /**
   * Reserves the estimate against the run's limits and the tenant's quota. Returns the stored
   * reservation unchanged when the id exists. Throws `UsageLimitExceededError` (nothing written)
   * when a limit would be exceeded.
   */
  reserve(request: ReserveRequest): Promise<Reservation>;
  /** Records that the request went out (reserved → sent); any other state is returned as is. */
  markSent(tenantId: string, reservationId: string, at?: number): Promise<Reservation>;
  /**
   * Settles the reservation; only the first call applies (see {@link ReconcileOutcome}). With the
   * reservation's `runId` it is one atomic step; without, the record is read first to find it.
   */
  reconcile(
    tenantId: string,
    reservationId: string,
    outcome: ReconcileOutcome,
    at?: number,
    runId?: string,
  ): Promise<ReconcileResult>;
  /** The run's reservations not yet reconciled, in creation order. */
  open(tenantId: string, runId: string): Promise<Reservation[]>;
  /** Every reservation of the run, in creation order. */
  list(tenantId: string, runId: string): Promise<Reservation[]>;
  /** The reservation, or null. */
  get(tenantId: string, reservationId: string): Promise<Reservation | null>;
  /** The run's counters and limits, or the tenant's when `runId` is omitted. */
  usage(tenantId: string, runId?: string): Promise<UsageTotals>;
  /** Changes the tenant's limits and returns them. */
  setTenantQuota(tenantId: string, update: TenantQuotaUpdate): Promise<TenantQuota>;
  /** The tenant's limits. */
  getTenantQuota(tenantId: string): Promise<TenantQuota>;
}

/** Options of {@link createQuotaStore}. */
export interface QuotaStoreOptions {
  /** The client; the store defines its Lua commands on it. It stays the caller's to close. */
  redis: Redis;
  /**
   * The key prefix (see `createKeys`).
   * @defaultValue `'flujo'`
   */
  prefix?: string;
  /**
   * The clock for timestamps, epoch ms.
   * @defaultValue the Redis server's clock
   */
  clock?: () => number;
}

const RESERVATION_ID = /^[\x21-\x7e]{1,256}$/;
const kindSchema = z.enum(['usage', 'baseline', 'none']);
const amount = z.number().int().nonnegative();

const reservationSchema = z.object({
  id: z.string(),
  tenantId: z.string(),
  runId: z.string(),
  stepId: z.string(),
  turn: amount,
  state: z.enum(['reserved', 'sent', 'reconciled']),
  estimate: z.object({
    inputTokens: amount,
    outputTokens: amount,
    microUsd: amount,
    baselineMicroUsd: amount,
  }),
  reservedTokens: amount,
  reservedMicroUsd: amount,
  charged: z
    .object({ inputTokens: amount, outputTokens: amount, tokens: amount, microUsd: amount })
    .nullable(),
  outcome: kindSchema.nullable(),
  requestedOutcome: kindSchema.nullable(),
  createdAt: z.number(),
  sentAt: z.number().nullable(),
  reconciledAt: z.number().nullable(),
  seq: z.number().int().positive(),
}) satisfies z.ZodType<Reservation>;

function decode(raw: string): Reservation {
  try {
    const value: unknown = JSON.parse(raw);
    // Read on every model call (reserve, mark, reconcile): checked by hand first, and by the
    // schema (for its message) only when that check does not pass.
    return reservationOf(value) ?? reservationSchema.parse(value);
  } catch (cause) {
    const reason = cause instanceof Error ? cause.message.split('\n')[0] : String(cause);
    throw new InvariantError(`a usage reservation is unreadable (${reason})`, { cause });
  }
}

const isAmount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;
const isTime = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const KINDS: ReadonlySet<unknown> = new Set(kindSchema.options);
const STATES: ReadonlySet<unknown> = new Set(reservationSchema.shape.state.options);
const isKind = (v: unknown): v is ReconcileKind | null => v === null || KINDS.has(v);

/**
 * The reservation `value` holds when it passes {@link reservationSchema} for certain (no stricter
 * than it: a value refused here is given to the schema), built with the schema's fields only; else
 * null.
 */
function reservationOf(value: unknown): Reservation | null {
  if (typeof value !== 'object' || value === null) return null;
  const v = value as Record<string, unknown>;
  const e = v['estimate'] as Record<string, unknown> | null | undefined;
  const c = v['charged'] as Record<string, unknown> | null | undefined;
  const { id, tenantId, runId, stepId, turn, state, createdAt, sentAt, reconciledAt, seq } = v;
  if (
    typeof id !== 'string' ||
    typeof tenantId !== 'string' ||
    typeof runId !== 'string' ||
    typeof stepId !== 'string' ||
    !isAmount(turn) ||
    !STATES.has(state) ||
    typeof e !== 'object' ||
    e === null ||
    !isAmount(e['inputTokens']) ||
    !isAmount(e['outputTokens']) ||
    !isAmount(e['microUsd']) ||
    !isAmount(e['baselineMicroUsd']) ||
    !isAmount(v['reservedTokens']) ||
    !isAmount(v['reservedMicroUsd']) ||
    c === undefined ||
    (c !== null &&
      (typeof c !== 'object' ||
        !isAmount(c['inputTokens']) ||
        !isAmount(c['outputTokens']) ||
        !isAmount(c['tokens']) ||
        !isAmount(c['microUsd']))) ||
    !isKind(v['outcome']) ||
    !isKind(v['requestedOutcome']) ||
    !isTime(createdAt) ||
    (sentAt !== null && !isTime(sentAt)) ||
    (reconciledAt !== null && !isTime(reconciledAt)) ||
    !Number.isSafeInteger(seq) ||
    (seq as number) <= 0
  ) {
    return null;
  }
  return {
    id,
    tenantId,
    runId,
    stepId,
    turn,
    state: state as ReservationState,
    estimate: {
      inputTokens: e['inputTokens'],
      outputTokens: e['outputTokens'],
      microUsd: e['microUsd'],
      baselineMicroUsd: e['baselineMicroUsd'],
    },
    reservedTokens: v['reservedTokens'],
    reservedMicroUsd: v['reservedMicroUsd'],
    charged:
      c === null
        ? null
        : {
            inputTokens: c['inputTokens'] as number,
            outputTokens: c['outputTokens'] as number,
            tokens: c['tokens'] as number,
            microUsd: c['microUsd'] as number,
          },
    outcome: v['outcome'],
    requestedOutcome: v['requestedOutcome'],
    createdAt,
    sentAt: sentAt,
    reconciledAt: reconciledAt,
    seq: seq as number,
  };
}

function refuse(what: string, path: string, message: string): never {
  throw new InputValidationError(what, [{ path, message }]);
}

function checkAmount(value: unknown, path: string, max = MAX_USAGE_AMOUNT): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0 || value > max) {
    refuse('usage figure', path, `must be an integer from 0 to ${max}, got ${String(value)}`);
  }
  return value;
}

function checkReservationId(id: unknown): asserts id is string {
  if (typeof id !== 'string' || !RESERVATION_ID.test(id)) {
    refuse(
      'reservation id',
      'reservationId',
      'must be 1 to 256 printable ASCII characters without spaces',
    );
  }
}

function checkLimit(value: unknown, path: string): void {
  if (value !== undefined) checkAmount(value, path, Number.MAX_SAFE_INTEGER);
}

type ScriptName = keyof typeof QUOTA_SCRIPTS;
type ScriptReply = [status: string, raw: string, ...denial: string[]];
const USAGE_FIELDS = [
  'reservedTokens',
  'reservedMicroUsd',
  'spentTokens',
  'spentMicroUsd',
  'maxTokens',
  'maxMicroUsd',
] as const;

/** Creates the Redis-backed {@link QuotaStore}. */
export function createQuotaStore(options: QuotaStoreOptions): QuotaStore {
  const { redis, clock } = options;
  const keys = createKeys(options.prefix);
  const names = {} as Record<ScriptName, string>;
  for (const [name, script] of Object.entries(QUOTA_SCRIPTS) as [
    ScriptName,
    (typeof QUOTA_SCRIPTS)[ScriptName],
  ][]) {
    names[name] = `flujoQuota_${name}_v${QUOTA_SCRIPT_VERSION}`;
    // ioredis runs EVALSHA and falls back to EVAL after a NOSCRIPT (e.g. a restarted server).
    redis.defineCommand(names[name], { numberOfKeys: script.keys, lua: script.lua });
  }

  async function redisCall<T>(op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
  }

  function call(name: ScriptName, args: string[]): Promise<ScriptReply> {
    const command = (redis as unknown as Record<string, (...a: string[]) => Promise<ScriptReply>>)[
      names[name]
    ]!;
    return redisCall(() => command.call(redis, ...args));
  }

  const now = (at: number | undefined): string => {
    if (at !== undefined) return String(checkAmount(at, 'at', MAX_RECORD_INTEGER));
    return clock === undefined ? '' : String(clock());
  };

  async function get(tenantId: string, reservationId: string): Promise<Reservation | null> {
    const key = keys.reservations(tenantId);
    checkReservationId(reservationId);
    const raw = await redisCall(() => redis.hget(key, reservationId));
    return raw === null ? null : decode(raw);
  }

  async function list(tenantId: string, runId: string): Promise<Reservation[]> {
    const idsKey = keys.runReservations(tenantId, runId);
    const ids = await redisCall(() => redis.lrange(idsKey, 0, -1));
    if (ids.length === 0) return [];
    // The list only grows, and each id is written with its record in one script.
    const raws = await redisCall(() => redis.hmget(keys.reservations(tenantId), ...ids));
    return raws.map((raw, i) => {
      if (raw === null) {
        throw new InvariantError(
          `usage reservation "${ids[i]}" of run "${runId}" (tenant "${tenantId}") is listed but has no record`,
        );
      }
      return decode(raw);
    });
  }

  async function readTotals(key: string): Promise<UsageTotals> {
    const values = await redisCall(() => redis.hmget(key, ...USAGE_FIELDS));
    const n = (i: number): number => Number(values[i] ?? 0);
    const limit = (i: number): number | null => (values[i] == null ? null : Number(values[i]));
    return {
      reservedTokens: n(0),
      reservedMicroUsd: n(1),
      spentTokens: n(2),
      spentMicroUsd: n(3),
      maxTokens: limit(4),
      maxMicroUsd: limit(5),
    };
  }

  return {
    /*
     * reserve: the Lua script `reserve` (see quota-lua.ts).
     *   Written keys:  reservations, runReservations, runUsage, tenantQuota (only when created)
     *   Throws:        InputValidationError (before any I/O), UsageLimitExceededError (nothing
     *                  written), RedisUnavailableError
     */
    async reserve(request) {
      const { reservationId, tenantId, runId, stepId, turn, estimate } = request;
      const limits = request.runLimits ?? {};
      const stepLimits = request.stepLimits ?? {};
      const idsKey = keys.runReservations(tenantId, runId);
      checkReservationId(reservationId);
      assertStepId(stepId);
      checkAmount(turn, 'turn', MAX_RECORD_INTEGER);
      if (typeof estimate !== 'object' || estimate === null) {
        refuse('usage estimate', 'estimate', 'must be an object');
      }
      const inputTokens = checkAmount(estimate.inputTokens, 'estimate.inputTokens');
      const outputTokens = checkAmount(estimate.outputTokens, 'estimate.outputTokens');
      const microUsd = checkAmount(estimate.microUsd, 'estimate.microUsd');
      const baselineMicroUsd = checkAmount(
        estimate.baselineMicroUsd ?? microUsd,
        'estimate.baselineMicroUsd',
        microUsd,
      );
      checkLimit(limits.maxTokens, 'runLimits.maxTokens');
      checkLimit(limits.maxMicroUsd, 'runLimits.maxMicroUsd');
      checkLimit(stepLimits.maxTokens, 'stepLimits.maxTokens');
      checkLimit(stepLimits.maxMicroUsd, 'stepLimits.maxMicroUsd');
      const fresh: Reservation = {
        id: reservationId, tenantId, runId, stepId, turn, state: ReservationState.Reserved,
        estimate: { inputTokens, outputTokens, microUsd, baselineMicroUsd },
        reservedTokens: inputTokens + outputTokens, reservedMicroUsd: microUsd,
        charged: null, outcome: null, requestedOutcome: null,
        createdAt: 0, sentAt: null, reconciledAt: null, seq: 0,
      }; // prettier-ignore
      const reply = await call('reserve', [
        keys.reservations(tenantId),
        idsKey,
        keys.runUsage(tenantId, runId),
        keys.tenantQuota(tenantId),
        keys.openReservations(tenantId, runId),
        reservationId,
        JSON.stringify(fresh),
        String(fresh.reservedTokens),
        String(microUsd),
        limits.maxTokens === undefined ? '' : String(limits.maxTokens),
        limits.maxMicroUsd === undefined ? '' : String(limits.maxMicroUsd),
        now(request.at),
        stepLimits.maxTokens === undefined ? '' : String(stepLimits.maxTokens),
        stepLimits.maxMicroUsd === undefined ? '' : String(stepLimits.maxMicroUsd),
      ]);
      const [status, raw, ...denial] = reply;
      if (status === 'denied') {
        const [scope, limit, limitValue, used, reserved, requested] = denial;
        const info: UsageLimitInfo = {
          scope: scope as UsageLimitInfo['scope'],
          limit: limit as UsageLimitInfo['limit'],
          limitValue: Number(limitValue),
          used: Number(used),
          reserved: Number(reserved),
          requested: Number(requested),
          runId,
          tenantId,
          ...(scope === 'step' ? { stepId } : {}),
        };
        throw new UsageLimitExceededError(info);
      }
      if (status !== 'created' && status !== 'existing') {
        throw new InvariantError(`reserve of "${reservationId}" replied ${status}`);
      }
      const reservation = decode(raw);
      const others = Number(denial[0] ?? 0);
      if (others > 0) Object.defineProperty(reservation, OTHERS_OPEN, { value: others });
      return reservation;
    },

    /*
     * markSent: the Lua script `markSent`.
     *   Written keys:  reservations (only reserved → sent)
     *   Throws:        ReservationNotFoundError, InputValidationError, RedisUnavailableError
     */
    async markSent(tenantId, reservationId, at) {
      const key = keys.reservations(tenantId);
      checkReservationId(reservationId);
      const [status, raw] = await call('markSent', [key, reservationId, now(at)]);
      if (status === 'missing') throw new ReservationNotFoundError(tenantId, reservationId);
      return decode(raw);
    },

    /*
     * reconcile: reads the reservation (for its run id: the run's usage key is named by the
     * caller, as Redis Cluster requires), then the Lua script `reconcile`, which applies once.
     *   Written keys:  reservations, runUsage, tenantQuota (only by the call that applies)
     *   Throws:        ReservationNotFoundError, InputValidationError, RedisUnavailableError
     */
    async reconcile(tenantId, reservationId, outcome, at, runId) {
      const kind = kindSchema.safeParse((outcome as { kind?: unknown } | null)?.kind);
      if (!kind.success) refuse('usage outcome', 'outcome.kind', 'must be usage, baseline or none');
      let figures = ['0', '0', '0'];
      if (outcome.kind === 'usage') {
        figures = [
          checkAmount(outcome.inputTokens, 'outcome.inputTokens'),
          checkAmount(outcome.outputTokens, 'outcome.outputTokens'),
          checkAmount(outcome.microUsd, 'outcome.microUsd'),
        ].map(String);
      }
      const stamp = now(at);
      // The run names the run's usage key, as Redis Cluster requires; read it when not given.
      let owner = runId;
      if (owner === undefined) {
        const before = await get(tenantId, reservationId);
        if (before === null) throw new ReservationNotFoundError(tenantId, reservationId);
        if (before.state === ReservationState.Reconciled) {
          return { reservation: before, applied: false };
        }
        owner = before.runId;
      }
      const [status, raw] = await call('reconcile', [
        keys.reservations(tenantId),
        keys.runUsage(tenantId, owner),
        keys.tenantQuota(tenantId),
        keys.openReservations(tenantId, owner),
        reservationId,
        owner,
        outcome.kind,
        ...figures,
        stamp,
      ]);
      if (status === 'applied' || status === 'already') {
        return { reservation: decode(raw), applied: status === 'applied' };
      }
      if (status === 'missing') throw new ReservationNotFoundError(tenantId, reservationId);
      throw new InvariantError(
        `reconcile of usage reservation "${reservationId}" (tenant "${tenantId}") replied ${status}`,
      );
    },

    async open(tenantId, runId) {
      const ids = await redisCall(() => redis.smembers(keys.openReservations(tenantId, runId)));
      if (ids.length === 0) return [];
      const raws = await redisCall(() => redis.hmget(keys.reservations(tenantId), ...ids));
      const open: Reservation[] = [];
      for (const raw of raws) {
        if (raw === null) continue;
        const r = decode(raw);
        if (r.state !== ReservationState.Reconciled) open.push(r);
      }
      return open.sort((a, b) => a.seq - b.seq);
    },

    list,
    get,

    async usage(tenantId, runId) {
      assertTenantId(tenantId);
      if (runId !== undefined) assertRunId(runId);
      return readTotals(
        runId === undefined ? keys.tenantQuota(tenantId) : keys.runUsage(tenantId, runId),
      );
    },

    /*
     * setTenantQuota: one MULTI: HSET / HDEL of maxTokens and maxMicroUsd, then HMGET of both.
     *   Written keys:  tenantQuota
     */
    async setTenantQuota(tenantId, update) {
      const key = keys.tenantQuota(tenantId);
      const fields = ['maxTokens', 'maxMicroUsd'] as const;
      for (const field of fields) if (update[field] !== null) checkLimit(update[field], field);
      const tx = redis.multi();
      for (const field of fields) {
        const value = update[field];
        if (value === null) tx.hdel(key, field);
        else if (value !== undefined) tx.hset(key, field, String(value));
      }
      tx.hmget(key, 'maxTokens', 'maxMicroUsd');
      const replies = await redisCall(() => tx.exec());
      if (replies === null) throw new InvariantError('EXEC of setTenantQuota returned null');
      for (const [error] of replies) if (error !== null) throw classifyRedisError(error, redis);
      const [maxTokens, maxMicroUsd] = replies[replies.length - 1]![1] as (string | null)[];
      return {
        maxTokens: maxTokens == null ? null : Number(maxTokens),
        maxMicroUsd: maxMicroUsd == null ? null : Number(maxMicroUsd),
      };
    },

    async getTenantQuota(tenantId) {
      const { maxTokens, maxMicroUsd } = await readTotals(keys.tenantQuota(tenantId));
      return { maxTokens, maxMicroUsd };
    },
  };
}
