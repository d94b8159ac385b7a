import { createActor, type Actor, type Snapshot, type SnapshotFrom } from 'xstate';
import { EventValidationError, InvariantError, type ValidationIssue } from '../errors.js';
import type { Plan } from '../plan/schema.js';
import {
  runEventSchema,
  type RunEvent,
  type StepFailedEvent,
  type StepSucceededEvent,
} from '../schemas/events.js';
import { zodIssuesToValidationIssues } from '../schemas/issues.js';
import { noteMovedSteps } from './moved-steps.js';
import {
  initialRunContext,
  runMachine,
  statusOf,
  stepInputs,
  type RunContext,
} from './run-machine.js';
import { openSteps, withinOneEvent } from './step-views.js';
import { stepMachine, type StepEvent, type StepMachine } from './step-machine.js';
import {
  isFinalStepStatus,
  type PlannedAction,
  type RunStatus,
  type StepContext,
  type StepStatus,
} from './types.js';

/** A step's entry in a run snapshot: xstate's persisted form of the run's child actor. */
export interface PersistedStep {
  snapshot: Snapshot<unknown> & {
    value: StepStatus;
    context: StepContext;
    [key: string]: unknown;
  };
  /** The actor logic the step was spawned from: `'step'`. */
  src: string;
  [key: string]: unknown;
}

/**
 * A run's persisted snapshot: xstate's persisted form of a run machine actor
 * (`actor.getPersistedSnapshot()`), with one step actor per step under `children`. Plain JSON;
 * this is what the snapshot store keeps, and what `createActor(runMachine, { snapshot })` takes.
 * Treat it as opaque outside `src/machines`.
 */
export type RunSnapshot = Snapshot<unknown> & {
  value: string;
  context: RunContext;
  children: Record<string, PersistedStep>;
  [key: string]: unknown;
};

/** A step's state moving, as recorded in the run's event stream. */
export interface StepChange {
  stepId: string;
  from: StepStatus;
  to: StepStatus;
  attempt: number;
}

/** The result of feeding one event to a run: its next snapshot and what must happen outside. */
export interface RunTransition {
  snapshot: RunSnapshot;
  status: RunStatus;
  /** Planned actions, in the order the machines planned them. */
  planned: PlannedAction[];
  /** Step state changes, in the order they happened. */
  changes: StepChange[];
  /** False when the event changed nothing (a stale attempt, approving a step that is not waiting, …). */
  accepted: boolean;
}

/**
 * A run held in memory: a started run machine actor with its step actors, fed one event at a
 * time. Pure: no clock, timer, randomness or I/O; what it returns for an event is a function of
 * its state and the event alone.
 *
 * The actors do all the work: the run forwards an event to its step (`sendTo`), the step reports
 * back (`sendParent`), and the run's `plan` actions are collected in the order they run. Every
 * message is delivered synchronously, so the run is at rest again when `send` returns. A worker
 * may keep an `OpenRun` between events of the same run (checking the stored version first) or open
 * one per event (`advanceRun`).
 */
export interface OpenRun {
  /** The snapshot as of the last event (or as opened). */
  readonly snapshot: RunSnapshot;
  /** Feeds one valid event (see {@link validateRunEvent}). */
  send(event: RunEvent): RunTransition;
  /**
   * Feeds a READY step's `step.started` and the result of the same attempt (`step.succeeded` or
   * `step.failed`, stamped no earlier), and returns what `send` gives for each of the two in turn,
   * the first without its snapshot (the step RUNNING in between is never stored). The machines
   * take the result from READY exactly as from RUNNING (same guards, same context), so only the
   * result is fed to them: the first transition is READY → RUNNING alone, and the second's change
   * of the step starts from RUNNING. Null when these conditions do not hold; nothing is fed then.
   */
  sendStartedWith(
    started: RunEvent,
    result: RunEvent,
  ): [Omit<RunTransition, 'snapshot'>, RunTransition] | null;
  /** Lets the run go (kept for hosts that pool open runs). */
  close(): void;
}

type StepSnapshot = SnapshotFrom<StepMachine>;

