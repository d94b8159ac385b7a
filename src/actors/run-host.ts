import { setTimeout as sleep } from 'node:timers/promises';
import { attemptsMade } from '../plan/condition.js';
import { SnapshotConflictError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import { jsonText } from '../internal/json-text.js';
import {
  openRun,
  runStatus,
  runSteps,
  startOpenRun,
  checkEventStep,
  validateRunEvent,
  type OpenRun,
  type RunSnapshot,
  type RunTransition,
} from '../machines/kernel.js';
import { RUN_SNAPSHOT_SCHEMA_VERSION } from '../machines/snapshot-migrations.js';
import type { RunStatus } from '../machines/types.js';
import type { Plan } from '../plan/schema.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import type {
  CommitOptions,
  RunEventRecord,
  SnapshotStore,
} from '../persistence/snapshot-store.js';
import type { RunEvent } from '../schemas/events.js';
import type { CommittedEvents } from '../observability/commit-spans.js';
import type { CommitObserver, CommittedRun, CreatedEvent } from '../observability/inspect.js';

export type { CommitObserver, CommittedRun, CreatedEvent };

/** What a run's stream says when it ends: what it produced, and where and why it stopped. */
export interface RunSummary {
  status: RunStatus;
  /** Outputs of the steps that succeeded, by step id. */
  produced: Record<string, JsonValue>;
  /** The first step (plan order) that failed finally, if any. */
  blockedStep: string | null;
  /** A reason code: `budget_exceeded`, `approval_rejected`, `tool_outcome_unknown`, … */
  reason: string | null;
  detail: JsonValue | null;
  attempts: number;
  at: number;
}

/** The summary of a run as its snapshot stands. */
export function summarize(snapshot: RunSnapshot, status: RunStatus, at: number): RunSummary {
  const steps = runSteps(snapshot);
  const produced: Record<string, JsonValue> = {};
  for (const s of steps)
    if (s.status === 'SUCCEEDED' && s.output !== null) produced[s.stepId] = s.output;
  const failed = steps.find((s) => s.status === 'FAILED_FINAL');
  const ctx = snapshot.context;
  let reason: string | null = null;
  let detail: JsonValue | null = null;
  if (ctx.stop !== null) {
    reason = ctx.stop.reason;
    detail = ctx.stop.detail;
  } else if (ctx.cancel !== null) {
    reason = 'run_cancelled';
    detail = ctx.cancel.reason;
  } else if (failed !== undefined) {
    // The error's own code says more than "non_retryable_error" (e.g. tool_outcome_unknown).
    reason =
      failed.reason === 'non_retryable_error' && failed.error !== null
        ? failed.error.code
        : failed.reason;
    detail = failed.error === null ? null : (failed.error as unknown as JsonValue);
  }
  return {
    status,
    produced,
    blockedStep: failed?.stepId ?? null,
    reason,
    detail,
    attempts: attemptsMade(steps),
    at,
  };
}

const ENDED: readonly RunStatus[] = ['succeeded', 'failed', 'cancelled'];

/**
 * The largest output (bytes of JSON) an event carries itself. A larger one is stored once, in the
 * run's outputs, and the event names it (`outputRef`; in the run summary, `producedRefs` and null);
 * readers of the stream put it back (see the worker's `eventsOf`).
 */
export const EVENT_OUTPUT_INLINE_MAX = 1024;

const inline = (output: JsonValue | null | undefined): boolean =>
  output === null ||
  output === undefined ||
  ((typeof output !== 'string' || output.length <= EVENT_OUTPUT_INLINE_MAX) &&
    jsonText(output).length <= EVENT_OUTPUT_INLINE_MAX);

/** A fact as the stream stores it: a large step output replaced by a reference to the stored one. */
function streamed(fact: RunEventRecord): RunEventRecord {
  if (fact.type !== 'step.succeeded') return fact;
  const output = fact['output'] as JsonValue | undefined;
  if (inline(output)) return fact;
  return { ...fact, output: null, outputRef: fact['stepId'] };
}

/**
 * The run summary's `produced` as the stream stores it: small outputs in it, and null for each
 * other step that succeeded (a large output, or one the snapshot was loaded without), put back by
 * readers from the run's outputs (a step that produced nothing is then left out).
 */
