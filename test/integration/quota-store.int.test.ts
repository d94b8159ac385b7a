import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  InputValidationError,
  InvariantError,
  ReservationNotFoundError,
  UsageLimitExceededError,
} from '../../src/errors.js';
import { createKeys, type Keys } from '../../src/persistence/keys.js';
import {
  createQuotaStore,
  type QuotaStore,
  type ReconcileOutcome,
  type Reservation,
  type ReserveRequest,
  othersOpen,
} from '../../src/persistence/quota-store.js';
import { caught } from '../helpers/caught.js';
import { connect, deletePrefix, readPrefix, testPrefix } from '../helpers/redis.js';

let redis: Redis;
let prefix: string;
let keys: Keys;
let now: number;
let store: QuotaStore;

const T = 'tenant-a';
const R = 'run-1';
const estimate = { inputTokens: 60, outputTokens: 40, microUsd: 500, baselineMicroUsd: 200 };
const req = (n: number, over: Partial<ReserveRequest> = {}): ReserveRequest => ({
  reservationId: `res-${n}`,
  tenantId: T,
  runId: R,
  stepId: 'agent',
  turn: n,
  estimate,
  ...over,
});
const zero = { reservedTokens: 0, reservedMicroUsd: 0, spentTokens: 0, spentMicroUsd: 0 };

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  await redis.quit();
});
beforeEach(() => {
  prefix = testPrefix();
  keys = createKeys(prefix);
  now = 1_000_000;
  store = createQuotaStore({ redis, prefix, clock: () => now });
});
afterEach(async () => {
  await deletePrefix(redis, prefix);
});

