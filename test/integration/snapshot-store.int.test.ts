import { createServer } from 'node:net';
import { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  InputValidationError,
  RedisUnavailableError,
  RunAlreadyExistsError,
  RunNotFoundError,
  SnapshotConflictError,
  SnapshotCorruptError,
  SnapshotUnsupportedError,
} from '../../src/errors.js';
import { createSnapshotCodec } from '../../src/persistence/codec.js';
import type { JsonValue } from '../../src/internal/json.js';
import { createKeys } from '../../src/persistence/keys.js';
import { createLedger } from '../../src/persistence/ledger.js';
import {
  classifyRedisError,
  describeRedisTarget,
  isConnectionError,
} from '../../src/persistence/redis-errors.js';
import {
  createSnapshotStore,
  type RunEventRecord,
  type SnapshotStore,
} from '../../src/persistence/snapshot-store.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';
import { startRedisServer } from '../helpers/redis-server.js';

interface Snap {
  status: string;
  steps: { id: string; state: string; attempt: number; output?: unknown }[];
}

const initial: Snap = { status: 'running', steps: [{ id: 'a', state: 'pending', attempt: 0 }] };
const next = (n: number): Snap => ({
  status: 'running',
  steps: [{ id: 'a', state: 'running', attempt: n, output: { n, text: 'héllo\n"quoted"' } }],
});

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error('expected the promise to reject');
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === 'string') throw new Error('no port');
  return address.port;
}

