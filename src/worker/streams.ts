import { toFlujoError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import type { StepStatus } from '../machines/types.js';
import { decodeEvent, type StoredRunEvent } from '../persistence/snapshot-store.js';
import type { StreamEntry } from '../persistence/stream-watcher.js';
import type { SerializedError } from '../errors.js';
import type { StepOutcome } from '../schemas/outcomes.js';
import type { RuntimeCore } from '../actors/core.js';

/** Options of a stream read. */
export interface StreamOptions {
  /** Start after this stream id. @defaultValue the beginning */
  after?: string;
  /** Keep reading new events until the run ends (a `run.finished` event) or `signal` aborts. */
  follow?: boolean;
  signal?: AbortSignal;
}

/** The steps whose output a run summary names instead of carrying (null in `produced`). */
function refsOf(e: StoredRunEvent): string[] {
  const produced = e.data['produced'] as Record<string, unknown> | undefined;
  return Object.keys(produced ?? {}).filter((id) => produced?.[id] === null);
}

/**
 * Puts back the step outputs that the stream names instead of carrying them (a large output is
 * stored once, in the run's outputs): a reader sees each event as it was committed. With
 * `produced` false, those of a `run.finished` event are left as references (a reader of outcomes
 * does not use them).
 */
async function withOutputs(
  core: RuntimeCore,
  runId: string,
  batch: StoredRunEvent[],
  produced = true,
): Promise<StoredRunEvent[]> {
  const wanted = new Set<string>();
  for (const e of batch) {
    const ref = e.data['outputRef'];
    if (e.type === 'step.succeeded' && typeof ref === 'string') wanted.add(ref);
    if (produced && e.type === 'run.finished' && e.data['producedRefs'] === true) {
      for (const id of refsOf(e)) wanted.add(id);
    }
  }
  if (wanted.size === 0) return batch;
  const outputs = await core.stores.store.readOutputs(runId, [...wanted]);
  // An output no longer stored (removed by retention meanwhile) stays a reference.
  return batch.map((e) => {
    const { outputRef, producedRefs, ...data } = e.data;
    if (e.type === 'step.succeeded' && typeof outputRef === 'string' && outputRef in outputs) {
      return { ...e, data: { ...data, output: outputs[outputRef] } };
    }
    if (produced && e.type === 'run.finished' && producedRefs === true) {
      const produced = { ...(data['produced'] as Record<string, unknown>) };
      // Not stored: the step produced nothing (or the run was removed meanwhile).
      for (const id of refsOf(e)) {
        if (id in outputs) produced[id] = outputs[id];
        else delete produced[id];
      }
      return { ...e, data: { ...data, produced } };
    }
    return e;
  });
}

/** A run's events in commit order; with `follow`, waits for new ones (see `StreamWatcher`). */
export async function* eventsOf(
  core: RuntimeCore,
  runId: string,
  options: StreamOptions = {},
  produced = true,
): AsyncGenerator<StoredRunEvent> {
  const { after } = options;
  // A run that does not exist is an error, not an empty stream.
  if ((await core.stores.store.version(runId)) === null) throw await core.stores.notFound(runId);
  const stored = await withOutputs(
    core,
    runId,
    await core.stores.store.readEvents(runId, after === undefined ? {} : { after }),
    produced,
  );
  let last = after;
  for (const e of stored) {
    yield e;
    last = e.id;
    if (e.type === 'run.finished' && options.follow === true) return;
  }
  if (options.follow !== true || options.signal?.aborted === true) return;
  yield* newEvents(core, runId, last ?? '0-0', options.signal, produced);
}

/**
 * The events of a run after `after`, as they are committed, until `run.finished`, `signal` aborts
 * or the watcher closes. The watcher's read hands each batch of new entries over as it read them
 * (one `XREAD` serves every follower of the runtime, each given what is new to it), so a follower
 * reads nothing again; only outputs stored apart are read, for the batch that names them.
 */
async function* newEvents(
  core: RuntimeCore,
  runId: string,
  after: string,
  signal: AbortSignal | undefined,
  produced: boolean,
): AsyncGenerator<StoredRunEvent> {
  const pending: StreamEntry[][] = [];
  let closed = false;
  let wake: (() => void) | undefined;
  const poke = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const stop = () => {
    closed = true;
    poke();
  };
  const unwatch = core.queues.watcher().watch(
    core.stores.keys.events(runId),
    after,
    (entries) => {
      pending.push(entries);
      poke();
    },
    stop,
  );
  signal?.addEventListener('abort', stop, { once: true });
  try {
    for (;;) {
      for (let entries = pending.shift(); entries !== undefined; entries = pending.shift()) {
        const decoded = entries.map(([id, flat]) => decodeEvent(runId, id, flat));
        for (const e of await withOutputs(core, runId, decoded, produced)) {
          yield e;
          if (e.type === 'run.finished') return;
        }
      }
      if (closed || signal?.aborted === true) return;
      await new Promise<void>((resolve) => {
        wake = resolve;
      });
    }
  } finally {
    unwatch();
    signal?.removeEventListener('abort', stop);
  }
}

interface Changed {
  stepId: string;
  from: StepStatus;
  to: StepStatus;
  attempt: number;
  at: number;
}

/**
 * A run's typed outcomes, derived from its events: `Success` for each attempt that finished,
 * `Failure` for each that failed (final or not), `Paused` when a step waits for approval,
 * `Aborted` when the run is cancelled or stopped. With `follow`, also `Chunk` for each piece of a
 * streaming agent's reply as it arrives (live only: chunks are never stored, the final message is).
 */
export async function* outcomesOf(
  core: RuntimeCore,
  runId: string,
  options: StreamOptions = {},
): AsyncGenerator<StepOutcome> {
  if (options.follow !== true) {
    yield* storedOutcomes(core, runId, options);
    return;
  }
  // Two sources, one sequence: the stored outcomes as they are committed, and the live chunks.
  const queue = new OutcomeQueue();
  const stop = new AbortController();
  const signal =
    options.signal === undefined ? stop.signal : AbortSignal.any([options.signal, stop.signal]);
  const unsubscribe = await core.queues.subscribeChunks(runId, (message) => {
    const chunk = parseChunk(runId, message);
    if (chunk !== null) queue.push(chunk);
  });
  const pump = (async () => {
    try {
      for await (const outcome of storedOutcomes(core, runId, { ...options, signal })) {
        queue.push(outcome);
      }
      queue.end();
    } catch (error) {
      queue.fail(error);
    }
  })();
  try {
    for (;;) {
      const next = await queue.next();
      if (next === null) break;
      yield next;
    }
  } finally {
    unsubscribe();
    stop.abort();
    await pump;
  }
}

/** A chunk message published by a worker, as a `Chunk` outcome; null when it is not one. */
function parseChunk(runId: string, message: string): StepOutcome | null {
  let c: Record<string, unknown>;
  try {
    c = JSON.parse(message) as Record<string, unknown>;
  } catch {
    return null;
  }
  if (c['runId'] !== runId || typeof c['text'] !== 'string') return null;
  return {
    type: 'chunk',
    runId,
    stepId: String(c['stepId']),
    attempt: Number(c['attempt']),
    seq: Number(c['seq']),
    data: { turn: Number(c['turn']), text: c['text'] },
    at: Number(c['at']),
  };
}

/** Outcomes handed from two producers to one consumer, in arrival order. */
class OutcomeQueue {
  readonly #items: StepOutcome[] = [];
  #waiter: ((value: StepOutcome | null) => void) | undefined;
  #failed: ((error: unknown) => void) | undefined;
  #ended = false;
  #error: unknown;

  push(item: StepOutcome): void {
    if (this.#ended) return;
    const waiter = this.#waiter;
    this.#waiter = undefined;
    this.#failed = undefined;
    if (waiter !== undefined) waiter(item);
    else this.#items.push(item);
  }

  end(): void {
    this.#ended = true;
    const waiter = this.#waiter;
    this.#waiter = undefined;
    waiter?.(null);
  }

  fail(error: unknown): void {
    this.#error = error;
    this.#ended = true;
    const failed = this.#failed;
    this.#waiter = undefined;
    this.#failed = undefined;
    failed?.(error);
  }

  next(): Promise<StepOutcome | null> {
    const item = this.#items.shift();
    if (item !== undefined) return Promise.resolve(item);
    if (this.#error !== undefined) {
      const error = this.#error;
      return Promise.reject(toFlujoError(error));
    }
    if (this.#ended) return Promise.resolve(null);
    return new Promise((resolve, reject) => {
      this.#waiter = resolve;
      this.#failed = reject;
    });
  }
}

/** The outcomes a run's stored events stand for. */
async function* storedOutcomes(
  core: RuntimeCore,
  runId: string,
  options: StreamOptions,
): AsyncGenerator<StepOutcome> {
  let lastError: SerializedError | null = null;
  // The outputs a run's summary names are not outcomes: not read.
  for await (const e of eventsOf(core, runId, options, false)) {
    const d = e.data as Record<string, unknown>;
    const at = Number(d['at'] ?? 0);
    switch (e.type) {
      case 'step.succeeded':
        yield {
          type: 'success',
          runId,
          stepId: String(d['stepId']),
          attempt: Number(d['attempt']),
          output: d['output'] as JsonValue,
          ...(d['producedBy'] === 'primary' || d['producedBy'] === 'fallback'
            ? { producedBy: d['producedBy'] }
            : {}),
          at,
        };
        break;
      case 'step.failed':
        lastError = d['error'] as SerializedError;
        break;
      case 'step.changed': {
        const c = d as unknown as Changed;
        const ran = c.from === 'RUNNING' || c.from === 'READY';
        if ((c.to === 'FAILED_RETRYABLE' || c.to === 'FAILED_FINAL') && ran) {
          const error = lastError ?? {
            name: 'StepFailed',
            code: 'step_failed',
            message: 'failed',
            retryable: false,
          };
          yield {
            type: 'failure',
            runId,
            stepId: c.stepId,
            attempt: c.attempt,
            error,
            feedback: `${error.name}: ${error.message}`,
            final: c.to === 'FAILED_FINAL',
            at,
          };
        } else if (c.to === 'READY' && ran && lastError !== null) {
          // The primary failed finally and the step's fallback is the next attempt.
          yield {
            type: 'failure',
            runId,
            stepId: c.stepId,
            attempt: c.attempt - 1,
            error: lastError,
            feedback: `${lastError.name}: ${lastError.message}`,
            final: false,
            at,
          };
        } else if (c.to === 'FAILED_FINAL' && c.from === 'WAITING_APPROVAL') {
          yield {
            type: 'aborted',
            runId,
            stepId: c.stepId,
            reason: 'approval_rejected',
            at,
          };
        } else if (c.to === 'WAITING_APPROVAL') {
          yield {
            type: 'paused',
            runId,
            stepId: c.stepId,
            message: `step "${c.stepId}" waits for approval`,
            at,
          };
        }
        break;
      }
      case 'run.cancelled':
      case 'run.stopped':
        yield {
          type: 'aborted',
          runId,
          reason: e.type === 'run.cancelled' ? 'run_cancelled' : String(d['reason']),
          ...(typeof d['reason'] === 'string' && e.type === 'run.cancelled'
            ? { message: d['reason'] }
            : {}),
          at,
        };
        break;
      default:
        break;
    }
  }
}