function producedForStream(snapshot: RunSnapshot): {
  produced: Record<string, JsonValue>;
  producedRefs?: true;
} {
  const produced: Record<string, JsonValue> = {};
  let refs = false;
  for (const s of runSteps(snapshot)) {
    if (s.status !== 'SUCCEEDED') continue;
    if (s.output !== null && inline(s.output)) {
      produced[s.stepId] = s.output;
    } else {
      produced[s.stepId] = null;
      refs = true;
    }
  }
  return refs ? { produced, producedRefs: true } : { produced };
}

/**
 * The events one commit appends to the run's stream: the event itself, each step change, the
 * run's status change, and a `run.finished` summary when the run ends.
 */
export function factsOf(
  event: RunEvent | { type: 'run.created'; at: number; [k: string]: unknown },
  before: RunStatus | null,
  t: RunTransition,
): RunEventRecord[] {
  const at = event.at;
  const facts: RunEventRecord[] = [streamed(event)];
  for (const c of t.changes) facts.push({ type: 'step.changed', ...c, at });
  if (before !== t.status) {
    facts.push({ type: 'run.status', from: before, to: t.status, at });
    if (ENDED.includes(t.status)) {
      facts.push({
        type: 'run.finished',
        ...summarize(t.snapshot, t.status, at),
        ...producedForStream(t.snapshot),
      });
    }
  }
  return facts;
}

/** Commit options of {@link RunHost.apply}. */
export interface HostCommitOptions extends CommitOptions {
  /**
   * What the execution did, recorded in the same commit (tool calls, model calls, the worker
   * that ran it): after the facts of the leading `step.started` events and before the rest, so a
   * reader meets them between an attempt's start and its result. Never fed to the machine.
   * @defaultValue none
   */
  records?: readonly RunEventRecord[];
}

/** The result of feeding one event to a stored run. */
export interface AppliedEvent {
  envelope: SnapshotEnvelope<RunSnapshot>;
  transition: RunTransition;
  /** False when the event changed nothing, so nothing was written. */
  committed: boolean;
}

/** Options of {@link createRunHost}. */
export interface RunHostOptions {
  store: SnapshotStore<RunSnapshot>;
  /**
   * How many lost compare-and-set races to absorb (reload, decide again) before giving up; from
   * the third, each waits a random while first (up to 100 ms).
   * @defaultValue 500
   */
  maxConflicts?: number;
  /**
   * How many runs to keep open in memory between their events (restoring a run's actors is the
   * costly part of an event). An open run is used only when its version equals the stored one.
   * @defaultValue 512
   */
  openRuns?: number;
  /**
   * Called after each commit of an event (not a creation) with the snapshot before, the events
   * and the snapshot committed. It must not throw. @defaultValue none
   */
  onCommitted?: (commit: CommittedEvents) => void;
}

/**
 * Runs kept open between events, least recently used first out. An entry is taken out while an
 * event is applied and put back only with the version its commit produced, so a run whose commit
 * failed (a lost race, Redis trouble) is never reused.
 */
interface OpenEntry {
  version: number;
  /** The `updatedAt` of the commit that wrote `version` (with it, tells this state apart). */
  updatedAt: number;
  run: OpenRun;
  carrier: string | undefined;
  /** Succeeded steps whose outputs the open run lacks (opened from a snapshot loaded without). */
  outputsMissing: ReadonlySet<string>;
}

/** A run's state as this host last committed it (or opened it at), kept while its run is taken. */
interface HeldState {
  version: number;
  updatedAt: number;
  snapshot: RunSnapshot;
  carrier: string | undefined;
  outputsMissing: ReadonlySet<string>;
}