// The persisted form of each step snapshot, computed once per snapshot object: a step actor that
// did not move keeps its snapshot object, so its persisted form (and the object a commit compares
// first) stays the same, and its context (a step output may be large) is not walked again.
const persistedSteps = new WeakMap<StepSnapshot, PersistedStep['snapshot']>();
// The child entry of each persisted step snapshot, for the same reason one level up.
const childEntries = new WeakMap<object, PersistedStep>();
// Below this many steps, a run that ends is ended by its whole actor: stopping its step actors
// costs less than restoring the run with the last step alone.
const ENDING_ALONE_FROM = 64;

/** The step machine as the kernel runs it: the same machine, its persisted snapshots cached. */
const kernelStepMachine: StepMachine = stepMachine.provide({});
kernelStepMachine.getPersistedSnapshot = (snapshot, options) => {
  let persisted = persistedSteps.get(snapshot);
  if (persisted === undefined) {
    const fresh = stepMachine.getPersistedSnapshot(snapshot, options);
    if (!isPersistedStepSnapshot(fresh)) throw new InvariantError('unreadable step snapshot');
    persisted = fresh;
    persistedSteps.set(snapshot, persisted);
  }
  return persisted;
};

// Where the run's `plan` actions go while the kernel feeds it an event (actors run synchronously).
let sink: PlannedAction[] | null = null;

/**
 * The run machine as the kernel runs it: its `plan` actions collected into the transition's
 * `planned`, its step actors persisted through the cache above.
 */
const kernelRunMachine = runMachine.provide({
  actors: { step: kernelStepMachine },
  actions: {
    plan: (_, action: PlannedAction) => {
      sink?.push(action);
    },
  },
});

type RunActor = Actor<typeof kernelRunMachine>;

function isPersistedStepSnapshot(value: unknown): value is PersistedStep['snapshot'] {
  return (
    typeof value === 'object' &&
    value !== null &&
    'value' in value &&
    typeof value.value === 'string' &&
    'context' in value &&
    typeof value.context === 'object'
  );
}

function isRunSnapshot(value: unknown): value is RunSnapshot {
  return (
    typeof value === 'object' &&
    value !== null &&
    'status' in value &&
    'value' in value &&
    typeof value.value === 'string' &&
    'context' in value &&
    typeof value.context === 'object' &&
    'children' in value &&
    typeof value.children === 'object'
  );
}

function check(actor: RunActor): void {
  const snapshot = actor.getSnapshot();
  if (snapshot.status === 'error') {
    const cause = snapshot.error;
    throw new InvariantError(`run machine failed: ${String(cause)}`, { cause });
  }
}

/** Starts `actor`, collecting what it plans; errors surface as its snapshot's status. */
function started(actor: RunActor, planned: PlannedAction[]): RunActor {
  // An error observer, so that a machine error is read from the snapshot, never thrown elsewhere.
  actor.subscribe({ error: () => {} });
  collecting(planned, () => actor.start());
  check(actor);
  return actor;
}

/** Runs `work` with the run's `plan` actions going to `planned`. */
function collecting(planned: PlannedAction[], work: () => void): void {
  const outer = sink;
  sink = planned;
  try {
    withinOneEvent(work);
  } finally {
    sink = outer;
  }
}

/**
 * The run's persisted snapshot: xstate's, with the entry of every unchanged step kept, in plan
 * order. A step the actor was restored without keeps its entry in `previous`.
 */
function persist(actor: RunActor, previous?: RunSnapshot): RunSnapshot {
  const persisted = actor.getPersistedSnapshot();
  if (!isRunSnapshot(persisted)) throw new InvariantError('unreadable run snapshot');
  const children: RunSnapshot['children'] = {};
  // In plan order (a reopened step's actor is spawned anew, so xstate lists it last).
  for (const id of persisted.context.order) {
    const child = persisted.children[id];
    if (child === undefined) {
      const kept = previous?.children[id];
      if (kept !== undefined) children[id] = kept;
      continue;
    }
    children[id] = knownEntry(child);
  }
  return { ...persisted, children };
}

/** The entry kept for a persisted step snapshot, so that an unchanged step keeps its object. */
function knownEntry(child: PersistedStep): PersistedStep {
  const known = childEntries.get(child.snapshot);
  if (known !== undefined && known.src === child.src) return known;
  childEntries.set(child.snapshot, child);
  return child;
}

