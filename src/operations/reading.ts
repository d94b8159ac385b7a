/**
 * Reading runs: the status report, the stored snapshot, the ledger, the usage, the trace, and the
 * wait for a run to settle. Each a plain function of the runtime core; nothing here writes.
 */
import { liveWorkers, queueBeats } from '../worker/heartbeat.js';
import { summarize, type RunSummary } from '../actors/run-host.js';
import { actionScopesOf } from '../execution/action-keys.js';
import type { RuntimeCore } from '../actors/core.js';
import { RUN_WAIT_FIELD, type SlotWaitNote } from '../actors/concurrency.js';
import { slotWaitText } from '../plan/concurrency.js';
import { childrenOf, type RunMeta, type RunParent } from '../actors/runtime-meta.js';
import type { JsonValue } from '../internal/json.js';
import { runSteps, runStatus, type RunSnapshot, type StepState } from '../machines/kernel.js';
import type { PendingCall, RunStatus } from '../machines/types.js';
import { buildRunTrace, type RunTrace } from '../observability/run-trace.js';
import type { Plan } from '../plan/schema.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import { assertRunId } from '../persistence/keys.js';
import type { LedgerEntry } from '../persistence/ledger.js';
import type { Reservation, UsageTotals } from '../persistence/quota-store.js';
import { withRedisDeadline } from '../persistence/redis-errors.js';
import { lastStatusId, readRunStatus } from '../persistence/run-lookups.js';
import type { StreamEntry } from '../persistence/stream-watcher.js';
import { lineageFrom, replaysOf, type RunLineage } from '../worker/replay.js';
import { planStep as stepOfPlan } from '../plan/graph.js';

/** What a person is asked to decide on: a step's gate, or one tool call of the step. */
export interface PendingApproval {
  stepId: string;
  /** The step's `gate.reason`, if any. */
  reason: string | null;
  /** Who may decide (the gate's `approvers`); null when anyone may. */
  approvers: string[] | null;
  /** The step's risk level. */
  riskLevel: string;
  /** The tool call that waits, with its tool, arguments and call id; null for the step's gate. */
  call: PendingCall | null;
}

/** A wait step that waits: for a signal (and how many of its name are queued), or a time. */
export interface PendingWait {
  stepId: string;
  /** The signal it waits for; null for a timer. */
  signal: string | null;
  /** Signals of that name sent to the run and not taken yet (0 for a timer). */
  queued: number;
  /** When the timer fires, or a signal wait times out (epoch ms); null: never. */
  dueAt: number | null;
  /** When it started waiting (epoch ms). */
  since: number;
}

/** The waits of a run's WAITING steps, with the signals queued for each (one read). */
export async function pendingWaits(
  core: RuntimeCore,
  runId: string,
  snapshot: RunSnapshot,
  steps: readonly StepState[],
): Promise<PendingWait[]> {
  const waiting = steps.filter(
    (s) => s.status === 'WAITING' && s.wait !== undefined && s.wait !== null,
  );
  if (waiting.length === 0) return [];
  const names = [
    ...new Set(waiting.flatMap((s) => (s.wait!.signal === null ? [] : [s.wait!.signal]))),
  ];
  const counts = await core.stores.inbox.counts(runId, names);
  return waiting.map((s) => {
    const { signal, dueAt, since } = s.wait!;
    const queued =
      signal === null
        ? 0
        : Math.max(0, (counts[signal] ?? 0) - (snapshot.context.taken?.[signal] ?? 0));
    return { stepId: s.stepId, signal, queued, dueAt, since };
  });
}