class OpenRuns {
  readonly #max: number;
  readonly #runs = new Map<string, OpenEntry>();
  // The state of each run held open, also while a commit has it taken: a unit of the run that is
  // admitted meanwhile reads it from here (one version check) instead of loading the run whole.
  readonly #last = new Map<string, HeldState>();
  constructor(max: number) {
    this.#max = max;
  }
  peek(runId: string): OpenEntry | undefined {
    return this.#runs.get(runId);
  }
  /** The run's state as last put here, whether or not it is taken now. */
  last(runId: string): HeldState | undefined {
    return this.#last.get(runId);
  }
  take(runId: string, version: number, updatedAt: number): OpenEntry | undefined {
    const entry = this.#runs.get(runId);
    if (entry === undefined) return undefined;
    this.#runs.delete(runId);
    if (entry.version === version && entry.updatedAt === updatedAt) return entry;
    entry.run.close();
    return undefined;
  }
  /** Forgets what is held of the run (its stored state was not what this host held). */
  forget(runId: string): void {
    this.#runs.get(runId)?.run.close();
    this.#runs.delete(runId);
    this.#last.delete(runId);
  }
  put(
    runId: string,
    stamp: { version: number; updatedAt: number },
    run: OpenRun,
    carrier: string | undefined,
    outputsMissing: ReadonlySet<string>,
  ): void {
    const { version, updatedAt } = stamp;
    if (this.#max <= 0 || run.snapshot.status !== 'active') {
      this.#last.delete(runId);
      return run.close();
    }
    this.#runs.set(runId, { version, updatedAt, run, carrier, outputsMissing });
    this.#last.delete(runId);
    this.#last.set(runId, { version, updatedAt, snapshot: run.snapshot, carrier, outputsMissing });
    if (this.#runs.size > this.#max) {
      const [oldest, entry] = this.#runs.entries().next().value as [string, OpenEntry];
      this.#runs.delete(oldest);
      entry.run.close();
    }
    if (this.#last.size > this.#max) {
      const oldest = this.#last.keys().next().value as string;
      this.#last.delete(oldest);
    }
  }
}

/** Creates runs and feeds them events: load → decide (pure) → commit with compare-and-set. */
export interface RunHost {
  /** Creates a run from a parsed plan; `meta` is stored with it in the same transaction. */
  create(
    runId: string,
    plan: Plan,
    at: number,
    meta: Readonly<Record<string, string>>,
  ): Promise<AppliedEvent>;
  /**
   * Creates a run from a snapshot built elsewhere (a replay's, with the steps it reuses), its
   * first facts and `meta`; observers are told of it as of a run created from its plan.
   */
  createFrom(
    runId: string,
    start: {
      snapshot: RunSnapshot;
      facts: readonly RunEventRecord[];
      created: CreatedEvent;
      meta: Readonly<Record<string, string>>;
    },
  ): Promise<SnapshotEnvelope<RunSnapshot>>;
  /**
   * Feeds `event` to the run, or several events in order, committed together (all or nothing).
   * On a lost race, reloads and decides again (events are facts, so deciding again is safe); an
   * event the new state no longer accepts is dropped, and with it the whole batch. `options`
   * carries list appends (an agent turn's messages) committed with the snapshot, and a carrier
   * note; given as a function, it is asked once the transition is known (again after a lost race).
   */
  apply(
    runId: string,
    event: RunEvent | readonly RunEvent[],
    loaded?: SnapshotEnvelope<RunSnapshot>,
    options?: HostCommitOptions | ((transition: RunTransition) => HostCommitOptions),
    /**
     * The events were built by the runtime from values it checked (a worker's results, their
     * outputs checked as JSON): only their step ids are checked again, not their whole shape.
     * @defaultValue false
     */
    checked?: boolean,
  ): Promise<AppliedEvent>;
  /**
   * The run's envelope: from the run held open in memory when its version is still the stored one
   * (a one-field read), else loaded, without the step outputs (the worker reads a dependency's
   * output when a step needs it).
   */
  load(runId: string): Promise<SnapshotEnvelope<RunSnapshot>>;
  /**
   * Calls `observer` after each commit of this host, in commit order (a run's creation too).
   * It must not throw (it runs in the commit's path). Returns the function that removes it.
   */
  observe(observer: CommitObserver): () => void;
}

/** Two transitions in a row as one: the second's snapshot and status, both plans and changes. */
function merge(a: RunTransition, b: RunTransition): RunTransition {
  return {
    snapshot: b.snapshot,
    status: b.status,
    planned: [...a.planned, ...b.planned],
    changes: [...a.changes, ...b.changes],
    accepted: a.accepted && b.accepted,
  };
}

/** The steps of a snapshot loaded without outputs whose outputs it lacks: those that succeeded. */
function succeededSteps(snapshot: RunSnapshot): ReadonlySet<string> {
  const ids = new Set<string>();
  for (const id in snapshot.children) {
    if (snapshot.children[id]?.snapshot.value === 'SUCCEEDED') ids.add(id);
  }
  return ids;
}

