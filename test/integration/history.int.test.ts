import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  HistoryConflictError,
  InputValidationError,
  SnapshotConflictError,
  SnapshotCorruptError,
} from '../../src/errors.js';
import type { ChatMessage } from '../../src/llm/messages.js';
import { createHistoryStore, type HistoryStore } from '../../src/persistence/history.js';
import { createKeys } from '../../src/persistence/keys.js';
import { createSnapshotStore } from '../../src/persistence/snapshot-store.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';
import { caught } from '../helpers/caught.js';

let redis: Redis;
let prefix: string;
let history: HistoryStore;
const R = 'run-1';
const S = 'agent';

const conversation: ChatMessage[] = [
  {
    role: 'system',
    content: 'You are terse. Ünïcödé: 日本語, emoji 🚀, RTL שלום, "quotes" \\ \n new line',
  },
  { role: 'user', content: '' },
  {
    role: 'assistant',
    content: null,
    tool_calls: [
      { id: 'call-1', name: 'search', arguments: '{"q":"naïve café","n":1e3}' },
      { id: 'call-2', name: 'write_note', arguments: '' },
    ],
  },
  { role: 'tool', tool_call_id: 'call-1', content: '[]' },
  { role: 'tool', tool_call_id: 'call-2', content: '\u0000 nul and \ud83d\ude00' },
  { role: 'assistant', content: 'done' },
  { role: 'assistant', content: '', tool_calls: [] },
];

beforeAll(() => {
  redis = connect();
});
afterEach(async () => {
  await deletePrefix(redis, prefix);
});
afterAll(() => {
  redis.disconnect();
});
beforeEach(() => {
  prefix = testPrefix();
  history = createHistoryStore({ redis, prefix });
});

