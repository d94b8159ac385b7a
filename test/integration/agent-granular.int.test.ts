import { createHash, randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineTool,
  type AgentDefinition,
  type AgentSpec,
  type Chunk,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
  type StepOutcome,
  type ToolDefinition,
} from '../../src/index.js';
import { runSteps } from '../../src/machines/kernel.js';
import type { Logger } from '../../src/logging.js';
import { JobName } from '../../src/actors/jobs.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { heldTool } from '../helpers/held-tool.js';
import { granularPlan, scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';
import { runtimeCore } from '../../src/runtime.js';

const sha256 = (text: string) => createHash('sha256').update(text).digest('hex');

describe('granular agent steps', () => {
  const model = useScriptedModel();
  let runtime: Runtime;
  let worker: FlujoWorker;
  let prefix: string;
  let effects: { tool: string; args: unknown; key: string; turnKey: string | undefined }[];
  let warnings: { fields: object; message: string }[];

  const logger: Logger = {
    debug: () => {},
    info: () => {},
    warn: (fields, message) => warnings.push({ fields, message }),
    error: () => {},
  };

  const saveNote = (): ToolDefinition =>
    defineTool({
      name: 'save_note',
      input: z.object({ text: z.string() }),
      requiresIdempotencyKey: false,
      idempotent: false,
      run: ({ text }, ctx) => {
        effects.push({
          tool: 'save_note',
          args: { text },
          key: ctx.idempotencyKey,
          turnKey: ctx.turnKey,
        });
        return { saved: text };
      },
    });
  const search = defineTool({
    name: 'search',
    input: z.object({ q: z.string() }),
    class: 'read_only',
    run: ({ q }, ctx) => {
      effects.push({ tool: 'search', args: { q }, key: ctx.idempotencyKey, turnKey: ctx.turnKey });
      return { hits: [`${q} 1`, `${q} 2`] };
    },
  });

  const agentWith = (over: Partial<AgentSpec> = {}): AgentDefinition =>
    scriptedAgent(model, {
      name: 'researcher',
      systemPrompt: 'Research, save notes, answer.',
      tools: [search, saveNote()],
      ...over,
    });

  const plan = (over: Record<string, unknown> = {}): PlanInput => granularPlan('granular', over);

  async function start(agent: AgentDefinition, runtimeOptions: object = {}): Promise<void> {
    runtime = createRuntime({ redis: redisUrl(), prefix, logger, ...runtimeOptions }).agent(agent);
    worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
    await worker.ready();
  }

  beforeEach(() => {
    effects = [];
    warnings = [];
    prefix = `t-${randomUUID().slice(0, 8)}`;
  });
  afterEach(async () => {
    await worker.close();
    await runtime.close();
    await deleteRuntimeKeys(prefix);
  });

  it('takes one turn per unit: journal, ledger per tool call id, one commit per turn', async () => {
    await start(agentWith());
    model.enqueue(
      { toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'durable agents' } }] },
      { toolCalls: [{ id: 'c2', name: 'save_note', arguments: { text: 'agents resume' } }] },
      {
        text: 'Durable agents resume after a crash.',
        usage: { prompt_tokens: 30, completion_tokens: 7 },
      },
    );
    const run = await runtime.start(plan(), 'What makes an agent durable?');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['research']).toMatchObject({
      answer: 'Durable agents resume after a crash.',
      turns: 3,
      toolCalls: 2,
    });
    expect(model.requestCount).toBe(3);
    // The model saw the history growing turn by turn, the system prompt first.
    expect(model.requests.map((r) => r.messages.length)).toEqual([2, 4, 6]);
    expect(model.requests[2]!.messages[0]).toMatchObject({ role: 'system' });

    const history = await runtimeCore(runtime).stores.history.read(run.runId, 'research');
    expect(history.map((m) => m.role)).toEqual([
      'user',
      'assistant',
      'tool',
      'assistant',
      'tool',
      'assistant',
    ]);
    expect(history[0]).toEqual({ role: 'user', content: 'What makes an agent durable?' });
    expect(history[2]).toEqual({
      role: 'tool',
      tool_call_id: 'c1',
      content: JSON.stringify({ hits: ['durable agents 1', 'durable agents 2'] }),
    });
    // The snapshot keeps a cursor, not a copy.
    const step = runSteps((await runtimeCore(runtime).stores.store.load(run.runId)).snapshot)[0]!;
    expect(step.agent).toMatchObject({ turns: 3, cursor: 6 });
    // Each tool call once, keyed by sha256(run:step:turn:toolCallId), with the turn's key.
    const ledger = await runtime.ledger(run.runId);
    expect(ledger.map((e) => [e.callId, e.state])).toEqual([
      [sha256(`${run.runId}:research:0:c1`), 'SUCCEEDED'],
      [sha256(`${run.runId}:research:1:c2`), 'SUCCEEDED'],
    ]);
    expect(effects.map((e) => [e.tool, e.turnKey])).toEqual([
      ['search', sha256(`${run.runId}:research:0`)],
      ['save_note', sha256(`${run.runId}:research:1`)],
    ]);
    // Every reply journaled; one turn.committed per turn, the last committed with the success.
    for (let t = 0; t < 3; t++) {
      expect(
        await runtimeCore(runtime).stores.journal.get(run.runId, 'research', t),
      ).not.toBeNull();
    }
    const events = await runtimeCore(runtime).stores.store.readEvents(run.runId);
    const turns = events.filter((e) => e.type === 'turn.committed');
    expect(turns.map((e) => [e.data['turn'], e.data['cursor']])).toEqual([
      [0, 3],
      [1, 5],
      [2, 6],
    ]);
    const last = turns[2]!;
    expect(events.find((e) => e.type === 'step.succeeded')?.version).toBe(last.version);
  });

  it('an agent step is given the outputs of the steps it depends on, in both modes', async () => {
    await start(agentWith());
    runtime.operator('gather', () => ({ facts: ['journals', 'ledgers'] }));
    for (const mode of ['granular', 'atomic'] as const) {
      model.reset();
      model.enqueue({ text: `Done (${mode}).` });
      const run = await runtime.start(
        {
          name: 'with-deps',
          steps: [
            { id: 'gather', kind: 'operator', operator: 'gather' },
            { id: 'research', kind: 'agent', agent: 'researcher', mode, dependsOn: ['gather'] },
          ],
        },
        'What do durable agents keep?',
      );
      expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
      const user = model.requests[0]!.messages.find((m) => m.role === 'user');
      expect(JSON.parse(String(user?.content))).toEqual({
        input: 'What do durable agents keep?',
        results: { gather: { facts: ['journals', 'ledgers'] } },
      });
    }
  });

  it('runs parallel tool calls of one reply in order, each once, answered by id', async () => {
    await start(agentWith());
    model.enqueue(
      {
        toolCalls: [
          { id: 'a', name: 'search', arguments: { q: 'one' } },
          { id: 'b', name: 'search', arguments: { q: 'two' } },
          { id: 'c', name: 'save_note', arguments: { text: 'three' } },
        ],
      },
      { text: 'Done.' },
    );
    const run = await runtime.start(plan(), 'Go.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    expect(effects.map((e) => e.args)).toEqual([{ q: 'one' }, { q: 'two' }, { text: 'three' }]);
    const history = await runtimeCore(runtime).stores.history.read(run.runId, 'research');
    expect(history.slice(2, 5).map((m) => (m.role === 'tool' ? m.tool_call_id : m.role))).toEqual([
      'a',
      'b',
      'c',
    ]);
    expect(model.requests[1]!.messages).toHaveLength(6);
  });

  it('a redelivered job for a committed turn makes no model call and appends nothing; a gap writes nothing', async () => {
    await start(agentWith());
    const { tool: slow, release } = heldTool('slow');
    await worker.close();
    await runtime.close();
    await start(agentWith({ tools: [search, slow] }));
    model.enqueue(
      { toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'x' } }] },
      { toolCalls: [{ id: 'c2', name: 'slow', arguments: {} }] },
      { text: 'Done.' },
    );
    const run = await runtime.start(plan(), 'Go.');
    // Wait until turn 1 is running (its tool holds): turn 0 is committed.
    for (let i = 0; i < 200 && model.requestCount < 2; i++)
      await new Promise((r) => setTimeout(r, 10));
    expect(model.requestCount).toBe(2);
    const before = await runtimeCore(runtime).stores.history.length(run.runId, 'research');
    expect(before).toBe(3);
    const data = (turn: number) => ({ runId: run.runId, stepId: 'research', attempt: 1, turn });
    const redelivered = await runtimeCore(runtime).queues.queue.add(JobName.turn, data(0), {
      jobId: `redo-${randomUUID()}`,
    });
    const ahead = await runtimeCore(runtime).queues.queue.add(JobName.turn, data(5), {
      jobId: `gap-${randomUUID()}`,
    });
    for (let i = 0; i < 200; i++) {
      const [a, b] = await Promise.all([redelivered.isCompleted(), ahead.isCompleted()]);
      if (a && b) break;
      await new Promise((r) => setTimeout(r, 10));
    }
    const finished = async (id: string) =>
      (await runtimeCore(runtime).queues.queue.getJob(id))?.returnvalue as unknown;
    expect(await finished(redelivered.id!)).toBe('turn-committed');
    expect(await finished(ahead.id!)).toBe('turn-gap');
    expect(model.requestCount).toBe(2);
    expect(await runtimeCore(runtime).stores.history.length(run.runId, 'research')).toBe(before);
    release();
    expect(warnings.map((w) => w.message).filter((m) => m.startsWith('turn job'))).toEqual([
      'turn job ahead of the committed turns: resuming from the committed turn',
    ]);
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    expect(model.requestCount).toBe(3);
  });

  it('maxTurns fails the run with max_turns_exceeded and keeps the last committed turn', async () => {
    await start(agentWith());
    model.enqueue(
      { toolCalls: [{ id: 'c1', name: 'search', arguments: { q: '1' } }] },
      { toolCalls: [{ id: 'c2', name: 'search', arguments: { q: '2' } }] },
    );
    const run = await runtime.start(plan({ maxTurns: 2 }), 'Go.');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary.reason).toBe('max_turns_exceeded');
    expect(done.steps[0]!.agent).toMatchObject({ turns: 2, cursor: 5 });
    expect(await runtimeCore(runtime).stores.history.length(run.runId, 'research')).toBe(5);
    expect(model.requestCount).toBe(2);
  });

  it('an inner failure aborts the loop and changes nothing committed', async () => {
    const broken = defineTool({
      name: 'broken',
      input: z.object({}),
      class: 'read_only',
      run: () => {
        throw Object.assign(new Error('the index is gone'), { retryable: false });
      },
    });
    await start(agentWith({ tools: [search, broken] }));
    model.enqueue(
      { toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'x' } }] },
      { toolCalls: [{ id: 'c2', name: 'broken', arguments: {} }] },
    );
    const run = await runtime.start(plan(), 'Go.');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.steps[0]!.error?.message).toContain('the index is gone');
    // Turn 0 stays committed, turn 1 left nothing behind but its journaled reply.
    expect(done.steps[0]!.agent).toMatchObject({ turns: 1, cursor: 3 });
    expect(await runtimeCore(runtime).stores.history.length(run.runId, 'research')).toBe(3);
    expect(await runtimeCore(runtime).stores.journal.get(run.runId, 'research', 1)).not.toBeNull();
  });

  describe('idempotency enforcement', () => {
    const keyed = (withKey: boolean) =>
      defineTool({
        name: 'send_email',
        input: withKey
          ? z.object({ to: z.string(), idempotency_key: z.string() })
          : z.object({ to: z.string() }),
        requiresIdempotencyKey: true,
        run: (args, ctx) => {
          effects.push({ tool: 'send_email', args, key: ctx.idempotencyKey, turnKey: ctx.turnKey });
          return { sent: true };
        },
      });

    it('fills the turn key into the idempotency_key argument, hidden from the model', async () => {
      await start(agentWith({ tools: [keyed(true)] }));
      model.enqueue(
        { toolCalls: [{ name: 'send_email', arguments: { to: 'ana@example.com' } }] },
        { text: 'Sent.' },
      );
      const run = await runtime.start(plan(), 'Mail Ana.');
      expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
      const key = sha256(`${run.runId}:research:0`);
      expect(effects).toHaveLength(1);
      expect(effects[0]!.args).toEqual({ to: 'ana@example.com', idempotency_key: key });
      const tools = (model.requests[0]!.body as { tools: { function: { parameters: unknown } }[] })
        .tools;
      expect(JSON.stringify(tools[0]!.function.parameters)).not.toContain('idempotency_key');
    });

    it('refuses, before the effect, a tool whose input drops the key', async () => {
      await start(agentWith({ tools: [keyed(false)] }));
      model.enqueue({ toolCalls: [{ name: 'send_email', arguments: { to: 'ana@example.com' } }] });
      const run = await runtime.start(plan(), 'Mail Ana.');
      const done = await run.settled({ timeoutMs: 10_000 });
      expect(done.status).toBe('failed');
      expect(done.summary.reason).toBe('configuration_invalid');
      expect(done.steps[0]!.error?.message).toMatch(
        /lacks the turn's idempotency_key \(tool "send_email" requires an idempotency key\): declare idempotency_key: z.string\(\)/,
      );
      expect(effects).toEqual([]);
      expect(await runtime.ledger(run.runId)).toEqual([]);
    });

    it('refuses, before the effect, a call that carries another key', async () => {
      await start(agentWith({ tools: [keyed(true)] }));
      model.enqueue({
        toolCalls: [
          { name: 'send_email', arguments: { to: 'ana@example.com', idempotency_key: 'mine' } },
        ],
      });
      const run = await runtime.start(plan(), 'Mail Ana.');
      const done = await run.settled({ timeoutMs: 10_000 });
      expect(done.status).toBe('failed');
      expect(done.steps[0]!.error?.message).toMatch(/carries another idempotency_key \("mine"\)/);
      expect(effects).toEqual([]);
    });

    it('with enforceIdempotency, every tool must take the key, read-only ones too', async () => {
      await start(agentWith());
      model.enqueue({ toolCalls: [{ name: 'search', arguments: { q: 'x' } }] });
      const run = await runtime.start(plan({ enforceIdempotency: true }), 'Go.');
      const done = await run.settled({ timeoutMs: 10_000 });
      expect(done.status).toBe('failed');
      expect(done.steps[0]!.error?.message).toMatch(
        /lacks the turn's idempotency_key \(step "research" enforces idempotency\)/,
      );
      expect(effects).toEqual([]);
    });
  });

  it('streams reply text live as Chunk outcomes; chunks are not stored, the final message is', async () => {
    await start(agentWith({ stream: true }));
    const answer = 'Durable agents keep a journal, a ledger and a history.';
    model.enqueue(
      { toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'x' } }] },
      { text: answer, chunkDelayMs: 30 },
    );
    const run = await runtime.start(plan(), 'Go.');
    const seen: StepOutcome[] = [];
    for await (const outcome of runtime.outcomes(run.runId, { follow: true })) seen.push(outcome);
    const chunks = seen.filter((o): o is Chunk => o.type === 'chunk');
    expect(chunks.length).toBeGreaterThan(2);
    expect(chunks.map((c) => (c.data as { text: string }).text).join('')).toBe(answer);
    expect(chunks.map((c) => c.seq)).toEqual(chunks.map((_, i) => i));
    expect(
      chunks.every((c) => c.stepId === 'research' && (c.data as { turn: number }).turn === 1),
    ).toBe(true);
    // Live before the step's success, which comes last.
    expect(seen.at(-1)).toMatchObject({ type: 'success', stepId: 'research' });
    expect(seen.findIndex((o) => o.type === 'chunk')).toBeLessThan(seen.length - 1);
    const events = await runtimeCore(runtime).stores.store.readEvents(run.runId);
    expect(events.some((e) => JSON.stringify(e.data).includes('chunk'))).toBe(false);
    const history = await runtimeCore(runtime).stores.history.read(run.runId, 'research');
    expect(history.at(-1)).toEqual({ role: 'assistant', content: answer });
  });

  describe('model faults', () => {
    it('429 with retry-after is honoured, 500 retried with backoff; each turn answered once', async () => {
      await start(agentWith());
      model.enqueue(
        { fault: 'status', status: 429, retryAfter: 1 },
        { toolCalls: [{ id: 'c1', name: 'save_note', arguments: { text: 'n' } }] },
        { fault: 'status', status: 500 },
        { text: 'Done.' },
      );
      const run = await runtime.start(plan(), 'Go.');
      const done = await run.settled({ timeoutMs: 10_000 });
      expect(done.status).toBe('succeeded');
      expect(done.steps[0]!.attempt).toBe(3);
      const at = model.requests.map((r) => r.at);
      expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(1000);
      expect(effects).toHaveLength(1);
      expect(done.steps[0]!.agent).toMatchObject({ turns: 2, cursor: 4 });
    });

    it('a timeout is retried; a 401 fails with the fix and without the key', async () => {
      await start(agentWith({ timeoutMs: 300 }));
      model.enqueue({ fault: 'hang' }, { fault: 'status', status: 401 });
      const run = await runtime.start(plan(), 'Go.');
      const done = await run.settled({ timeoutMs: 10_000 });
      expect(done.status).toBe('failed');
      expect(model.requestCount).toBe(2);
      expect(done.steps[0]!.attempt).toBe(2);
      const message = done.steps[0]!.error?.message ?? '';
      expect(message).toMatch(/401/);
      expect(message).toMatch(/API key/);
      expect(message).not.toContain('test-key');
    });
  });
});
