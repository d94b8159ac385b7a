/**
 * Conversations: a granular agent step with an inbox takes the signals of its name as user
 * messages at its turn boundaries, each once, in send order; with `conversation: true` it waits
 * for the next message between replies (no worker held) and ends with the `end` tool or an `end`
 * signal. What is checked comes from the scripted model server's requests, the step's stored
 * history and the run's events.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PlanValidationError } from '../../src/errors.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, runtimeCore, type Runtime } from '../../src/runtime.js';
import type { RecordedRequest } from '../../src/testing/index.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { runFlujo } from '../helpers/cli.js';
import { heldTool } from '../helpers/held-tool.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';

const model = useScriptedModel();

let redis: Redis;
let prefix: string;
let rt: Runtime;
let worker: FlujoWorker;
const held = heldTool('hold');

/** The last user message of a request. */
const lastUser = (r: RecordedRequest): string =>
  String(r.messages.filter((m) => m.role === 'user').at(-1)?.content);

/**
 * Replies `re: <last user message>`; "slow" is answered after 700 ms; "bye" calls the `end` tool
 * with a farewell.
 */
function reply(r: RecordedRequest) {
  const said = lastUser(r);
  if (said === 'bye') return { text: 'Goodbye.', toolCalls: [{ name: 'end', arguments: {} }] };
  if (said === 'slow') return { fault: 'delay' as const, ms: 700, then: { text: `re: ${said}` } };
  return { text: `re: ${said}` };
}