// Deciding never needs what steps produced: a step's output is read when a dependent runs.
const WITHOUT_OUTPUTS = { outputs: false } as const;

/** Creates a {@link RunHost} over a snapshot store. */
export function createRunHost({
  store,
  maxConflicts = 500,
  openRuns = 512,
  onCommitted,
}: RunHostOptions): RunHost {
  const open = new OpenRuns(openRuns);
  // The last commit of each run from this host, in flight or queued (see `serialized`).
  const tails = new Map<string, Promise<void>>();
  const observers = new Set<CommitObserver>();
  const notify = (commit: CommittedRun): void => {
    for (const observer of observers) observer(commit);
  };
  return {
    observe(observer) {
      observers.add(observer);
      return () => observers.delete(observer);
    },

    async load(runId) {
      // A commit of this run from this host in flight: its result is the state to read.
      const inFlight = tails.get(runId);
      if (inFlight !== undefined) await inFlight;
      const held = open.last(runId);
      if (held !== undefined) {
        const stored = await store.stamp(runId);
        if (stored?.version === held.version && stored.updatedAt === held.updatedAt) {
          return heldEnvelope(held);
        }
      }
      return store.load(runId, WITHOUT_OUTPUTS);
    },

    async create(runId, plan, at, meta) {
      const { transition, run } = startOpenRun(plan, { runId, at });
      const created = { type: 'run.created', runId, plan: plan.name, at } as const;
      const envelope = await store.create(
        runId,
        transition.snapshot,
        factsOf(created, null, transition),
        meta,
      );
      // Held open: the run's first unit, when this process runs it, need not restore it.
      const nothingSucceeded: ReadonlySet<string> = new Set();
      open.put(runId, envelope, run, undefined, nothingSucceeded);
      if (observers.size > 0) {
        notify({ runId, before: null, fed: [{ event: created, snapshot: transition.snapshot }] });
      }
      return {
        envelope: { ...envelope, outputsMissing: nothingSucceeded },
        transition,
        committed: true,
      };
    },

    async createFrom(runId, { snapshot, facts, created, meta }) {
      const envelope = await store.create(runId, snapshot, facts, meta);
      if (observers.size > 0) notify({ runId, before: null, fed: [{ event: created, snapshot }] });
      return envelope;
    },

    apply(runId, event, loaded, options, checked = false) {
      return serialized(runId, () => applyNow(runId, event, loaded, options, checked));
    },
  };

  /**
   * One run's commits from this host go one at a time: units of one run that finish together
   * (a wide fan-out) would otherwise race each other's compare-and-set, and each lost race costs a
   * reload and a restore of the whole run. In turn, each starts from the run as this host last
   * committed it (held open), unless the caller loaded a newer version.
   */
  function serialized<T>(runId: string, work: () => Promise<T>): Promise<T> {
    const previous = tails.get(runId);
    const result = previous === undefined ? work() : previous.then(work);
    const tail = result.then(
      () => {},
      () => {},
    );
    tails.set(runId, tail);
    void tail.then(() => {
      if (tails.get(runId) === tail) tails.delete(runId);
    });
    return result;
  }

  /**
   * The state an apply decides on first: the state this host committed after the caller loaded
   * it (commits of one run from this host go one at a time), which is newer and which the
   * compare-and-set checks is still stored; else the caller's, else the stored one.
   */
  async function startingState(
    runId: string,
    loaded: SnapshotEnvelope<RunSnapshot> | undefined,
  ): Promise<SnapshotEnvelope<RunSnapshot>> {
    const held = open.last(runId);
    if (held !== undefined && loaded !== undefined && held.version > loaded.version) {
      return heldEnvelope(held);
    }
    return loaded ?? store.load(runId, WITHOUT_OUTPUTS);
  }

  /** {@link RunHost.apply}, once the run's earlier commits from this host are done. */
  async function applyNow(
    runId: string,
    event: RunEvent | readonly RunEvent[],
    loaded: SnapshotEnvelope<RunSnapshot> | undefined,
    options: HostCommitOptions | ((transition: RunTransition) => HostCommitOptions) | undefined,
    checked: boolean,
  ): Promise<AppliedEvent> {
    {
      const events: readonly RunEvent[] = Array.isArray(event) ? event : [event as RunEvent];
      let envelope = await startingState(runId, loaded);
      for (let conflicts = 0; ; conflicts++) {
        const { snapshot } = envelope;
        const valid = events.map((e) =>
          checked ? checkEventStep(snapshot, e) : validateRunEvent(snapshot, e),
        );
        let status = runStatus(envelope.snapshot);
        const taken = open.take(runId, envelope.version, envelope.updatedAt);
        const run = taken?.run ?? openRun(envelope.snapshot);
        const outputsMissing =
          taken?.outputsMissing ?? envelope.outputsMissing ?? succeededSteps(envelope.snapshot);
        const facts: RunEventRecord[] = [];
        let t: RunTransition | undefined;
        let refused = false;
        let recordsAt = -1;
        const fed: CommittedRun['fed'][number][] = [];
        // An attempt's start and its result: fed as one when nobody observes each event's
        // snapshot (the facts and the committed snapshot are the same as one by one).
        const pair =
          valid.length === 2 && observers.size === 0
            ? run.sendStartedWith(valid[0]!, valid[1]!)
            : null;
        if (pair !== null) {
          const [first, second] = pair;
          // The first leaves the run's status as it was: its facts need no snapshot.
          facts.push(...factsOf(valid[0]!, status, { ...first, snapshot: second.snapshot }));
          recordsAt = facts.length;
          facts.push(...factsOf(valid[1]!, first.status, second));
          status = second.status;
          t = { ...second, changes: [...first.changes, ...second.changes] };
        }
        for (const e of pair === null ? valid : []) {
          if (recordsAt < 0 && e.type !== 'step.started') recordsAt = facts.length;
          const step = run.send(e);
          if (!step.accepted) {
            refused = true;
            break;
          }
          fed.push({ event: e, snapshot: step.snapshot });
          facts.push(...factsOf(e, status, step));
          status = step.status;
          t = t === undefined ? step : merge(t, step);
        }
        if (refused || t === undefined) {
          // A batch is all or nothing: the events taken before the refused one stay uncommitted.
          if (valid.length === 1) {
            open.put(runId, envelope, run, envelope.carrier, outputsMissing);
          } else run.close();
          const unchanged = {
            snapshot: envelope.snapshot,
            status: runStatus(envelope.snapshot),
            planned: [],
            changes: [],
            accepted: false,
          };
          return { envelope, transition: unchanged, committed: false };
        }
        try {
          const { records, ...commitOptions } =
            (typeof options === 'function' ? options(t) : options) ?? {};
          const at = recordsAt < 0 ? facts.length : recordsAt;
          const written = await store.commit(
            runId,
            envelope.version,
            t.snapshot,
            records === undefined || records.length === 0
              ? facts
              : [...facts.slice(0, at), ...records, ...facts.slice(at)],
            { ...commitOptions, previous: envelope.snapshot },
          );
          // A commit that sets no carrier leaves the stored one as it was.
          const carrier = written.carrier ?? envelope.carrier;
          const next = {
            ...written,
            ...(carrier === undefined ? {} : { carrier }),
            outputsMissing,
          };
          open.put(runId, next, run, carrier, outputsMissing);
          if (observers.size > 0) notify({ runId, before: envelope.snapshot, fed });
          onCommitted?.({ runId, before: envelope.snapshot, events: valid, after: t.snapshot });
          return { envelope: next, transition: t, committed: true };
        } catch (error) {
          run.close();
          if (!(error instanceof SnapshotConflictError) || conflicts >= maxConflicts) throw error;
          // What this host held is not what is stored: it is read again from here on.
          open.forget(runId);
          // Another process commits to the run too: after a few lost races, wait a random while
          // (growing to 100 ms) so that both get through instead of one starving the other.
          if (conflicts >= 2) await sleep(Math.random() * Math.min(100, 5 * 2 ** (conflicts - 2)));
          envelope = await store.load(runId, WITHOUT_OUTPUTS);
        }
      }
    }
  }
}

/** The envelope of a run held open, as `load` would read it (without outputs). */
function heldEnvelope(held: HeldState): SnapshotEnvelope<RunSnapshot> {
  const { snapshot } = held;
  return {
    schemaVersion: RUN_SNAPSHOT_SCHEMA_VERSION,
    version: held.version,
    snapshot,
    updatedAt: held.updatedAt,
    ...(held.carrier === undefined ? {} : { carrier: held.carrier }),
    outputsMissing: held.outputsMissing,
  };
}
