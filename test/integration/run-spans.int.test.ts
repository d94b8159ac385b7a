/**
 * The spans recorded after the fact, against an SDK that takes the run's chosen ids
 * (`runSpanIdGenerator`) and keeps its spans in memory: the run's span from its start to its end
 * (its steps its children), a span per wait (the retry's backoff, the gate, a risky tool call, a
 * wait step), each recorded once, by the commit that ended it; a redelivered final event records
 * nothing, and a failed run that is resumed and ends again keeps its one run span.
 */
import { trace } from '@opentelemetry/api';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from '@opentelemetry/sdk-trace-base';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineTool,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { runSpanIdGenerator, spansRecorded } from '../../src/observability/tracing.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';

const plan: PlanInput = {
  name: 'waits',
  steps: [
    {
      id: 'flaky',
      kind: 'operator',
      operator: 'flaky',
      retry: { maxAttempts: 3, initialDelayMs: 150, jitter: 0 },
    },
    { id: 'review', kind: 'human_gate', dependsOn: ['flaky'] },
    { id: 'research', kind: 'agent', agent: 'researcher', dependsOn: ['review'], maxTurns: 4 },
  ],
};

const memory = new InMemorySpanExporter();
const provider = new BasicTracerProvider({
  spanProcessors: [new SimpleSpanProcessor(memory)],
  idGenerator: runSpanIdGenerator(),
});
const model = useScriptedModel();
let runtime: Runtime;
let worker: FlujoWorker;
let prefix: string;
let flakyFails: number;

const ms = (t: [number, number]): number => t[0] * 1000 + t[1] / 1e6;
const sleep = (n: number) => new Promise((r) => setTimeout(r, n));

async function spansOf(runId: string): Promise<ReadableSpan[]> {
  await spansRecorded();
  return memory.getFinishedSpans().filter((s) => s.attributes['flujo.run_id'] === runId);
}