beforeAll(async () => {
  redis = connect();
  prefix = testPrefix();
  rt = createRuntime({ redis: redisUrl(), prefix });
  rt.agent(scriptedAgent(model, { name: 'talker', systemPrompt: 'Talk.' }));
  rt.agent(scriptedAgent(model, { name: 'worker', systemPrompt: 'Work.', tools: [held.tool] }));
  worker = rt.createWorker({ concurrency: 4, recoveryMs: 1000 });
  await worker.ready();
});
afterAll(async () => {
  await worker.close();
  await rt.close();
  await deletePrefix(redis, prefix);
  await deletePrefix(redis, `{${prefix}:q}`);
  await redis.quit();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until<T>(what: string, probe: () => Promise<T | undefined>, ms = 10_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

const chatPlan = (name: string, extra: Record<string, unknown> = {}): PlanInput => ({
  name,
  steps: [
    {
      id: 'chat',
      kind: 'agent',
      agent: 'talker',
      mode: 'granular',
      inbox: 'message',
      conversation: true,
      ...extra,
    },
  ],
});

/** The chat step once it waits for a message after `turns` committed turns. */
const waitsAfter = (runId: string, turns: number) =>
  until(`${runId} waiting after ${turns} turns`, async () => {
    const snap = await runtimeCore(rt).host.load(runId);
    const child = snap.snapshot.children['chat']?.snapshot;
    return child?.value === 'WAITING' && child.context.agent?.turns === turns ? child : undefined;
  });

const settled = (runId: string) =>
  until(`${runId} settled`, async () => {
    const r = await rt.status(runId);
    return r.status === 'succeeded' || r.status === 'failed' ? r : undefined;
  });

async function events(runId: string) {
  const out: { type: string; data: Record<string, unknown> }[] = [];
  for await (const e of rt.events(runId)) {
    out.push({ type: e.type, data: e.data });
  }
  return out;
}

const requestsOf = (input: string) =>
  model.requests.filter((r) => r.messages.find((m) => m.role === 'user')?.content === input);

const history = (runId: string) => runtimeCore(rt).stores.history.read(runId, 'chat');

describe('conversations', { timeout: 60_000 }, () => {
  it('5 messages (4 from the API, 1 from flujo signal): 5 replies, each message once, one request per committed turn', async () => {
    model.setDefaultReply(reply);
    const input = 'conv-five';
    const run = await rt.start(chatPlan('five'), input);
    const { runId } = run;
    await waitsAfter(runId, 1);
    const status = await rt.status(runId);
    expect(status.status).toBe('waiting');
    expect(status.waits).toMatchObject([{ stepId: 'chat', signal: 'message', queued: 0 }]);
    for (let i = 1; i <= 5; i++) {
      if (i === 3) {
        const sent = await runFlujo(['signal', runId, 'message', '--data', '"m3"'], { prefix });
        expect(sent.code, sent.err).toBe(0);
      } else {
        await rt.signal(runId, 'message', `m${i}`);
      }
      await waitsAfter(runId, i + 1);
    }
    await rt.signal(runId, 'end');
    const report = await settled(runId);
    expect(report.status).toBe('succeeded');
    expect(report.steps[0]!.output).toMatchObject({ answer: 're: m5', turns: 6, toolCalls: 0 });

    const messages = await history(runId);
    expect(messages.filter((m) => m.role === 'user').map((m) => m.content)).toEqual([
      input,
      'm1',
      'm2',
      'm3',
      'm4',
      'm5',
    ]);
    expect(messages.filter((m) => m.role === 'assistant').map((m) => m.content)).toEqual([
      `re: ${input}`,
      're: m1',
      're: m2',
      're: m3',
      're: m4',
      're: m5',
    ]);
    const all = await events(runId);
    const turns = all.filter((e) => e.type === 'turn.committed');
    expect(turns).toHaveLength(6);
    expect(requestsOf(input)).toHaveLength(turns.length);
    const taken = all.filter((e) => e.type === 'signal.taken');
    expect(taken.map((e) => [e.data['name'], e.data['index'], e.data['turn']])).toEqual([
      ['message', 0, 1],
      ['message', 1, 2],
      ['message', 2, 3],
      ['message', 3, 4],
      ['message', 4, 5],
      ['end', 0, 6],
    ]);
    expect(all.filter((e) => e.type === 'wait.started')).toHaveLength(6);
    expect(all.filter((e) => e.type === 'wait.woken')).toHaveLength(6);
    // The trace lists the step's six turns and six model calls.
    const trace = await rt.trace(runId);
    expect(trace.steps[0]!.attempts.map((a) => [a.turns.length, a.modelCalls.length])).toEqual([
      [6, 6],
    ]);
    // The run's stored events lead to its stored snapshot (the cursors included).
    const reproduced = await rt.replay(runId, { mode: 'reproduce' });
    expect(reproduced.integrity).toEqual({ ok: true, problems: [], differences: [] });
  });

  it('a message sent while a model call is in flight is taken at the next boundary, once', async () => {
    model.setDefaultReply(reply);
    const input = 'conv-busy';
    const { runId } = await rt.start(chatPlan('busy'), input);
    await waitsAfter(runId, 1);
    await rt.signal(runId, 'message', 'slow');
    // The model call of turn 1 is in flight: send the next message now.
    await until('the slow call', () =>
      Promise.resolve(requestsOf(input).some((r) => lastUser(r) === 'slow') ? true : undefined),
    );
    await rt.signal(runId, 'message', 'during');
    // Turn 1 answers "slow"; "during" was sent meanwhile: turn 2 takes it without waiting.
    await waitsAfter(runId, 3);
    const asked = requestsOf(input).map((r) =>
      r.messages.filter((m) => m.role === 'user').map((m) => m.content),
    );
    expect(asked).toEqual([[input], [input, 'slow'], [input, 'slow', 'during']]);
    const all = await events(runId);
    expect(all.filter((e) => e.type === 'signal.taken').map((e) => e.data['turn'])).toEqual([1, 2]);
    expect(all.filter((e) => e.type === 'wait.started')).toHaveLength(2);

    // The model ends it: "bye" calls the end tool; the last reply is the output.
    await rt.signal(runId, 'message', 'bye');
    const report = await settled(runId);
    expect(report.status).toBe('succeeded');
    expect(report.steps[0]!.output).toMatchObject({ answer: 'Goodbye.', turns: 4, toolCalls: 1 });
    expect(requestsOf(input)).toHaveLength(4);
    // The end tool is offered to the model.
    expect(requestsOf(input)[0]!.tools.map((t) => t.function?.name)).toEqual(['end']);
  });

  it("onBusy 'interrupt': a message sent mid model call aborts it, and the retaken turn answers with it; usage conserved", async () => {
    model.setDefaultReply(reply);
    const input = 'conv-interrupt';
    const { runId } = await rt.start(chatPlan('interrupt', { onBusy: 'interrupt' }), input);
    await waitsAfter(runId, 1);
    await rt.signal(runId, 'message', 'slow');
    await until('the slow call', () =>
      Promise.resolve(requestsOf(input).some((r) => lastUser(r) === 'slow') ? true : undefined),
    );
    await rt.signal(runId, 'message', 'during');
    await waitsAfter(runId, 2);
    const asked = requestsOf(input);
    expect(
      asked.map((r) => r.messages.filter((m) => m.role === 'user').map((m) => m.content)),
    ).toEqual([[input], [input, 'slow'], [input, 'slow', 'during']]);
    expect(asked.map((r) => r.answered)).toEqual([true, false, true]);
    const messages = await history(runId);
    expect(messages.map((m) => `${m.role} ${String(m.content)}`)).toEqual([
      `user ${input}`,
      `assistant re: ${input}`,
      'user slow',
      'user during',
      'assistant re: during',
    ]);
    const all = await events(runId);
    expect(all.filter((e) => e.type === 'signal.taken').map((e) => e.data['turn'])).toEqual([1, 1]);
    expect(all.filter((e) => e.type === 'turn.committed')).toHaveLength(2);
    // One reservation per request sent, each reconciled once: the interrupted one as sent without
    // an answer, and nothing left reserved.
    const usage = await rt.usage(runId);
    expect(usage.reservations.map((r) => [r.turn, r.outcome])).toEqual([
      [0, 'usage'],
      [1, 'baseline'],
      [1, 'usage'],
    ]);
    expect(usage.totals.reservedTokens).toBe(0);
    const charged = usage.reservations.reduce((n, r) => n + (r.charged?.tokens ?? 0), 0);
    expect(usage.totals.spentTokens).toBe(charged);
    await rt.signal(runId, 'end');
    expect((await settled(runId)).status).toBe('succeeded');
  });

  it('maxTurns ends a conversation with its last reply', async () => {
    // Two messages sent before the run starts its first turn are taken by turn 0, after the input.
    model.setDefaultReply(reply);
    const input = 'conv-max';
    const { runId } = await rt.start(chatPlan('max', { maxTurns: 2 }), input);
    await waitsAfter(runId, 1);
    await rt.signal(runId, 'message', 'a');
    await rt.signal(runId, 'message', 'b');
    const report = await settled(runId);
    expect(report.status).toBe('succeeded');
    // Both messages in one turn (sent together) or in two: each once, in send order.
    const users = (await history(runId)).filter((m) => m.role === 'user').map((m) => m.content);
    expect(users.slice(0, 2)).toEqual([input, 'a']);
    expect(users.filter((u) => u === 'a')).toHaveLength(1);
    expect(users.filter((u) => u === 'b').length).toBeLessThanOrEqual(1);
    expect(report.steps[0]!.output).toMatchObject({ turns: 2 });
  });

  it('an inbox without a conversation: a message sent during a turn joins the history after that turn, once', async () => {
    const input = 'inbox-only';
    model.setDefaultReply((r) =>
      r.messages.some((m) => m.role === 'tool')
        ? { text: `saw ${lastUser(r)}` }
        : { toolCalls: [{ name: 'hold', arguments: {} }] },
    );
    const plan: PlanInput = {
      name: 'inbox-only',
      steps: [{ id: 'chat', kind: 'agent', agent: 'worker', mode: 'granular', inbox: 'message' }],
    };
    const { runId } = await rt.start(plan, input);
    await until('the held call', () =>
      Promise.resolve(requestsOf(input).length === 1 || undefined),
    );
    await rt.signal(runId, 'message', 'extra');
    held.release();
    const report = await settled(runId);
    expect(report.status).toBe('succeeded');
    expect(report.steps[0]!.output).toMatchObject({ answer: 'saw extra', turns: 2, toolCalls: 1 });
    const roles = (await history(runId)).map(
      (m) => `${m.role}${m.role === 'user' ? ` ${String(m.content)}` : ''}`,
    );
    expect(roles).toEqual([`user ${input}`, 'assistant', 'tool', 'user extra', 'assistant']);
    expect(requestsOf(input)).toHaveLength(2);
    // No end tool without a conversation.
    expect(requestsOf(input)[0]!.tools.map((t) => t.function?.name)).toEqual(['hold']);
  });

  it('bad input is refused with the field named, nothing written', async () => {
    const before = await redis.keys(`${prefix}:*`);
    const cases: [PlanInput, string][] = [
      [
        {
          name: 'atomic-inbox',
          steps: [{ id: 'chat', kind: 'agent', agent: 'talker', inbox: 'message' }],
        },
        'steps[0].inbox',
      ],
      [
        {
          name: 'atomic-conversation',
          steps: [{ id: 'chat', kind: 'agent', agent: 'talker', conversation: true }],
        },
        'steps[0].conversation',
      ],
      [
        {
          name: 'no-inbox',
          steps: [
            { id: 'chat', kind: 'agent', agent: 'talker', mode: 'granular', conversation: true },
          ],
        },
        'steps[0].inbox',
      ],
      [chatPlan('end-inbox', { inbox: 'end' }), 'steps[0].inbox'],
      [
        {
          name: 'atomic-on-busy',
          steps: [{ id: 'chat', kind: 'agent', agent: 'talker', onBusy: 'interrupt' }],
        },
        'steps[0].onBusy',
      ],
      [
        {
          name: 'on-busy-no-inbox',
          steps: [
            { id: 'chat', kind: 'agent', agent: 'talker', mode: 'granular', onBusy: 'queue' },
          ],
        },
        'steps[0].onBusy',
      ],
      [chatPlan('on-busy-bad', { onBusy: 'drop' }), 'steps[0].onBusy'],
      [
        {
          name: 'shared-inbox',
          steps: [
            { id: 'w', kind: 'wait', for: { signal: 'message' } },
            { id: 'chat', kind: 'agent', agent: 'talker', mode: 'granular', inbox: 'message' },
          ],
        },
        'steps[1].inbox',
      ],
      [
        {
          name: 'two-conversations',
          steps: ['one', 'two'].map((id) => ({
            id,
            kind: 'agent' as const,
            agent: 'talker',
            mode: 'granular' as const,
            inbox: id,
            conversation: true,
          })),
        },
        'steps[1].conversation',
      ],
      [chatPlan('bad-name', { inbox: 'no spaces' }), 'steps[0].inbox'],
    ];
    for (const [plan, field] of cases) {
      const error = await rt.start(plan, 'x').then(
        () => null,
        (e: unknown) => e,
      );
      expect(error, plan.name).toBeInstanceOf(PlanValidationError);
      expect(String((error as Error).message), plan.name).toContain(field);
    }
    expect(await redis.keys(`${prefix}:*`)).toEqual(before);
  });
});
