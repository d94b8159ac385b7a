/**
 * Runs as the Stately inspector sees actors: a run is a root actor (the run machine) whose step
 * machines are its children, one per step (actor id = step id). Its stored history (each event fed
 * in commit order and the snapshot it led to) becomes xstate inspection events: `@xstate.actor`
 * the first time an actor is seen, `@xstate.event` for each event, `@xstate.snapshot` for the run
 * and for each step whose state moved. The conversion is pure; the runtime's commit observer and
 * `flujo inspect` both use it.
 *
 * Session ids are derived from the run, not drawn: the run's is its run id and a step's is
 * `<runId>.<stepId>`, so every process that shows a run (the workers, a follower) names the same
 * actors.
 */
import {
  toObserver,
  type AnyActorRef,
  type AnyEventObject,
  type AnyStateMachine,
  type InspectionEvent,
  type Observer,
} from 'xstate';
import { InputValidationError } from '../errors.js';
import type { Logger } from '../logging.js';
import {
  openRun,
  startRun,
  validateRunEvent,
  type OpenRun,
  type RunSnapshot,
} from '../machines/kernel.js';
import { runMachine } from '../machines/run-machine.js';
import { stepMachine } from '../machines/step-machine.js';
import type { Plan } from '../plan/schema.js';
import { runEventSchema, type RunEvent } from '../schemas/events.js';

/** One commit of a run: the snapshot it started from, each event fed and the snapshot it led to. */
export interface CommittedRun {
  runId: string;
  /** Null for the run's creation. */
  before: RunSnapshot | null;
  fed: readonly { event: RunEvent | CreatedEvent; snapshot: RunSnapshot }[];
}

/** What a run's creation records as its first event. */
export interface CreatedEvent {
  type: 'run.created';
  runId: string;
  plan: string;
  at: number;
}

/** Told of every commit a run host makes. */
export type CommitObserver = (commit: CommittedRun) => void;

/**
 * What `createRuntime({ inspect })` takes: the inspection observer xstate's
 * `createActor(machine, { inspect })` takes, e.g. `createWebSocketInspector().inspect` from
 * `@statelyai/inspect`.
 */
export type InspectObserver = Observer<InspectionEvent> | ((event: InspectionEvent) => void);

/** One event fed to a run and the snapshot it led to. */
export interface InspectedTransition {
  /** The event as committed (`run.created` for the run's creation). */
  event: AnyEventObject;
  /** The snapshot the event was fed to; null when it created the run. */
  before: RunSnapshot | null;
  after: RunSnapshot;
}

/** The session id of a run's actor: its run id. */
export const runSessionId = (runId: string): string => runId;

/** The session id of a step's actor: `<runId>.<stepId>`. */
export const stepSessionId = (runId: string, stepId: string): string => `${runId}.${stepId}`;

/** The event types a run is fed (the other types in its stream are facts derived from them). */
const FED_TYPES: ReadonlySet<string> = new Set([
  'run.created',
  ...runEventSchema.options.map((o) => o.shape.type.value),
]);

/** Whether a stream event of this type is one fed to the run (`run.created` included). */
export function isFedEvent(type: string): boolean {
  return FED_TYPES.has(type);
}

type PersistedStep = RunSnapshot['children'][string];

// How xstate writes a child actor in its parent's snapshot when it is serialized (`toJSON`).
const ACTOR_TYPE = 1;

/**
 * The run's snapshot as the inspector gets it: the stored one with each step as a reference to its
 * actor, the way xstate serializes a machine's children (their snapshots come in their own events).
 */
function runView(snapshot: RunSnapshot): Record<string, unknown> {
  const children: Record<string, { xstate$$type: number; id: string }> = {};
  for (const id of Object.keys(snapshot.children)) children[id] = { xstate$$type: ACTOR_TYPE, id };
  return { ...snapshot, children };
}

const noSubscription = { unsubscribe: () => {} };

/**
 * A read-only actor ref over a stored snapshot: what inspectors read from a ref (`sessionId`,
 * `id`, `_parent`, `logic` and its config, `getSnapshot`, `system`, `src`), nothing started.
 */
function actorRef(options: {
  id: string;
  sessionId: string;
  logic: AnyStateMachine;
  src: string;
  parent: AnyActorRef | undefined;
  snapshot: unknown;
}): AnyActorRef {
  const { id, sessionId, logic, src, parent, snapshot } = options;
  const refuse = (): never => {
    throw new Error(
      `actor ${sessionId} is a view of a stored run; steer the run through the runtime (approve, cancel, …)`,
    );
  };
  const ref = {
    id,
    sessionId,
    src,
    logic,
    _parent: parent,
    system: { get: () => undefined, getAll: () => ({}) },
    getSnapshot: () => snapshot,
    getPersistedSnapshot: () => snapshot,
    send: refuse,
    start: () => {},
    stop: () => {},
    subscribe: () => noSubscription,
    on: () => noSubscription,
    select: refuse,
    toJSON: () => ({ xstate$$type: ACTOR_TYPE, id }),
  };
  // The members an inspector reads; the rest of an actor's surface (observables) it never uses.
  return ref as unknown as AnyActorRef;
}