describe('snapshot store', () => {
  let redis: Redis;
  let prefix: string;
  let store: SnapshotStore<Snap>;
  const stores: SnapshotStore<unknown>[] = [];
  const clients: Redis[] = [];

  beforeEach(() => {
    redis = connect();
    prefix = testPrefix();
    store = createSnapshotStore<Snap>({ redis, prefix, clock: () => 1_700_000_000_000 });
  });

  afterEach(async () => {
    await store.close();
    for (const s of stores.splice(0)) await s.close();
    for (const c of clients.splice(0)) c.disconnect();
    await deletePrefix(redis, prefix);
    await redis.quit();
  });

  const keys = () => createKeys(prefix);
  const rawSnap = (runId: string) => redis.hgetall(keys().snap(runId));
  const streamLength = (runId: string) => redis.xlen(keys().events(runId));

  it('creates and loads a run', async () => {
    const created = await store.create('run-1', initial, [{ type: 'run.started', at: 1 }]);
    expect(created).toEqual({
      schemaVersion: 1,
      version: 0,
      snapshot: initial,
      updatedAt: 1_700_000_000_000,
    });
    expect(await store.load('run-1')).toEqual(created);
    expect(await store.tryLoad('run-1')).toEqual(created);
    expect(await rawSnap('run-1')).toEqual({
      v: '0',
      sv: '1',
      s: JSON.stringify(initial),
      u: '1700000000000',
    });
    const events = await store.readEvents('run-1');
    expect(events).toMatchObject([
      { version: 0, type: 'run.started', data: { type: 'run.started', at: 1 } },
    ]);
  });

  it('refuses to create a run twice and leaves the first one unchanged', async () => {
    await store.create('run-1', initial, [{ type: 'run.started' }]);
    const before = await rawSnap('run-1');
    const err = await rejection(store.create('run-1', next(9), [{ type: 'run.started' }]));
    expect(err).toBeInstanceOf(RunAlreadyExistsError);
    expect(err).toMatchObject({ runId: 'run-1', retryable: false });
    expect(await rawSnap('run-1')).toEqual(before);
    expect(await streamLength('run-1')).toBe(1);
  });

  it('lets exactly one of many concurrent creates win', async () => {
    const others = Array.from({ length: 4 }, () => {
      const client = connect();
      clients.push(client);
      const s = createSnapshotStore<Snap>({ redis: client, prefix });
      stores.push(s);
      return s;
    });
    const attempts = [store, ...others].flatMap((s, i) =>
      Array.from({ length: 8 }, (_, j) =>
        s.create('race', next(i * 100 + j), [{ type: 'run.started', by: i * 100 + j }]),
      ),
    );
    const results = await Promise.allSettled(attempts);
    const won = results.filter((r) => r.status === 'fulfilled');
    const lost = results.filter((r) => r.status === 'rejected');
    expect(won).toHaveLength(1);
    for (const r of lost) expect(r.reason).toBeInstanceOf(RunAlreadyExistsError);
    const winner = (won[0] as PromiseFulfilledResult<{ snapshot: Snap }>).value;
    expect((await store.load('race')).snapshot).toEqual(winner.snapshot);
    expect(await streamLength('race')).toBe(1);
  });

  it('throws RunNotFoundError for an unknown run, and tryLoad returns null', async () => {
    const err = await rejection(store.load('nope'));
    expect(err).toBeInstanceOf(RunNotFoundError);
    expect(err).toMatchObject({ runId: 'nope', code: 'run_not_found' });
    expect(await store.tryLoad('nope')).toBeNull();
    expect(await store.readEvents('nope')).toEqual([]);
  });

  it('commits: increments the version and appends the events in order in the same transaction', async () => {
    await store.create('run-1', initial);
    const e1 = await store.commit('run-1', 0, next(1), [
      { type: 'step.started', stepId: 'a' },
      { type: 'step.succeeded', stepId: 'a', output: { ok: true } },
    ]);
    expect(e1).toEqual({
      schemaVersion: 1,
      version: 1,
      snapshot: next(1),
      updatedAt: 1_700_000_000_000,
    });
    const e2 = await store.commit('run-1', 1, next(2), [{ type: 'run.succeeded' }]);
    expect(e2.version).toBe(2);
    await store.commit('run-1', 2, next(3), []);
    expect(await store.load('run-1')).toMatchObject({ version: 3, snapshot: next(3) });

    const events = await store.readEvents('run-1');
    expect(events.map((e) => [e.version, e.type])).toEqual([
      [1, 'step.started'],
      [1, 'step.succeeded'],
      [2, 'run.succeeded'],
    ]);
    expect(events[1]?.data).toEqual({ type: 'step.succeeded', stepId: 'a', output: { ok: true } });
    const ids = events.map((e) => e.id);
    expect([...ids].sort()).toEqual(ids);

    expect(await store.readEvents('run-1', { after: ids[0] as string })).toEqual(events.slice(1));
    expect(await store.readEvents('run-1', { count: 2 })).toEqual(events.slice(0, 2));
    expect(await store.readEvents('run-1', { after: ids[2] as string })).toEqual([]);
    const raw = await redis.xrange(keys().events('run-1'), '-', '+');
    expect(raw[0]?.[1]).toEqual([
      'v',
      '1',
      't',
      'step.started',
      'd',
      JSON.stringify({ type: 'step.started', stepId: 'a' }),
    ]);
  });

  it('refuses a stale commit with SnapshotConflictError and writes nothing', async () => {
    await store.create('run-1', initial);
    await store.commit('run-1', 0, next(1), [{ type: 'one' }]);
    await store.commit('run-1', 1, next(2), [{ type: 'two' }]);
    const before = await rawSnap('run-1');
    const err = await rejection(store.commit('run-1', 1, next(99), [{ type: 'stale' }]));
    expect(err).toBeInstanceOf(SnapshotConflictError);
    expect(err).toMatchObject({
      runId: 'run-1',
      expectedVersion: 1,
      actualVersion: 2,
      retryable: true,
      code: 'snapshot_conflict',
    });
    expect((err as Error).message).toMatch(/expected version 1, found version 2/);
    expect(await rawSnap('run-1')).toEqual(before);
    expect(await streamLength('run-1')).toBe(2);
    const ahead = await rejection(store.commit('run-1', 7, next(99), [{ type: 'ahead' }]));
    expect(ahead).toMatchObject({ expectedVersion: 7, actualVersion: 2 });
    expect(await streamLength('run-1')).toBe(2);
  });

  it('commits list appends with the snapshot, all or nothing', async () => {
    await store.create('run-1', initial);
    const list = keys().history('run-1', 'agent');
    const conflict = (actual: number) => new Error(`list has ${actual}`);
    const v1 = await store.commit('run-1', 0, next(1), [{ type: 'turn' }], {
      appends: [{ key: list, expectedLength: 0, values: ['a', 'b'], conflict }],
    });
    expect(v1.version).toBe(1);
    expect(await redis.lrange(list, 0, -1)).toEqual(['a', 'b']);
    // A length that moved on refuses the whole commit with the append's own error.
    const before = await rawSnap('run-1');
    const err = await rejection(
      store.commit('run-1', 1, next(2), [{ type: 'turn' }], {
        appends: [{ key: list, expectedLength: 1, values: ['c'], conflict }],
      }),
    );
    expect((err as Error).message).toBe('list has 2');
    expect(await rawSnap('run-1')).toEqual(before);
    expect(await redis.lrange(list, 0, -1)).toEqual(['a', 'b']);
    expect(await streamLength('run-1')).toBe(1);
    // A stale version refuses the appends too.
    await rejection(
      store.commit('run-1', 0, next(2), [], {
        appends: [{ key: list, expectedLength: 2, values: ['c'] }],
      }),
    );
    expect(await redis.llen(list)).toBe(2);
    // 2,500 values go in chunks (the script's stack is limited); the count is exact.
    const many = Array.from({ length: 2500 }, (_, i) => `m${i}`);
    await store.commit('run-1', 1, next(2), [], {
      appends: [{ key: list, expectedLength: 2, values: many }],
    });
    expect(await redis.llen(list)).toBe(2502);
    expect(await redis.lindex(list, 2501)).toBe('m2499');
  });

  it('writes ledger receipts with the snapshot, all or nothing; a receipt already there stays', async () => {
    await store.create('run-1', initial);
    const ledger = createLedger({ redis, prefix, clock: () => 1_600_000_000_000 });
    const call = (callId: string, args: JsonValue) => ({
      runId: 'run-1',
      stepId: 'agent',
      tenantId: 'default',
      callId,
      tool: 'lookup@1',
      args,
    });
    const first = ledger.recordOp(call('a'.repeat(64), { n: 1 }), { found: [1, 2] });
    // A stale version writes no receipt.
    await rejection(store.commit('run-1', 5, next(1), [], { ledgerRecords: [first.op] }));
    expect(await ledger.list('run-1', 'default')).toEqual([]);
    await store.commit('run-1', 0, next(1), [{ type: 'turn' }], { ledgerRecords: [first.op] });
    const [written] = await ledger.list('run-1', 'default');
    expect(written).toMatchObject({
      state: 'SUCCEEDED',
      receipt: { found: [1, 2] },
      runs: 1,
      seq: 1,
      args: { n: 1 },
      createdAt: 1_700_000_000_000,
      updatedAt: 1_700_000_000_000,
    });
    // A second receipt of the same call leaves the first; a new call comes next in order.
    const again = ledger.recordOp(call('a'.repeat(64), { n: 1 }), { found: [] });
    const second = ledger.recordOp(call('b'.repeat(64), { n: 2 }), []);
    await store.commit('run-1', 1, next(2), [], { ledgerRecords: [again.op, second.op] });
    const entries = await ledger.list('run-1', 'default');
    expect(entries.map((e) => [e.callId[0], e.seq, e.receipt])).toEqual([
      ['a', 1, { found: [1, 2] }],
      ['b', 2, []],
    ]);
    // Another run's ledger is refused before any I/O, naming the field.
    const other = ledger.recordOp({ ...call('c'.repeat(64), {}), runId: 'run-2' }, 1);
    const err = await rejection(
      store.commit('run-1', 2, next(3), [], { ledgerRecords: [other.op] }),
    );
    expect(err).toBeInstanceOf(InputValidationError);
    expect((err as InputValidationError).message).toMatch(/ledgerRecords\[0\]\.key/);
    expect((await store.load('run-1')).version).toBe(2);
    expect(await ledger.list('run-2', 'default')).toEqual([]);
  });

  it('stores a carrier note with a commit; a commit without one leaves it; a stale one writes none', async () => {
    await store.create('run-1', initial);
    expect((await store.load('run-1')).carrier).toBeUndefined();
    const v1 = await store.commit('run-1', 0, next(1), [{ type: 'one' }], {
      carrier: 'job-a unit-b',
    });
    expect(v1.carrier).toBe('job-a unit-b');
    expect(await redis.hget(keys().snap('run-1'), 'c')).toBe('job-a unit-b');
    const v2 = await store.commit('run-1', 1, next(2), [{ type: 'two' }]);
    expect(v2.carrier).toBeUndefined();
    expect((await store.load('run-1')).carrier).toBe('job-a unit-b');
    await rejection(store.commit('run-1', 1, next(3), [], { carrier: 'job-x unit-y' }));
    expect((await store.load('run-1')).carrier).toBe('job-a unit-b');
    await expect(store.commit('run-1', 2, next(3), [], { carrier: '' })).rejects.toThrow(
      /carrier: must be a non-empty string/,
    );
    expect((await store.load('run-1')).version).toBe(2);
  });

  it('refuses list appends to another run or with a bad length before any I/O', async () => {
    await store.create('run-1', initial);
    const other = keys().history('run-2', 'agent');
    await expect(
      store.commit('run-1', 0, next(1), [], {
        appends: [{ key: other, expectedLength: 0, values: ['x'] }],
      }),
    ).rejects.toThrow(/appends\[0\]\.key: must be a key of the same run/);
    await expect(
      store.commit('run-1', 0, next(1), [], {
        appends: [{ key: keys().history('run-1', 'a'), expectedLength: -1, values: [] }],
      }),
    ).rejects.toThrow(/appends\[0\]\.expectedLength/);
    expect((await store.load('run-1')).version).toBe(0);
  });

  it('many concurrent commits: each run commits once, one winner per version', async () => {
    const s = store;
    const runs = Array.from({ length: 12 }, (_, i) => `r${i}`);
    await Promise.all(runs.map((r) => s.create(r, initial)));
    const results = await Promise.all(runs.map((r) => s.commit(r, 0, next(1), [{ type: 'x' }])));
    expect(results.map((e) => e.version)).toEqual(runs.map(() => 1));
    // Many concurrent commits with the same expected version on one run: exactly one wins.
    const same = await Promise.allSettled(
      Array.from({ length: 12 }, (_, i) => s.commit('r0', 1, next(i), [{ type: 'y', i }])),
    );
    expect(same.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    for (const r of same) {
      if (r.status === 'rejected') expect(r.reason).toBeInstanceOf(SnapshotConflictError);
    }
    expect(await streamLength('r0')).toBe(2);
  });

  it('throws RunNotFoundError when committing to a missing run, writing nothing', async () => {
    const err = await rejection(store.commit('ghost', 0, next(1), [{ type: 'x' }]));
    expect(err).toBeInstanceOf(RunNotFoundError);
    expect(err).toMatchObject({ runId: 'ghost' });
    expect(await redis.exists(keys().snap('ghost'), keys().events('ghost'))).toBe(0);
  });

  it('refuses bad input before any I/O with InputValidationError', async () => {
    await store.create('run-1', initial);
    const bad = [{ type: 'ok' }, { notype: 1 }] as unknown as RunEventRecord[];
    await expect(store.commit('run-1', 0, next(1), bad)).rejects.toThrow(/events\[1\]\.type/);
    await expect(store.commit('run-1', -1, next(1), [])).rejects.toThrow(InputValidationError);
    await expect(store.commit('run-1', 0, { big: 1n } as unknown as Snap, [])).rejects.toThrow(
      InputValidationError,
    );
    await expect(store.load('bad{id}')).rejects.toThrow(InputValidationError);
    await expect(store.readEvents('run-1', { after: 'nope' })).rejects.toThrow(/after/);
    expect((await store.load('run-1')).version).toBe(0);
    expect(await streamLength('run-1')).toBe(0);
  });

  it('round trips the persisted envelope through JSON', async () => {
    const snapshot = {
      status: 'running',
      steps: [
        {
          id: 'α',
          state: 'succeeded',
          attempt: 2,
          output: { n: 1.5, neg: -0.25, big: 2 ** 52, nil: null },
        },
        {
          id: 'b',
          state: 'pending',
          attempt: 0,
          output: ['x', { nested: [[]] }, '\u0000\u2028😀'],
        },
      ],
    } satisfies Snap;
    await store.create('run-j', snapshot);
    const committed = await store.commit('run-j', 0, snapshot, []);
    const loaded = await store.load('run-j');
    expect(loaded).toEqual(committed);
    expect(JSON.parse(JSON.stringify(loaded))).toEqual(loaded);
    expect(loaded.snapshot).toEqual(snapshot);
  });

  it('migrates an older envelope on load and writes the current schemaVersion on commit', async () => {
    const runKey = keys().snap('old');
    await redis.hset(
      runKey,
      'v',
      '4',
      'sv',
      '1',
      's',
      JSON.stringify({ name: 'legacy', steps: [] }),
      'u',
      '5',
    );
    const codec = createSnapshotCodec<{ title: string; steps: unknown[] }>({
      schemaVersion: 2,
      migrations: [
        {
          from: 1,
          to: 2,
          migrate: (s) => {
            const { name, ...rest } = s as { name: string; steps: unknown[] };
            return { ...rest, title: name };
          },
        },
      ],
    });
    const s = createSnapshotStore({ redis, prefix, codec });
    stores.push(s);
    const loaded = await s.load('old');
    expect(loaded).toEqual({
      schemaVersion: 2,
      version: 4,
      snapshot: { title: 'legacy', steps: [] },
      updatedAt: 5,
    });
    await s.commit('old', loaded.version, { ...loaded.snapshot, title: 'renamed' }, []);
    const raw = await redis.hgetall(runKey);
    expect(raw['sv']).toBe('2');
    expect(raw['v']).toBe('5');
    expect(JSON.parse(raw['s'] ?? '')).toEqual({ title: 'renamed', steps: [] });
  });

  it('throws SnapshotUnsupportedError for a future schemaVersion', async () => {
    await redis.hset(keys().snap('future'), 'v', '0', 'sv', '9', 's', '{}', 'u', '1');
    const err = await rejection(store.load('future'));
    expect(err).toBeInstanceOf(SnapshotUnsupportedError);
    expect(err).toMatchObject({ runId: 'future', schemaVersion: 9, supportedVersion: 1 });
  });

  it('throws SnapshotCorruptError for unreadable data', async () => {
    await redis.hset(keys().snap('bad'), 'v', '0', 'sv', '1', 's', '{"steps": [', 'u', '1');
    await expect(store.load('bad')).rejects.toThrow(SnapshotCorruptError);
    await expect(store.load('bad')).rejects.toThrow(/not JSON/);
    await redis.hset(keys().snap('partial'), 's', '{}');
    await expect(store.load('partial')).rejects.toThrow(/field "v"/);
    await redis.hset(keys().snap('badv'), 'v', 'seven', 'sv', '1', 's', '{}', 'u', '1');
    await expect(store.commit('badv', 0, initial, [])).rejects.toThrow(SnapshotCorruptError);
  });

  it.each([
    ['a lazy client that gives up', { lazyConnect: true, retryStrategy: (): null => null }],
    ['a reconnecting client', { retryStrategy: (): number => 50 }],
  ])(
    'throws a retryable RedisUnavailableError when nothing listens (%s)',
    async (_name, options) => {
      const port = await freePort();
      const dead = new Redis({
        host: '127.0.0.1',
        port,
        connectTimeout: 200,
        maxRetriesPerRequest: 0,
        ...options,
      });
      dead.on('error', () => {});
      clients.push(dead);
      const s = createSnapshotStore<Snap>({ redis: dead, prefix });
      stores.push(s);
      for (const attempt of [
        () => s.load('r'),
        () => s.create('r', initial),
        () => s.commit('r', 0, initial, []),
        () => s.readEvents('r'),
      ]) {
        const err = await rejection(attempt());
        expect(err).toBeInstanceOf(RedisUnavailableError);
        expect(err).toMatchObject({ retryable: true, code: 'redis_unavailable' });
        expect((err as Error).message).toContain(`redis://127.0.0.1:${port}`);
        expect((err as Error).message).toContain('REDIS_URL');
      }
    },
  );

  it('throws RedisUnavailableError when the server goes away between commits', async () => {
    const server = await startRedisServer();
    try {
      const client = new Redis(server.url, {
        maxRetriesPerRequest: 0,
        connectTimeout: 300,
        retryStrategy: () => 100,
      });
      client.on('error', () => {});
      clients.push(client);
      const s = createSnapshotStore<Snap>({ redis: client, prefix });
      stores.push(s);
      await s.create('r', initial);
      expect((await s.commit('r', 0, next(1), [{ type: 'x' }])).version).toBe(1);
      await server.stop();
      const err = await rejection(s.commit('r', 1, next(2), [{ type: 'y' }]));
      expect(err).toBeInstanceOf(RedisUnavailableError);
      expect(err).toMatchObject({ retryable: true });
      expect((err as Error).message).toContain(`127.0.0.1:${server.port}`);
      await expect(s.load('r')).rejects.toThrow(RedisUnavailableError);
    } finally {
      await server.stop().catch(() => {});
    }
  });
});

describe('classifyRedisError', () => {
  const target = { options: { host: '10.0.0.7', port: 6380 } } as Pick<Redis, 'options'>;
  const withCode = (message: string, code: string) => Object.assign(new Error(message), { code });

  it.each([
    ['ECONNREFUSED', withCode('connect ECONNREFUSED 10.0.0.7:6380', 'ECONNREFUSED')],
    ['ECONNRESET', withCode('read ECONNRESET', 'ECONNRESET')],
    ['ETIMEDOUT', new Error('connect ETIMEDOUT')],
    ['a closed connection', new Error('Connection is closed.')],
    [
      'no offline queue',
      new Error("Stream isn't writeable and enableOfflineQueue options is false"),
    ],
    [
      'max retries',
      Object.assign(new Error('Reached the max retries per request limit'), {
        name: 'MaxRetriesPerRequestError',
      }),
    ],
    ['a loading server', new Error('LOADING Redis is loading the dataset in memory')],
  ])('wraps %s into a retryable RedisUnavailableError naming the server', (_name, error) => {
    expect(isConnectionError(error)).toBe(true);
    const out = classifyRedisError(error, target);
    expect(out).toBeInstanceOf(RedisUnavailableError);
    expect(out).toMatchObject({ retryable: true, cause: error });
    expect((out as Error).message).toMatch(/redis:\/\/10\.0\.0\.7:6380.*REDIS_URL/);
  });

  it("leaves command errors and the runtime's own errors alone", () => {
    const wrongType = new Error(
      'WRONGTYPE Operation against a key holding the wrong kind of value',
    );
    expect(classifyRedisError(wrongType, target)).toBe(wrongType);
    const conflict = new SnapshotConflictError('r', 1, 2);
    expect(classifyRedisError(conflict, target)).toBe(conflict);
    expect(classifyRedisError('a string', target)).toBe('a string');
  });

  it('names the target without credentials', () => {
    expect(describeRedisTarget({ options: { path: '/tmp/redis.sock' } })).toBe('/tmp/redis.sock');
    expect(
      describeRedisTarget({ options: { host: 'h', port: 1, tls: {}, password: 'secret' } }),
    ).toBe('rediss://h:1');
    expect(describeRedisTarget(undefined)).toBe('Redis');
  });
});