// A run context holds no actor reference (it is plain JSON: what the snapshot store keeps), so
// xstate's walk of it when persisting (to replace references) is left out by persisting a shell.
const NO_CONTEXT = Object.freeze({}) as RunContext;

/**
 * {@link persist} when only the steps in `moved` can have changed since `previous` (the same run
 * actor, the same step actors): xstate persists the run with those steps alone, and every other
 * step keeps its entry. Its cost follows the steps that moved, not the run's size: the snapshot's
 * `children` are built only when read whole (see {@link stepEntry}).
 */
function persistMoved(
  actor: RunActor,
  previous: RunSnapshot,
  moved: ReadonlySet<string>,
): RunSnapshot {
  const snapshot = actor.getSnapshot();
  const refs: typeof snapshot.children = {};
  for (const id of moved) {
    const ref = snapshot.children[id];
    if (ref !== undefined) refs[id] = ref;
  }
  const shell: unknown = kernelRunMachine.getPersistedSnapshot({
    ...snapshot,
    context: NO_CONTEXT,
    children: refs,
  });
  if (!isRunSnapshot(shell)) throw new InvariantError('unreadable run snapshot');
  const entries = new Map<string, PersistedStep>();
  for (const id in shell.children) {
    const entry = shell.children[id]!;
    if (stepEntry(previous, id)?.snapshot !== entry.snapshot) entries.set(id, knownEntry(entry));
  }
  return lazyChildren({ ...shell, context: snapshot.context }, previous, entries);
}

/*
 * A run of 1,000 steps would copy its 1,000 step entries on every event (the snapshot is
 * immutable), and an object of that many keys costs hundreds of µs to copy. Instead, a snapshot
 * made from the one before by a few steps' entries holds those and a link to the one before, and
 * builds its `children` the first time they are read whole (a point read, `stepEntry`, follows the
 * links). At most LAZY_DEPTH snapshots are linked so: the next one is built at once, so that a
 * chain never holds more than that many snapshots alive, nor makes a point read walk further.
 */

/** A snapshot whose `children` are not built yet: its base's, with `entries` in their place. */
interface LazyChildren {
  base: RunSnapshot;
  entries: ReadonlyMap<string, PersistedStep>;
  depth: number;
}

const lazy = new WeakMap<RunSnapshot, LazyChildren>();
const LAZY_DEPTH = 16;

/** `shell` (a snapshot without children) with the children of `base` but for `entries`. */
function lazyChildren(
  shell: Omit<RunSnapshot, 'children'>,
  base: RunSnapshot,
  entries: ReadonlyMap<string, PersistedStep>,
): RunSnapshot {
  const depth = (lazy.get(base)?.depth ?? 0) + 1;
  const snapshot = shell as RunSnapshot;
  let built: RunSnapshot['children'] | undefined;
  Object.defineProperty(snapshot, 'children', {
    enumerable: true,
    configurable: true,
    get(): RunSnapshot['children'] {
      if (built === undefined) {
        built = buildChildren(snapshot);
        lazy.delete(snapshot);
      }
      return built;
    },
  });
  lazy.set(snapshot, { base, entries, depth });
  // The chain is cut here: this snapshot's children are built now.
  if (depth >= LAZY_DEPTH) void snapshot.children;
  return snapshot;
}

/** The children of a lazy snapshot, built: its nearest built base's, with each link's entries. */
function buildChildren(snapshot: RunSnapshot): RunSnapshot['children'] {
  const links: LazyChildren[] = [];
  let at = snapshot;
  for (let link = lazy.get(at); link !== undefined; link = lazy.get(at)) {
    links.push(link);
    at = link.base;
  }
  const base = at.children;
  const children: RunSnapshot['children'] = {};
  // In plan order, each step's newest entry.
  for (const id of snapshot.context.order) {
    let entry: PersistedStep | undefined;
    for (const link of links) {
      entry = link.entries.get(id);
      if (entry !== undefined) break;
    }
    entry ??= base[id];
    if (entry !== undefined) children[id] = entry;
  }
  return children;
}

/**
 * The entry of step `stepId` in a run snapshot (`snapshot.children[stepId]`), read without
 * building the children of a snapshot that has not built them.
 */
