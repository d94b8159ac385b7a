/**
 * Runs in the Stately inspector. A local WebSocket server stands in for the inspector's relay and
 * receives the messages `@statelyai/inspect` sends: from a runtime created with
 * `inspect: createWebSocketInspector({ url }).inspect`, and from `flujo inspect <runId> --follow
 * --url …` (the real binary, dist) following a run live. The run has a retried
 * operator step, a gate and an agent step (scripted model server). Also: `flujo inspect --json`
 * on a finished run, the command's refusals, and the runtime option's.
 */
import type { AddressInfo } from 'node:net';
import { createWebSocketInspector } from '@statelyai/inspect';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { WebSocketServer } from 'ws';
import type { InspectionEvent } from 'xstate';
import { createRuntime, type FlujoWorker, type PlanInput, type Runtime } from '../../src/index.js';
import { silentLogger, type Logger } from '../../src/logging.js';
import { isFedEvent } from '../../src/observability/inspect.js';
import { startFlujo } from '../helpers/cli.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';

const plan: PlanInput = {
  name: 'inspected',
  steps: [
    {
      id: 'flaky',
      kind: 'operator',
      operator: 'flaky',
      retry: { maxAttempts: 3, initialDelayMs: 20, maxDelayMs: 40, jitter: 0 },
    },
    { id: 'review', kind: 'human_gate', dependsOn: ['flaky'] },
    { id: 'research', kind: 'agent', agent: 'researcher', dependsOn: ['review'], maxTurns: 2 },
  ],
};
const STEPS = ['flaky', 'review', 'research'];

/** A message as `@statelyai/inspect` sends it (the fields these tests read). */
interface Message {
  type: '@xstate.actor' | '@xstate.event' | '@xstate.snapshot';
  sessionId: string;
  parentId?: string;
  sourceId?: string;
  name?: string;
  event?: { type: string; stepId?: string };
  snapshot?: { status: string; value: string };
}

/** A local WebSocket server that keeps every message it gets. */
interface Server {
  url: string;
  messages: Message[];
  connections: number;
  close(): Promise<void>;
}

async function startServer(): Promise<Server> {
  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 });
  await new Promise<void>((resolve) => wss.once('listening', () => resolve()));
  const server: Server = {
    url: `ws://127.0.0.1:${(wss.address() as AddressInfo).port}`,
    messages: [],
    connections: 0,
    close: () =>
      new Promise<void>((resolve) => {
        for (const client of wss.clients) client.terminate();
        wss.close(() => resolve());
      }),
  };
  wss.on('connection', (ws) => {
    server.connections += 1;
    ws.on('message', (data: Buffer) =>
      server.messages.push(JSON.parse(data.toString()) as Message),
    );
  });
  return server;
}