describe('history store', () => {
  it('round-trips messages to equal messages and reads ranges', async () => {
    expect(await history.length(R, S)).toBe(0);
    expect(await history.read(R, S)).toEqual([]);
    expect(await history.append(R, S, 0, conversation.slice(0, 2))).toBe(2);
    expect(await history.append(R, S, 2, conversation.slice(2))).toBe(conversation.length);
    expect(await history.length(R, S)).toBe(conversation.length);
    const back = await history.read(R, S);
    expect(back).toStrictEqual(conversation);
    expect(await history.read(R, S, { from: 2, to: 4 })).toStrictEqual(conversation.slice(2, 4));
    expect(await history.read(R, S, { to: 1 })).toStrictEqual(conversation.slice(0, 1));
    expect(await history.read(R, S, { from: 5 })).toStrictEqual(conversation.slice(5));
    expect(await history.read(R, S, { from: 3, to: 3 })).toEqual([]);
    expect(await history.read(R, S, { from: 100 })).toEqual([]);
    // an empty append at the right length is a no-op that returns the length
    expect(await history.append(R, S, conversation.length, [])).toBe(conversation.length);
    // steps are separate lists of the run's hash tag
    expect(await history.length(R, 'other')).toBe(0);
    expect(history.key(R, S)).toBe(`${prefix}:{${R}}:history:${S}`);
    expect(createKeys(prefix).history(R, S)).toBe(history.key(R, S));
  });

  it('writes nothing for a stale expectedLength and reports expected and actual', async () => {
    await history.append(R, S, 0, conversation.slice(0, 3));
    for (const stale of [0, 2, 4]) {
      const e = await caught(history.append(R, S, stale, conversation.slice(3)));
      expect(e).toBeInstanceOf(HistoryConflictError);
      expect((e as HistoryConflictError).details).toEqual({
        runId: R,
        stepId: S,
        expectedLength: stale,
        actualLength: 3,
      });
      expect((e as HistoryConflictError).retryable).toBe(true);
    }
    expect(await history.read(R, S)).toStrictEqual(conversation.slice(0, 3));
  });

  it('lets exactly one of concurrent appends with the same expectedLength win', async () => {
    await history.append(R, S, 0, conversation.slice(0, 1));
    const clients = Array.from({ length: 10 }, () => connect());
    try {
      const stores = clients.map((c) => createHistoryStore({ redis: c, prefix }));
      const results = await Promise.allSettled(
        stores.map((h, i) =>
          h.append(R, S, 1, [
            { role: 'user', content: `writer ${i}` },
            { role: 'assistant', content: `answer ${i}` },
          ]),
        ),
      );
      const won = results.filter((r) => r.status === 'fulfilled');
      expect(won).toHaveLength(1);
      expect((won[0] as PromiseFulfilledResult<number>).value).toBe(3);
      for (const r of results) {
        if (r.status === 'rejected') expect(r.reason).toBeInstanceOf(HistoryConflictError);
      }
      const back = await history.read(R, S);
      expect(back).toHaveLength(3);
      const i = results.findIndex((r) => r.status === 'fulfilled');
      expect(back.slice(1)).toEqual([
        { role: 'user', content: `writer ${i}` },
        { role: 'assistant', content: `answer ${i}` },
      ]);
    } finally {
      for (const c of clients) c.disconnect();
    }
  });

  it('validates messages before any I/O, naming the path', async () => {
    const bad = [
      conversation[0],
      { role: 'assistant', content: 'x', tool_calls: [{ id: 'c', name: 1 }] },
    ] as unknown as ChatMessage[];
    const e = await caught(history.append(R, S, 0, bad));
    expect(e).toBeInstanceOf(InputValidationError);
    expect((e as InputValidationError).issues.map((i) => i.path)).toContain(
      'messages[1].tool_calls[0].name',
    );
    expect(await history.length(R, S)).toBe(0);
    expect(await caught(history.append(R, S, -1, []))).toBeInstanceOf(InputValidationError);
    expect(await caught(history.append(R, 'bad step', 0, []))).toBeInstanceOf(InputValidationError);
    expect(await caught(history.read(R, S, { from: 1.5 }))).toBeInstanceOf(InputValidationError);
    expect(() => history.appendOp(R, S, 0, bad)).toThrow(InputValidationError);
  });

  it('reports a corrupt element as SnapshotCorruptError naming run, step and index', async () => {
    await history.append(R, S, 0, conversation.slice(0, 2));
    await redis.rpush(history.key(R, S), '{"role":"robot"}');
    const e = await caught(history.read(R, S));
    expect(e).toBeInstanceOf(SnapshotCorruptError);
    expect((e as Error).message).toContain(`"${R}"`);
    expect((e as Error).message).toContain(`history message 2 of step "${S}"`);
    expect(await history.read(R, S, { to: 2 })).toStrictEqual(conversation.slice(0, 2));
  });

  it('appendOp commits with the run snapshot, all or nothing', async () => {
    const store = createSnapshotStore({ redis, prefix });
    await store.create(R, { cursor: 0 });
    const v1 = await store.commit(R, 0, { cursor: 3 }, [], {
      appends: [history.appendOp(R, S, 0, conversation.slice(0, 3))],
    });
    expect(v1.version).toBe(1);
    expect(await history.read(R, S)).toStrictEqual(conversation.slice(0, 3));

    // A history that moved on (another writer appended) refuses the whole commit.
    await history.append(R, S, 3, conversation.slice(3, 4));
    const e = await caught(
      store.commit(R, 1, { cursor: 6 }, [], {
        appends: [history.appendOp(R, S, 3, conversation.slice(3))],
      }),
    );
    expect(e).toBeInstanceOf(HistoryConflictError);
    expect(e).toMatchObject({ expectedLength: 3, actualLength: 4 });
    expect((await store.load(R)).version).toBe(1);
    expect(await history.length(R, S)).toBe(4);

    // A stale snapshot version refuses the append too.
    expect(
      await caught(
        store.commit(R, 0, { cursor: 9 }, [], {
          appends: [history.appendOp(R, S, 4, conversation.slice(4))],
        }),
      ),
    ).toBeInstanceOf(SnapshotConflictError);
    expect(await history.length(R, S)).toBe(4);
  });
});
