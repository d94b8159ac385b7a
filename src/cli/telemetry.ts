/**
 * OpenTelemetry for the commands that change runs, configured by the standard environment
 * variables: when `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
 * `OTEL_TRACES_EXPORTER` is set (and `OTEL_SDK_DISABLED` is not true), the SDK is loaded (only
 * then) and its spans are exported over OTLP/HTTP (JSON), batched, and flushed when the command
 * ends. The exporter reads the endpoint, headers and timeout variables itself; the resource takes
 * `OTEL_SERVICE_NAME` (default `flujo`) and `OTEL_RESOURCE_ATTRIBUTES`; `OTEL_TRACES_SAMPLER` and
 * `OTEL_BSP_*` apply. A tracer provider registered before (e.g. by a module preloaded with
 * `node --import`) is left in charge.
 */
import { trace } from '@opentelemetry/api';
import { runSpanIdGenerator, spansRecorded, tracingEnabled } from '../observability/tracing.js';
import { badInput } from './exit-codes.js';

/** A started SDK: `shutdown` records what is pending, exports it and stops. */
export interface Telemetry {
  shutdown(): Promise<void>;
}

const truthy = (v: string | undefined): boolean => v?.trim().toLowerCase() === 'true';
const set = (v: string | undefined): v is string => v !== undefined && v.trim() !== '';

/** The exporters `OTEL_TRACES_EXPORTER` names, checked; empty when tracing stays off. */
function exportersOf(env: NodeJS.ProcessEnv): ('otlp' | 'console')[] {
  if (truthy(env.OTEL_SDK_DISABLED)) return [];
  const named = env.OTEL_TRACES_EXPORTER;
  if (!set(named)) {
    const endpoint =
      set(env.OTEL_EXPORTER_OTLP_ENDPOINT) || set(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
    return endpoint ? ['otlp'] : [];
  }
  const names = named
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n !== '');
  if (names.includes('none')) return [];
  for (const n of names) {
    if (n !== 'otlp' && n !== 'console') {
      badInput(
        `OTEL_TRACES_EXPORTER="${named}" names "${n}", which flujo does not export to; use otlp, console or none`,
      );
    }
  }
  return [...new Set(names)] as ('otlp' | 'console')[];
}

/** Refuses an OTLP protocol other than HTTP with JSON, the one the exporter speaks. */
function checkProtocol(env: NodeJS.ProcessEnv): void {
  for (const name of ['OTEL_EXPORTER_OTLP_TRACES_PROTOCOL', 'OTEL_EXPORTER_OTLP_PROTOCOL']) {
    const value = env[name]?.trim();
    if (value === undefined || value === '') continue;
    if (value !== 'http/json') {
      badInput(
        `${name}="${value}": flujo exports traces over OTLP/HTTP with JSON; set ${name}=http/json or unset it`,
      );
    }
    return;
  }
}

/** True when the variables ask for traces (checked: a bad value is refused). */
export function telemetryWanted(env: NodeJS.ProcessEnv): boolean {
  const wanted = exportersOf(env);
  if (wanted.includes('otlp')) checkProtocol(env);
  return wanted.length > 0;
}

/**
 * Starts the SDK when the variables ask for traces; returns undefined (and loads nothing) when
 * they do not, or when a tracer provider is already registered.
 */
export async function startTelemetry(env: NodeJS.ProcessEnv): Promise<Telemetry | undefined> {
  const exporters = exportersOf(env);
  if (exporters.length === 0) return undefined;
  if (exporters.includes('otlp')) checkProtocol(env);
  if (tracingEnabled()) return undefined;
  const [node, otlp, resources] = await Promise.all([
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/exporter-trace-otlp-http'),
    import('@opentelemetry/resources'),
  ]);
  const resource = resources
    .defaultResource()
    .merge(resources.resourceFromAttributes({ 'service.name': 'flujo' }))
    .merge(resources.detectResources({ detectors: [resources.envDetector] }));
  const spanProcessors = exporters.map((name) =>
    name === 'otlp'
      ? new node.BatchSpanProcessor(new otlp.OTLPTraceExporter())
      : new node.SimpleSpanProcessor(new node.ConsoleSpanExporter()),
  );
  const provider = new node.NodeTracerProvider({
    resource,
    spanProcessors,
    idGenerator: runSpanIdGenerator(),
  });
  provider.register();
  return {
    async shutdown() {
      // An unreachable collector holds the exit up to the exporter's timeout (its retries
      // included): say so, rather than hang silently.
      const slow = setTimeout(() => {
        const timeout = env.OTEL_EXPORTER_OTLP_TRACES_TIMEOUT ?? env.OTEL_EXPORTER_OTLP_TIMEOUT;
        process.stderr.write(
          `flujo: still exporting spans to the OpenTelemetry collector; waiting for it at most ${timeout ?? '10000'} ms (OTEL_EXPORTER_OTLP_TIMEOUT)\n`,
        );
      }, 1000);
      slow.unref();
      try {
        await spansRecorded();
        await provider.shutdown();
      } finally {
        clearTimeout(slow);
        trace.disable();
      }
    },
  };
}
