/**
 * OpenTelemetry spans of a run, through `@opentelemetry/api` only: the application registers an
 * SDK and an exporter; without one every span is the API's no-op span.
 *
 * A run has one trace across the workers and processes that work on it. Its trace context (a W3C
 * `traceparent`: trace id and the id of the `flujo.run` span) is made when the run starts and
 * stored with the run; every span of a step attempt or a granular turn uses it as a remote parent,
 * and the spans inside (turns, model calls, tool calls) nest under the span that is current.
 * What outlives a process (the run itself, a wait for a person, a retry's backoff) is recorded
 * after the fact, with its start and end times from the run's committed facts, by the process
 * that commits its end.
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
  type SpanOptions,
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
  /**
   * Where the `flujo.run` span is recorded: null when it was recorded at the start (it covers the
   * start only: the SDK chose its own ids); else it is recorded when the run ends, under the span
   * this `traceparent` names ('' for none: the run span is the root of its trace). Stored with the
   * run, so that the process that commits the run's end can record it.
   */
  caller: string | null;
  end(error?: unknown): void;
}

/** Ids the next span this process starts must take (see {@link runSpanIdGenerator}). */
let pinned: { traceId: string; spanId: string } | undefined;

/** The id generator of an OpenTelemetry SDK's tracer provider (its `idGenerator` option). */
export interface SpanIdGenerator {
  /** A new trace id: 32 hex digits. */
  generateTraceId(): string;
  /** A new span id: 16 hex digits. */
  generateSpanId(): string;
}

/**
 * An id generator for the tracer provider of an OpenTelemetry SDK (`new NodeTracerProvider({
 * idGenerator: runSpanIdGenerator() })`): random ids, but for a `flujo.run` span, which takes the
 * ids chosen when its run started. With it, a run's span is recorded when the run ends and covers
 * the run from its start to its end (the run's other spans are its children); without it, the run
 * span is recorded when the run starts and covers only the start.
 */
export function runSpanIdGenerator(): SpanIdGenerator {
  return {
    generateTraceId: () => pinned?.traceId ?? randomHex(16),
    generateSpanId: () => pinned?.spanId ?? randomHex(8),
  };
}

/** Starts a span that should take `ids`; `pinned` says whether the SDK gave it those ids. */
function startPinned(
  tracer: Tracer,
  name: string,
  options: SpanOptions,
  parent: Context,
  ids: { traceId: string; spanId: string },
): { span: Span; pinned: boolean } {
  pinned = ids;
  let span: Span;
  try {
    span = tracer.startSpan(name, options, parent);
  } finally {
    pinned = undefined;
  }
  const sc = span.spanContext();
  return { span, pinned: sc.traceId === ids.traceId && sc.spanId === ids.spanId };
}

const flagsHex = (flags: number): string => flags.toString(16).padStart(2, '0');

/**
 * Chooses the trace context of a new run (its trace id is the caller's, when the caller's active
 * span is valid) and returns the `traceparent` every later span of the run descends from. The
 * `flujo.run` span with those ids is recorded when the run ends, by the process that commits the
 * end ({@link recordRunSpan}), if its SDK lets a span take chosen ids ({@link runSpanIdGenerator});
 * if the SDK here does not, the span is recorded now, with the ids the SDK gave it, and covers the
 * start only.
 */
