/**
 * What a granular turn waits on: the Redis round trips on the runtime's connection from one model
 * request to the next, in a run of turns that each call one read-only tool (its journal write
 * shares the usage reconcile's round trip, its receipt is written by its commit, and the next
 * turn's usage reservation goes out with that commit), with and without a tenant quota; and what
 * the ledger and the usage records hold afterwards.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { connect, deleteRuntimeKeys } from '../helpers/redis.js';
import { redisUrl } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';

const TURNS = 12;

// Model requests in flight in this process (the runtime's openai client calls the global fetch),
// and the round trips counted as each one went out.
let modelPending = 0;
// Whether Redis commands are outstanding on the counted connection, and whether a model request
// was in flight at some time since the first of them went out.
let stretchOpen = false;
let stretchHidden = false;
let counted: { trips: number } | undefined;
const marks: number[] = [];
const realFetch = globalThis.fetch;

/**
 * Round trips on the critical path of `redis`: a stretch from a command sent while none was
 * outstanding to the reply that leaves none outstanding, unless a model request was in flight at
 * some time during it (it was hidden behind the model call: the usage mark goes out with the
 * request, and on a busy machine its reply may be read only after the model's).
 */
function countTrips(redis: Redis): { trips: number } {
  const counts = { trips: 0 };
  let outstanding = 0;
  const send = redis.sendCommand.bind(redis);
  const counting = (command: { promise: Promise<unknown> }, stream?: unknown) => {
    if (outstanding === 0) stretchHidden = modelPending > 0;
    outstanding++;
    stretchOpen = true;
    const done = () => {
      outstanding--;
      if (outstanding > 0) return;
      stretchOpen = false;
      if (!stretchHidden && modelPending === 0) counts.trips++;
    };
    command.promise.then(done, done);
    return send(command as Parameters<Redis['sendCommand']>[0], stream as undefined);
  };
  redis.sendCommand = counting;
  return counts;
}

describe('the round trips of a granular turn', () => {
  let model: ScriptedModelServer;
  let runtime: Runtime;
  let worker: FlujoWorker;
  let poll: Redis;
  let prefix: string;
  let ran: number;

  const lookup = defineTool({
    name: 'lookup',
    input: z.object({ n: z.number() }),
    class: 'read_only',
    run: ({ n }) => {
      ran++;
      return { n, found: true };
    },
  });
  const plan: PlanInput = {
    name: 'round-trips',
    steps: [{ id: 'loop', kind: 'agent', agent: 'counter', mode: 'granular', maxTurns: TURNS + 1 }],
  };

  beforeAll(async () => {
    model = await startScriptedModelServer();
    globalThis.fetch = async (input, init) => {
      if (counted !== undefined) marks.push(counted.trips);
      modelPending++;
      if (stretchOpen) stretchHidden = true;
      try {
        return await realFetch(input, init);
      } finally {
        modelPending--;
      }
    };
  });
  afterAll(async () => {
    globalThis.fetch = realFetch;
    await model.close();
  });
  beforeEach(() => {
    model.reset();
    ran = 0;
    prefix = `t-${randomUUID().slice(0, 8)}`;
    poll = connect();
    counted = undefined;
    marks.length = 0;
  });
  afterEach(async () => {
    await worker.close();
    await runtime.close();
    poll.disconnect();
    await deleteRuntimeKeys(prefix);
  });

  it.each([
    ['no tenant quota', 2, false],
    ['a tenant quota', 2, true],
  ])(
    'with %s, a turn with one read-only call waits on at most %i round trips',
    async (_what, most, quota) => {
      const agent = defineAgent({
        name: 'counter',
        model: 'gpt-test',
        provider: { baseURL: model.url, apiKey: 'test-key' },
        systemPrompt: 'Call lookup once per turn, then answer.',
        tools: [lookup],
        timeoutMs: 5000,
      });
      runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger }).agent(agent);
      if (quota) await runtime.setTenantQuota('default', { maxTokens: 1_000_000_000 });
      worker = runtime.createWorker({ concurrency: 1, recoverOnStart: false });
      await worker.ready();
      model.enqueue(
        ...Array.from({ length: TURNS }, (_, n) => ({
          toolCalls: [{ id: `c${n}`, name: 'lookup', arguments: { n } }],
          usage: { prompt_tokens: 40, completion_tokens: 5 },
        })),
        { text: 'Done.', usage: { prompt_tokens: 40, completion_tokens: 2 } },
      );
      counted = countTrips(runtimeCore(runtime).redis);
      const run = await runtime.start(plan, 'Count.');
      while ((await poll.scard(runtimeCore(runtime).stores.keys.activeRuns())) > 0) {
        await new Promise((r) => setTimeout(r, 10));
      }
      const report = await runtime.status(run.runId);
      expect(report.status).toBe('succeeded');
      expect(ran).toBe(TURNS);
      // Between one model request and the next: a whole turn (the first load and the end aside).
      // The median: a stray command of the worker's own (a heartbeat) may add to a turn or two.
      expect(marks).toHaveLength(TURNS + 1);
      const perTurn = marks.slice(2).map((m, k) => m - marks[k + 1]!);
      const median = [...perTurn].sort((a, b) => a - b)[Math.floor(perTurn.length / 2)]!;
      expect(median).toBeLessThanOrEqual(most);
      // Every receipt is in the ledger, once, in the order of the calls.
      const entries = await runtime.ledger(run.runId);
      expect(entries.map((e) => [e.state, e.runs, e.seq, e.receipt])).toEqual(
        Array.from({ length: TURNS }, (_, n) => ['SUCCEEDED', 1, n + 1, { n, found: true }]),
      );
      // Every model call charged once, none left open.
      const usage = await runtime.usage(run.runId);
      expect(usage.reservations.map((r) => [r.state, r.outcome])).toEqual(
        Array.from({ length: TURNS + 1 }, () => ['reconciled', 'usage']),
      );
    },
  );
});
