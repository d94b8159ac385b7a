import { InputValidationError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import { PlanCache } from '../plan/plan-cache.js';
import type { Plan } from '../plan/schema.js';
import type { RunCacheOptions } from '../execution/step-cache.js';
import { replayOriginOf, type ReplayOrigin } from '../execution/replay-calls.js';
import type { RuntimeStores } from './runtime-stores.js';
import type { EndedStatus } from '../persistence/run-end.js';

const ENDED_STATUSES: ReadonlySet<string> = new Set(['succeeded', 'failed', 'cancelled']);

/** What a run was started with, as stored beside it. */
export interface RunMeta {
  plan: Plan;
  input: JsonValue;
  tenantId: string;
  requestKey: string | null;
  /** The run's trace context (a W3C `traceparent`), or null for a run started without one. */
  trace: string | null;
  /**
   * The span the run's span is recorded under when the run ends ('' for none); null when its
   * span was recorded at its start.
   */
  traceCaller: string | null;
  createdAt: number;
  /** What the start said about cached step outputs. */
  cache: RunCacheOptions;
  /** What the run replays, when it is a replay of another run. */
  replay: ReplayOrigin | null;
  /**
   * The BullMQ queue the run's units go to, as recorded when it was created; null for a run
   * created before runs recorded one (its units go to the queue of the runtime that adds them).
   */
  queue: string | null;
  /**
   * The run's priority as the start gave it (see `StartOptions.priority`: higher goes first);
   * 0 for a run started without one. Every job of the run's units is added with it.
   */
  priority: number;
  /** The singleton key the run holds (see `StartOptions.singleton`), released when it ends. */
  singleton: string | null;
  /** For a child run (started by a `run` step): the parent run, its step and that step's attempt. */
  parent: RunParent | null;
}

/**
 * The run and step (attempt) that started a child run. For the child of an item of a map step,
 * `stepId` is the item's id (`<map>.<index>`), `attempt` the map's attempt and `itemAttempt` the
 * item's attempt.
 */
export interface RunParent {
  runId: string;
  stepId: string;
  attempt: number;
  itemAttempt?: number;
}

/** The meta fields that link a child run to its parent (see {@link RunParent}). */
export function parentFields(parent: RunParent): Record<string, string> {
  return {
    parentRunId: parent.runId,
    parentStepId: parent.stepId,
    parentAttempt: String(parent.attempt),
    ...(parent.itemAttempt === undefined ? {} : { parentItemAttempt: String(parent.itemAttempt) }),
  };
}

/** The parent a run's stored meta names, or null. */
export function parentOf(raw: Readonly<Record<string, string>>): RunParent | null {
  const runId = raw['parentRunId'];
  const stepId = raw['parentStepId'];
  if (runId === undefined || stepId === undefined) return null;
  const attempt = Number(raw['parentAttempt'] ?? 1);
  const item = raw['parentItemAttempt'];
  return { runId, stepId, attempt, ...(item === undefined ? {} : { itemAttempt: Number(item) }) };
}

/**
 * The meta field of a parent that records the child of attempt `attempt` of run step `stepId` (for
 * a map's item: attempt `attempt` of item `<map>.<index>`).
 */
export const childField = (stepId: string, attempt: number): string => `child:${stepId}:${attempt}`;

/** The children a parent's stored meta records, in step then attempt order. */
export function childrenOf(
  raw: Readonly<Record<string, string>>,
): { stepId: string; attempt: number; runId: string }[] {
  const out: { stepId: string; attempt: number; runId: string }[] = [];
  for (const [field, runId] of Object.entries(raw)) {
    if (!field.startsWith('child:')) continue;
    const at = field.lastIndexOf(':');
    out.push({ stepId: field.slice(6, at), attempt: Number(field.slice(at + 1)), runId });
  }
  return out.sort((a, b) =>
    a.stepId === b.stepId ? a.attempt - b.attempt : a.stepId < b.stepId ? -1 : 1,
  );
}

/** The metas kept at most (one per run): more runs at once than this read theirs again. */
const META_CACHE_MAX = 1024;

/**
 * The runs' metadata: what each run was started with (read once per process and kept, as it
 * never changes), the plans parsed here, and the expiry of a run's keys that follows from its
 * meta when it ends or is resumed.
 */
export class RuntimeMeta {
  /** Plans parsed by this process (started here, or read back from a run's meta), by their text. */
  readonly plans = new PlanCache(1000);
  readonly #metaCache = new Map<string, RunMeta>();
  readonly #metaLoads = new Map<string, Promise<RunMeta>>();
  readonly #stores: RuntimeStores;
  readonly #tenantId: string;

  /** `tenantId` is the tenant of a run whose meta names none. */
  constructor(stores: RuntimeStores, tenantId: string) {
    this.#stores = stores;
    this.#tenantId = tenantId;
  }

  /** How many runs' metas are kept now. @internal */
  get kept(): number {
    return this.#metaCache.size;
  }

  /** The run's plan, input and tenant (cached, the newest {@link META_CACHE_MAX}: they never change). */
  async read(runId: string): Promise<RunMeta> {
    const cached = this.#metaCache.get(runId);
    if (cached !== undefined) return cached;
    // One read for the callers that ask at once (a unit's guard and a status report, say).
    let loading = this.#metaLoads.get(runId);
    if (loading === undefined) {
      loading = this.#stores.store
        .loadMeta(runId)
        .then((raw) => {
          if (raw['plan'] === undefined) {
            throw new InputValidationError('run meta', [
              { path: 'plan', message: `run "${runId}" has no stored plan` },
            ]);
          }
          return this.remember(runId, raw, this.plans.parse(raw['plan']));
        })
        .finally(() => this.#metaLoads.delete(runId));
      this.#metaLoads.set(runId, loading);
    }
    return loading;
  }

  /**
   * Keeps the meta of a run as stored (`raw`, its fields), with its plan parsed: what {@link read}
   * reads back, kept by the process that started the run so that its workers need not read it.
   */
  remember(runId: string, raw: Readonly<Record<string, string>>, plan: Plan): RunMeta {
    const meta: RunMeta = {
      plan,
      input: JSON.parse(raw['input'] ?? 'null') as JsonValue,
      tenantId: raw['tenantId'] ?? this.#tenantId,
      requestKey: raw['requestKey'] ?? null,
      trace: raw['trace'] ?? null,
      traceCaller: raw['traceCaller'] ?? null,
      createdAt: Number(raw['createdAt'] ?? 0),
      cache: {
        allowCacheHit: raw['allowCacheHit'] === '1',
        refresh: raw['refreshCache'] === '1',
      },
      replay: replayOriginOf(raw),
      queue: raw['queue'] ?? null,
      priority: Number(raw['priority'] ?? 0) || 0,
      singleton: raw['singleton'] ?? null,
      parent: parentOf(raw),
    };
    // The oldest goes first: a process that starts runs and never sees them end (no worker of
    // its own) holds as many as a process that runs them, not one per run it ever started.
    if (this.#metaCache.size >= META_CACHE_MAX) {
      this.#metaCache.delete(this.#metaCache.keys().next().value!);
    }
    this.#metaCache.set(runId, meta);
    return meta;
  }

  /**
   * Settles the usage reservations a run that succeeded or failed left open (a worker that died
   * mid-call), when its end finds some (set by the runtime core: its usage meter).
   */
  settleOpen: ((runId: string, meta: RunMeta) => Promise<void>) | undefined;

  /**
   * A run that ended (succeeded, failed, cancelled: `status`, as the caller's snapshot says): its
   * singleton key (if it holds one) is released first, then its keys get their expiry (none for a
   * failed run without `retention.failedRunsMs`: it is kept until resumed), it leaves the active runs either
   * way (a failed run that is resumed joins them again), noted among the runs that ended lately,
   * its end is noted in the run list, and the reservations it left open are settled (none in the
   * common case). Two round trips (`persistence/run-end.ts`, which says what a crash between
   * them leaves): a redelivered job or the next sweep comes here again and finishes the job.
   */
  async ended(runId: string, status: string): Promise<void> {
    const meta = await this.read(runId);
    // Its singleton key is free for the next start; before it leaves the active runs, so that a
    // crash in between is finished by a sweep (and a start that finds the holder ended clears it).
    if (meta.singleton !== null && ENDED_STATUSES.has(status)) {
      await this.#stores.singletons.release(meta.tenantId, meta.singleton, runId);
    }
    if (!ENDED_STATUSES.has(status)) {
      // Not a status a run ends with: only the active runs are told.
      await this.#stores.activeRuns.ended(runId);
      return;
    }
    const { open } = await this.#stores.runEnd.end(
      runId,
      {
        tenantId: meta.tenantId,
        stepIds: meta.plan.steps.map((s) => s.id),
        mapStepIds: meta.plan.steps.filter((s) => s.kind === 'map').map((s) => s.id),
        requestKey: meta.requestKey === '' ? null : meta.requestKey,
      },
      status as EndedStatus,
    );
    if (open.length > 0 && status !== 'cancelled') await this.settleOpen?.(runId, meta);
    // Its units are done: a late one reads the meta again.
    this.#metaCache.delete(runId);
  }

  /** A resumed run: it keeps its keys again (no expiry). */
  async resumed(runId: string): Promise<void> {
    const meta = await this.read(runId);
    await this.#stores.retention.keep(runId, {
      tenantId: meta.tenantId,
      stepIds: meta.plan.steps.map((s) => s.id),
      mapStepIds: meta.plan.steps.filter((s) => s.kind === 'map').map((s) => s.id),
      requestKey: meta.requestKey === '' ? null : meta.requestKey,
    });
  }
}