describe('quota store: reserve', () => {
  it('records a reservation, adds it to run and tenant, and returns it unchanged when asked again', async () => {
    const first = await store.reserve(req(1, { runLimits: { maxTokens: 1000 } }));
    const expected: Reservation = {
      id: 'res-1',
      tenantId: T,
      runId: R,
      stepId: 'agent',
      turn: 1,
      state: 'reserved',
      estimate,
      reservedTokens: 100,
      reservedMicroUsd: 500,
      charged: null,
      outcome: null,
      requestedOutcome: null,
      createdAt: now,
      sentAt: null,
      reconciledAt: null,
      seq: 1,
    };
    expect(first).toEqual(expected);
    expect(JSON.parse((await redis.hget(keys.reservations(T), 'res-1'))!)).toEqual(expected);
    const before = await readPrefix(redis, prefix);
    expect(before).toEqual({
      [keys.reservations(T)]: {
        hash: { 'res-1': await redis.hget(keys.reservations(T), 'res-1') },
      },
      [keys.runReservations(T, R)]: { list: ['res-1'] },
      [keys.openReservations(T, R)]: { set: ['res-1'] },
      [keys.runUsage(T, R)]: {
        hash: {
          reservedTokens: '100',
          reservedMicroUsd: '500',
          maxTokens: '1000',
          // The step's own counters, in the run's usage.
          'step:agent:reservedTokens': '100',
          'step:agent:reservedMicroUsd': '500',
        },
      },
      [keys.tenantQuota(T)]: { hash: { reservedTokens: '100', reservedMicroUsd: '500' } },
    });

    // Same id, another estimate and time: the stored reservation, counters untouched.
    now += 50;
    const again = await store.reserve(
      req(1, { turn: 9, estimate: { inputTokens: 1, outputTokens: 1, microUsd: 1 } }),
    );
    expect(again).toEqual(expected);
    expect(await readPrefix(redis, prefix)).toEqual(before);
    expect(await store.get(T, 'res-1')).toEqual(expected);
    expect(await store.get(T, 'res-2')).toBeNull();
    expect(await store.list(T, R)).toEqual([expected]);
    expect(await store.usage(T, R)).toEqual({
      ...zero,
      reservedTokens: 100,
      reservedMicroUsd: 500,
      maxTokens: 1000,
      maxMicroUsd: null,
    });
    expect(await store.usage(T)).toEqual({
      ...zero,
      reservedTokens: 100,
      reservedMicroUsd: 500,
      maxTokens: null,
      maxMicroUsd: null,
    });
  });

  it('keeps creation order per run and fills the baseline with the whole cost when omitted', async () => {
    const whole = { inputTokens: 10, outputTokens: 5, microUsd: 70 };
    await store.reserve(req(3, { estimate: whole }));
    await store.reserve(req(1));
    await store.reserve(req(2, { runId: 'run-2' }));
    await store.reserve(req(4));
    expect((await store.list(T, R)).map((r) => [r.id, r.seq])).toEqual([
      ['res-3', 1],
      ['res-1', 2],
      ['res-4', 3],
    ]);
    expect((await store.list(T, 'run-2')).map((r) => [r.id, r.seq])).toEqual([['res-2', 1]]);
    expect((await store.get(T, 'res-3'))?.estimate).toEqual({ ...whole, baselineMicroUsd: 70 });
    expect(await store.list(T, 'run-none')).toEqual([]);
    expect(await store.open(T, 'run-none')).toEqual([]);
    expect(await store.usage(T)).toMatchObject({ reservedTokens: 315, reservedMicroUsd: 1570 });
  });

  it('a denial writes nothing, not even keys of a run it never saw', async () => {
    await store.setTenantQuota(T, { maxTokens: 150 });
    await store.reserve(req(1));
    const before = await readPrefix(redis, prefix);
    expect(Object.keys(before)).toHaveLength(5);
    now += 10;
    const e = await caught(store.reserve(req(2, { runId: 'run-new' })));
    expect(e).toBeInstanceOf(UsageLimitExceededError);
    expect(await readPrefix(redis, prefix)).toEqual(before);
    const e2 = await caught(store.reserve(req(3, { runLimits: { maxMicroUsd: 999 } })));
    expect((e2 as UsageLimitExceededError).details).toMatchObject({
      scope: 'run',
      limit: 'maxCostUsd',
    });
    expect(await readPrefix(redis, prefix)).toEqual(before);
    expect(await store.get(T, 'res-2')).toBeNull();
  });

  it.each([
    [
      'run maxTokens',
      { runLimits: { maxTokens: 250 } },
      { scope: 'run', limit: 'maxTokens', limitValue: 250, used: 0, reserved: 200 },
    ],
    [
      'run maxCostUsd',
      { runLimits: { maxMicroUsd: 1400 } },
      { scope: 'run', limit: 'maxCostUsd', limitValue: 1400, used: 0, reserved: 1000 },
    ],
    [
      'tenant maxTokens',
      { quota: { maxTokens: 299 } },
      { scope: 'tenant', limit: 'maxTokens', limitValue: 299, used: 0, reserved: 200 },
    ],
    [
      'tenant maxCostUsd',
      { quota: { maxMicroUsd: 1499 } },
      { scope: 'tenant', limit: 'maxCostUsd', limitValue: 1499, used: 0, reserved: 1000 },
    ],
  ] as const)('refuses past the %s and admits up to it', async (_name, setup, details) => {
    const runLimits = 'runLimits' in setup ? setup.runLimits : {};
    if ('quota' in setup) await store.setTenantQuota(T, setup.quota);
    // The tenant quota covers every run of the tenant: spread the first two over two runs.
    await store.reserve(req(1, { runLimits }));
    await store.reserve(req(2, { runLimits, runId: 'quota' in setup ? 'run-2' : R }));
    const e = await caught(store.reserve(req(3, { runLimits })));
    expect(e).toBeInstanceOf(UsageLimitExceededError);
    const requested = details.limit === 'maxTokens' ? 100 : 500;
    expect((e as UsageLimitExceededError).details).toEqual({
      ...details,
      requested,
      runId: R,
      tenantId: T,
    });
    expect((e as UsageLimitExceededError).retryable).toBe(false);
    // A smaller call that fits is admitted: the check is spent + reserved + requested ≤ limit.
    const room = details.limitValue - details.reserved;
    const fits =
      details.limit === 'maxTokens'
        ? { inputTokens: room, outputTokens: 0, microUsd: 1 }
        : { inputTokens: 1, outputTokens: 0, microUsd: room };
    await store.reserve(req(4, { runLimits, estimate: fits }));
    // Now at the limit: one more token (or micro-USD) is refused.
    const over =
      details.limit === 'maxTokens'
        ? { inputTokens: 1, outputTokens: 0, microUsd: 0 }
        : { inputTokens: 0, outputTokens: 0, microUsd: 1 };
    expect(await caught(store.reserve(req(5, { runLimits, estimate: over })))).toBeInstanceOf(
      UsageLimitExceededError,
    );
    expect((await store.list(T, R)).map((r) => r.id)).toEqual(
      'quota' in setup ? ['res-1', 'res-4'] : ['res-1', 'res-2', 'res-4'],
    );
  });

  it('counts spent usage against the limits, including usage above the estimate', async () => {
    const runLimits = { maxTokens: 300 };
    await store.reserve(req(1, { runLimits }));
    await store.reconcile(T, 'res-1', {
      kind: 'usage',
      inputTokens: 150,
      outputTokens: 90,
      microUsd: 800,
    });
    const e = await caught(store.reserve(req(2, { runLimits })));
    expect((e as UsageLimitExceededError).details).toEqual({
      scope: 'run',
      limit: 'maxTokens',
      limitValue: 300,
      used: 240,
      reserved: 0,
      requested: 100,
      runId: R,
      tenantId: T,
    });
    expect((e as Error).message).toBe(
      'Run "run-1" would exceed its budget maxTokens: limit 300 tokens, spent 240 tokens, reserved 0 tokens, this call needs 100 tokens. Nothing was reserved. Raise budgets.maxTokens in the plan to allow more.',
    );
  });

  it("counts each step apart against its own limits; a step's denial names the step and writes nothing", async () => {
    const stepLimits = { maxTokens: 249 };
    await store.reserve(req(1, { stepLimits }));
    await store.reconcile(T, 'res-1', {
      kind: 'usage',
      inputTokens: 100,
      outputTokens: 50,
      microUsd: 10,
    });
    // Another step of the same run has its own count.
    await store.reserve(req(2, { stepId: 'other', stepLimits }));
    await store.reserve(req(3, { stepId: 'other', stepLimits }));
    const before = await readPrefix(redis, prefix);
    const e = await caught(store.reserve(req(4, { stepLimits })));
    expect(e).toBeInstanceOf(UsageLimitExceededError);
    expect((e as UsageLimitExceededError).details).toEqual({
      scope: 'step',
      limit: 'maxTokens',
      limitValue: 249,
      used: 150,
      reserved: 0,
      requested: 100,
      runId: R,
      tenantId: T,
      stepId: 'agent',
    });
    expect((e as Error).message).toBe(
      'Step "agent" of run "run-1" would exceed its budget maxTokens: limit 249 tokens, spent 150 tokens, reserved 0 tokens, this call needs 100 tokens. Nothing was reserved. Raise the step\'s budgets.maxTokens in the plan to allow more.',
    );
    expect(await readPrefix(redis, prefix)).toEqual(before);
    const usage = await redis.hgetall(keys.runUsage(T, R));
    expect(usage).toMatchObject({
      'step:agent:spentTokens': '150',
      'step:agent:reservedTokens': '0',
      'step:other:reservedTokens': '200',
      spentTokens: '150',
      reservedTokens: '200',
    });
    await expect(store.reserve(req(5, { stepLimits: { maxMicroUsd: -1 } }))).rejects.toThrow(
      /stepLimits\.maxMicroUsd/,
    );
  });

  it('refuses bad input before any I/O, naming the field', async () => {
    const cases: [Partial<ReserveRequest>, string][] = [
      [{ reservationId: 'has space' }, 'reservationId'],
      [{ tenantId: 'a{b}' }, 'tenantId'],
      [{ runId: '' }, 'runId'],
      [{ stepId: 'bad step' }, 'stepId'],
      [{ turn: -1 }, 'turn'],
      [{ estimate: { ...estimate, microUsd: 1.5 } }, 'estimate.microUsd'],
      [{ estimate: { ...estimate, inputTokens: 1e13 } }, 'estimate.inputTokens'],
      [{ estimate: { ...estimate, baselineMicroUsd: 501 } }, 'estimate.baselineMicroUsd'],
      [{ runLimits: { maxTokens: -5 } }, 'runLimits.maxTokens'],
      [{ at: 1.5 }, 'at'],
    ];
    for (const [over, path] of cases) {
      const e = await caught(store.reserve(req(1, over)));
      expect(e, path).toBeInstanceOf(InputValidationError);
      expect((e as InputValidationError).issues[0]?.path).toBe(path);
    }
    const e = await caught(store.reconcile(T, 'res-1', { kind: 'refund' } as never));
    expect((e as InputValidationError).issues[0]?.path).toBe('outcome.kind');
    const e2 = await caught(store.setTenantQuota(T, { maxMicroUsd: 0.5 }));
    expect((e2 as InputValidationError).issues[0]?.path).toBe('maxMicroUsd');
    expect(await readPrefix(redis, prefix)).toEqual({});
  });

  it('uses the Redis clock without a clock option, and `at` when given', async () => {
    const plain = createQuotaStore({ redis, prefix });
    const before = Date.now();
    const r = await plain.reserve(req(1));
    expect(r.createdAt).toBeGreaterThanOrEqual(before - 1000);
    expect(r.createdAt).toBeLessThanOrEqual(Date.now() + 1000);
    expect((await plain.reserve(req(2, { at: 42 }))).createdAt).toBe(42);
    expect((await plain.markSent(T, 'res-2', 43)).sentAt).toBe(43);
  });
});