/** A run as it stands. */
export interface RunReport {
  runId: string;
  planName: string;
  tenantId: string;
  status: RunStatus;
  /** The snapshot version (number of commits). */
  version: number;
  /**
   * Every step, in plan order. A READY step whose execution a worker has started shows RUNNING
   * (the start is committed with the execution's first result).
   */
  steps: StepState[];
  /** What waits for a person: one entry per step in WAITING_APPROVAL. */
  approvals: PendingApproval[];
  /** What waits for a signal or a time: one entry per step in WAITING. */
  waits: PendingWait[];
  summary: RunSummary;
  createdAt: number;
  updatedAt: number;
  /** Present when the run replays another or has replays: the run it replays and its replays. */
  lineage?: RunLineage;
  /**
   * Work that is due (a READY step, a retry whose time came) and that no worker has taken for
   * `IDLE_WORK_MS` or more: no worker is running on this prefix, or all are busy. Null
   * otherwise.
   */
  idle: { stepId: string; dueSince: number; idleMs: number } | null;
  /** The BullMQ queue the run's units go to (see `StartOptions.queue`). */
  queue: string;
  /**
   * Why a running run's due work may not be taken, when it may not: a worker put one of its units
   * back untried for want of its operator or agent (within the last 15 s), or
   * its queue has no live worker (with due work idle, see `idle`). Null otherwise.
   */
  routing: RunRouting | null;
  /** The latest progress each step's operator reported (`ctx.progress`), by step id. */
  progress: Record<string, StepProgress>;
  /**
   * The units of a running run that wait for a concurrency slot (a plan's `concurrency`: the run
   * waits, `stepId` null; a step's: that step), each with the words status shows, e.g.
   * `waiting for a concurrency slot of key customer=acme (limit 1)`. Empty when none waits.
   */
  concurrency?: ConcurrencyWait[];
  /** How far each map step that started has come, by step id (its latest attempt). */
  maps: Record<string, MapProgressReport>;
  /** For a child run (started by a `run` step): the run, step and attempt that started it. */
  parent: RunParent | null;
  /** The child runs its `run` steps started, by step then attempt, with their status. */
  children: RunChild[];
}

/** A unit waiting for a concurrency slot (see {@link RunReport.concurrency}). */
export interface ConcurrencyWait {
  /** The step whose limit it waits on, or null for the plan's (the run waits). */
  stepId: string | null;
  /** The key and its value, `customer=acme`. */
  key: string;
  limit: number;
  /** When it began to wait (epoch ms). */
  since: number;
  /** `waiting for a concurrency slot of key customer=acme (limit 1)`. */
  message: string;
}

/** The run's units waiting for a concurrency slot, from the run's notes. */
async function concurrencyWaits(core: RuntimeCore, runId: string): Promise<ConcurrencyWait[]> {
  const notes = await core.redis.hgetall(core.stores.keys.slotWaits(runId));
  return Object.entries(notes)
    .map(([field, raw]) => {
      const note = JSON.parse(raw) as SlotWaitNote;
      return {
        stepId: field === RUN_WAIT_FIELD ? null : field,
        key: note.label,
        limit: note.limit,
        since: note.since,
        message: slotWaitText(note),
      };
    })
    .sort((a, b) => a.since - b.since);
}

/** How far a map step has come: its items, those committed, failed and in flight. */
export interface MapProgressReport {
  /** The items of its latest attempt. */
  total: number;
  /** Items committed (with `itemFailures: 'collect'`, failed ones included). */
  done: number;
  /** Items that failed finally. */
  failed: number;
  /** Items dispatched and not committed. */
  running: number;
}

export { mapText } from '../plan/map-words.js';

/** The progress of the plan's map steps that started (one small read each). */
async function mapsOf(
  core: RuntimeCore,
  runId: string,
  plan: { steps: readonly { id: string; kind: string }[] },
): Promise<Record<string, MapProgressReport>> {
  const out: Record<string, MapProgressReport> = {};
  for (const step of plan.steps) {
    if (step.kind !== 'map') continue;
    const counts = await core.stores.maps.counts(runId, step.id);
    if (counts === null) continue;
    const { total, done, failed, running } = counts;
    out[step.id] = { total, done, failed, running };
  }
  return out;
}

/**
 * A child run a `run` step started, or an item of a map step whose items are `run` (`stepId` the
 * item's id `<map>.<index>`, `attempt` the item's attempt) (see {@link RunReport.children}).
 */
export interface RunChild {
  stepId: string;
  attempt: number;
  runId: string;
  /** Its status, or null when it is not found (removed by retention, or not created yet). */
  status: RunStatus | null;
}

