import { randomUUID } from 'node:crypto';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  type FlujoWorker,
  type JsonValue,
  type PlanInput,
  type Runtime,
  type StepOutcome,
} from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import type { RunSnapshot } from '../../src/machines/kernel.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { caught } from '../helpers/caught.js';
import { changedKeys, dumpAll } from '../helpers/dump.js';
import { connect, deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

describe('replay: reproduce, replay, regenerate, fork', () => {
  let model: ScriptedModelServer;
  let runtime: Runtime;
  let worker: FlujoWorker | undefined;
  let prefix: string;
  let redis: Redis;
  let sent: { to: string; body: string; key: string }[];
  let invoked: Record<string, number>;

  const sendEmail = defineTool({
    name: 'send_email',
    input: z.object({ to: z.string(), body: z.string() }),
    output: z.object({ messageId: z.string() }),
    class: 'external',
    requiresIdempotencyKey: true,
    run: ({ to, body }, ctx) => {
      sent.push({ to, body, key: ctx.idempotencyKey });
      return { messageId: `m-${sent.length}` };
    },
  });

  const saveNote = defineTool({
    name: 'save_note',
    input: z.object({ text: z.string(), idempotency_key: z.string() }),
    class: 'external',
    requiresIdempotencyKey: true,
    run: ({ text, idempotency_key }) => {
      sent.push({ to: 'notes', body: text, key: idempotency_key });
      return { saved: text };
    },
  });

  const BIG = 'page '.repeat(400);
  const fetchPage = defineTool({
    name: 'fetch_page',
    input: z.object({ url: z.string() }),
    class: 'external',
    idempotent: true,
    run: ({ url }) => {
      sent.push({ to: 'fetch', body: url, key: '' });
      return { url, text: BIG };
    },
  });

  const count = (name: string) => (ctx: { deps: Record<string, JsonValue> }) => {
    invoked[name] = (invoked[name] ?? 0) + 1;
    return { step: name, n: invoked[name], deps: Object.keys(ctx.deps).sort() };
  };

  /** prepare → draft (an agent) → email (an e-mail through the ledger); prepare → audit. */
  const plan: PlanInput = {
    name: 'newsletter',
    steps: [
      { id: 'prepare', kind: 'operator', operator: 'prepare', effects: ['read_only'] },
      {
        id: 'draft',
        kind: 'agent',
        agent: 'drafter',
        mode: 'granular',
        dependsOn: ['prepare'],
        effects: ['read_only'],
      },
      {
        id: 'email',
        kind: 'operator',
        operator: 'email',
        dependsOn: ['draft'],
        effects: ['external'],
      },
      { id: 'audit', kind: 'operator', operator: 'audit', dependsOn: ['prepare'] },
    ],
  };

  beforeAll(async () => {
    model = await startScriptedModelServer();
    redis = connect();
  });
  afterAll(async () => {
    redis.disconnect();
    await model.close();
  });
  beforeEach(() => {
    model.reset();
    sent = [];
    invoked = {};
    prefix = `t-${randomUUID().slice(0, 8)}`;
    const drafter = defineAgent({
      name: 'drafter',
      model: 'gpt-test',
      provider: { baseURL: model.url, apiKey: 'test-key' },
      systemPrompt: 'Draft the newsletter.',
      tools: [],
      timeoutMs: 5000,
    });
    runtime = createRuntime({
      redis: redisUrl(),
      prefix,
      logger: silentLogger,
      tools: [sendEmail],
      operators: {
        prepare: count('prepare'),
        audit: count('audit'),
        broken: () => {
          throw Object.assign(new Error('broken on purpose'), { retryable: false });
        },
        email: async (ctx) => {
          invoked['email'] = (invoked['email'] ?? 0) + 1;
          const draft = ctx.need('draft', 'answer') as string;
          return ctx.tools.call('send_email', { to: 'team@example.com', body: draft });
        },
      },
    })
      .agent(drafter)
      .agent(
        defineAgent({
          name: 'noter',
          model: 'gpt-test',
          provider: { baseURL: model.url, apiKey: 'test-key' },
          systemPrompt: 'Save a note, then answer.',
          tools: [saveNote],
          timeoutMs: 5000,
        }),
      )
      .agent(
        defineAgent({
          name: 'reader',
          model: 'gpt-test',
          provider: { baseURL: model.url, apiKey: 'test-key' },
          systemPrompt: 'Fetch, then answer.',
          tools: [fetchPage],
          timeoutMs: 5000,
        }),
      );
  });
  afterEach(async () => {
    await worker?.close();
    worker = undefined;
    await runtime.close();
    await deleteRuntimeKeys(prefix);
  });

  async function startWorker(): Promise<void> {
    worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
    await worker.ready();
  }

  /** Runs the plan to success with the model drafting `draft`; returns the run id. */
  async function original(draft = 'Draft A'): Promise<string> {
    model.enqueue({ text: draft });
    const run = await runtime.start(plan, { issue: 7 });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    return run.runId;
  }

  it('reproduce returns the stored outcomes and replies, writes nothing, and checks integrity', async () => {
    model.enqueue({ text: 'Draft A' });
    const run = await runtime.start(plan, { issue: 7 });
    // The outcomes as a follower saw them while the run ran (no worker yet: nothing is missed).
    const following = collect(runtime.outcomes(run.runId, { follow: true }));
    await startWorker();
    const live = await following;
    const runId = run.runId;
    expect(live.map((o) => o.type)).toEqual(['success', 'success', 'success', 'success']);
    await worker!.close();
    worker = undefined;
    const calls = model.requestCount;

    // A runtime that only reads: not even the queue's meta, which BullMQ writes for a new queue.
    await redis.del(`{${prefix}:q}:runs:meta`);
    const before = await dumpAll(redis, prefix);
    const reader = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
    const got = await reader.replay(runId, { mode: 'reproduce' });
    await reader.status(runId);
    await new Promise((resolve) => setTimeout(resolve, 200));
    await reader.close();
    expect(changedKeys(before, await dumpAll(redis, prefix))).toEqual([]);
    expect(Object.keys(before).length).toBeGreaterThan(5);
    expect(model.requestCount).toBe(calls);
    expect(invoked).toEqual({ prepare: 1, audit: 1, email: 1 });

    expect(got.outcomes).toEqual(live);
    expect(got.outcomes.filter((o: StepOutcome) => o.type === 'success')).toHaveLength(4);
    expect(got.status).toBe('succeeded');
    expect(got.events.map((e) => e.type)).toContain('run.finished');
    expect(got.modelReplies.map((r) => [r.stepId, r.turn, r.attempt])).toEqual([
      ['draft', 0, null],
    ]);
    expect(got.modelReplies[0]?.replies[0]?.message.content).toBe('Draft A');
    expect(got.integrity).toEqual({ ok: true, problems: [], differences: [] });

    // A planted difference: the stored e-mail receipt is edited behind the events' back.
    const env = await runtimeCore(runtime).stores.store.load(runId);
    const planted: RunSnapshot = structuredClone(env.snapshot);
    planted.children['email']!.snapshot.context.output = { messageId: 'forged' };
    await runtimeCore(runtime).stores.store.commit(runId, env.version, planted, []);
    const checked = await runtime.replay(runId, { mode: 'reproduce' });
    expect(checked.integrity.ok).toBe(false);
    expect(checked.integrity.differences).toEqual([
      {
        path: 'children.email.snapshot.context.output.messageId',
        stored: 'forged',
        derived: 'm-1',
      },
    ]);
  });

  it("replay makes new model calls and no new e-mail: the e-mail step returns the original's output and receipt", async () => {
    await startWorker();
    const runId = await original();
    expect(model.requestCount).toBe(1);
    model.enqueue({ text: 'Draft A' });
    const replayed = await runtime.replay(runId, { mode: 'replay' });
    expect(replayed.runId).not.toBe(runId);
    expect({ ...replayed, runId: 'new' }).toEqual({
      mode: 'replay',
      runId: 'new',
      replayOf: runId,
      lineage: runId,
      fromStep: null,
      reusedSteps: [],
      allowEffects: false,
    });
    const done = await (await runtime.attach(replayed.runId)).settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(model.requestCount).toBe(2);
    expect(sent).toHaveLength(1);
    // The e-mail step declares an external effect and its input (the draft) is the original's:
    // it does not run; its output and its call's receipt are the original's.
    expect(invoked).toEqual({ prepare: 2, audit: 2, email: 1 });
    expect(done.summary.produced['email']).toEqual({ messageId: 'm-1' });
    // The reused receipt is in the replay's own ledger, so a replay of the replay finds it too.
    const ledger = await runtime.ledger(replayed.runId);
    expect(ledger.map((e) => [e.tool, e.state, e.receipt])).toEqual([
      ['send_email@1', 'SUCCEEDED', { messageId: 'm-1' }],
    ]);
    // Both sides show the lineage.
    expect(done.lineage).toMatchObject({ replayOf: runId, mode: 'replay', lineage: runId });
    const first = await runtime.status(runId);
    expect(first.lineage?.replays.map((r) => [r.runId, r.mode])).toEqual([
      [replayed.runId, 'replay'],
    ]);
    const again = await runtime.replay(replayed.runId, { mode: 'replay' });
    model.enqueue({ text: 'Draft A' });
    const twice = await (await runtime.attach(again.runId)).settled({ timeoutMs: 10_000 });
    expect(twice.status).toBe('succeeded');
    expect(again.lineage).toBe(runId);
    expect(sent).toHaveLength(1);
  });

  it("replay: a changed draft changes the e-mail step's input: the step waits for approval before it acts", async () => {
    await startWorker();
    const runId = await original();
    model.enqueue({ text: 'Draft B' });
    const replayed = await runtime.replay(runId, { mode: 'replay' });
    const waiting = await (await runtime.attach(replayed.runId)).settled({ timeoutMs: 10_000 });
    expect(waiting.status).toBe('waiting');
    expect(waiting.approvals.map((a) => [a.stepId, a.call?.tool, a.call?.args])).toEqual([
      [
        'email',
        'operator:email',
        {
          replayOf: runId,
          step: 'email',
          effects: ['external'],
          why: `its inputs differ from run ${runId}'s (changed: draft)`,
        },
      ],
    ]);
    expect(invoked['email']).toBe(1);
    expect(sent).toHaveLength(1);
    // Approved: the step runs; its call, which the original never made, runs without asking again.
    await runtime.approve(replayed.runId, 'email', { by: 'ana' });
    const done = await (await runtime.attach(replayed.runId)).settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(invoked['email']).toBe(2);
    expect(sent.map((s) => s.body)).toEqual(['Draft A', 'Draft B']);
  });

  it('regenerate: a new draft, the e-mail waits for approval; with allowEffects one new e-mail', async () => {
    await startWorker();
    const runId = await original();
    model.enqueue({ text: 'Draft B' });
    const regenerated = await runtime.replay(runId, { mode: 'regenerate' });
    expect(regenerated.lineage).toBe(regenerated.runId);
    const waiting = await (await runtime.attach(regenerated.runId)).settled({ timeoutMs: 10_000 });
    expect(model.requestCount).toBe(2);
    expect(waiting.status).toBe('waiting');
    expect(waiting.steps.find((s) => s.stepId === 'email')?.status).toBe('WAITING_APPROVAL');
    expect(waiting.summary.produced['draft']).toMatchObject({ answer: 'Draft B' });
    expect(sent).toHaveLength(1);

    model.enqueue({ text: 'Draft C' });
    const allowed = await runtime.replay(runId, { mode: 'regenerate', allowEffects: true });
    const done = await (await runtime.attach(allowed.runId)).settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(model.requestCount).toBe(3);
    expect(sent.map((s) => s.body)).toEqual(['Draft A', 'Draft C']);

    // Unchanged inputs: the e-mail step returns its receipt, even in a new lineage.
    model.enqueue({ text: 'Draft A' });
    const same = await runtime.replay(runId, { mode: 'regenerate' });
    const sameDone = await (await runtime.attach(same.runId)).settled({ timeoutMs: 10_000 });
    expect(sameDone.status).toBe('succeeded');
    expect(sent).toHaveLength(2);
  });

  it('granular agent: the same tool call returns its receipt (its turn key aside); another waits', async () => {
    await startWorker();
    const notes: PlanInput = {
      name: 'notes',
      steps: [
        { id: 'note', kind: 'agent', agent: 'noter', mode: 'granular', effects: ['external'] },
      ],
    };
    const call = (text: string) => ({
      toolCalls: [{ id: `c-${text}`, name: 'save_note', arguments: { text } }],
    });
    model.enqueue(call('x'), { text: 'saved x' });
    const run = await runtime.start(notes, 'note x');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    expect(sent.map((s) => s.body)).toEqual(['x']);

    // Another tool call id, same arguments: the original's receipt, no second note.
    model.enqueue({ toolCalls: [{ id: 'other', name: 'save_note', arguments: { text: 'x' } }] });
    model.enqueue({ text: 'saved x again' });
    const same = await runtime.replay(run.runId, { mode: 'replay' });
    const sameDone = await (await runtime.attach(same.runId)).settled({ timeoutMs: 10_000 });
    expect(sameDone.status).toBe('succeeded');
    expect(model.requestCount).toBe(4);
    expect(sent).toHaveLength(1);
    expect(sameDone.summary.produced['note']).toMatchObject({ answer: 'saved x again' });

    model.enqueue(call('y'), { text: 'saved y' });
    const changed = await runtime.replay(run.runId, { mode: 'replay' });
    const waiting = await (await runtime.attach(changed.runId)).settled({ timeoutMs: 10_000 });
    expect(waiting.status).toBe('waiting');
    expect(waiting.approvals[0]?.call?.args).toMatchObject({ text: 'y' });
    expect(sent).toHaveLength(1);
  });

  it('granular agent: a reused receipt of a large result brings its blob into the new run', async () => {
    await startWorker();
    const pages: PlanInput = {
      name: 'pages',
      steps: [
        {
          id: 'read',
          kind: 'agent',
          agent: 'reader',
          mode: 'granular',
          blobThresholdBytes: 500,
          effects: ['external'],
        },
      ],
    };
    const fetchCall = { toolCalls: [{ id: 'f1', name: 'fetch_page', arguments: { url: 'u' } }] };
    model.enqueue(fetchCall, { text: 'read it' });
    const run = await runtime.start(pages, 'read u');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const [receipt] = await runtime.ledger(run.runId);
    expect(receipt?.receipt).toHaveProperty('$flujoBlob');

    model.enqueue(fetchCall, { text: 'read it again' });
    const replayed = await runtime.replay(run.runId, { mode: 'replay' });
    const done = await (await runtime.attach(replayed.runId)).settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(sent).toHaveLength(1);
    // The replay's second turn was sent the page itself; the blob is the replay's own too, so a
    // worker without it in memory finds it.
    const last = model.requests.at(-1)!;
    expect(JSON.stringify(last.messages)).toContain(BIG.slice(0, 200));
    const ref = (receipt!.receipt as { $flujoBlob: string }).$flujoBlob;
    const id = /FL_BLOB_REF:([0-9a-f]{64})/.exec(ref)![1]!;
    const own = await runtimeCore(runtime).stores.blobs.get(replayed.runId, id);
    expect(own).toBe(await runtimeCore(runtime).stores.blobs.get(run.runId, id));
    expect(own).toContain(BIG);
  });

  it('fork from a middle step runs only it and its dependents', async () => {
    await startWorker();
    const runId = await original();
    expect(invoked).toEqual({ prepare: 1, audit: 1, email: 1 });
    const forked = await runtime.replay(runId, { mode: 'replay', fromStep: 'email' });
    expect(forked.reusedSteps).toEqual(['prepare', 'draft', 'audit']);
    const done = await (await runtime.attach(forked.runId)).settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    // The e-mail step is effectful and its input is the original's: it takes the original's
    // output instead of running (see the next test).
    expect(invoked).toEqual({ prepare: 1, audit: 1, email: 1 });
    expect(model.requestCount).toBe(1);
    expect(sent).toHaveLength(1);
    expect(done.lineage).toMatchObject({
      fromStep: 'email',
      reusedSteps: ['prepare', 'draft', 'audit'],
    });
    const orig = await runtime.status(runId);
    for (const id of ['prepare', 'draft', 'audit']) {
      expect(done.summary.produced[id]).toEqual(orig.summary.produced[id]);
    }

    model.enqueue({ text: 'Draft A' });
    const fromDraft = await runtime.replay(runId, { mode: 'replay', fromStep: 'draft' });
    expect(fromDraft.reusedSteps).toEqual(['prepare', 'audit']);
    const done2 = await (await runtime.attach(fromDraft.runId)).settled({ timeoutMs: 10_000 });
    expect(done2.status).toBe('succeeded');
    // The draft ran again (a model call); the e-mail step, given the same draft, did not.
    expect(invoked).toEqual({ prepare: 1, audit: 1, email: 1 });
    expect(model.requestCount).toBe(2);
    expect(sent).toHaveLength(1);
    // A run forked and then reproduced: its events still lead to its snapshot.
    const reproduced = await runtime.replay(fromDraft.runId, { mode: 'reproduce' });
    expect(reproduced.integrity.ok).toBe(true);
  });

  it('a fork reuses a gate the original passed: recorded as approved by replay', async () => {
    await startWorker();
    const gated: PlanInput = {
      name: 'gated',
      steps: [
        { id: 'prepare', kind: 'operator', operator: 'prepare' },
        { id: 'review', kind: 'human_gate', dependsOn: ['prepare'], gate: { approvers: ['ana'] } },
        { id: 'audit', kind: 'operator', operator: 'audit', dependsOn: ['review'] },
      ],
    };
    const run = await runtime.start(gated, null);
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('waiting');
    await runtime.approve(run.runId, 'review', { by: 'ana', comment: 'fine' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    const forked = await runtime.replay(run.runId, { mode: 'replay', fromStep: 'audit' });
    expect(forked.reusedSteps).toEqual(['prepare', 'review']);
    const again = await (await runtime.attach(forked.runId)).settled({ timeoutMs: 10_000 });
    expect(again.status).toBe('succeeded');
    expect(invoked).toEqual({ prepare: 1, audit: 2 });
    expect(again.summary.produced['review']).toEqual(done.summary.produced['review']);
    expect(again.steps.find((s) => s.stepId === 'review')?.approval).toMatchObject({
      by: 'replay',
    });
    expect((await runtime.replay(forked.runId, { mode: 'reproduce' })).integrity.ok).toBe(true);
  });

  it('an effectful operator that acts directly does not act again: replay takes its recorded output', async () => {
    await startWorker();
    const dir = mkdtempSync(join(tmpdir(), 'flujo-replay-effect-'));
    const file = join(dir, 'appended.log');
    const lines = () => (existsSync(file) ? readFileSync(file, 'utf8').trim().split('\n') : []);
    // Acts on the world itself, not through ctx.tools: no ledger entry stands for its effect.
    runtime.operator('append', (ctx) => {
      invoked['append'] = (invoked['append'] ?? 0) + 1;
      const line = `${ctx.need('draft', 'answer') as string} (run ${ctx.runId})`;
      appendFileSync(file, `${line}\n`);
      return { appended: line, at: invoked['append'] };
    });
    const appender: PlanInput = {
      name: 'appender',
      steps: [
        { id: 'draft', kind: 'agent', agent: 'drafter', effects: ['read_only'] },
        {
          id: 'append',
          kind: 'operator',
          operator: 'append',
          dependsOn: ['draft'],
          effects: ['external'],
        },
      ],
    };
    try {
      model.enqueue({ text: 'Draft A' });
      const run = await runtime.start(appender, null);
      const first = await run.settled({ timeoutMs: 10_000 });
      expect(first.status).toBe('succeeded');
      expect(lines()).toHaveLength(1);
      expect(invoked['append']).toBe(1);

      // replay: the draft is made again (a model call), the same; the append does not run.
      model.enqueue({ text: 'Draft A' });
      const replayed = await runtime.replay(run.runId, { mode: 'replay' });
      const done = await (await runtime.attach(replayed.runId)).settled({ timeoutMs: 10_000 });
      expect(done.status).toBe('succeeded');
      expect(model.requestCount).toBe(2);
      expect(invoked['append']).toBe(1);
      expect(lines()).toEqual([`Draft A (run ${run.runId})`]);
      expect(done.summary.produced['append']).toEqual(first.summary.produced['append']);
      // Marked in the replay's events as a reused receipt is: replayed, from the original run.
      const events = await collect(runtime.events(replayed.runId));
      const reused = events
        .filter((e) => e.type === 'tool.called' && e.data['stepId'] === 'append')
        .map((e) => e.data);
      expect(reused).toEqual([
        expect.objectContaining({
          tool: 'operator:append',
          class: 'external',
          replayed: true,
          outcome: 'succeeded',
          reusedFrom: run.runId,
        }),
      ]);
      expect(events.some((e) => e.type === 'step.ran' && e.data['stepId'] === 'append')).toBe(true);
      expect((await runtime.replay(replayed.runId, { mode: 'reproduce' })).integrity.ok).toBe(true);

      // A replay of the replay: the recorded output is the replay's, the original's still.
      model.enqueue({ text: 'Draft A' });
      const again = await runtime.replay(replayed.runId, { mode: 'replay' });
      const twice = await (await runtime.attach(again.runId)).settled({ timeoutMs: 10_000 });
      expect(twice.status).toBe('succeeded');
      expect(twice.summary.produced['append']).toEqual(first.summary.produced['append']);
      expect(invoked['append']).toBe(1);

      // regenerate, a new draft: the step's input changed, so it waits for approval to act.
      model.enqueue({ text: 'Draft B' });
      const regenerated = await runtime.replay(run.runId, { mode: 'regenerate' });
      const waiting = await (
        await runtime.attach(regenerated.runId)
      ).settled({ timeoutMs: 10_000 });
      expect(waiting.status).toBe('waiting');
      expect(waiting.approvals.map((a) => [a.stepId, a.call?.tool])).toEqual([
        ['append', 'operator:append'],
      ]);
      expect(invoked['append']).toBe(1);
      expect(lines()).toHaveLength(1);
      await runtime.approve(regenerated.runId, 'append', { by: 'ana' });
      const approved = await (
        await runtime.attach(regenerated.runId)
      ).settled({ timeoutMs: 10_000 });
      expect(approved.status).toBe('succeeded');
      expect(invoked['append']).toBe(2);
      expect(lines()).toEqual([`Draft A (run ${run.runId})`, `Draft B (run ${regenerated.runId})`]);

      // regenerate with the same draft: its input is unchanged, its output the original's.
      model.enqueue({ text: 'Draft A' });
      const same = await runtime.replay(run.runId, { mode: 'regenerate' });
      const sameDone = await (await runtime.attach(same.runId)).settled({ timeoutMs: 10_000 });
      expect(sameDone.status).toBe('succeeded');
      expect(sameDone.summary.produced['append']).toEqual(first.summary.produced['append']);
      expect(invoked['append']).toBe(2);

      // regenerate with allowEffects and a new draft: it acts, once, without asking.
      model.enqueue({ text: 'Draft C' });
      const allowed = await runtime.replay(run.runId, { mode: 'regenerate', allowEffects: true });
      const allowedDone = await (
        await runtime.attach(allowed.runId)
      ).settled({ timeoutMs: 10_000 });
      expect(allowedDone.status).toBe('succeeded');
      expect(invoked['append']).toBe(3);
      expect(lines()).toHaveLength(3);
      expect(lines()[2]).toBe(`Draft C (run ${allowed.runId})`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a deterministic step runs again in a replay: another output than the stored one is a NonDeterminismError', async () => {
    await startWorker();
    let n = 0;
    let stable = true;
    runtime.operator('measure', ({ runInput }) => {
      n++;
      return stable ? { length: JSON.stringify(runInput).length } : { length: 0, n };
    });
    const measured: PlanInput = {
      name: 'measured',
      steps: [
        {
          id: 'measure',
          kind: 'operator',
          operator: 'measure',
          cachePolicy: { class: 'deterministic' },
          retry: { maxAttempts: 1 },
        },
      ],
    };
    const run = await runtime.start(measured, { doc: 'hello' });
    const first = await run.settled({ timeoutMs: 10_000 });
    expect(first.status).toBe('succeeded');
    expect(n).toBe(1);

    // The same output: the replay ran the step (no cache hit) and it passed the check.
    const replayed = await runtime.replay(run.runId, { mode: 'replay' });
    const same = await (await runtime.attach(replayed.runId)).settled({ timeoutMs: 10_000 });
    expect(same.status).toBe('succeeded');
    expect(n).toBe(2);
    expect(same.steps[0]!.cachedFrom).toBeNull();
    expect(same.summary.produced['measure']).toEqual(first.summary.produced['measure']);

    // Another output: the replay fails the step, naming it and the run that stored the entry
    // (the first replay, which stored the same output again).
    stable = false;
    const changed = await runtime.replay(run.runId, { mode: 'replay' });
    const failed = await (await runtime.attach(changed.runId)).settled({ timeoutMs: 10_000 });
    expect(n).toBe(3);
    expect(failed.status).toBe('failed');
    const error = failed.steps[0]!.error!;
    expect(error).toMatchObject({
      name: 'NonDeterminismError',
      code: 'non_determinism',
      retryable: false,
    });
    expect(error.message).toContain('step "measure"');
    expect(error.message).toContain(replayed.runId);
  });

  it('refuses bad options before writing anything', async () => {
    await startWorker();
    const runId = await original();
    await worker!.close();
    worker = undefined;
    const before = await dumpAll(redis, prefix);
    const cases: [unknown, string, RegExp][] = [
      [{ mode: 'rerun' }, 'mode', /reproduce", "replay" or "regenerate/],
      [{}, 'mode', /got nothing/],
      [{ mode: 'replay', fromStep: 'nope' }, 'fromStep', /has no step "nope"/],
      [{ mode: 'replay', fromStep: '' }, 'fromStep', /id of a step/],
      [{ mode: 'reproduce', fromStep: 'draft' }, 'fromStep', /reproduce only reads/],
      [{ mode: 'reproduce', allowEffects: true }, 'allowEffects', /runs nothing/],
      [{ mode: 'regenerate', allowEffects: 'yes' }, 'allowEffects', /true or false/],
    ];
    for (const [options, path, message] of cases) {
      const error = await caught(runtime.replay(runId, options as { mode: 'replay' }));
      expect(error).toMatchObject({ code: 'input_invalid' });
      const issue = (error as { issues: { path: string; message: string }[] }).issues[0]!;
      expect(issue.path).toBe(path);
      expect(issue.message).toMatch(message);
    }
    const missing = await caught(runtime.replay('no-such-run', { mode: 'replay' }));
    expect(missing).toMatchObject({ code: 'run_not_found' });
    expect(changedKeys(before, await dumpAll(redis, prefix))).toEqual([]);
  });

  it('refuses a fork whose reused step did not succeed', async () => {
    await startWorker();
    model.enqueue({ text: 'Draft A' });
    const run = await runtime.start(
      {
        ...plan,
        steps: plan.steps.map((s) =>
          s.id === 'audit' ? { ...s, operator: 'broken', retry: { maxAttempts: 1 } } : s,
        ),
      },
      null,
    );
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    // The worker's work after the final commit (the run's expiry) is done once it has closed.
    await worker!.close();
    worker = undefined;
    const before = await dumpAll(redis, prefix);
    const error = await caught(runtime.replay(run.runId, { mode: 'replay', fromStep: 'email' }));
    expect(error).toMatchObject({ code: 'input_invalid' });
    expect((error as Error).message).toMatch(/step "audit" does not depend on "email"/);
    expect(changedKeys(before, await dumpAll(redis, prefix))).toEqual([]);
  });
});