describe('quota store: markSent and reconcile', () => {
  it('markSent: reserved → sent once; sent and reconciled stay as they are; unknown ids fail', async () => {
    await store.reserve(req(1));
    now += 5;
    const sent = await store.markSent(T, 'res-1');
    expect(sent).toMatchObject({ state: 'sent', sentAt: 1_000_005, createdAt: 1_000_000 });
    now += 5;
    expect(await store.markSent(T, 'res-1')).toEqual(sent);
    const { reservation } = await store.reconcile(T, 'res-1', { kind: 'baseline' });
    expect(await store.markSent(T, 'res-1')).toEqual(reservation);
    const e = await caught(store.markSent(T, 'nope'));
    expect(e).toBeInstanceOf(ReservationNotFoundError);
    expect((e as Error).message).toContain('No usage reservation "nope" for tenant "tenant-a"');
    expect(await caught(store.reconcile(T, 'nope', { kind: 'none' }))).toBeInstanceOf(
      ReservationNotFoundError,
    );
    expect(await store.get(T, 'nope')).toBeNull();
  });

  const kinds: [
    string,
    ReconcileOutcome,
    boolean,
    { inputTokens: number; outputTokens: number; microUsd: number },
    string,
  ][] = [
    [
      'usage (above the estimate)',
      { kind: 'usage', inputTokens: 70, outputTokens: 95, microUsd: 910 },
      true,
      { inputTokens: 70, outputTokens: 95, microUsd: 910 },
      'usage',
    ],
    [
      'baseline',
      { kind: 'baseline' },
      true,
      { inputTokens: 60, outputTokens: 0, microUsd: 200 },
      'baseline',
    ],
    [
      'none, never sent',
      { kind: 'none' },
      false,
      { inputTokens: 0, outputTokens: 0, microUsd: 0 },
      'none',
    ],
    [
      'none after markSent',
      { kind: 'none' },
      true,
      { inputTokens: 60, outputTokens: 0, microUsd: 200 },
      'baseline',
    ],
  ];

  it.each(kinds)('reconciles %s exactly once', async (_n, outcome, send, charge, applied) => {
    await store.reserve(req(1, { runLimits: { maxMicroUsd: 10_000 } }));
    await store.reserve(req(2)); // stays open: its reserved amounts must remain
    if (send) await store.markSent(T, 'res-1');
    now += 100;
    const first = await store.reconcile(T, 'res-1', outcome);
    const tokens = charge.inputTokens + charge.outputTokens;
    expect(first.applied).toBe(true);
    expect(first.reservation).toMatchObject({
      state: 'reconciled',
      outcome: applied,
      requestedOutcome: outcome.kind,
      charged: { ...charge, tokens },
      reconciledAt: 1_000_100,
      reservedTokens: 100,
      reservedMicroUsd: 500,
      sentAt: send ? 1_000_000 : null,
    });
    const totals = {
      reservedTokens: 100,
      reservedMicroUsd: 500,
      spentTokens: tokens,
      spentMicroUsd: charge.microUsd,
    };
    expect(await store.usage(T, R)).toEqual({ ...totals, maxTokens: null, maxMicroUsd: null });
    expect(await store.usage(T)).toEqual({ ...totals, maxTokens: null, maxMicroUsd: null });
    expect((await store.open(T, R)).map((r) => r.id)).toEqual(['res-2']);
    expect((await store.list(T, R)).map((r) => r.id)).toEqual(['res-1', 'res-2']);

    // Every later call, whatever it says, changes nothing.
    const after = await readPrefix(redis, prefix);
    now += 100;
    for (const again of [
      outcome,
      { kind: 'none' } as const,
      { kind: 'usage', inputTokens: 1, outputTokens: 1, microUsd: 1 } as const,
    ]) {
      expect(await store.reconcile(T, 'res-1', again)).toEqual({
        reservation: first.reservation,
        applied: false,
      });
    }
    expect(await readPrefix(redis, prefix)).toEqual(after);
  });

  it('tracks open reservations: others open at reserve time, and reconcile by run in one step', async () => {
    const first = await store.reserve(req(1));
    expect(othersOpen(first)).toBe(0);
    const second = await store.reserve(req(2));
    // A reservation made while another of the run is open says so (a worker may have died).
    expect(othersOpen(second)).toBe(1);
    expect((await store.open(T, R)).map((r) => r.id)).toEqual(['res-1', 'res-2']);
    const done = await store.reconcile(T, 'res-1', { kind: 'none' }, undefined, R);
    expect(done.applied).toBe(true);
    expect((await store.open(T, R)).map((r) => r.id)).toEqual(['res-2']);
    expect(await redis.smembers(keys.openReservations(T, R))).toEqual(['res-2']);
    // Again, by run: nothing changes.
    expect((await store.reconcile(T, 'res-1', { kind: 'baseline' }, undefined, R)).applied).toBe(
      false,
    );
    await store.reconcile(T, 'res-2', { kind: 'baseline' }, undefined, R);
    expect(await store.open(T, R)).toEqual([]);
    expect(await redis.exists(keys.openReservations(T, R))).toBe(0);
    expect(othersOpen(await store.reserve(req(3)))).toBe(0);
    await expect(store.reconcile(T, 'res-9', { kind: 'none' }, undefined, R)).rejects.toThrow(
      ReservationNotFoundError,
    );
  });

  it('a stored reservation that is not one is refused as unreadable, naming what is wrong; a good one reads back exactly', async () => {
    const made = await store.reserve(req(1));
    const key = keys.reservations(T);
    const raw = (await redis.hget(key, 'res-1'))!;
    // Fields the record does not know are dropped; the rest reads back as written.
    await redis.hset(key, 'res-1', JSON.stringify({ ...JSON.parse(raw), extra: 1 }));
    expect(await store.get(T, 'res-1')).toEqual(made);
    const broken: [string, (r: Record<string, unknown>) => unknown][] = [
      ['a negative amount', (r) => ({ ...r, reservedTokens: -1 })],
      ['a fractional turn', (r) => ({ ...r, turn: 1.5 })],
      ['an unknown state', (r) => ({ ...r, state: 'lost' })],
      ['a missing estimate field', (r) => ({ ...r, estimate: { inputTokens: 1 } })],
      ['a charge that is not an object', (r) => ({ ...r, charged: 'all' })],
      ['an unknown outcome', (r) => ({ ...r, outcome: 'refund' })],
      ['a missing sentAt', ({ sentAt: _sentAt, ...r }) => r],
      ['a zero seq', (r) => ({ ...r, seq: 0 })],
      ['not an object', () => [1, 2]],
    ];
    for (const [what, change] of broken) {
      await redis.hset(
        key,
        'res-1',
        JSON.stringify(change(JSON.parse(raw) as Record<string, unknown>)),
      );
      const error = await caught(store.get(T, 'res-1'));
      expect(error, what).toBeInstanceOf(InvariantError);
      expect((error as Error).message, what).toMatch(/a usage reservation is unreadable \(/);
    }
    await redis.hset(key, 'res-1', '{not json');
    expect(await caught(store.get(T, 'res-1'))).toBeInstanceOf(InvariantError);
  });

  it('a reconcile replayed by two clients at once applies once', async () => {
    const other = connect();
    try {
      const otherStore = createQuotaStore({ redis: other, prefix, clock: () => now });
      for (let i = 1; i <= 20; i++) await store.reserve(req(i));
      const usage = { kind: 'usage', inputTokens: 50, outputTokens: 25, microUsd: 300 } as const;
      const results = await Promise.all(
        Array.from({ length: 20 }, (_, i) => [
          store.reconcile(T, `res-${i + 1}`, usage),
          otherStore.reconcile(T, `res-${i + 1}`, usage),
        ]).flat(),
      );
      expect(results.filter((r) => r.applied)).toHaveLength(20);
      expect(results.filter((r) => !r.applied)).toHaveLength(20);
      expect(await store.usage(T)).toEqual({
        reservedTokens: 0,
        reservedMicroUsd: 0,
        spentTokens: 20 * 75,
        spentMicroUsd: 20 * 300,
        maxTokens: null,
        maxMicroUsd: null,
      });
      expect(await store.open(T, R)).toEqual([]);
    } finally {
      await other.quit();
    }
  });
});

describe('quota store: tenant quota', () => {
  it('sets, keeps, removes and reads the limits', async () => {
    expect(await store.getTenantQuota(T)).toEqual({ maxTokens: null, maxMicroUsd: null });
    expect(await store.setTenantQuota(T, { maxTokens: 1000, maxMicroUsd: 5_000_000 })).toEqual({
      maxTokens: 1000,
      maxMicroUsd: 5_000_000,
    });
    expect(await store.setTenantQuota(T, { maxTokens: null })).toEqual({
      maxTokens: null,
      maxMicroUsd: 5_000_000,
    });
    expect(await store.setTenantQuota(T, {})).toEqual({ maxTokens: null, maxMicroUsd: 5_000_000 });
    expect(await store.getTenantQuota(T)).toEqual({ maxTokens: null, maxMicroUsd: 5_000_000 });
    expect(await store.getTenantQuota('tenant-b')).toEqual({ maxTokens: null, maxMicroUsd: null });
    // Removing a limit makes the tenant unlimited again.
    await store.setTenantQuota(T, { maxTokens: 0 });
    expect(await caught(store.reserve(req(1)))).toBeInstanceOf(UsageLimitExceededError);
    await store.setTenantQuota(T, { maxTokens: null });
    expect((await store.reserve(req(1))).state).toBe('reserved');
    expect(await store.usage(T)).toEqual({
      reservedTokens: 100,
      reservedMicroUsd: 500,
      spentTokens: 0,
      spentMicroUsd: 0,
      maxTokens: null,
      maxMicroUsd: 5_000_000,
    });
  });

  it('admits exactly K of 100 concurrent reservations on several connections; reconciling all leaves reserved 0 and spent the sum of the charges', async () => {
    const K = 37;
    const clients = Array.from({ length: 5 }, () => connect());
    const sampler = connect();
    try {
      const stores = clients.map((c) => createQuotaStore({ redis: c, prefix, clock: () => now }));
      await store.setTenantQuota(T, { maxTokens: K * 100 });
      const runs = ['run-a', 'run-b', 'run-c', 'run-d'];
      let done = false;
      let maxReserved = 0;
      let samples = 0;
      const sampling = (async () => {
        while (!done) {
          const v = Number((await sampler.hget(keys.tenantQuota(T), 'reservedTokens')) ?? 0);
          maxReserved = Math.max(maxReserved, v);
          samples++;
        }
      })();
      const settled = await Promise.allSettled(
        Array.from({ length: 100 }, (_, i) =>
          stores[i % stores.length]!.reserve(
            req(i, { runId: runs[i % runs.length]!, runLimits: { maxTokens: 1_000_000 } }),
          ),
        ),
      );
      done = true;
      await sampling;
      const admitted = settled.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
      const refused = settled.flatMap((s): unknown[] =>
        s.status === 'rejected' ? [s.reason] : [],
      );
      expect(admitted).toHaveLength(K);
      expect(refused).toHaveLength(100 - K);
      for (const e of refused) {
        expect(e).toBeInstanceOf(UsageLimitExceededError);
        expect((e as UsageLimitExceededError).details).toMatchObject({
          scope: 'tenant',
          limit: 'maxTokens',
          limitValue: K * 100,
          requested: 100,
        });
      }
      expect(samples).toBeGreaterThan(0);
      expect(maxReserved).toBeLessThanOrEqual(K * 100);
      expect(await store.usage(T)).toMatchObject({ reservedTokens: K * 100, spentTokens: 0 });
      const perRun = await Promise.all(runs.map((r) => store.list(T, r)));
      expect(
        perRun
          .flat()
          .map((r) => r.id)
          .sort(),
      ).toEqual(admitted.map((r) => r.id).sort());
      for (const list of perRun) expect(list.map((r) => r.seq)).toEqual(list.map((_, i) => i + 1));

      // Reconcile every admitted one, each twice from two connections, with every outcome kind.
      let spentTokens = 0;
      let spentMicroUsd = 0;
      const outcomes = admitted.map((_r, i): ReconcileOutcome => {
        if (i % 3 === 0) {
          const o = {
            kind: 'usage',
            inputTokens: 55 + i,
            outputTokens: 7,
            microUsd: 300 + i,
          } as const;
          spentTokens += o.inputTokens + o.outputTokens;
          spentMicroUsd += o.microUsd;
          return o;
        }
        if (i % 3 === 1) {
          spentTokens += 60;
          spentMicroUsd += 200;
          return { kind: 'baseline' };
        }
        return { kind: 'none' };
      });
      const results = await Promise.all(
        admitted.flatMap((r, i) => [
          stores[i % 5]!.reconcile(T, r.id, outcomes[i]!),
          stores[(i + 1) % 5]!.reconcile(T, r.id, outcomes[i]!),
        ]),
      );
      expect(results.filter((x) => x.applied)).toHaveLength(K);
      expect(await store.usage(T)).toEqual({
        reservedTokens: 0,
        reservedMicroUsd: 0,
        spentTokens,
        spentMicroUsd,
        maxTokens: K * 100,
        maxMicroUsd: null,
      });
      const runTotals = await Promise.all(runs.map((r) => store.usage(T, r)));
      expect(runTotals.every((u) => u.reservedTokens === 0 && u.reservedMicroUsd === 0)).toBe(true);
      expect(runTotals.reduce((s, u) => s + u.spentTokens, 0)).toBe(spentTokens);
      expect(runTotals.reduce((s, u) => s + u.spentMicroUsd, 0)).toBe(spentMicroUsd);
      for (const r of runs) expect(await store.open(T, r)).toEqual([]);
    } finally {
      await Promise.all([...clients, sampler].map((c) => c.quit()));
    }
  });
});