export function startRunTrace(runId: string, attributes: Attributes = {}): RunTraceStart {
  const tracer = sdkTracer();
  const parent = otelContext.active();
  const callerContext = trace.getSpanContext(parent);
  const caller =
    callerContext !== undefined && isSpanContextValid(callerContext) ? callerContext : undefined;
  const ids = { traceId: caller?.traceId ?? randomHex(16), spanId: randomHex(8) };
  let flags = caller?.traceFlags ?? TraceFlags.SAMPLED;
  if (tracer !== undefined) {
    const started = startPinned(
      tracer,
      'flujo.run',
      { kind: SpanKind.INTERNAL, attributes: { [Attr.runId]: runId, ...attributes } },
      parent,
      ids,
    );
    const { span } = started;
    if (!started.pinned) {
      return {
        traceparent: traceparentOf(span),
        caller: null,
        end: (error) => {
          if (error !== undefined) fail(span, error);
          span.end();
        },
      };
    }
    // The SDK takes chosen ids: this span only asked for the sampling decision, and is dropped
    // unended (never exported); the run's span is recorded when the run ends.
    flags = span.spanContext().traceFlags;
  }
  return {
    traceparent: `00-${ids.traceId}-${ids.spanId}-${flagsHex(flags)}`,
    caller: caller === undefined ? '' : `00-${caller.traceId}-${caller.spanId}-${flagsHex(flags)}`,
    end: () => {},
  };
}

// Spans recorded after the fact wait for a read of the run's meta: a process that shuts its SDK
// down awaits them first ({@link spansRecorded}).
const recording = new Set<Promise<void>>();

/** Runs `record` (which records spans) and keeps its promise until it settles. @internal */
export function recordLater(record: Promise<void>): void {
  const p = record.catch(() => {}).finally(() => recording.delete(p));
  recording.add(p);
}

/** Resolves when the spans this process is about to record (a run's end, a wait) are recorded. */
export async function spansRecorded(): Promise<void> {
  while (recording.size > 0) await Promise.all(recording);
}

/** True when an SDK is registered: spans are recorded. @internal */
export function tracingEnabled(): boolean {
  return sdkTracer() !== undefined;
}

/** What a run came to, for its span (see {@link recordRunSpan}). */
export interface RunSpanFacts {
  runId: string;
  /** The run's `traceparent` and its caller, as {@link startRunTrace} returned them. */
  traceparent: string;
  caller: string;
  /** Epoch ms. */
  start: number;
  end: number;
  status: string;
  attributes?: Attributes;
}

/**
 * Records the `flujo.run` span of a run that ended, from its start to its end, with the ids its
 * start chose (so the run's spans are its children). Records nothing without an SDK, or when the
 * SDK gives spans ids of its own (the span would be no one's parent).
 */
export function recordRunSpan(facts: RunSpanFacts): void {
  const tracer = sdkTracer();
  const m = TRACEPARENT.exec(facts.traceparent);
  if (tracer === undefined || m === null) return;
  const parent = facts.caller === '' ? ROOT_CONTEXT : (remoteParent(facts.caller) ?? ROOT_CONTEXT);
  const { span, pinned: tookIds } = startPinned(
    tracer,
    'flujo.run',
    {
      kind: SpanKind.INTERNAL,
      startTime: facts.start,
      attributes: {
        [Attr.runId]: facts.runId,
        ...facts.attributes,
        'flujo.run.status': facts.status,
      },
    },
    parent,
    { traceId: m[1]!, spanId: m[2]! },
  );
  if (!tookIds) return;
  if (facts.status === 'failed') markFailed(span, 'the run failed');
  span.end(facts.end);
}

/** A wait of a run (for a person's decision, or a retry's backoff), with its times. */
export interface WaitSpanFacts {
  name: string;
  traceparent: string;
  ids: SpanIds;
  /** Epoch ms. */
  start: number;
  end: number;
  attributes?: Attributes;
}

/** Records a span of a wait that ended, a child of the run's span, from its start to its end. */
export function recordWaitSpan(facts: WaitSpanFacts): void {
  const tracer = sdkTracer();
  const parent = remoteParent(facts.traceparent);
  if (tracer === undefined || parent === undefined) return;
  const span = tracer.startSpan(
    facts.name,
    {
      kind: SpanKind.INTERNAL,
      startTime: facts.start,
      attributes: { ...idAttributes(facts.ids), ...facts.attributes },
    },
    parent,
  );
  span.end(Math.max(facts.start, facts.end));
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