/** See {@link RunReport.routing}. */
export interface RunRouting {
  queue: string;
  /** The live workers that take units from the run's queue. */
  liveWorkers: number;
  /** The latest heartbeat of any worker on the queue (epoch ms), null if none was ever seen. */
  lastSeen: number | null;
  /** The latest unit a worker put back untried, and why. */
  putBack: {
    reason: string;
    operator?: string;
    agent?: string;
    host: string;
    pid: number;
    at: number;
  } | null;
}

/** How long after a worker put a run's unit back a report still says so. */
export const PUT_BACK_SHOWN_MS = 15_000;

/** What a report says of a running run's routing (see {@link RunReport.routing}). */
async function routingOf(
  core: RuntimeCore,
  runId: string,
  queue: string,
  idle: RunReport['idle'],
): Promise<RunRouting | null> {
  const raw = await core.redis.get(core.stores.keys.unrouted(runId));
  const now = core.clock();
  const note = raw === null ? null : (JSON.parse(raw) as NonNullable<RunRouting['putBack']>);
  const putBack = note !== null && note.at >= now - PUT_BACK_SHOWN_MS ? note : null;
  if (putBack === null && idle === null) return null;
  const [workers, beats] = await Promise.all([
    liveWorkers(core.redis, core.stores.keys, now),
    queueBeats(core.redis, core.stores.keys),
  ]);
  const liveWorkersOn = workers.filter((w) => w.queues.includes(queue)).length;
  if (putBack === null && liveWorkersOn > 0) return null;
  return { queue, liveWorkers: liveWorkersOn, lastSeen: beats[queue] ?? null, putBack };
}

/** What an operator last reported with `ctx.progress`. */
export interface StepProgress {
  attempt: number;
  info: JsonValue;
  at: number;
}

/** A run's model usage. */
export interface RunUsage {
  runId: string;
  tenantId: string;
  /** Every usage reservation of the run, in the order they were made. */
  reservations: Reservation[];
  /** Tokens and micro-USD reserved (calls in flight) and spent, with the run's limits. */
  totals: UsageTotals;
}

/** How long due work waits for a worker before a report calls it idle. */
export const IDLE_WORK_MS = 5000;

/** The statuses a run settles in: {@link waitSettled} resolves on any of them. */
export const SETTLED: readonly RunStatus[] = ['succeeded', 'failed', 'cancelled', 'waiting'];

/** The first due step no worker has taken for `IDLE_WORK_MS`, if any. */
export function idleWork(steps: readonly StepState[], now: number): RunReport['idle'] {
  for (const s of steps) {
    const dueSince =
      s.status === 'READY'
        ? s.updatedAt
        : s.status === 'FAILED_RETRYABLE' && s.retryAt !== null
          ? s.retryAt
          : null;
    if (dueSince !== null && now - dueSince >= IDLE_WORK_MS) {
      return { stepId: s.stepId, dueSince, idleMs: now - dueSince };
    }
  }
  return null;
}

/** The progress hash of a run, parsed (an unreadable field is left out). */
export function progressOf(raw: Record<string, string>): Record<string, StepProgress> {
  const out: Record<string, StepProgress> = {};
  for (const [stepId, json] of Object.entries(raw)) {
    try {
      const p = JSON.parse(json) as StepProgress;
      out[stepId] = { attempt: p.attempt, info: p.info, at: p.at };
    } catch {
      // written by the runtime only; skip what cannot be read
    }
  }
  return out;
}

/** What the steps waiting for approval wait on, with what the plan says about who decides. */
export function pendingApprovals(steps: readonly StepState[], plan: Plan): PendingApproval[] {
  const out: PendingApproval[] = [];
  for (const s of steps) {
    if (s.status !== 'WAITING_APPROVAL') continue;
    const planStep = stepOfPlan(plan, s.stepId);
    out.push({
      stepId: s.stepId,
      reason: planStep?.gate?.reason ?? null,
      approvers: planStep?.gate?.approvers === undefined ? null : [...planStep.gate.approvers],
      riskLevel: planStep?.riskLevel ?? 'low',
      call: s.pendingCall ?? null,
    });
  }
  return out;
}

/**
 * The steps as a report shows them: a READY step whose execution a worker has started (its unit
 * note names the step's attempt and pauses), not yet committed as RUNNING, shows RUNNING.
 */
