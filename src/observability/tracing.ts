/**
 * OpenTelemetry spans of a run, through `@opentelemetry/api` only: the application registers an
 * SDK and an exporter; without one every span is the API's no-op span.
 *
 * A run has one trace across the workers and processes that work on it. Its trace context (a W3C
 * `traceparent`: trace id and the id of the `flujo.run` span) is made when the run starts and
 * stored with the run; every span of a step attempt or a granular turn uses it as a remote parent,
 * and the spans inside (turns, model calls, tool calls) nest under the span that is current.
 * The current span is kept in this module's own async context, so the tree is right even when the
 * application registered no context manager; it is also made the active OpenTelemetry context, so
 * a tool's own spans nest under its `execute_tool` span when one is registered.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { randomBytes } from 'node:crypto';
import {
  context as otelContext,
  isSpanContextValid,
  ProxyTracer,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  TraceFlags,
  type Attributes,
  type Context,
  type Span,
  type Tracer,
} from '@opentelemetry/api';

/** The instrumentation scope every span of the runtime is recorded under. */
export const TRACER_NAME = 'flujo';

/** The ids a span carries as `flujo.*` attributes; a nested span inherits its parent's. */
export interface SpanIds {
  runId?: string;
  stepId?: string;
  attempt?: number;
  turn?: number;
}

/** Span attribute names of the runtime's own ids and verdicts. */
export const Attr = {
  runId: 'flujo.run_id',
  stepId: 'flujo.step_id',
  attempt: 'flujo.attempt',
  turn: 'flujo.turn',
  outcome: 'flujo.outcome',
  toolVerdict: 'flujo.tool.verdict',
} as const;

interface Scope {
  ctx: Context;
  ids: SpanIds;
}

const current = new AsyncLocalStorage<Scope>();

/**
 * The registered SDK's tracer, or undefined while none is registered (the API then hands out its
 * proxy): without one, a span costs this check and nothing else.
 */
