/**
 * A granular turn's usage reservation sent ahead, beside the commit of the turn before it: the
 * next turn's model call takes it when it asks for the same thing; anything else releases it, so
 * no reservation is left open and nothing is charged twice. Through the runtime (a policy that
 * stops the turn after the commit that reserved for it) and through the meter itself.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineTool,
  type AgentDefinition,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import type { ChatMessage, ModelReply } from '../../src/llm/messages.js';
import type { MeteredCall } from '../../src/execution/usage-meter.js';
import { runtimeCore } from '../../src/runtime.js';
import { connect, dataNodes, deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';

const model = useScriptedModel();
let runtime: Runtime;
let worker: FlujoWorker | undefined;
let prefix: string;
let redis: Redis;

const lookup = defineTool({
  name: 'lookup',
  input: z.object({ n: z.number() }),
  class: 'read_only',
  run: ({ n }) => ({ n }),
});

const agentOf = (): AgentDefinition =>
  scriptedAgent(model, { name: 'counter', systemPrompt: 'Count.', tools: [lookup] });

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  redis = connect();
});
afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await runtime.close();
  redis.disconnect();
  await deleteRuntimeKeys(prefix);
});

/** The reserve scripts the runtime's connection ran, counted at the server (every master). */
async function reserveCalls(): Promise<number> {
  let n = 0;
  for (const node of await dataNodes(redis)) {
    for (const line of (await node.info('commandstats')).split('\n')) {
      const calls = /^cmdstat_(evalsha|eval):calls=(\d+)/.exec(line);
      if (calls !== null) n += Number(calls[2]);
    }
  }
  return n;
}

describe('a turn reserved with the commit before it', () => {
  it('each turn of a chained run is reserved once, sent with the commit before it, and charged once', async () => {
    const agent = agentOf();
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger }).agent(agent);
    worker = runtime.createWorker({ concurrency: 1 });
    await worker.ready();
    const turns = 6;
    model.enqueue(
      ...Array.from({ length: turns - 1 }, (_, n) => ({
        toolCalls: [{ id: `c${n}`, name: 'lookup', arguments: { n } }],
        usage: { prompt_tokens: 30 + n, completion_tokens: 4 },
      })),
      { text: 'Six.', usage: { prompt_tokens: 60, completion_tokens: 2 } },
    );
    const plan: PlanInput = {
      name: 'ahead',
      steps: [{ id: 'loop', kind: 'agent', agent: 'counter', mode: 'granular', maxTurns: 10 }],
    };
    const run = await runtime.start(plan, 'Go.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const usage = await runtime.usage(run.runId);
    // One reservation per model call: none made ahead and then dropped, none left open.
    expect(usage.reservations.map((r) => [r.turn, r.state, r.outcome])).toEqual(
      Array.from({ length: turns }, (_, n) => [n, 'reconciled', 'usage']),
    );
    expect(usage.totals).toMatchObject({
      reservedTokens: 0,
      spentTokens: [0, 1, 2, 3, 4].reduce((sum, n) => sum + 34 + n, 0) + 62,
    });
    // (That the reservations went out with the commits is what agent-round-trips counts.)
    expect(model.requestCount).toBe(turns);
  });

  it('a turn stopped by a policy after the commit that reserved it: the reservation is released, nothing charged for it', async () => {
    const agent = agentOf();
    let checks = 0;
    runtime = createRuntime({
      redis: redisUrl(),
      prefix,
      logger: silentLogger,
      policies: {
        // Allows the first turn only: the second is refused before its model call.
        'one-turn': {
          check: () => {
            checks++;
            return checks === 1 ? { allow: true } : { allow: false, reason: 'one turn only' };
          },
          appliesTo: { tags: ['metered'] },
        },
      },
    }).agent(agent);
    worker = runtime.createWorker({ concurrency: 1 });
    await worker.ready();
    model.enqueue(
      {
        toolCalls: [{ id: 'c0', name: 'lookup', arguments: { n: 0 } }],
        usage: { prompt_tokens: 30, completion_tokens: 4 },
      },
      { text: 'Never asked.', usage: { prompt_tokens: 40, completion_tokens: 2 } },
    );
    const plan: PlanInput = {
      name: 'ahead-policy',
      steps: [
        {
          id: 'loop',
          kind: 'agent',
          agent: 'counter',
          mode: 'granular',
          maxTurns: 5,
          policyTags: ['metered'],
        },
      ],
    };
    const run = await runtime.start(plan, 'Go.');
    const report = await run.settled({ timeoutMs: 10_000 });
    expect(report.status).toBe('failed');
    expect(report.steps[0]?.error?.code).toBe('policy_denied');
    expect(checks).toBe(2);
    expect(model.requestCount).toBe(1);
    const usage = await runtime.usage(run.runId);
    expect(usage.reservations.map((r) => [r.turn, r.state, r.outcome])).toEqual([
      [0, 'reconciled', 'usage'],
      [1, 'reconciled', 'none'],
    ]);
    expect(usage.reservations[1]!.charged?.tokens).toBe(0);
    expect(usage.totals).toMatchObject({ reservedTokens: 0, spentTokens: 34 });
  });
});

