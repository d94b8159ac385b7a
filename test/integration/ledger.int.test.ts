import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  InputValidationError,
  LedgerStateError,
  NonDeterminismError,
  ToolCallBusyError,
  ToolOutcomeUnknownError,
  UnknownError,
  RedisUnavailableError,
} from '../../src/errors.js';
import { createKeys } from '../../src/persistence/keys.js';
import {
  argsHash,
  createLedger,
  ledgerCallId,
  type Ledger,
  type PrepareCall,
} from '../../src/persistence/ledger.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';
import { caught } from '../helpers/caught.js';

let redis: Redis;
let prefix: string;
let now: number;
let ledger: Ledger;

const T = 'tenant-a';
const R = 'run-1';
const call = (over: Partial<PrepareCall> = {}): PrepareCall => ({
  runId: R,
  stepId: 'send',
  tenantId: T,
  callId: 'call-1',
  tool: 'send_email@1',
  args: { to: 'a@b.co', n: 1 },
  ...over,
});
const finalError = new UnknownError('card declined').toJSON();
const retryableError = new RedisUnavailableError('flaky').toJSON();

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  await redis.quit();
});
beforeEach(() => {
  prefix = testPrefix();
  now = 1_000_000;
  ledger = createLedger({ redis, prefix, clock: () => now });
});
afterEach(async () => {
  await deletePrefix(redis, prefix);
});