/**
 * Whether a step's stored state differs between two snapshots. Its output is left out: a snapshot
 * may be loaded without the outputs (they are read when a step needs them), and an output never
 * changes without the step's state changing too.
 */
function moved(before: PersistedStep | undefined, after: PersistedStep): boolean {
  if (before === after) return false;
  if (before === undefined) return true;
  if (before.snapshot.value !== after.snapshot.value) return true;
  const comparable = ({ snapshot }: PersistedStep) =>
    JSON.stringify({ ...snapshot, context: { ...snapshot.context, output: null } });
  return comparable(before) !== comparable(after);
}

/**
 * The inspection events of a run's transitions, in order. `seen` holds the session ids already
 * announced (with `@xstate.actor`) to the observer these events go to; an actor not in it is
 * announced before its first event, with its snapshot as of then. Pure.
 */
export function inspectionEvents(
  runId: string,
  transitions: readonly InspectedTransition[],
  seen: ReadonlySet<string> = new Set(),
): InspectionEvent[] {
  const out: InspectionEvent[] = [];
  const announced = new Set(seen);
  const rootId = runSessionId(runId);
  for (const { event, before, after } of transitions) {
    const first = before ?? after;
    const run = actorRef({
      id: runId,
      sessionId: rootId,
      logic: runMachine,
      src: 'run',
      parent: undefined,
      snapshot: runView(first),
    });
    if (!announced.has(rootId)) {
      announced.add(rootId);
      out.push({ type: '@xstate.actor', actorRef: run, rootId });
    }
    const stepRef = (stepId: string, snapshot: unknown) =>
      actorRef({
        id: stepId,
        sessionId: stepSessionId(runId, stepId),
        logic: stepMachine,
        src: 'step',
        parent: run,
        snapshot,
      });
    for (const [stepId, child] of Object.entries(first.children)) {
      const sessionId = stepSessionId(runId, stepId);
      if (announced.has(sessionId)) continue;
      announced.add(sessionId);
      out.push({ type: '@xstate.actor', actorRef: stepRef(stepId, child.snapshot), rootId });
    }
    out.push({ type: '@xstate.event', sourceRef: undefined, actorRef: run, event, rootId });
    const addressed = typeof event['stepId'] === 'string' ? event['stepId'] : undefined;
    for (const [stepId, child] of Object.entries(after.children)) {
      const sessionId = stepSessionId(runId, stepId);
      const fresh = !announced.has(sessionId);
      // The run forwards an event about a step to that step's machine.
      const forwarded = stepId === addressed;
      const changed = before === null || moved(before.children[stepId], child);
      // Most steps of a large run stay as they were: no ref is built for them.
      if (!fresh && !forwarded && !changed) continue;
      const ref = stepRef(stepId, child.snapshot);
      if (fresh) {
        announced.add(sessionId);
        out.push({ type: '@xstate.actor', actorRef: ref, rootId });
      }
      if (forwarded) {
        out.push({ type: '@xstate.event', sourceRef: run, actorRef: ref, event, rootId });
      }
      if (changed) {
        const snapshot = child.snapshot as unknown as InspectionEventSnapshot;
        out.push({ type: '@xstate.snapshot', actorRef: ref, event, snapshot, rootId });
      }
    }
    const snapshot = runView(after) as unknown as InspectionEventSnapshot;
    out.push({ type: '@xstate.snapshot', actorRef: run, event, snapshot, rootId });
  }
  return out;
}

type InspectionEventSnapshot = Extract<InspectionEvent, { type: '@xstate.snapshot' }>['snapshot'];

/** Folds a run's stream into its transitions, one stored event at a time (see {@link streamInspector}). */
export interface StreamInspector {
  /** The inspection events of one stored event (none for a derived fact or a record). */
  feed(event: {
    id: string;
    type: string;
    data: Readonly<Record<string, unknown>>;
  }): InspectionEvent[];
}

/**
 * The inspection events of a run's stored stream, read in commit order: `run.created` gives the
 * initial snapshot of `plan`, and each event fed to the run is fed again through the machines to
 * get the snapshot it led to (as the integrity check does). Pure: no I/O, the state is the run
 * held open and the actors announced so far.
 */