async function until(what: string, ok: () => boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

let prefix: string;

const flujo = (args: string[]) => startFlujo(args, { prefix });

const model = useScriptedModel();
let flakyCalls: number;

function runtimeWith(extra: Partial<Parameters<typeof createRuntime>[0]> = {}): Runtime {
  const researcher = scriptedAgent(model, { name: 'researcher', systemPrompt: 'Answer.' });
  return createRuntime({
    redis: redisUrl(),
    prefix,
    logger: silentLogger,
    operators: {
      flaky: () => {
        flakyCalls += 1;
        if (flakyCalls < 2) throw new Error(`flake ${flakyCalls}`);
        return { ok: true };
      },
    },
    ...extra,
  }).agent(researcher);
}

/** Starts the plan and takes it to its gate. */
async function startToGate(runtime: Runtime): Promise<string> {
  model.enqueue({ text: 'Done.', usage: { prompt_tokens: 20, completion_tokens: 2 } });
  const run = await runtime.start(plan, 'durable agents');
  const atGate = await run.settled({ timeoutMs: 10_000 });
  expect(atGate.approvals.map((a) => a.stepId)).toEqual(['review']);
  return run.runId;
}

async function finish(runtime: Runtime, runId: string): Promise<void> {
  await runtime.approve(runId, 'review', { by: 'ana' });
  const done = await (await runtime.attach(runId)).settled({ timeoutMs: 10_000 });
  expect(done.status).toBe('succeeded');
}

/** The events the run was fed (type and step), from its stream, in commit order. */
async function fedEvents(runtime: Runtime, runId: string): Promise<Fed[]> {
  const fed: Fed[] = [];
  for await (const e of runtime.events(runId)) {
    if (!isFedEvent(e.type)) continue;
    const stepId = e.data['stepId'];
    fed.push({ type: e.type, stepId: typeof stepId === 'string' ? stepId : null });
  }
  return fed;
}

interface Fed {
  type: string;
  stepId: string | null;
}

/** The checks every path must pass, on the messages about `runId`. */
function checkMessages(all: Message[], runId: string, fed: Fed[]): void {
  const sessions = [runId, ...STEPS.map((s) => `${runId}.${s}`)];
  const messages = all.filter((m) => sessions.includes(m.sessionId));
  // Each actor announced once, the steps as children of the run, before anything else about it.
  const actors = messages.filter((m) => m.type === '@xstate.actor');
  expect(actors.map((m) => [m.sessionId, m.parentId ?? null, m.name])).toEqual([
    [runId, null, 'run'],
    ...STEPS.map((s) => [`${runId}.${s}`, runId, s]),
  ]);
  for (const session of sessions) {
    const first = messages.findIndex((m) => m.sessionId === session);
    expect(messages[first]?.type).toBe('@xstate.actor');
  }
  // The events sent to the run from outside are the stream's, in its order.
  const external = messages.filter(
    (m) => m.type === '@xstate.event' && m.sessionId === runId && m.sourceId === undefined,
  );
  expect(external.map((m) => m.event?.type)).toEqual(fed.map((e) => e.type));
  expect(fed.map((e) => e.type)).toEqual([
    'run.created',
    'step.started',
    'step.failed',
    'retry.due',
    'step.started',
    'step.succeeded',
    'gate.approved',
    'step.started',
    'step.succeeded',
    'step.started',
    'step.succeeded',
  ]);
  // An event about a step goes on from the run to that step.
  const forwarded = messages.filter((m) => m.type === '@xstate.event' && m.sourceId === runId);
  expect(forwarded.map((m) => [m.sessionId, m.event?.type])).toEqual(
    fed.filter((e) => e.stepId !== null).map((e) => [`${runId}.${e.stepId}`, e.type]),
  );
  // One run snapshot per event; the last one succeeded.
  const runSnapshots = messages.filter(
    (m) => m.type === '@xstate.snapshot' && m.sessionId === runId,
  );
  expect(runSnapshots).toHaveLength(fed.length);
  expect(runSnapshots.at(-1)?.snapshot).toMatchObject({ status: 'done', value: 'succeeded' });
  const values = (stepId: string) =>
    messages
      .filter((m) => m.type === '@xstate.snapshot' && m.sessionId === `${runId}.${stepId}`)
      .map((m) => m.snapshot?.value);
  expect(values('flaky')).toEqual([
    'READY',
    'RUNNING',
    'FAILED_RETRYABLE',
    'READY',
    'RUNNING',
    'SUCCEEDED',
  ]);
  expect(values('review')).toEqual([
    'PENDING',
    'WAITING_APPROVAL',
    'READY',
    'RUNNING',
    'SUCCEEDED',
  ]);
  expect(values('research')).toEqual(['PENDING', 'READY', 'RUNNING', 'SUCCEEDED']);
}

beforeEach(() => {
  flakyCalls = 0;
  prefix = testPrefix();
});
afterEach(async () => {
  await deleteRuntimeKeys(prefix);
});

describe('createRuntime({ inspect })', () => {
  let server: Server;
  let runtime: Runtime;
  let worker: FlujoWorker;
  beforeEach(async () => {
    server = await startServer();
  });
  afterEach(async () => {
    await worker?.close();
    await runtime?.close();
    await server.close();
  });

  it('sends every commit of a run to a WebSocket inspector, as the run actor and its step children', async () => {
    const inspector = createWebSocketInspector({ url: server.url });
    try {
      runtime = runtimeWith({ inspect: inspector.inspect });
      worker = runtime.createWorker({ concurrency: 2 });
      await worker.ready();
      await until('the inspector to connect', () => server.connections === 1);
      const runId = await startToGate(runtime);
      await finish(runtime, runId);
      const isLast = (m: Message) =>
        m.type === '@xstate.snapshot' && m.sessionId === runId && m.snapshot?.value === 'succeeded';
      await until('the final snapshot', () => server.messages.some(isLast));
      checkMessages(server.messages, runId, await fedEvents(runtime, runId));
      expect(flakyCalls).toBe(2);
      // The actor carries the machine's definition, for the inspector to draw.
      const runActor = server.messages.find((m) => m.type === '@xstate.actor') as Message & {
        definition: string;
      };
      expect(JSON.parse(runActor.definition)).toMatchObject({ id: 'run' });
    } finally {
      inspector.stop();
    }
  });

  it('a throwing observer changes nothing: the run ends, the error is logged once', async () => {
    const warnings: string[] = [];
    const logger: Logger = { ...silentLogger, warn: (_f, message) => warnings.push(message) };
    let calls = 0;
    runtime = runtimeWith({
      logger,
      inspect: () => {
        calls += 1;
        throw new Error('observer down');
      },
    });
    worker = runtime.createWorker({ concurrency: 2 });
    await worker.ready();
    const runId = await startToGate(runtime);
    await finish(runtime, runId);
    expect(calls).toBeGreaterThan(20);
    expect(warnings.filter((w) => w.includes('inspect observer threw'))).toHaveLength(1);
  });

  it('a replay is announced when it is created, then followed like any run', async () => {
    const seen: InspectionEvent[] = [];
    runtime = runtimeWith({ inspect: (event: InspectionEvent) => seen.push(event) });
    worker = runtime.createWorker({ concurrency: 2 });
    await worker.ready();
    const runId = await startToGate(runtime);
    await finish(runtime, runId);
    const replay = await runtime.replay(runId, { mode: 'replay' });
    // The replay asks at the gate again: it settles waiting there.
    const report = await (await runtime.attach(replay.runId)).settled();
    expect(report.status).toBe('waiting');
    const first = seen.findIndex((e) => e.actorRef.sessionId === replay.runId);
    expect(first).toBeGreaterThanOrEqual(0);
    expect(seen[first]?.type).toBe('@xstate.actor');
    const created = seen.find(
      (e) =>
        e.type === '@xstate.event' &&
        e.actorRef.sessionId === replay.runId &&
        e.event.type === 'run.created',
    );
    expect(created).toBeDefined();
    const snapshots = seen.flatMap((e) =>
      e.type === '@xstate.snapshot' && e.actorRef.sessionId === replay.runId ? [e.snapshot] : [],
    );
    expect((snapshots.at(-1) as { value?: unknown } | undefined)?.value).toBe('waiting');
  });

  it('refuses an inspect option that is not an observer, naming it, before connecting', () => {
    for (const inspect of [42, 'ws://localhost:8080', {}, { next: 1 }]) {
      let error: unknown;
      try {
        createRuntime({ redis: 'redis://127.0.0.1:1', prefix, inspect: inspect as never });
      } catch (e) {
        error = e;
      }
      expect(error).toMatchObject({
        code: 'input_invalid',
        issues: [expect.objectContaining({ path: 'inspect' })],
      });
      expect((error as Error).message).toContain('createWebSocketInspector().inspect');
    }
  });
});

describe('flujo inspect', () => {
  let runtime: Runtime;
  let worker: FlujoWorker;
  beforeEach(async () => {
    runtime = runtimeWith();
    worker = runtime.createWorker({ concurrency: 2 });
    await worker.ready();
  });
  afterEach(async () => {
    await worker.close();
    await runtime.close();
  });

  it('--follow replays the run so far to the inspector, then follows it live until it ends', async () => {
    const server = await startServer();
    try {
      const runId = await startToGate(runtime);
      const cli = flujo(['inspect', runId, '--follow', '--url', server.url]);
      // The replay reaches the gate; the rest arrives live.
      await until('the gate in the replay', () =>
        server.messages.some(
          (m) => m.sessionId === `${runId}.review` && m.snapshot?.value === 'WAITING_APPROVAL',
        ),
      );
      expect(server.messages.some((m) => m.snapshot?.value === 'succeeded')).toBe(false);
      await finish(runtime, runId);
      const r = await cli.done;
      expect(r.code, r.err).toBe(0);
      expect(r.out).toBe('');
      expect(r.err).toContain(`sending run ${runId} to the inspector at ${server.url}`);
      expect(r.err).toContain('https://stately.ai/inspect');
      checkMessages(server.messages, runId, await fedEvents(runtime, runId));
    } finally {
      await server.close();
    }
  });

  it('--json prints the inspection events of a finished run as JSON lines', async () => {
    const runId = await startToGate(runtime);
    await finish(runtime, runId);
    const r = await flujo(['inspect', runId, '--json']).done;
    expect(r.code, r.err).toBe(0);
    const lines = r.out
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    type Ref = { sessionId: string; id: string; parentSessionId: string | null };
    // The same checks, on the events as the inspector library would turn them into messages.
    const messages: Message[] = lines.map((l) => {
      const ref = l['actorRef'] as Ref;
      const source = l['sourceRef'] as Ref | null;
      return {
        type: l['type'] as Message['type'],
        sessionId: ref.sessionId,
        ...(ref.parentSessionId === null ? {} : { parentId: ref.parentSessionId }),
        ...(source === null || source === undefined ? {} : { sourceId: source.sessionId }),
        name: ref.sessionId === runId ? 'run' : ref.id,
        ...(l['event'] === undefined ? {} : { event: l['event'] as NonNullable<Message['event']> }),
        ...(l['snapshot'] === undefined
          ? {}
          : { snapshot: l['snapshot'] as NonNullable<Message['snapshot']> }),
      };
    });
    checkMessages(messages, runId, await fedEvents(runtime, runId));
    expect(lines[0]).toMatchObject({
      type: '@xstate.actor',
      rootId: runId,
      actorRef: { sessionId: runId, id: runId, parentSessionId: null },
      snapshot: { value: 'running' },
    });
    // A run snapshot names its steps' actors the way xstate serializes children.
    const last = lines.at(-1) as { snapshot: { children: Record<string, unknown> } };
    expect(last.snapshot.children).toEqual({
      flaky: { xstate$$type: 1, id: 'flaky' },
      review: { xstate$$type: 1, id: 'review' },
      research: { xstate$$type: 1, id: 'research' },
    });
  });

  it.each([
    [['inspect'], 'name the run id'],
    [['inspect', 'no-such-run', '--json'], 'no-such-run'],
    [['inspect', 'some-run', '--url', 'notaurl'], '--url "notaurl" is not a WebSocket URL'],
    [['inspect', 'some-run', '--url', 'http://localhost:8080'], 'is not a WebSocket URL'],
    [['inspect', 'some-run', '--json', '--url', 'ws://localhost:8080'], 'leave out --url'],
    [['inspect', 'some-run', 'extra'], 'unexpected argument "extra"'],
  ])('refuses %j with exit 2', async (args, message) => {
    const r = await flujo(args).done;
    expect(r.code).toBe(2);
    expect(r.err).toContain(message);
    expect(r.out).toBe('');
  });

  it('an inspector that closes the connection while following: a clear error and exit 1', async () => {
    const runId = await startToGate(runtime);
    const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 });
    await new Promise<void>((resolve) => wss.once('listening', () => resolve()));
    let got = 0;
    wss.on('connection', (ws) =>
      ws.on('message', () => {
        got += 1;
        if (got === 1) ws.close();
      }),
    );
    try {
      const url = `ws://127.0.0.1:${(wss.address() as AddressInfo).port}`;
      // The run waits at its gate: without the check, --follow would wait for it forever.
      const r = await flujo(['inspect', runId, '--follow', '--url', url]).done;
      expect(r.code).toBe(1);
      expect(r.err).toContain(`the inspector at ${url} closed the connection`);
      expect(got).toBeGreaterThanOrEqual(1);
    } finally {
      await new Promise<void>((resolve) => wss.close(() => resolve()));
    }
  });

  it('an unreachable inspector: a clear error and exit 1 within a few seconds', async () => {
    const runId = await startToGate(runtime);
    // A port nothing listens on: a server started and closed again.
    const gone = await startServer();
    await gone.close();
    const r = await flujo(['inspect', runId, '--url', gone.url]).done;
    expect(r.code).toBe(1);
    expect(r.err).toContain(`cannot reach the inspector at ${gone.url}`);
    expect(r.ms).toBeLessThan(8000);
  });
});