describe('ledger', () => {
  it('prepare creates a PREPARED entry once and returns it as is afterwards', async () => {
    const first = await ledger.prepare(call());
    expect(first).toEqual({
      callId: 'call-1',
      runId: R,
      stepId: 'send',
      tenantId: T,
      tool: 'send_email@1',
      argsHash: argsHash({ n: 1, to: 'a@b.co' }),
      args: { to: 'a@b.co', n: 1 },
      state: 'PREPARED',
      runs: 0,
      leaseUntil: null,
      receipt: null,
      error: null,
      createdAt: now,
      updatedAt: now,
      resolution: null,
      seq: 1,
    });
    now += 10;
    // Key order of the args does not matter: same hash, same entry.
    expect(await ledger.prepare(call({ args: { n: 1, to: 'a@b.co' } }))).toEqual(first);
    expect(await ledger.list(R, T)).toEqual([first]);
    expect(await redis.hkeys(createKeys(prefix).ledger(R, T))).toEqual(['call-1']);
  });

  it('walks PREPARED → RUNNING → SUCCEEDED and then only returns the receipt', async () => {
    await ledger.prepare(call());
    const running = await ledger.markRunning(R, T, 'call-1', 5000);
    expect(running).toMatchObject({ state: 'RUNNING', runs: 1, leaseUntil: now + 5000 });
    now += 100;
    const receipt = {
      id: 'm-1',
      tags: [],
      meta: {},
      big: 9007199254740991,
      float: 0.30000000000000004,
      text: 'ünï ✓',
    };
    const done = await ledger.markSucceeded(R, T, 'call-1', receipt, 1);
    expect(done.applied).toBe(true);
    expect(done.entry).toMatchObject({
      state: 'SUCCEEDED',
      runs: 1,
      leaseUntil: null,
      updatedAt: now,
    });
    // The receipt comes back exactly: empty arrays stay arrays, numbers are not rounded.
    expect(JSON.stringify(done.entry.receipt)).toBe(JSON.stringify(receipt));
    expect(await ledger.markRunning(R, T, 'call-1', 5000)).toEqual(done.entry);
    expect(await ledger.prepare(call())).toEqual(done.entry);
    expect(await ledger.get(R, T, 'call-1')).toEqual(done.entry);
  });

  it('refuses another tool or other arguments under the same call id', async () => {
    const entry = await ledger.prepare(call());
    const other = await caught(ledger.prepare(call({ tool: 'send_sms@1' })));
    expect(other).toBeInstanceOf(NonDeterminismError);
    expect((other as NonDeterminismError).recorded).toEqual({
      tool: 'send_email@1',
      argsHash: entry.argsHash,
    });
    const args = await caught(ledger.prepare(call({ args: { to: 'x@y.z', n: 1 } })));
    expect(args).toBeInstanceOf(NonDeterminismError);
    expect((args as Error).message).toContain(
      "The run's code or inputs changed since the call was recorded",
    );
    expect(await ledger.get(R, T, 'call-1')).toEqual(entry);
  });

  it('a live lease makes the call busy, retryable after the rest of the lease', async () => {
    await ledger.prepare(call());
    await ledger.markRunning(R, T, 'call-1', 5000);
    now += 1200;
    const busy = await caught(ledger.markRunning(R, T, 'call-1', 5000, { rerunInDoubt: true }));
    expect(busy).toBeInstanceOf(ToolCallBusyError);
    expect((busy as ToolCallBusyError).retryAfterMs).toBe(3800);
    expect((busy as ToolCallBusyError).retryable).toBe(true);
    // Still live at the last millisecond of the lease.
    now += 3800;
    expect(await ledger.prepare(call())).toMatchObject({ state: 'RUNNING' });
  });

  it('an expired lease makes the call IN_DOUBT; only an idempotent re-run takes it', async () => {
    await ledger.prepare(call());
    await ledger.markRunning(R, T, 'call-1', 50);
    now += 51;
    const doubt = await ledger.prepare(call());
    expect(doubt).toMatchObject({ state: 'IN_DOUBT', runs: 1, leaseUntil: null, updatedAt: now });
    expect(await ledger.prepare(call())).toEqual(doubt);
    const refused = await caught(ledger.markRunning(R, T, 'call-1', 50));
    expect(refused).toBeInstanceOf(ToolOutcomeUnknownError);
    expect(refused).toMatchObject({
      runId: R,
      stepId: 'send',
      callId: 'call-1',
      tool: 'send_email@1',
    });
    const rerun = await ledger.markRunning(R, T, 'call-1', 50, { rerunInDoubt: true });
    expect(rerun).toMatchObject({ state: 'RUNNING', runs: 2, leaseUntil: now + 50 });
  });

  it('markRunning on an expired lease flips it to IN_DOUBT unless it may re-run', async () => {
    await ledger.prepare(call());
    await ledger.markRunning(R, T, 'call-1', 50);
    now += 100;
    expect(await caught(ledger.markRunning(R, T, 'call-1', 50))).toBeInstanceOf(
      ToolOutcomeUnknownError,
    );
    expect(await ledger.get(R, T, 'call-1')).toMatchObject({ state: 'IN_DOUBT', runs: 1 });
  });

  it('a stale run number can neither renew nor overwrite; the current one can', async () => {
    await ledger.prepare(call());
    await ledger.markRunning(R, T, 'call-1', 50); // worker A: run 1
    now += 100;
    await ledger.prepare(call()); // worker B finds it in doubt and re-runs (idempotent tool)
    const b = await ledger.markRunning(R, T, 'call-1', 50, { rerunInDoubt: true });
    expect(b.runs).toBe(2);
    const renewA = await ledger.renewLease(R, T, 'call-1', 50, 1);
    expect(renewA).toEqual({ entry: b, applied: false });
    expect(await ledger.markSucceeded(R, T, 'call-1', { by: 'A' }, 1)).toEqual({
      entry: b,
      applied: false,
    });
    expect(await ledger.markFailed(R, T, 'call-1', finalError, 1)).toEqual({
      entry: b,
      applied: false,
    });
    now += 10;
    const renewB = await ledger.renewLease(R, T, 'call-1', 50, 2);
    expect(renewB.applied).toBe(true);
    expect(renewB.entry.leaseUntil).toBe(now + 50);
    const doneB = await ledger.markSucceeded(R, T, 'call-1', { by: 'B' }, 2);
    expect(doneB.entry).toMatchObject({ state: 'SUCCEEDED', receipt: { by: 'B' } });
    expect((await ledger.renewLease(R, T, 'call-1', 50, 2)).applied).toBe(false);
  });

  it('a worker whose lease lapsed records its outcome if nobody ran the call since', async () => {
    await ledger.prepare(call());
    await ledger.markRunning(R, T, 'call-1', 50);
    now += 100;
    expect((await ledger.prepare(call())).state).toBe('IN_DOUBT');
    const late = await ledger.markSucceeded(R, T, 'call-1', { late: true }, 1);
    expect(late).toMatchObject({
      applied: true,
      entry: { state: 'SUCCEEDED', receipt: { late: true } },
    });
  });

  it('FAILED with a retryable error may run again; with a final error it stays FAILED', async () => {
    await ledger.prepare(call());
    await ledger.markRunning(R, T, 'call-1', 5000);
    const failed = await ledger.markFailed(R, T, 'call-1', retryableError, 1);
    expect(failed.entry).toMatchObject({
      state: 'FAILED',
      error: retryableError,
      leaseUntil: null,
    });
    const again = await ledger.markRunning(R, T, 'call-1', 5000);
    expect(again).toMatchObject({ state: 'RUNNING', runs: 2, error: null });
    const final = await ledger.markFailed(R, T, 'call-1', finalError, 2);
    expect(final.entry.error).toEqual(finalError);
    expect(await ledger.markRunning(R, T, 'call-1', 5000, { rerunInDoubt: true })).toEqual(
      final.entry,
    );
  });

  it('resolve: succeeded records the receipt, retry makes it PREPARED; both record who and when', async () => {
    await ledger.prepare(call());
    await ledger.markRunning(R, T, 'call-1', 50);
    now += 100;
    await ledger.prepare(call());
    const ok = await ledger.resolve(R, T, 'call-1', { succeeded: { id: 'm-9' } }, 'ops@acme');
    expect(ok).toMatchObject({
      state: 'SUCCEEDED',
      receipt: { id: 'm-9' },
      resolution: { by: 'ops@acme', at: now, as: 'succeeded' },
    });

    // RUNNING with an expired lease can be resolved directly.
    await ledger.prepare(call({ callId: 'call-2' }));
    await ledger.markRunning(R, T, 'call-2', 50);
    now += 100;
    const retry = await ledger.resolve(R, T, 'call-2', { retry: true }, 'ops@acme');
    expect(retry).toMatchObject({
      state: 'PREPARED',
      runs: 1,
      leaseUntil: null,
      resolution: { as: 'retry' },
    });
    expect(await ledger.markRunning(R, T, 'call-2', 50)).toMatchObject({
      state: 'RUNNING',
      runs: 2,
    });
  });

  it('resolve refuses calls that are not in doubt, saying their state', async () => {
    const refusal = async (callId: string): Promise<LedgerStateError> => {
      const e = await caught(ledger.resolve(R, T, callId, { retry: true }, 'ops'));
      expect(e).toBeInstanceOf(LedgerStateError);
      return e as LedgerStateError;
    };
    await ledger.prepare(call());
    expect((await refusal('call-1')).message).toBe(
      'Cannot resolve call call-1 of run "run-1": it is PREPARED, it has not started: the next run of its step calls the tool. Only a call in doubt (IN_DOUBT, or RUNNING with an expired lease) can be resolved.',
    );
    await ledger.markRunning(R, T, 'call-1', 5000);
    now += 1000;
    expect((await refusal('call-1')).message).toContain(
      'it is RUNNING and its worker holds the lease for 4000 ms more.',
    );
    await ledger.markSucceeded(R, T, 'call-1', null, 1);
    const done = await refusal('call-1');
    expect(done.state).toBe('SUCCEEDED');
    expect(done.message).toContain('it is SUCCEEDED, its receipt is recorded.');
    await ledger.prepare(call({ callId: 'call-2' }));
    await ledger.markRunning(R, T, 'call-2', 5000);
    await ledger.markFailed(R, T, 'call-2', finalError, 1);
    expect((await refusal('call-2')).message).toContain('it is FAILED, its error is recorded.');
    const missing = await refusal('call-3');
    expect(missing.state).toBeNull();
    expect(missing.message).toBe(
      'No ledger entry for call call-3 of run "run-1" (tenant "tenant-a"). Check the run id, tenant id and call id.',
    );
    await expect(ledger.resolve(R, T, 'call-1', { retry: false } as never, 'ops')).rejects.toThrow(
      InputValidationError,
    );
    await expect(ledger.resolve(R, T, 'call-1', { retry: true }, '')).rejects.toThrow(
      /by: must name who resolved it/,
    );
  });

  it('keeps tenants apart: the same call id in two tenants is two entries', async () => {
    const a = await ledger.prepare(call());
    const b = await ledger.prepare(call({ tenantId: 'tenant-b', tool: 'other@1' }));
    expect(a.tool).toBe('send_email@1');
    expect(b.tool).toBe('other@1');
    await ledger.markRunning(R, T, 'call-1', 5000);
    expect((await ledger.get(R, 'tenant-b', 'call-1'))?.state).toBe('PREPARED');
    expect(await ledger.list(R, 'tenant-b')).toEqual([b]);
    const keys = createKeys(prefix);
    expect(keys.ledger(R, T)).toBe(`${prefix}:{run-1}:ledger:tenant-a`);
    expect(await redis.exists(keys.ledger(R, T), keys.ledger(R, 'tenant-b'))).toBe(2);
  });

  it('lists entries in creation order and returns null for an absent call', async () => {
    for (const id of ['z', 'a', 'm', 'b']) await ledger.prepare(call({ callId: id }));
    expect((await ledger.list(R, T)).map((e) => [e.callId, e.seq])).toEqual([
      ['z', 1],
      ['a', 2],
      ['m', 3],
      ['b', 4],
    ]);
    expect(await ledger.get(R, T, 'nope')).toBeNull();
    expect(await ledger.list('other-run', T)).toEqual([]);
  });

  it('uses the Redis server clock by default (a real 50 ms lease expires)', async () => {
    const real = createLedger({ redis, prefix });
    await real.prepare(call());
    const running = await real.markRunning(R, T, 'call-1', 50);
    expect(Math.abs((running.leaseUntil ?? 0) - 50 - Date.now())).toBeLessThan(1000);
    await expect(real.markRunning(R, T, 'call-1', 50)).rejects.toThrow(ToolCallBusyError);
    await new Promise((r) => setTimeout(r, 80));
    expect((await real.prepare(call())).state).toBe('IN_DOUBT');
  });

  it('refuses bad arguments before touching Redis', async () => {
    await expect(ledger.prepare(call({ callId: 'has space' }))).rejects.toThrow(
      /callId: must be 1 to 256 printable/,
    );
    await expect(ledger.prepare(call({ tenantId: 'a{b}' }))).rejects.toThrow(
      /tenantId: must not contain/,
    );
    await expect(ledger.prepare(call({ stepId: '' }))).rejects.toThrow(/stepId: must not be empty/);
    await expect(ledger.prepare(call({ args: { at: new Date(0) } as never }))).rejects.toThrow(
      /args\.at: Date is not JSON/,
    );
    await expect(ledger.markRunning(R, T, 'call-1', 0)).rejects.toThrow(
      /leaseMs: must be an integer ≥ 1/,
    );
    await expect(ledger.markRunning(R, T, 'call-1', 10)).rejects.toThrow(
      /No ledger entry for call call-1.*Call prepare first/,
    );
    await expect(ledger.markFailed(R, T, 'call-1', { oops: true } as never, 1)).rejects.toThrow(
      /error: must be a SerializedError/,
    );
    expect(await redis.exists(createKeys(prefix).ledger(R, T))).toBe(0);
  });
});