function sdkTracer(): Tracer | undefined {
  const tracer = trace.getTracerProvider().getTracer(TRACER_NAME);
  return tracer instanceof ProxyTracer ? undefined : tracer;
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** The OpenTelemetry context whose remote parent is the span `traceparent` names. */
function remoteParent(traceparent: string): Context | undefined {
  const m = TRACEPARENT.exec(traceparent);
  if (m === null) return undefined;
  const spanContext = {
    traceId: m[1]!,
    spanId: m[2]!,
    traceFlags: Number.parseInt(m[3]!, 16),
    isRemote: true,
  };
  if (!isSpanContextValid(spanContext)) return undefined;
  return trace.setSpanContext(ROOT_CONTEXT, spanContext);
}

function idAttributes(ids: SpanIds): Attributes {
  const out: Attributes = {};
  if (ids.runId !== undefined) out[Attr.runId] = ids.runId;
  if (ids.stepId !== undefined) out[Attr.stepId] = ids.stepId;
  if (ids.attempt !== undefined) out[Attr.attempt] = ids.attempt;
  if (ids.turn !== undefined) out[Attr.turn] = ids.turn;
  return out;
}

// Random bytes drawn a page at a time: ids are made at every start, and one call for a page costs
// about what one call for a single id does.
let randomPage = Buffer.alloc(0);
let randomAt = 0;

/** `bytes` fresh random bytes, in hex. */
function randomHex(bytes: number): string {
  if (randomAt + bytes > randomPage.length) {
    randomPage = randomBytes(4096);
    randomAt = 0;
  }
  const hex = randomPage.toString('hex', randomAt, randomAt + bytes);
  randomAt += bytes;
  return hex;
}

/** The `traceparent` of a span context, or of fresh random ids when it is not valid. */
function traceparentOf(span: Span | undefined): string {
  const sc = span?.spanContext();
  if (sc !== undefined && isSpanContextValid(sc)) {
    return `00-${sc.traceId}-${sc.spanId}-${sc.traceFlags.toString(16).padStart(2, '0')}`;
  }
  // No SDK here: the run still gets ids, so that workers with an SDK share one trace.
  const flags = TraceFlags.SAMPLED.toString(16).padStart(2, '0');
  return `00-${randomHex(16)}-${randomHex(8)}-${flags}`;
}

/** The start of a run's trace: its `traceparent` to store with the run, and its span to end. */
export interface RunTraceStart {
  traceparent: string;
  end(error?: unknown): void;
}

/**
 * Starts the `flujo.run` span of a new run (a child of the caller's active span, if any) and
 * returns the `traceparent` every later span of the run descends from. The span covers the start
 * itself; the run's work is in its descendants.
 */
export function startRunTrace(runId: string, attributes: Attributes = {}): RunTraceStart {
  const span = sdkTracer()?.startSpan(
    'flujo.run',
    { kind: SpanKind.INTERNAL, attributes: { [Attr.runId]: runId, ...attributes } },
    otelContext.active(),
  );
  return {
    traceparent: traceparentOf(span),
    end: (error) => {
      if (span === undefined) return;
      if (error !== undefined) fail(span, error);
      span.end();
    },
  };
}

/** How {@link traced} starts and ends its span. */
export interface TracedOptions<T> {
  /** The run's `traceparent`: the span is a child of the run, not of the current span. */
  trace?: string | null | undefined;
  /** Ids added to (and overriding) those the current span carries. */
  ids?: SpanIds;
  attributes?: Attributes;
  kind?: SpanKind;
  /** Attributes (and an error status) from the result, set before the span ends. */
  end?: (result: T, span: Span) => void;
  /**
   * Attributes from a thrown error, set before the span ends with an error status; returning
   * false ends it without one (a throw that is not a failure, e.g. a pause for approval).
   */
  error?: (error: unknown, span: Span) => boolean | void;
}

function fail(span: Span, error: unknown): void {
  const message = error instanceof Error ? error.message : String(error);
  if (error instanceof Error) span.recordException(error);
  span.setStatus({ code: SpanStatusCode.ERROR, message });
}

/**
 * Runs `fn` in a span named `name`: a child of the run (with `options.trace`), else of the
 * current span, else of the active OpenTelemetry context. Ends the span when `fn` settles; a
 * throw sets an error status and is rethrown.
 */
export function traced<T>(
  name: string,
  options: TracedOptions<T>,
  fn: () => Promise<T>,
): Promise<T> {
  const tracer = sdkTracer();
  return tracer === undefined ? fn() : inSpan(tracer, name, options, fn);
}

async function inSpan<T>(
  tracer: Tracer,
  name: string,
  options: TracedOptions<T>,
  fn: () => Promise<T>,
): Promise<T> {
  const outer = current.getStore();
  const run =
    options.trace === undefined || options.trace === null ? undefined : remoteParent(options.trace);
  const parent = run ?? outer?.ctx ?? otelContext.active();
  const ids: SpanIds = {
    ...(run === undefined ? outer?.ids : undefined),
    ...options.ids,
  };
  const span = tracer.startSpan(
    name,
    {
      kind: options.kind ?? SpanKind.INTERNAL,
      attributes: { ...idAttributes(ids), ...options.attributes },
    },
    parent,
  );
  const ctx = trace.setSpan(parent, span);
  let result: T;
  try {
    result = await current.run({ ctx, ids }, () => otelContext.with(ctx, fn));
  } catch (error) {
    if (options.error?.(error, span) !== false) fail(span, error);
    span.end();
    throw error;
  }
  options.end?.(result, span);
  span.end();
  return result;
}

/** Sets the error status of `span` with `message` (for a result that stands for a failure). */
export function markFailed(span: Span, message: string): void {
  span.setStatus({ code: SpanStatusCode.ERROR, message });
}

export { SpanKind };