export function streamInspector(runId: string, plan: Plan): StreamInspector {
  let run: OpenRun | null = null;
  const seen = new Set<string>();
  const convert = (transition: InspectedTransition): InspectionEvent[] => {
    const events = inspectionEvents(runId, [transition], seen);
    for (const e of events) if (e.type === '@xstate.actor') seen.add(e.actorRef.sessionId);
    return events;
  };
  return {
    feed(e) {
      const event = e.data as AnyEventObject;
      if (e.type === 'run.created') {
        const at = e.data['at'];
        if (run !== null || typeof at !== 'number') return [];
        run = openRun(startRun(plan, { runId, at }).snapshot);
        return convert({ event, before: null, after: run.snapshot });
      }
      if (run === null || !FED_TYPES.has(e.type)) return [];
      const before = run.snapshot;
      let accepted = false;
      try {
        accepted = run.send(validateRunEvent(before, e.data)).accepted;
      } catch {
        // An event the machines cannot read was never committed by a runtime: nothing to show.
      }
      return accepted ? convert({ event, before, after: run.snapshot }) : [];
    },
  };
}

/** An actor ref as a JSON line shows it. */
export interface InspectedRef {
  sessionId: string;
  id: string;
  parentSessionId: string | null;
}

function reduceRef(ref: AnyActorRef): InspectedRef {
  return { sessionId: ref.sessionId, id: ref.id, parentSessionId: ref._parent?.sessionId ?? null };
}

/**
 * An inspection event as plain JSON (`flujo inspect --json`): its actor refs reduced to
 * `{ sessionId, id, parentSessionId }`, a missing `sourceRef` as null, and an `@xstate.actor`
 * event with the actor's snapshot as it was announced.
 */
export function inspectionJson(e: InspectionEvent): Record<string, unknown> {
  const actorRef = reduceRef(e.actorRef as AnyActorRef);
  switch (e.type) {
    case '@xstate.actor':
      return { type: e.type, rootId: e.rootId, actorRef, snapshot: e.actorRef.getSnapshot() };
    case '@xstate.event':
      return {
        type: e.type,
        rootId: e.rootId,
        sourceRef: e.sourceRef === undefined ? null : reduceRef(e.sourceRef as AnyActorRef),
        actorRef,
        event: e.event,
      };
    case '@xstate.snapshot':
      return { type: e.type, rootId: e.rootId, actorRef, event: e.event, snapshot: e.snapshot };
    default:
      return { type: e.type, rootId: e.rootId, actorRef };
  }
}

/**
 * Checks `createRuntime({ inspect })`: a function, or an observer with `next`. Throws
 * `InputValidationError` naming `inspect` otherwise (before the runtime opens anything).
 */
export function checkInspectOption(value: unknown): InspectObserver | undefined {
  if (value === undefined) return undefined;
  if (typeof value === 'function') return value as InspectObserver;
  if (typeof value === 'object' && value !== null) {
    const next = (value as { next?: unknown }).next;
    if (typeof next === 'function') return value;
  }
  throw new InputValidationError('runtime options', [
    {
      path: 'inspect',
      message:
        'must be an inspection observer: a function of the event, or an object with next(event), e.g. inspect: createWebSocketInspector().inspect (from @statelyai/inspect)',
    },
  ]);
}

/** Runs whose announced actors a runtime remembers; the least recently committed go first. */
const REMEMBERED_RUNS = 10_000;

/**
 * The commit observer of `createRuntime({ inspect })`: each commit's transitions as inspection
 * events, handed to `observer` at once, in commit order. Actors are announced the first time this
 * runtime commits something of theirs. An observer that throws is logged once and changes nothing.
 */
export function commitInspector(observer: InspectObserver, log: Logger): CommitObserver {
  const target = toObserver(observer);
  // Per run, the session ids announced to the observer, in least recently committed order.
  const announced = new Map<string, Set<string>>();
  let complained = false;
  return (commit: CommittedRun) => {
    let seen = announced.get(commit.runId);
    const events = inspectionEvents(commit.runId, transitionsOf(commit), seen);
    if (seen === undefined) seen = new Set();
    announced.delete(commit.runId);
    const last = commit.fed[commit.fed.length - 1];
    // An ended run takes no more commits; one resumed later is announced again.
    if (last === undefined || last.snapshot.status === 'active') {
      announced.set(commit.runId, seen);
      if (announced.size > REMEMBERED_RUNS) {
        const oldest = announced.keys().next().value as string;
        announced.delete(oldest);
      }
    }
    for (const e of events) {
      if (e.type === '@xstate.actor') seen.add(e.actorRef.sessionId);
      try {
        target.next?.(e);
      } catch (error) {
        if (!complained) {
          complained = true;
          log.warn(
            { err: error, runId: commit.runId, event: e.type },
            'the inspect observer threw; its errors are ignored (this is logged once)',
          );
        }
      }
    }
  };
}

/** A commit's transitions, each from the snapshot the one before it led to. */
function transitionsOf(commit: CommittedRun): InspectedTransition[] {
  let before = commit.before;
  return commit.fed.map(({ event, snapshot }) => {
    const t = { event: event as AnyEventObject, before, after: snapshot };
    before = snapshot;
    return t;
  });
}
