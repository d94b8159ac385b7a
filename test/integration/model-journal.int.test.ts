import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { InputValidationError, SnapshotCorruptError } from '../../src/errors.js';
import type { ModelReply } from '../../src/llm/messages.js';
import { createKeys } from '../../src/persistence/keys.js';
import { createModelJournal, type ModelJournal } from '../../src/persistence/model-journal.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';
import { caught } from '../helpers/caught.js';

let redis: Redis;
let prefix: string;
let journal: ModelJournal;
const R = 'run-1';
const S = 'agent';

const reply = (n: number): ModelReply => ({
  message: {
    role: 'assistant',
    content: null,
    tool_calls: [{ id: `call-${n}`, name: 'search', arguments: `{"q":"q${n}"}` }],
  },
  finishReason: 'tool_calls',
  usage: { promptTokens: 10 + n, completionTokens: n },
  model: 'gpt-test',
  requestId: `req-${n}`,
});

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
  journal = createModelJournal({ redis, prefix });
});

describe('model journal', () => {
  it('records a reply once and returns it to every later caller', async () => {
    expect(await journal.get(R, S, 0)).toBeNull();
    expect(await journal.record(R, S, 0, reply(1))).toEqual({ reply: reply(1), recorded: true });
    expect(await journal.record(R, S, 0, reply(2))).toEqual({ reply: reply(1), recorded: false });
    expect(await journal.get(R, S, 0)).toEqual(reply(1));
    // other turns, steps and runs are separate entries
    expect(await journal.get(R, S, 1)).toBeNull();
    expect(await journal.get(R, 'other', 0)).toBeNull();
    expect(await journal.get('run-2', S, 0)).toBeNull();
    const final: ModelReply = {
      message: { role: 'assistant', content: 'done ✓ 🚀' },
      finishReason: 'stop',
      usage: null,
      model: 'gpt-test',
    };
    expect(await journal.record(R, S, 1, final)).toEqual({ reply: final, recorded: true });
    expect(await journal.get(R, S, 1)).toEqual(final);
    expect(await redis.hkeys(createKeys(prefix).journal(R))).toEqual(
      expect.arrayContaining([`${S}:0`, `${S}:1`]),
    );
  });

  it('first writer wins under 10 concurrent records with different replies', async () => {
    const clients = Array.from({ length: 10 }, () => connect());
    try {
      const journals = clients.map((c) => createModelJournal({ redis: c, prefix }));
      const results = await Promise.all(journals.map((j, i) => j.record(R, S, 3, reply(i))));
      expect(results.filter((r) => r.recorded)).toHaveLength(1);
      const winner = results.find((r) => r.recorded)!.reply;
      for (const r of results) expect(r.reply).toEqual(winner);
      expect(await journal.get(R, S, 3)).toEqual(winner);
    } finally {
      for (const c of clients) c.disconnect();
    }
  });

  it('refuses an invalid reply before any I/O, naming the path', async () => {
    const bad = { ...reply(1), usage: { promptTokens: -1, completionTokens: 0 } } as ModelReply;
    const e = await caught(journal.record(R, S, 0, bad));
    expect(e).toBeInstanceOf(InputValidationError);
    expect((e as InputValidationError).issues[0]?.path).toBe('reply.usage.promptTokens');
    expect(await journal.get(R, S, 0)).toBeNull();
    expect(await caught(journal.record(R, S, -1, reply(1)))).toBeInstanceOf(InputValidationError);
    expect(await caught(journal.record(R, 'a:b', 0, reply(1)))).toBeInstanceOf(
      InputValidationError,
    );
    expect(await caught(journal.get('r{x}', S, 0))).toBeInstanceOf(InputValidationError);
  });

  it('reports a corrupt entry as SnapshotCorruptError naming run, step and turn', async () => {
    const key = createKeys(prefix).journal(R);
    await redis.hset(key, `${S}:4`, 'not json', `${S}:5`, JSON.stringify({ message: {} }));
    for (const turn of [4, 5]) {
      const e = await caught(journal.get(R, S, turn));
      expect(e).toBeInstanceOf(SnapshotCorruptError);
      expect((e as Error).message).toContain(`"${R}"`);
      expect((e as Error).message).toContain(`step "${S}" turn ${turn}`);
      // record over a corrupt entry does not overwrite it, and says so
      expect(await caught(journal.record(R, S, turn, reply(1)))).toBeInstanceOf(
        SnapshotCorruptError,
      );
    }
    expect(await redis.hget(key, `${S}:4`)).toBe('not json');
  });

  it('drops a step from a turn on, leaving other steps and earlier turns', async () => {
    for (const t of [0, 1, 2, 10]) await journal.record(R, S, t, reply(t));
    await journal.record(R, 'agent2', 5, reply(5));
    expect(await journal.drop(R, S, 1)).toBe(3);
    expect(await journal.get(R, S, 0)).toEqual(reply(0));
    expect(await journal.get(R, S, 1)).toBeNull();
    expect(await journal.get(R, S, 10)).toBeNull();
    expect(await journal.get(R, 'agent2', 5)).toEqual(reply(5));
    expect(await journal.drop(R, S, 0)).toBe(1);
    expect(await journal.drop(R, S, 0)).toBe(0);
    // a dropped turn can be recorded again
    expect((await journal.record(R, S, 1, reply(7))).recorded).toBe(true);
  });

  it("an atomic attempt's calls: first writer wins per request, another request replaces it; list reads them in order", async () => {
    const [a, b] = ['a'.repeat(64), 'b'.repeat(64)];
    expect(await journal.recordCall(R, S, 1, 0, a, reply(1))).toEqual({
      reply: reply(1),
      recorded: true,
      replaced: false,
    });
    // The same request again (a racing execution): the first reply stands.
    expect(await journal.recordCall(R, S, 1, 0, a, reply(2))).toEqual({
      reply: reply(1),
      recorded: false,
      replaced: false,
    });
    // Another request for the same call: its reply replaces the first.
    expect(await journal.recordCall(R, S, 1, 0, b, reply(3))).toEqual({
      reply: reply(3),
      recorded: true,
      replaced: true,
    });
    await journal.recordCall(R, S, 1, 1, a, reply(4));
    await journal.recordCall(R, S, 2, 0, a, reply(5));
    await journal.record(R, S, 0, reply(6));
    expect(await journal.attemptCalls(R, S, 1, 3)).toEqual([
      { request: b, reply: reply(3) },
      { request: a, reply: reply(4) },
      null,
    ]);
    expect(await redis.hkeys(createKeys(prefix).journal(R))).toEqual(
      expect.arrayContaining([`${S}#1:0`, `${S}#1:1`, `${S}#2:0`, `${S}:0`]),
    );
    const listed = (await journal.list(R)).map((j) => [j.turn, j.attempt, j.call, j.replies]);
    expect(listed).toEqual([
      [0, null, null, [reply(6)]],
      [null, 1, 0, [reply(3)]],
      [null, 1, 1, [reply(4)]],
      [null, 2, 0, [reply(5)]],
    ]);
    // Bad input writes nothing.
    expect(await caught(journal.recordCall(R, S, 1, 5, 'not-a-digest', reply(1)))).toBeInstanceOf(
      InputValidationError,
    );
    expect(await journal.attemptCalls(R, S, 1, 6)).toHaveLength(6);
    expect((await journal.attemptCalls(R, S, 1, 6))[5]).toBeNull();
  });
});