describe('the meter, with a reservation prepared ahead', () => {
  const runId = 'run-ahead';
  const reply: ModelReply = {
    message: { role: 'assistant', content: 'ok' },
    finishReason: 'stop',
    usage: { promptTokens: 10, completionTokens: 2 },
    model: 'gpt-test',
  };
  const history: ChatMessage[] = [{ role: 'user', content: 'Go.' }];

  function setUp(): { call: (turn: number, messages?: ChatMessage[]) => MeteredCall } {
    const agent = agentOf();
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger }).agent(agent);
    return {
      call: (turn, messages = history) => ({
        agent,
        tenantId: 'default',
        runId,
        stepId: 'loop',
        turn,
        messages,
        budget: undefined,
      }),
    };
  }
  const send = async (onSend: () => Promise<void>): Promise<ModelReply> => {
    await onSend();
    return reply;
  };
  const states = async () =>
    (await runtimeCore(runtime).stores.quota.list('default', runId)).map((r) => [
      r.turn,
      r.state,
      r.outcome,
    ]);

  it('the call that asks for the same takes it: one reservation, one script run fewer', async () => {
    const { call } = setUp();
    const { meter } = runtimeCore(runtime);
    const before = await reserveCalls();
    meter.prepare(call(1)).reserve();
    meter.prepare(call(1)).reserve(); // a second handle for the step replaces the first
    await meter.call(
      call(
        1,
        history.map((m) => ({ ...m })),
      ),
      send,
    ); // equal messages, not the same objects
    expect(await states()).toEqual([
      [1, 'reconciled', 'none'],
      [1, 'reconciled', 'usage'],
    ]);
    // reserve ×2, release ×1, markSent, reconcile: no reserve of the call's own.
    expect((await reserveCalls()) - before).toBe(5);
  });

  it('a call that asks for something else releases it and reserves afresh', async () => {
    const { call } = setUp();
    const { meter } = runtimeCore(runtime);
    meter.prepare(call(1)).reserve();
    await meter.call(call(1, [...history, { role: 'user', content: 'More.' }]), send);
    expect(await states()).toEqual([
      [1, 'reconciled', 'none'],
      [1, 'reconciled', 'usage'],
    ]);
  });

  it('release() lets go of a turn up to the one named, and keeps a later one', async () => {
    const { call } = setUp();
    const { meter } = runtimeCore(runtime);
    const handle = meter.prepare(call(2));
    await meter.release(runId, 'loop', 2); // prepared, never sent: nothing to release
    expect(await states()).toEqual([]);
    handle.reserve();
    handle.reserve(); // once
    await meter.release(runId, 'loop', 1);
    expect(await states()).toEqual([[2, 'reserved', null]]);
    await meter.release(runId, 'loop', 2);
    expect(await states()).toEqual([[2, 'reconciled', 'none']]);
    const totals = await runtimeCore(runtime).stores.quota.usage('default', runId);
    expect(totals).toMatchObject({ reservedTokens: 0, spentTokens: 0 });
  });
});