export function stepsAsStarted(
  steps: readonly StepState[],
  started: Readonly<Record<string, string>>,
): StepState[] {
  return steps.map((s) => {
    const note = started[s.stepId]?.split(' ');
    const mine = note?.[0] === String(s.attempt) && note[1] === String(s.pauses ?? 0);
    return s.status === 'READY' && mine ? { ...s, status: 'RUNNING' as const } : s;
  });
}

/** Whether a raw stream entry is a change of the run's status to a settled one. */
export function settles([, fields]: StreamEntry): boolean {
  const t = fields.indexOf('t');
  if (t < 0 || fields[t + 1] !== 'run.status') return false;
  const d = fields.indexOf('d');
  try {
    const to = (JSON.parse(fields[d + 1] ?? '{}') as { to?: RunStatus }).to;
    return to !== undefined && SETTLED.includes(to);
  } catch {
    return false;
  }
}

/** Loads a run; a run removed by retention throws `RunRemovedError`. */
export async function loadRun(
  core: RuntimeCore,
  runId: string,
): Promise<SnapshotEnvelope<RunSnapshot>> {
  const env = await core.stores.store.tryLoad(runId);
  if (env === null) throw await core.stores.notFound(runId);
  return env;
}

/** The run's status report (`runtime.status`). */
export async function readReport(core: RuntimeCore, runId: string): Promise<RunReport> {
  const [env, started, replays, progress] = await Promise.all([
    loadRun(core, runId),
    core.stores.unitNotes.read(runId),
    replaysOf(core, runId),
    core.queues.channels.readProgress(runId),
  ]);
  const meta = await core.meta.read(runId);
  const lineage = lineageFrom(runId, meta.replay, replays);
  const status = runStatus(env.snapshot);
  const steps = stepsAsStarted(runSteps(env.snapshot), started);
  const idle = status === 'running' ? idleWork(steps, core.clock()) : null;
  const queue = meta.queue ?? core.queues.queueName;
  return {
    runId,
    planName: env.snapshot.context.planName,
    tenantId: meta.tenantId,
    status,
    version: env.version,
    steps,
    approvals: pendingApprovals(steps, meta.plan),
    waits: await pendingWaits(core, runId, env.snapshot, steps),
    summary: summarize(env.snapshot, status, env.updatedAt),
    createdAt: env.snapshot.context.createdAt,
    updatedAt: env.updatedAt,
    ...(lineage === undefined ? {} : { lineage }),
    idle,
    queue,
    routing: status === 'running' ? await routingOf(core, runId, queue, idle) : null,
    progress: progressOf(progress),
    concurrency: status === 'running' ? await concurrencyWaits(core, runId) : [],
    maps: await mapsOf(core, runId, meta.plan),
    parent: meta.parent,
    children: await childrenReport(core, runId, meta),
  };
}

/** The children the run's meta records, each with its status (one read each). */
async function childrenReport(
  core: RuntimeCore,
  runId: string,
  meta: RunMeta,
): Promise<RunChild[]> {
  const starts = (s: RunMeta['plan']['steps'][number]) =>
    s.kind === 'run' || (s.kind === 'map' && s.item.kind === 'run');
  if (!meta.plan.steps.some(starts)) return [];
  const listed = childrenOf(await core.stores.store.loadMeta(runId));
  const statuses = await Promise.all(
    listed.map((c) => readRunStatus(core.redis, core.stores.keys, c.runId)),
  );
  return listed.map((c, i) => ({ ...c, status: (statuses[i] ?? null) as RunStatus | null }));
}

/** The run's persisted snapshot as stored (`runtime.snapshot`). */
export async function readSnapshot(core: RuntimeCore, runId: string): Promise<RunSnapshot> {
  assertRunId(runId);
  return (await loadRun(core, runId)).snapshot;
}

/**
 * The run's report once it settles, learned from its status stream (its `run.status` events
 * alone): a change to a settled status wakes it, never a timer; nothing is read while the run
 * works, however many steps it commits. With `timeoutMs` > 0, the report as it stands then.
 */