beforeAll(() => {
  trace.setGlobalTracerProvider(provider);
});
afterAll(async () => {
  trace.disable();
  await provider.shutdown();
});
beforeEach(async () => {
  memory.reset();
  flakyFails = 1;
  prefix = testPrefix();
  const publish = defineTool({
    name: 'publish',
    input: z.object({ text: z.string() }),
    riskLevel: 'high',
    idempotent: false,
    run: () => ({ url: 'https://example.test/1' }),
  });
  runtime = createRuntime({
    redis: redisUrl(),
    prefix,
    logger: silentLogger,
    operators: {
      flaky: () => {
        if (flakyFails > 0) {
          flakyFails -= 1;
          throw new Error('flake');
        }
        return { ok: true };
      },
    },
  }).agent(
    scriptedAgent(model, { name: 'researcher', systemPrompt: 'Publish.', tools: [publish] }),
  );
  worker = runtime.createWorker({ concurrency: 2 });
  await worker.ready();
});
afterEach(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('spans recorded after the fact', () => {
  it('one run span over the whole run, and a span per wait with its times', async () => {
    model.enqueue(
      { toolCalls: [{ id: 'c1', name: 'publish', arguments: { text: 'notes' } }] },
      { text: 'Published.' },
    );
    const run = await runtime.start(plan, 'durable agents');
    const atGate = await run.settled({ timeoutMs: 10_000 });
    expect(atGate.approvals.map((a) => a.stepId)).toEqual(['review']);
    await sleep(300);
    await runtime.approve(run.runId, 'review', { by: 'ana' });
    const atCall = await run.settled({ timeoutMs: 10_000 });
    const call = atCall.approvals[0]!.call!;
    await sleep(200);
    await runtime.approve(run.runId, 'research', { by: 'bo', callId: call.callId });
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');

    const spans = await spansOf(run.runId);
    const runs = spans.filter((s) => s.name === 'flujo.run');
    expect(runs).toHaveLength(1);
    const root = runs[0]!;
    // The ids the run was started with: every span of the run is in its trace, steps its children.
    const traceparent = (await runtime.core.meta.read(run.runId)).trace!;
    expect(traceparent).toBe(`00-${root.spanContext().traceId}-${root.spanContext().spanId}-01`);
    expect(root.parentSpanContext).toBeUndefined();
    expect(root.attributes).toMatchObject({
      'flujo.plan': 'waits',
      'flujo.run.status': 'succeeded',
    });
    expect(new Set(spans.map((s) => s.spanContext().traceId))).toEqual(
      new Set([root.spanContext().traceId]),
    );
    const steps = spans.filter((s) => s.name === 'flujo.step');
    expect(
      steps.map((s) => [s.attributes['flujo.step_id'], s.attributes['flujo.attempt']]),
    ).toEqual([
      ['flaky', 1],
      ['flaky', 2],
      ['review', 1],
      ['research', 1],
      ['research', 1],
    ]);
    for (const s of steps) expect(s.parentSpanContext?.spanId).toBe(root.spanContext().spanId);
    // It covers the run: from before the first span of the run to after the last.
    const others = spans.filter((s) => s !== root);
    expect(ms(root.startTime)).toBeLessThanOrEqual(Math.min(...others.map((s) => ms(s.startTime))));
    expect(ms(root.endTime)).toBeGreaterThanOrEqual(Math.max(...others.map((s) => ms(s.endTime))));

    const waits = spans.filter((s) => s.name.startsWith('flujo.wait.'));
    expect(waits.map((w) => w.name)).toEqual([
      'flujo.wait.retry',
      'flujo.wait.approval',
      'flujo.wait.tool_approval',
    ]);
    for (const w of waits) expect(w.parentSpanContext?.spanId).toBe(root.spanContext().spanId);
    const [retry, gate, tool] = waits;
    expect(retry!.attributes).toMatchObject({
      'flujo.step_id': 'flaky',
      'flujo.attempt': 1,
      'flujo.retry.next_attempt': 2,
      'flujo.retry.delay_ms': 150,
    });
    // The backoff: from the failure to the retry's start (event times, in whole ms), at least the
    // delay, between the two attempts.
    const [first, second] = steps;
    expect(ms(retry!.duration)).toBeGreaterThanOrEqual(150);
    expect(ms(retry!.startTime)).toBeGreaterThanOrEqual(ms(first!.startTime) - 5);
    expect(ms(retry!.endTime)).toBeLessThanOrEqual(ms(second!.startTime) + 5);
    expect(gate!.attributes).toMatchObject({
      'flujo.step_id': 'review',
      'flujo.wait.decision': 'approved',
      'flujo.wait.by': 'ana',
    });
    expect(ms(gate!.duration)).toBeGreaterThanOrEqual(300);
    expect(ms(gate!.duration)).toBeLessThan(3000);
    expect(tool!.attributes).toMatchObject({
      'flujo.step_id': 'research',
      'flujo.attempt': 1,
      'flujo.tool': 'publish@1',
      'flujo.tool.call_id': call.callId,
      'flujo.wait.by': 'bo',
    });
    expect(ms(tool!.duration)).toBeGreaterThanOrEqual(200);
    expect(ms(tool!.duration)).toBeLessThan(3000);

    // The final event delivered again commits nothing: nothing is recorded again.
    const again = await runtime.core.host.apply(run.runId, {
      type: 'step.succeeded',
      stepId: 'research',
      attempt: 1,
      output: 'Published.',
      at: Date.now(),
    });
    expect(again.committed).toBe(false);
    expect((await spansOf(run.runId)).length).toBe(spans.length);
  });

  it('a failed run resumed to its end keeps the one run span of its first end', async () => {
    flakyFails = 3;
    const run = await runtime.start(
      { name: 'fails', steps: [{ id: 'flaky', kind: 'operator', operator: 'flaky' }] },
      null,
    );
    const failed = await run.settled({ timeoutMs: 15_000 });
    expect(failed.status).toBe('failed');
    const before = (await spansOf(run.runId)).filter((s) => s.name === 'flujo.run');
    expect(before.map((s) => s.attributes['flujo.run.status'])).toEqual(['failed']);
    await runtime.resume(run.runId, { by: 'ana' });
    expect((await run.settled({ timeoutMs: 15_000 })).status).toBe('succeeded');
    const after = (await spansOf(run.runId)).filter((s) => s.name === 'flujo.run');
    expect(after).toEqual(before);
  });

  it('a wait step: a span from when it started waiting to the signal it took, or to its timer', async () => {
    const run = await runtime.start(
      {
        name: 'waits',
        steps: [
          { id: 'approval', kind: 'wait', for: { signal: 'go' } },
          { id: 'cool-off', kind: 'wait', for: { durationMs: 200 }, dependsOn: ['approval'] },
        ],
      },
      null,
    );
    let waiting = await run.status();
    for (let i = 0; i < 100 && waiting.waits.length === 0; i++) {
      await sleep(20);
      waiting = await run.status();
    }
    const since = waiting.waits[0]!.since;
    await sleep(100);
    await runtime.signal(run.runId, 'go', { ok: true });
    for (let i = 0; i < 200 && (await run.status()).status !== 'succeeded'; i++) await sleep(20);
    const spans = await spansOf(run.runId);
    const signal = spans.filter((s) => s.name === 'flujo.wait.signal');
    expect(signal).toHaveLength(1);
    expect(signal[0]!.attributes).toMatchObject({
      'flujo.step_id': 'approval',
      'flujo.wait.signal': 'go',
      'flujo.wait.outcome': 'taken',
    });
    expect(ms(signal[0]!.startTime)).toBeCloseTo(since, -1);
    expect(ms(signal[0]!.endTime) - since).toBeGreaterThanOrEqual(100);
    const timer = spans.filter((s) => s.name === 'flujo.wait.timer');
    expect(timer).toHaveLength(1);
    expect(ms(timer[0]!.endTime) - ms(timer[0]!.startTime)).toBeGreaterThanOrEqual(200);
  });
});
