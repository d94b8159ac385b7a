/**
 * Debounced starts (`start(…, { debounce: { key, delayMs, maxDelayMs } })`): a burst of starts of
 * one key, each within `delayMs` of the one before, becomes one run with the last start's input,
 * started `delayMs` after the last start, or `maxDelayMs` after the first when the burst goes on
 * that long. Every start of a burst returns the burst's run id (random, chosen by its first start).
 * See `worker/debounce-job.ts` for the job that starts the run.
 */
import { randomUUID } from 'node:crypto';
import type { RuntimeCore } from '../actors/core.js';
import { InputValidationError } from '../errors.js';
import type { Plan, PlanInput } from '../plan/schema.js';
import { addDebounceJob, type DebouncedStart } from '../worker/debounce-job.js';
import { checkStart, type StartOptions } from '../worker/start-run.js';

/** `start(…, { debounce })`: a burst of starts of one key becomes one run. */
export interface DebounceOptions {
  /** The key (1 to 512 characters), per tenant. */
  key: string;
  /** The quiet time (ms, 1 to 86 400 000) after a burst's last start before its run starts. */
  delayMs: number;
  /**
   * The longest a burst postpones its run, from its first start (ms, at least `delayMs`, at most
   * 86 400 000). @defaultValue no cap
   */
  maxDelayMs?: number;
}

/** The longest delay a debounce takes: a day. */
const MAX_DELAY_MS = 86_400_000;

/** What a debounced start returns beside its run id. */
export interface DebounceInfo {
  key: string;
  /** When the burst's run is due to start, as this start left it (later starts may push it back). */
  dueAt: number;
  /** True for the start that opened the burst. */
  first: boolean;
}

/** Checks `debounce` (a start's option), naming the field of each problem. */
export function checkDebounce(value: unknown): DebounceOptions {
  const issues: { path: string; message: string }[] = [];
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new InputValidationError('start options', [
      {
        path: 'debounce',
        message: `must be an object { key, delayMs, maxDelayMs? }, e.g. { key: "inbox-42", delayMs: 300 }, got ${JSON.stringify(value)}`,
      },
    ]);
  }
  const o = value as Partial<DebounceOptions>;
  if (typeof o.key !== 'string' || o.key.length === 0 || o.key.length > 512) {
    issues.push({
      path: 'debounce.key',
      message: `must be a string of 1 to 512 characters, got ${JSON.stringify(o.key)}`,
    });
  }
  const ms = (v: unknown) =>
    typeof v === 'number' && Number.isInteger(v) && v >= 1 && v <= MAX_DELAY_MS;
  if (!ms(o.delayMs)) {
    issues.push({
      path: 'debounce.delayMs',
      message: `must be a whole number of ms from 1 to ${MAX_DELAY_MS}, got ${JSON.stringify(o.delayMs) ?? String(o.delayMs)}`,
    });
  }
  if (o.maxDelayMs !== undefined && (!ms(o.maxDelayMs) || o.maxDelayMs < (o.delayMs ?? 0))) {
    issues.push({
      path: 'debounce.maxDelayMs',
      message: `must be a whole number of ms from delayMs to ${MAX_DELAY_MS}, got ${JSON.stringify(o.maxDelayMs) ?? String(o.maxDelayMs)}`,
    });
  }
  if (issues.length > 0) throw new InputValidationError('start options', issues);
  return o as DebounceOptions;
}

/** Refuses start options a debounced start cannot honour (its run id is the burst's). */
export function checkDebouncedStart(opts: StartOptions & { signal?: unknown }): void {
  const refused = (['runId', 'requestKey', 'resumeFailed', 'signal'] as const).filter(
    (k) => opts[k] !== undefined,
  );
  if (refused.length === 0) return;
  throw new InputValidationError(
    'start options',
    refused.map((k) => ({
      path: k,
      message: `does not go with debounce: a burst's run gets the burst's own id, started by a worker when the burst ends`,
    })),
  );
}

/**
 * A debounced start: every check of a start first (a refused one writes nothing), then the start
 * joins its key's open burst (or opens one) and the burst's delayed job is added.
 */
export async function debounceStart(
  core: RuntimeCore,
  planSource: Plan | PlanInput | string,
  input: unknown,
  opts: StartOptions,
  debounce: DebounceOptions,
): Promise<{ runId: string; debounce: DebounceInfo }> {
  const checked = checkStart(core, planSource, input, opts);
  const options: StartOptions = { ...opts, tenantId: checked.tenantId, queue: checked.queue };
  const start: DebouncedStart = { plan: JSON.stringify(checked.plan), input, options };
  const newBurst = randomUUID();
  const pushed = await core.stores.debounces.push(checked.tenantId, debounce.key, {
    now: core.clock(),
    delayMs: debounce.delayMs,
    maxDelayMs: debounce.maxDelayMs ?? null,
    start: JSON.stringify(start),
    newBurst,
  });
  // Every start adds it (a no-op but the first): a start that died before adding it is healed.
  await addDebounceJob(
    core,
    checked.queue,
    { tenantId: checked.tenantId, key: debounce.key, burst: pushed.burst },
    pushed.due,
  );
  return {
    runId: pushed.burst,
    debounce: { key: debounce.key, dueAt: pushed.due, first: pushed.burst === newBurst },
  };
}
