/**
 * The span helpers against the in-memory exporter of @opentelemetry/sdk-trace-base: the tree and
 * the inherited ids, the run's stored trace context as remote parent, the verdict of each tool
 * call outcome, and the ids a run gets when no SDK is registered.
 */
import { SpanStatusCode, trace } from '@opentelemetry/api';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ApprovalPending } from '../../src/execution/call-approval.js';
import { ToolCallBusyError, ToolOutcomeUnknownError } from '../../src/errors.js';
import {
  traceAttempt,
  traceModelCall,
  traceToolCall,
  traceTurn,
} from '../../src/observability/spans.js';
import { startRunTrace } from '../../src/observability/tracing.js';

const memory = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(memory)] });
const tool = { name: 'pay', identity: 'pay@1', class: 'external' };
const ids = { runId: 'r1', stepId: 's1', attempt: 2 };

const byName = (name: string) => memory.getFinishedSpans().filter((s) => s.name === name);
const caught = async (p: Promise<unknown>): Promise<unknown> =>
  p.then(
    () => null,
    (e: unknown) => e,
  );

describe('without an SDK', () => {
  it('a run still gets a valid trace context, different for each run', () => {
    const a = startRunTrace('r1');
    const b = startRunTrace('r2');
    a.end();
    b.end();
    expect(a.traceparent).toMatch(/^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
    expect(b.traceparent.slice(3, 35)).not.toBe(a.traceparent.slice(3, 35));
  });
});

describe('with an SDK', () => {
  beforeAll(() => {
    trace.setGlobalTracerProvider(provider);
  });
  afterEach(() => memory.reset());
  afterAll(async () => {
    trace.disable();
    await provider.shutdown();
  });

  it('a worker with an SDK joins the trace of a run started without one', async () => {
    trace.disable();
    const started = startRunTrace('r0');
    started.end();
    trace.setGlobalTracerProvider(provider);
    expect(memory.getFinishedSpans()).toEqual([]);
    await traceAttempt(started.traceparent, ids, 'operator', () =>
      Promise.resolve({ kind: 'succeeded' }),
    );
    const [step] = byName('flujo.step');
    expect(step!.spanContext().traceId).toBe(started.traceparent.slice(3, 35));
    expect(step!.parentSpanContext?.spanId).toBe(started.traceparent.slice(36, 52));
  });

  it('nests a step, its turn, its model and tool calls under the run, ids inherited', async () => {
    const run = startRunTrace('r1', { 'flujo.plan': 'p' });
    run.end();
    const reply = {
      model: 'gpt-x-2',
      finishReason: 'tool_calls',
      usage: { promptTokens: 12, completionTokens: 5 },
    };
    const entry = { callId: 'c1', runs: 1, state: 'SUCCEEDED' };
    await traceAttempt(run.traceparent, ids, 'agent', () =>
      traceTurn(0, async () => {
        await traceModelCall({ model: 'gpt-x', agent: 'a' }, () => Promise.resolve(reply));
        await traceToolCall(tool, {}, () => Promise.resolve({ replayed: true, entry }));
        return { kind: 'succeeded' };
      }),
    );
    const [root] = byName('flujo.run');
    const [step] = byName('flujo.step');
    const [turn] = byName('flujo.turn');
    const [chat] = byName('chat gpt-x');
    const [call] = byName('execute_tool pay');
    const traceId = root!.spanContext().traceId;
    expect(run.traceparent).toBe(`00-${traceId}-${root!.spanContext().spanId}-01`);
    expect([step, turn, chat, call].map((s) => s!.spanContext().traceId)).toEqual(
      Array(4).fill(traceId),
    );
    expect(step!.parentSpanContext?.spanId).toBe(root!.spanContext().spanId);
    expect(turn!.parentSpanContext?.spanId).toBe(step!.spanContext().spanId);
    expect(chat!.parentSpanContext?.spanId).toBe(turn!.spanContext().spanId);
    expect(call!.parentSpanContext?.spanId).toBe(turn!.spanContext().spanId);
    expect(step!.attributes).toEqual({
      'flujo.run_id': 'r1',
      'flujo.step_id': 's1',
      'flujo.attempt': 2,
      'flujo.step.kind': 'agent',
      'flujo.outcome': 'succeeded',
    });
    expect(chat!.attributes).toEqual({
      'flujo.run_id': 'r1',
      'flujo.step_id': 's1',
      'flujo.attempt': 2,
      'flujo.turn': 0,
      'gen_ai.system': 'openai',
      'gen_ai.provider.name': 'openai',
      'gen_ai.operation.name': 'chat',
      'gen_ai.request.model': 'gpt-x',
      'gen_ai.agent.name': 'a',
      'gen_ai.response.model': 'gpt-x-2',
      'gen_ai.response.finish_reasons': ['tool_calls'],
      'gen_ai.usage.input_tokens': 12,
      'gen_ai.usage.output_tokens': 5,
    });
    expect(call!.attributes).toMatchObject({
      'flujo.turn': 0,
      'flujo.tool.verdict': 'receipt_replayed',
      'flujo.tool.call_id': 'c1',
      'flujo.tool.runs': 1,
      'gen_ai.tool.name': 'pay',
    });
  });

  it.each([
    [
      'in doubt',
      new ToolOutcomeUnknownError({ runId: 'r1', stepId: 's1', callId: 'c9', tool: 'pay@1' }),
      'in_doubt',
    ],
    ['busy', new ToolCallBusyError('r1', 'c9', 'pay@1', 5000), 'busy'],
    ['failed', new Error('card declined'), 'failed'],
  ])(
    'a tool call %s: its verdict, an error status, the error rethrown',
    async (_, error, verdict) => {
      const thrown = await caught(traceToolCall(tool, ids, () => Promise.reject(error)));
      expect(thrown).toBe(error);
      const [call] = byName('execute_tool pay');
      expect(call!.attributes['flujo.tool.verdict']).toBe(verdict);
      expect(call!.status).toEqual({ code: SpanStatusCode.ERROR, message: error.message });
      expect(call!.events.map((e) => e.name)).toEqual(['exception']);
    },
  );

  it('a pause for approval is no failure: the call and its turn say so, without an error status', async () => {
    const pause = new ApprovalPending({ callId: 'c9', tool: 'pay@1', args: {} });
    const thrown = await caught(
      traceTurn(3, () => traceToolCall(tool, ids, () => Promise.reject(pause))),
    );
    expect(thrown).toBe(pause);
    const [call] = byName('execute_tool pay');
    const [turn] = byName('flujo.turn');
    expect(call!.attributes).toMatchObject({
      'flujo.tool.verdict': 'awaiting_approval',
      'flujo.tool.call_id': 'c9',
      'flujo.turn': 3,
    });
    expect(turn!.attributes['flujo.outcome']).toBe('paused');
    expect([call!.status, turn!.status]).toEqual([
      { code: SpanStatusCode.UNSET },
      { code: SpanStatusCode.UNSET },
    ]);
    expect([...call!.events, ...turn!.events]).toEqual([]);
  });

  it('a failed attempt ends with an error status and its code; a bad trace context starts a root', async () => {
    const failure = { kind: 'failed', error: { code: 'model_error', message: 'HTTP 500' } };
    await traceAttempt('00-not-a-traceparent', ids, 'agent', () => Promise.resolve(failure));
    const [step] = byName('flujo.step');
    expect(step!.status).toEqual({ code: SpanStatusCode.ERROR, message: 'HTTP 500' });
    expect(step!.attributes).toMatchObject({
      'flujo.outcome': 'failed',
      'error.type': 'model_error',
    });
    expect(step!.parentSpanContext).toBeUndefined();
  });

  it('a model call that fails records the error kind', async () => {
    const error = Object.assign(new Error('rate limited'), { kind: 'rate_limit' });
    await caught(traceModelCall({ model: 'gpt-x', agent: 'a' }, () => Promise.reject(error)));
    const [chat] = byName('chat gpt-x');
    expect(chat!.attributes['error.type']).toBe('rate_limit');
    expect(chat!.status.code).toBe(SpanStatusCode.ERROR);
  });
});
