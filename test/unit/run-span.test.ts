/**
 * The run's span recorded when the run ends, with the ids its start chose: against an SDK that
 * takes them (`runSpanIdGenerator`) and one that does not; and which OpenTelemetry variables make
 * the CLI start the SDK.
 */
import { SpanStatusCode, trace } from '@opentelemetry/api';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { afterEach, describe, expect, it } from 'vitest';
import { telemetryWanted } from '../../src/cli/telemetry.js';
import { CliError } from '../../src/cli/exit-codes.js';
import {
  recordRunSpan,
  runSpanIdGenerator,
  startRunTrace,
} from '../../src/observability/tracing.js';

const memory = new InMemorySpanExporter();
const ms = (t: [number, number]): number => t[0] * 1000 + t[1] / 1e6;

function register(idGenerator?: ReturnType<typeof runSpanIdGenerator>): BasicTracerProvider {
  const provider = new BasicTracerProvider({
    spanProcessors: [new SimpleSpanProcessor(memory)],
    ...(idGenerator === undefined ? {} : { idGenerator }),
  });
  trace.setGlobalTracerProvider(provider);
  return provider;
}

afterEach(() => {
  trace.disable();
  memory.reset();
});

describe('the run span, with an SDK that takes chosen ids', () => {
  it('is not recorded at the start; recorded at the end with the ids and times of the run', () => {
    register(runSpanIdGenerator());
    const started = startRunTrace('r1', { 'flujo.plan': 'p' });
    started.end();
    expect(memory.getFinishedSpans()).toEqual([]);
    expect(started.caller).toBe('');
    const [, traceId, spanId] = started.traceparent.split('-');
    recordRunSpan({
      runId: 'r1',
      traceparent: started.traceparent,
      caller: started.caller!,
      start: 1_700_000_000_000,
      end: 1_700_000_004_500,
      status: 'failed',
      attributes: { 'flujo.plan': 'p' },
    });
    const [span, ...more] = memory.getFinishedSpans();
    expect(more).toEqual([]);
    expect(span!.name).toBe('flujo.run');
    expect(span!.spanContext()).toMatchObject({ traceId, spanId });
    expect(span!.parentSpanContext).toBeUndefined();
    expect(ms(span!.startTime)).toBe(1_700_000_000_000);
    expect(ms(span!.endTime)).toBe(1_700_000_004_500);
    expect(span!.status.code).toBe(SpanStatusCode.ERROR);
    expect(span!.attributes).toEqual({
      'flujo.run_id': 'r1',
      'flujo.plan': 'p',
      'flujo.run.status': 'failed',
    });
    // Other spans still get random ids.
    const other = trace.getTracer('t').startSpan('x');
    expect(other.spanContext().spanId).not.toBe(spanId);
  });

  it('under the caller the start recorded', () => {
    register(runSpanIdGenerator());
    const caller = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    recordRunSpan({
      runId: 'r2',
      traceparent: '00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01',
      caller,
      start: 1_700_000_000_000,
      end: 1_700_000_001_000,
      status: 'succeeded',
    });
    const [span] = memory.getFinishedSpans();
    expect(span!.spanContext()).toMatchObject({
      traceId: '0af7651916cd43dd8448eb211c80319c',
      spanId: '00f067aa0ba902b7',
    });
    expect(span!.parentSpanContext?.spanId).toBe('b7ad6b7169203331');
    expect(span!.status.code).toBe(SpanStatusCode.UNSET);
  });
});

describe('the run span, with an SDK that chooses its own ids', () => {
  it('is recorded at the start (covering the start), and not again at the end', () => {
    register();
    const started = startRunTrace('r3');
    started.end();
    expect(started.caller).toBeNull();
    const [span] = memory.getFinishedSpans();
    expect(started.traceparent).toBe(
      `00-${span!.spanContext().traceId}-${span!.spanContext().spanId}-01`,
    );
    recordRunSpan({
      runId: 'r3',
      traceparent: started.traceparent,
      caller: '',
      start: 1,
      end: 2,
      status: 'succeeded',
    });
    expect(memory.getFinishedSpans()).toHaveLength(1);
  });
});

describe('the variables that start the CLI SDK', () => {
  const refusal = (env: NodeJS.ProcessEnv): CliError => {
    try {
      telemetryWanted(env);
    } catch (error) {
      return error as CliError;
    }
    throw new Error('not refused');
  };

  it('an endpoint or an exporter asks for traces; nothing else does', () => {
    expect(telemetryWanted({})).toBe(false);
    expect(telemetryWanted({ OTEL_SERVICE_NAME: 'svc', OTEL_RESOURCE_ATTRIBUTES: 'a=b' })).toBe(
      false,
    );
    expect(telemetryWanted({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:4318' })).toBe(true);
    expect(telemetryWanted({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://c/v1/traces' })).toBe(
      true,
    );
    expect(telemetryWanted({ OTEL_TRACES_EXPORTER: 'otlp' })).toBe(true);
    expect(telemetryWanted({ OTEL_TRACES_EXPORTER: 'console' })).toBe(true);
    expect(
      telemetryWanted({ OTEL_TRACES_EXPORTER: 'none', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c' }),
    ).toBe(false);
    expect(
      telemetryWanted({ OTEL_SDK_DISABLED: 'true', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c' }),
    ).toBe(false);
    expect(
      telemetryWanted({
        OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c',
        OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
      }),
    ).toBe(true);
  });

  it('refuses an exporter or a protocol it cannot honour, naming the variable and the fix', () => {
    const exporter = refusal({ OTEL_TRACES_EXPORTER: 'otlp,jaeger' });
    expect(exporter).toBeInstanceOf(CliError);
    expect(exporter.exitCode).toBe(2);
    expect(exporter.message).toContain('OTEL_TRACES_EXPORTER="otlp,jaeger" names "jaeger"');
    const protocol = refusal({
      OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c',
      OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'http/protobuf',
    });
    expect(protocol.exitCode).toBe(2);
    expect(protocol.message).toContain('set OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json');
  });
});
