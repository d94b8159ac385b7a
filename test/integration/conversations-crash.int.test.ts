/**
 * A conversation across SIGKILL: a worker child (test/fixtures/agent-child.ts) is killed in a
 * conversation's turn, between its model reply and its commit (or just after the commit), with a
 * message taken by that turn and another sent while no worker runs; a fresh child goes on. Every
 * message is in the step's history once, in send order, and each signal is taken once.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/logging.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, runtimeCore, type Runtime } from '../../src/runtime.js';
import type { RecordedRequest } from '../../src/testing/index.js';
import { agentChildren, settledReport, turnOf } from '../helpers/agent-child.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';
import { useScriptedModel } from '../helpers/scripted-agent.js';

const plan: PlanInput = {
  name: 'conversation-crash',
  steps: [
    {
      id: 'chat',
      kind: 'agent',
      agent: 'researcher',
      mode: 'granular',
      inbox: 'message',
      conversation: true,
    },
  ],
};

const model = useScriptedModel();
let rt: Runtime;
let prefix: string;
const children = agentChildren(() => ({
  REDIS_URL: redisUrl(),
  FLUJO_PREFIX: prefix,
  MODEL_URL: model.url,
  EFFECT_FILE: '/dev/null',
  RECOVERY_MS: '1000',
}));

const lastUser = (r: RecordedRequest): string =>
  String(r.messages.filter((m) => m.role === 'user').at(-1)?.content);

beforeEach(() => {
  model.setDefaultReply((r) => ({ text: `re: ${lastUser(r)}` }));
  prefix = testPrefix();
  rt = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
});
afterEach(async () => {
  await children.killAll();
  await rt.close();
  await deleteRuntimeKeys(prefix);
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The chat step's state once `ok` holds for it (20 s at most). */
async function chatWhen(
  runId: string,
  ok: (value: string, turns: number, taken: number) => boolean,
) {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const env = await runtimeCore(rt).host.load(runId);
    const child = env.snapshot.children['chat']?.snapshot;
    const taken = env.snapshot.context.taken?.['message'] ?? 0;
    if (child !== undefined && ok(child.value, child.context.agent?.turns ?? 0, taken)) return;
    if (Date.now() > deadline) throw new Error(`chat of ${runId} never got there`);
    await sleep(25);
  }
}

describe('a conversation across SIGKILL', { timeout: 60_000 }, () => {
  it.each([
    // The reply was lost with the worker: turn 1 is asked again, and then takes both messages.
    ['after the model reply, before the journal', 'after-model-reply:chat:1', 1],
    // The journaled reply answered m1 only: the retaken turn takes m1, the next one m2.
    ['after the journal, before the commit', 'after-journal:chat:1', 0],
    ['after the commit', 'after-commit:chat:1', 0],
  ])('killed %s: no message lost, none twice', async (_name, killAt, extraAsks) => {
    const runId = `run-${Math.random().toString(36).slice(2, 10)}`;
    await rt.start(plan, runId, { runId });
    const doomed = await children.spawn({ FLUJO_KILL_AT: killAt });
    await chatWhen(runId, (value, turns) => value === 'WAITING' && turns === 1);
    await rt.signal(runId, 'message', 'm1');
    const exit = await Promise.race([doomed.exited, sleep(15_000).then(() => 'alive')]);
    expect(exit, doomed.stderr()).toEqual({ code: null, signal: 'SIGKILL' });
    // Sent while no worker runs.
    await rt.signal(runId, 'message', 'm2');
    const resumer = await children.spawn();
    await chatWhen(runId, (value, _turns, taken) => value === 'WAITING' && taken === 2);
    await rt.signal(runId, 'end');
    await chatWhen(runId, (value) => value === 'SUCCEEDED' || value === 'FAILED_FINAL');
    const report = await settledReport(rt, runId);
    resumer.proc.kill('SIGTERM');
    await resumer.exited;

    expect(report.status).toBe('succeeded');
    const history = await runtimeCore(rt).stores.history.read(runId, 'chat');
    expect(history.filter((m) => m.role === 'user').map((m) => m.content)).toEqual([
      runId,
      'm1',
      'm2',
    ]);
    const events: { type: string; data: Record<string, unknown> }[] = [];
    for await (const e of rt.events(runId)) {
      events.push({ type: e.type, data: e.data });
    }
    const taken = events.filter((e) => e.type === 'signal.taken');
    expect(taken.map((e) => `${String(e.data['name'])}#${String(e.data['index'])}`)).toEqual([
      'message#0',
      'message#1',
      'end#0',
    ]);
    const turns = events.filter((e) => e.type === 'turn.committed').length;
    const asked = model.requests.filter(
      (r) => r.messages.find((m) => m.role === 'user')?.content === runId,
    );
    expect(asked).toHaveLength(turns + extraAsks);
    // Each turn asked once (twice for a reply lost before its journal).
    const perTurn: number[] = [];
    for (const r of asked) perTurn[turnOf(r)] = (perTurn[turnOf(r)] ?? 0) + 1;
    expect(perTurn[1]).toBe(1 + extraAsks);
    expect(report.steps[0]!.output).toMatchObject({ answer: 're: m2', turns });
  });
});