describe('ledger ids', () => {
  const base = { tenantId: T, runId: R, tool: 'send_email@1', args: { to: 'a@b.co', n: 1 } };

  it('are deterministic hex SHA-256 and ignore key order', () => {
    const id = ledgerCallId(base);
    expect(id).toMatch(/^[0-9a-f]{64}$/);
    expect(ledgerCallId({ ...base, args: { n: 1, to: 'a@b.co' } })).toBe(id);
    expect(argsHash({ b: [1, { y: 2, x: 1 }], a: null })).toBe(
      argsHash({ a: null, b: [1, { x: 1, y: 2 }] }),
    );
  });

  it('change with tenant, run, step, tool and args', () => {
    const id = ledgerCallId(base);
    const variants = [
      { ...base, tenantId: 'tenant-b' },
      { ...base, runId: 'run-2' },
      { ...base, stepId: 'send' },
      { ...base, tool: 'send_email@2' },
      { ...base, args: { to: 'a@b.co', n: 2 } },
    ];
    const ids = new Set([id, ...variants.map(ledgerCallId)]);
    expect(ids.size).toBe(6);
  });
});

describe('ledger.begin: prepare and markRunning in one step', () => {
  it('records and leases a new call, run 1, exactly as prepare then markRunning would', async () => {
    const begun = await ledger.begin(call(), 5000);
    expect(begun).toMatchObject({ state: 'RUNNING', runs: 1, leaseUntil: now + 5000, seq: 1 });
    expect(await ledger.get(R, T, 'call-1')).toEqual(begun);
    const other = createLedger({ redis, prefix: testPrefix(), clock: () => now });
    await other.prepare(call());
    const twoSteps = await other.markRunning(R, T, 'call-1', 5000);
    expect({ ...twoSteps, updatedAt: 0 }).toEqual({ ...begun, updatedAt: 0 });
  });

  it('returns a recorded outcome without taking a lease, and refuses what markRunning refuses', async () => {
    const begun = await ledger.begin(call(), 5000);
    // Live lease: busy.
    expect(await caught(ledger.begin(call(), 5000))).toBeInstanceOf(ToolCallBusyError);
    await ledger.markSucceeded(R, T, 'call-1', { id: 'm-1' }, begun.runs);
    const again = await ledger.begin(call(), 5000);
    expect(again).toMatchObject({ state: 'SUCCEEDED', runs: 1, receipt: { id: 'm-1' } });
    // Other arguments under the same call id: non-determinism, nothing changed.
    const e = await caught(ledger.begin(call({ args: { to: 'x@y.z' } }), 5000));
    expect(e).toBeInstanceOf(NonDeterminismError);
    expect(await ledger.get(R, T, 'call-1')).toEqual(again);
  });

  it('an expired lease is in doubt: refused unless the tool may re-run, then re-run as run 2', async () => {
    await ledger.begin(call({ callId: 'c2' }), 100);
    now += 1000;
    expect(await caught(ledger.begin(call({ callId: 'c2' }), 100))).toBeInstanceOf(
      ToolOutcomeUnknownError,
    );
    expect((await ledger.get(R, T, 'c2'))?.state).toBe('IN_DOUBT');
    const rerun = await ledger.begin(call({ callId: 'c2' }), 100, { rerunInDoubt: true });
    expect(rerun).toMatchObject({ state: 'RUNNING', runs: 2 });
  });
});