export function stepEntry(snapshot: RunSnapshot, stepId: string): PersistedStep | undefined {
  let at = snapshot;
  for (let link = lazy.get(at); link !== undefined; link = lazy.get(at)) {
    const entry = link.entries.get(stepId);
    if (entry !== undefined) return entry;
    at = link.base;
  }
  return at.children[stepId];
}

// Each step id's index in a run's plan order, computed once per order array.
const orderIndexes = new WeakMap<readonly string[], Map<string, number>>();

/** `ids` in the plan order of `order`. */
function inPlanOrder(order: readonly string[], ids: Iterable<string>): string[] {
  let index = orderIndexes.get(order);
  if (index === undefined) {
    index = new Map(order.map((id, i) => [id, i]));
    orderIndexes.set(order, index);
  }
  const known = index;
  return [...ids].sort((a, b) => (known.get(a) ?? 0) - (known.get(b) ?? 0));
}

/** Whether every step of the run but `stepId` has ended. */
function othersEnded(context: RunContext, stepId: string): boolean {
  const open = isFinalStepStatus(context.steps[stepId]?.status ?? 'PENDING') ? 0 : 1;
  return openSteps(context) === open;
}

/** A run in memory: its started actor and its persisted snapshot as of the last event. */
class LiveRun implements OpenRun {
  /** The run actor; restored from the snapshot by the first event when given as a function. */
  #actor: RunActor | (() => RunActor);
  #snapshot: RunSnapshot;
  /** The children object of the run actor's snapshot whose step actors are watched. */
  #watchedChildren: object | null = null;
  /** The step actors watched. */
  readonly #watched = new WeakSet<object>();
  /** Step actors that processed a message since the last event began (see `#watch`). */
  readonly #touched = new Set<string>();
  /** Whether the run's last result may be fed to the run restored with its step alone. */
  readonly #endsAlone: boolean;

  constructor(actor: RunActor | (() => RunActor), snapshot: RunSnapshot, endsAlone = true) {
    this.#actor = actor;
    this.#snapshot = snapshot;
    this.#endsAlone = endsAlone;
    if (typeof actor !== 'function') this.#watch(actor);
  }

  /** The run actor, restored (and its step actors watched) the first time it is needed. */
  #live(): RunActor {
    if (typeof this.#actor !== 'function') return this.#actor;
    const actor = this.#actor();
    this.#actor = actor;
    this.#watch(actor);
    return actor;
  }

  get snapshot(): RunSnapshot {
    return this.#snapshot;
  }