export async function waitSettled(
  core: RuntimeCore,
  runId: string,
  timeoutMs = 0,
): Promise<RunReport> {
  // The run's status changes alone: a commit that changes nothing of it wakes no waiter.
  const key = core.stores.keys.status(runId);
  // The newest status change before the status (same connection, so read in this order):
  // nothing committed after the status was read can be missed. The status alone is read first (one
  // field): the whole report only once the run settled, or when that field does not say (no
  // run: the report says why; a run stored by an older version).
  const [last, stored] = await withRedisDeadline(
    () =>
      Promise.all([
        lastStatusId(core.redis, core.stores.keys, runId),
        readRunStatus(core.redis, core.stores.keys, runId),
      ]),
    core.redisTimeoutMs,
    core.redis,
  );
  if (stored === null || SETTLED.includes(stored as RunStatus)) {
    const first = await withRedisDeadline(
      () => readReport(core, runId),
      core.redisTimeoutMs,
      core.redis,
    );
    if (SETTLED.includes(first.status)) return first;
  }
  return new Promise<RunReport>((resolve, reject) => {
    let done = false;
    let timer: NodeJS.Timeout | undefined;
    const stop = () => {
      done = true;
      unwatch();
      clearTimeout(timer);
    };
    const check = (anyway: boolean) => {
      readReport(core, runId).then(
        (r) => {
          if (done || (!anyway && !SETTLED.includes(r.status))) return;
          stop();
          resolve(r);
        },
        (error: unknown) => {
          if (done) return;
          stop();
          reject(error instanceof Error ? error : new Error(String(error)));
        },
      );
    };
    const unwatch = core.queues.watcher().watch(
      key,
      last ?? '0-0',
      (entries) => {
        if (entries.some(settles)) check(false);
      },
      () => {
        if (done) return;
        stop();
        reject(new Error(`the runtime was closed while waiting for run "${runId}" to settle`));
      },
    );
    if (timeoutMs > 0) timer = setTimeout(() => check(true), timeoutMs);
  });
}

/**
 * The run's tool-call ledger (`runtime.ledger`): its own entries, then those of its steps with key
 * inputs, which are in their actions' ledgers, shared by the tenant's runs.
 */
export async function readLedger(core: RuntimeCore, runId: string): Promise<LedgerEntry[]> {
  const meta = await core.meta.read(runId);
  const own = await core.stores.ledger.list(runId, meta.tenantId);
  const scopes = new Set(actionScopesOf(meta.plan, meta.input, meta.tenantId).values());
  const shared = await Promise.all(
    [...scopes].map((scope) => core.stores.ledger.list(scope, meta.tenantId)),
  );
  return [...own, ...shared.flat()];
}

/** The run's model usage (`runtime.usage`): every reservation and the run's totals. */
export async function readUsage(core: RuntimeCore, runId: string): Promise<RunUsage> {
  const meta = await core.meta.read(runId);
  const [reservations, totals] = await Promise.all([
    core.stores.quota.list(meta.tenantId, runId),
    core.stores.quota.usage(meta.tenantId, runId),
  ]);
  return { runId, tenantId: meta.tenantId, reservations, totals };
}

/** The run's trace as JSON (`runtime.trace`), built from what is stored about the run. */
export async function readTrace(core: RuntimeCore, runId: string): Promise<RunTrace> {
  // The report first: a run that does not exist is refused as such.
  const current = await readReport(core, runId);
  const [meta, events, started] = await Promise.all([
    core.meta.read(runId),
    core.stores.store.readEvents(runId),
    core.stores.unitNotes.read(runId),
  ]);
  const [ledger, reservations] = await Promise.all([
    // As `runtime.ledger` reads it: within the Redis deadline.
    withRedisDeadline(() => readLedger(core, runId), core.redisTimeoutMs, core.redis),
    core.stores.quota.list(meta.tenantId, runId),
  ]);
  return buildRunTrace({
    runId,
    planName: current.planName,
    tenantId: meta.tenantId,
    status: current.status,
    createdAt: current.createdAt,
    traceparent: meta.trace,
    plan: meta.plan.steps,
    steps: current.steps,
    started,
    events: events.map((e) => e.data),
    ledger,
    reservations,
  });
}