  /**
   * Subscribes to every step actor not yet watched, so that an event tells which steps it moved
   * without visiting the others (a run of 1,000 steps pays for the few an event reaches). Called
   * again whenever the run's set of step actors changes (a step reopened, the run ended).
   */
  #watch(actor: RunActor): void {
    const children = actor.getSnapshot().children;
    if (children === this.#watchedChildren) return;
    for (const id in children) {
      const ref = children[id];
      if (ref === undefined || this.#watched.has(ref)) continue;
      this.#watched.add(ref);
      const touched = this.#touched;
      ref.subscribe({ next: () => touched.add(id), error: () => {} });
    }
    this.#watchedChildren = children;
  }

  send(event: RunEvent): RunTransition {
    return this.#deliver(event);
  }

  /**
   * Feeds `event` to the run, or, with `toStep`, straight to the step actor it names: what the run
   * does with an event about an open step is forwarding it there (`toStep`), so the step gets the
   * same event either way and the run hears of it by the step's report, one message fewer.
   */
  #deliver(event: RunEvent, toStep?: StepSucceededEvent | StepFailedEvent): RunTransition {
    const before = this.#snapshot.context;
    // A run that has ended never changes.
    if (this.#snapshot.status !== 'active') {
      return {
        snapshot: this.#snapshot,
        status: statusOf(before),
        planned: [],
        changes: [],
        accepted: false,
      };
    }
    const ending = this.#deliverEnding(event);
    if (ending !== null) return ending;
    const actor = this.#live();
    const run = actor.getSnapshot();
    const planned: PlannedAction[] = [];
    const step = toStep === undefined ? undefined : run.children[toStep.stepId];
    const touched = this.#touched;
    touched.clear();
    collecting(planned, () => (step === undefined ? actor.send(event) : step.send(toStep!)));
    check(actor);
    const next = actor.getSnapshot();
    const previous = this.#snapshot;
    if (next.children !== this.#watchedChildren) {
      // Step actors came or went: the run is persisted whole.
      this.#watch(actor);
      this.#snapshot = persist(actor, previous);
    } else {
      const movedSteps = new Set<string>();
      for (const id of touched) {
        const ref = next.children[id];
        if (ref === undefined) continue;
        const persisted = kernelStepMachine.getPersistedSnapshot(ref.getSnapshot(), undefined);
        if (stepEntry(previous, id)?.snapshot !== persisted) movedSteps.add(id);
      }
      touched.clear();
      if (next === run && movedSteps.size === 0) {
        return {
          snapshot: previous,
          status: statusOf(before),
          planned,
          changes: [],
          accepted: false,
        };
      }
      this.#snapshot = persistMoved(actor, previous, movedSteps);
      const context = this.#snapshot.context;
      const moved = inPlanOrder(context.order, movedSteps);
      noteMovedSteps(this.#snapshot, previous, moved);
      return {
        snapshot: this.#snapshot,
        status: statusOf(context),
        planned,
        changes: diffSteps(before, context, moved),
        accepted: true,
      };
    }
    const context = this.#snapshot.context;
    return {
      snapshot: this.#snapshot,
      status: statusOf(context),
      planned,
      changes: diffSteps(before, context),
      accepted: true,
    };
  }

  /**
   * The result of the run's last open step, fed to the run restored with only the steps it
   * reaches, when the run ends with it: a run that ends stops each of its step actors, and xstate
   * copies the set of the others for each one it stops, which a run of 1,000 steps would pay a
   * million times. Null (nothing fed) when the event is not such a result, or when the run, fed it
   * so, does not end (it is fed again to the whole run).
   */
  #deliverEnding(event: RunEvent): RunTransition | null {
    if (
      !this.#endsAlone ||
      (event.type !== 'step.succeeded' &&
        event.type !== 'step.cacheHit' &&
        event.type !== 'step.skipped')
    ) {
      return null;
    }
    const context = this.#snapshot.context;
    if (context.order.length < ENDING_ALONE_FROM || !othersEnded(context, event.stepId)) {
      return null;
    }
    const ids = reach(context, event);
    if (ids === null) return null;
    let transition: RunTransition;
    let restored: RunActor;
    try {
      restored = restore(this.#snapshot, ids);
      transition = new LiveRun(restored, this.#snapshot, false).send(event);
    } catch (error) {
      if (error instanceof InvariantError) return null;
      throw error;
    }
    if (transition.snapshot.status === 'active') return null;
    this.#actor = restored;
    this.#snapshot = transition.snapshot;
    this.#watchedChildren = null;
    this.#watch(restored);
    return transition;
  }

  sendStartedWith(
    started: RunEvent,
    result: RunEvent,
  ): [Omit<RunTransition, 'snapshot'>, RunTransition] | null {
    if (
      started.type !== 'step.started' ||
      (result.type !== 'step.succeeded' && result.type !== 'step.failed') ||
      result.stepId !== started.stepId ||
      result.attempt !== started.attempt ||
      result.at < started.at ||
      this.#snapshot.status !== 'active'
    ) {
      return null;
    }
    const { stepId, attempt } = started;
    const before = this.#snapshot.context;
    const view = before.steps[stepId];
    const child = stepEntry(this.#snapshot, stepId)?.snapshot;
    if (
      view?.status !== 'READY' ||
      view.attempt !== attempt ||
      child?.value !== 'READY' ||
      child.context.attempt !== attempt
    ) {
      return null;
    }
    // The step is open (READY): the run would forward the result to it, so it is given straight
    // to the step. But for the run's last open step: the run may end with it, and an actor that
    // ended refuses the step's last message (its done event; a warning in development builds),
    // which the run, forwarding, drops as it stops.
    const last = othersEnded(before, stepId);
    const second = last ? this.#deliver(result) : this.#deliver(result, result);
    if (!second.accepted) return null;
    return [
      {
        // READY and RUNNING count alike for the run's status.
        status: statusOf(before),
        planned: [],
        changes: [{ stepId, from: 'READY', to: 'RUNNING', attempt }],
        accepted: true,
      },
      {
        ...second,
        changes: second.changes.map((c) =>
          c.stepId === stepId ? { ...c, from: 'RUNNING' as const } : c,
        ),
      },
    ];
  }

  // Nothing to stop: the actors hold no timer or subscription outside themselves, so a run that
  // is let go is collected. (Stopping one walks every child: a cost paid for nothing.)
  close(): void {}
}

/**
 * The run actor of a persisted snapshot, started: restored with every step actor, or only with
 * those named in `only` (the others are left out of the snapshot it is restored from).
 */
function restore(snapshot: RunSnapshot, only?: ReadonlySet<string>): RunActor {
  let from = snapshot;
  if (only !== undefined) {
    const children: RunSnapshot['children'] = {};
    for (const id of only) {
      const entry = snapshot.children[id];
      if (entry !== undefined) children[id] = entry;
    }
    from = { ...snapshot, children };
  }
  const actor = createActor(kernelRunMachine, { snapshot: from });
  // Each restored step stands for the persisted entry it came from, until it moves.
  const restored = actor.getSnapshot().children;
  for (const id in from.children) {
    const entry = from.children[id];
    const child = restored[id];
    if (entry === undefined || child === undefined) continue;
    persistedSteps.set(child.getSnapshot(), entry.snapshot);
    childEntries.set(entry.snapshot, entry);
  }
  return started(actor, []);
}

/** Opens a run from its persisted snapshot: its run actor restored with every step actor. */
export function openRun(snapshot: RunSnapshot): OpenRun {
  for (const id of snapshot.context.order) {
    if (snapshot.children[id] === undefined) {
      throw new InvariantError(`run snapshot has no child for step "${id}"`);
    }
  }
  return new LiveRun(restore(snapshot), snapshot);
}

/**
 * The steps an event about one step reaches unless a failure cascades: that step, the steps that
 * depend on it directly, and their dependencies that were skipped (a dependent of skipped steps
 * only is skipped too when each was skipped by its condition). Null for an event about the whole
 * run (every step).
 */
function reach(context: RunContext, event: RunEvent): Set<string> | null {
  if (!('stepId' in event)) return null;
  const ids = new Set([event.stepId]);
  for (const id of context.order) {
    const deps = context.dependsOn[id] ?? [];
    if (!deps.includes(event.stepId)) continue;
    ids.add(id);
    // Whether a dependent is skipped too reads why its skipped dependencies were skipped.
    for (const d of deps) if (context.steps[d]?.status === 'SKIPPED') ids.add(d);
  }
  return ids;
}

/** The steps of `ids` (default: every step, in plan order) whose status or attempt changed. */
function diffSteps(
  before: RunContext | null,
  after: RunContext,
  ids: readonly string[] = after.order,
): StepChange[] {
  const changes: StepChange[] = [];
  for (const id of ids) {
    const prev = before?.steps[id] ?? { status: 'PENDING' as const, attempt: 0 };
    const next = after.steps[id];
    if (next === undefined) continue;
    if (prev.status !== next.status || prev.attempt !== next.attempt) {
      changes.push({ stepId: id, from: prev.status, to: next.status, attempt: next.attempt });
    }
  }
  return changes;
}

/** Options of {@link startRun}. */
export interface StartRunOptions {
  runId: string;
  /** Creation time, epoch ms. */
  at: number;
}

/** Creates a run from a parsed plan: one step actor per step; starts those with no dependencies. */
export function startRun(plan: Plan, options: StartRunOptions): RunTransition {
  return startOpenRun(plan, options).transition;
}

/**
 * {@link startRun}, and the run it created held open for its next events (a host that keeps runs
 * in memory need not restore it from its first snapshot).
 */
export function startOpenRun(
  plan: Plan,
  options: StartRunOptions,
): { transition: RunTransition; run: OpenRun } {
  const template = startTemplate(plan);
  if (template !== null) {
    const transition = fillTemplate(template, options);
    // Restored from the snapshot (a few times cheaper than creating the actors) when its first
    // event comes: by the run's first unit, when the process that started it runs it. A process
    // that only starts runs never restores them.
    const { snapshot } = transition;
    return { transition, run: new LiveRun(() => restore(snapshot), snapshot) };
  }
  return createRun(plan, options);
}

/** A run created by its actors: the run actor started with its input, spawning its steps. */
function createRun(
  plan: Plan,
  options: StartRunOptions,
): { transition: RunTransition; run: OpenRun } {
  if (plan.steps.length >= RESTORED_FROM) return createRestored(plan, options);
  const { runId, at } = options;
  const planned: PlannedAction[] = [];
  const actor = started(createActor(kernelRunMachine, { input: { runId, plan, at } }), planned);
  return created(actor, planned);
}

// From this many steps on, a run is created by restoring its actors rather than spawning them.
const RESTORED_FROM = 64;

/**
 * {@link createRun} without spawning: xstate copies the set of a run's step actors for each one it
 * spawns, so a run of 1,000 steps spawned by its machine's entry costs a million copies. The
 * same first transition is reached from the run as its entry leaves it before any step moves
 * (its initial state and context, each step actor in its initial state), restored (one actor per
 * step, in one pass), and each step without dependencies told its dependencies are met, in plan
 * order, as the entry tells them. A test holds the two ways equal on plans of every kind of step.
 */
export function createRestored(
  plan: Plan,
  { runId, at }: StartRunOptions,
): { transition: RunTransition; run: OpenRun } {
  const input = { runId, plan, at };
  const shell = kernelRunMachine.getPersistedSnapshot(
    kernelRunMachine.resolveState({ value: 'running', context: initialRunContext(input) }),
  );
  const children: RunSnapshot['children'] = {};
  for (const stepInput of stepInputs(plan, at)) {
    const step = createActor(kernelStepMachine, { input: stepInput });
    const snapshot = step.getPersistedSnapshot();
    if (!isPersistedStepSnapshot(snapshot)) throw new InvariantError('unreadable step snapshot');
    children[stepInput.stepId] = { snapshot, src: 'step', syncSnapshot: false };
  }
  const initial = { ...shell, children } as RunSnapshot;
  const actor = restore(initial);
  const planned: PlannedAction[] = [];
  collecting(planned, () => {
    const refs = actor.getSnapshot().children;
    for (const id of initial.context.order) {
      if ((initial.context.dependsOn[id] ?? []).length === 0) {
        refs[id]?.send({ type: 'deps.met', at } satisfies StepEvent);
      }
    }
  });
  check(actor);
  return created(actor, planned);
}

/** A new run's first transition, from its started actor and what it planned. */
function created(
  actor: RunActor,
  planned: PlannedAction[],
): { transition: RunTransition; run: OpenRun } {
  const snapshot = persist(actor);
  return {
    transition: {
      snapshot,
      status: statusOf(snapshot.context),
      planned,
      changes: diffSteps(null, snapshot.context),
      accepted: true,
    },
    run: new LiveRun(actor, snapshot),
  };
}

/*
 * Creating a run spawns one step actor per step and runs their first transitions: most of the cost
 * of a start, and the same work for every run of a plan. What a new run's first transition comes
 * to is a function of the plan, its run id and its creation time; the id and the time only enter
 * it as copies (the run's id, the times it and its steps were last updated). So the first
 * transition of a plan is computed once, with stand-ins for the id and the time, and each later
 * run of the same plan object (a host that starts a plan many times keeps one parsed plan) gets a
 * copy with its own id and time in their places. Whether the stand-ins are only copied is checked
 * when the template is made, not assumed: the plan is started with two different pairs, and the
 * first result, with the second pair put in place of the first, must be the second result exactly.
 * A plan for which it is not (a machine that computes with the time, a stand-in that occurs in the
 * plan) is created by its actors, every time.
 */

/** Run ids and creation times that stand for a run's own in a template. */
const STAND_INS = [
  { runId: '\u0000run-template-1', at: 2 ** 52 + 1 },
  { runId: '\u0000run-template-2', at: 2 ** 52 + 3 },
] as const;

/**
 * The template of each plan object (its first transition, computed with the first stand-ins):
 * `'once'` after its first start (a plan started once is never templated), null when the check
 * failed.
 */
const templates = new WeakMap<Plan, RunTransition | 'once' | null>();

/** The template of `plan` from its second start on; null before, or when it cannot have one. */
function startTemplate(plan: Plan): RunTransition | null {
  const known = templates.get(plan);
  if (known === undefined) {
    templates.set(plan, 'once');
    return null;
  }
  if (known !== 'once') return known;
  const [first, second] = STAND_INS;
  const a = createRun(plan, first).transition;
  const b = createRun(plan, second).transition;
  const template = JSON.stringify(fillTemplate(a, second)) === JSON.stringify(b) ? a : null;
  templates.set(plan, template);
  return template;
}

/** A copy of the template's transition with the run's id and creation time in their places. */
function fillTemplate(template: RunTransition, { runId, at }: StartRunOptions): RunTransition {
  const [stand] = STAND_INS;
  const fill = (value: unknown): unknown => {
    if (value === stand.runId) return runId;
    if (value === stand.at) return at;
    if (typeof value !== 'object' || value === null) return value;
    if (Array.isArray(value)) return value.map(fill);
    const out: Record<string, unknown> = {};
    for (const key in value) out[key] = fill((value as Record<string, unknown>)[key]);
    return out;
  };
  return fill(template) as RunTransition;
}

/** Checks that `event` is a run event and names a step of this run; throws `EventValidationError`. */
export function validateRunEvent(snapshot: RunSnapshot, event: unknown): RunEvent {
  const parsed = runEventSchema.safeParse(event);
  if (!parsed.success) {
    throw new EventValidationError(zodIssuesToValidationIssues(parsed.error.issues, 'event'));
  }
  return checkEventStep(snapshot, parsed.data);
}

/**
 * The part of {@link validateRunEvent} that depends on the run: an event about a step must name
 * one of its steps. For events whose shape is known good (built by the runtime from values it
 * checked); throws `EventValidationError`.
 */
export function checkEventStep(snapshot: RunSnapshot, e: RunEvent): RunEvent {
  if ('stepId' in e && !(e.stepId in snapshot.context.steps)) {
    const issue: ValidationIssue = {
      path: 'event.stepId',
      message: `unknown step "${e.stepId}"; this run has: ${snapshot.context.order.join(', ')}`,
    };
    throw new EventValidationError([issue]);
  }
  return e;
}

/**
 * Feeds one event to a run and returns its next snapshot, the planned actions and the step changes.
 * Pure: the same snapshot and event always give the same result. Throws `EventValidationError`
 * (nothing changes) when the event is malformed or names an unknown step.
 */
export function advanceRun(snapshot: RunSnapshot, event: unknown): RunTransition {
  const valid = validateRunEvent(snapshot, event);
  // A run that has ended never changes: no actor is even restored.
  if (snapshot.status !== 'active') {
    return {
      snapshot,
      status: statusOf(snapshot.context),
      planned: [],
      changes: [],
      accepted: false,
    };
  }
  // Restoring a step actor is most of an event's cost: the run is restored with only the steps
  // the event reaches. A message to a step left out (a failure cascading past the dependents)
  // fails that actor, and the event is fed again to the run restored whole.
  const ids = reach(snapshot.context, valid);
  if (ids !== null && ids.size < snapshot.context.order.length) {
    try {
      return new LiveRun(restore(snapshot, ids), snapshot, false).send(valid);
    } catch (error) {
      if (!(error instanceof InvariantError)) throw error;
    }
  }
  return openRun(snapshot).send(valid);
}

/** The run's status, read from its snapshot. */
export function runStatus(snapshot: RunSnapshot): RunStatus {
  return statusOf(snapshot.context);
}

/** A step as read from a run snapshot: its state and its context (attempts, output, error, …). */
export interface StepState extends StepContext {
  status: StepStatus;
}

/** Every step of a run, in plan order, read from its snapshot. */
export function runSteps(snapshot: RunSnapshot): StepState[] {
  return snapshot.context.order.map((id) => {
    const child = snapshot.children[id];
    if (child === undefined) throw new InvariantError(`run snapshot has no child for step "${id}"`);
    const { context } = child.snapshot;
    return { ...context, status: child.snapshot.value, cachedFrom: context.cachedFrom ?? null };
  });
}
