import { createActor, type Actor } from 'xstate';
import { EventValidationError, InvariantError, type ValidationIssue } from '../errors.js';
import type { Plan } from '../plan/schema.js';
import { runEventSchema, type RunEvent } from '../schemas/events.js';
import { zodIssuesToValidationIssues } from '../schemas/issues.js';
import { runMachine, type RunContext } from './run-machine.js';
import { deriveRunStatus } from './run-status.js';
import type { PlannedAction, RunStatus, StepContext, StepStatus } from './types.js';

/**
 * A run's persisted snapshot: the run machine's state with one child snapshot per step. Plain JSON;
 * this is what the snapshot store keeps. Treat it as opaque outside `src/machines`.
 */
export interface RunSnapshot {
  status: 'active' | 'done' | 'error' | 'stopped';
  value: string;
  context: RunContext;
  children: Record<
    string,
    {
      snapshot: {
        status: string;
        value: StepStatus;
        context: StepContext;
        [key: string]: unknown;
      };
      src: string;
      [key: string]: unknown;
    }
  >;
  [key: string]: unknown;
}

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
 * A run restored in memory: an xstate actor system (the run and one child per step) that takes
 * events one at a time. Pure: no clock, timer, randomness or I/O; what it returns for an event is a
 * function of its state and the event alone.
 *
 * Why not xstate's pure `transition()`: it does not deliver `sendTo` / `sendParent` between a run
 * and its child step actors (those come back as unexecuted actions). So the kernel runs the actor
 * system, lets parent and children settle synchronously after each event, and reads the persisted
 * snapshot back. Restoring that system is the costly part, so a worker may keep an `OpenRun` between
 * events of the same run (checking the stored version first); `advanceRun` opens one per call.
 */
export interface OpenRun {
  /** The snapshot as of the last event (or as opened). */
  readonly snapshot: RunSnapshot;
  /** Feeds one valid event (see {@link validateRunEvent}). */
  send(event: RunEvent): RunTransition;
  /** Stops the actor system. */
  close(): void;
}

/**
 * The persisted form of a run actor, the same as xstate's `getPersistedSnapshot()` (a test checks
 * it on every state the graph walk reaches) but without its walk of every context object in search
 * of actor references: these machines keep none in context, and history states are not used. That
 * walk was a third of the kernel's time per event.
 */
export function persistedSnapshot(actor: Actor<typeof runMachine>): RunSnapshot {
  const snap = actor.getSnapshot();
  const children: RunSnapshot['children'] = {};
  for (const [id, ref] of Object.entries(snap.children)) {
    if (ref === undefined) continue;
    const child = ref.getSnapshot() as unknown as {
      status: string;
      value: StepStatus;
      context: StepContext;
      output: unknown;
      error: unknown;
    };
    children[id] = {
      snapshot: {
        status: child.status,
        value: child.value,
        historyValue: {},
        context: child.context,
        children: {},
        output: child.output,
        error: child.error,
      },
      src: 'step',
      syncSnapshot: false,
    };
  }
  return {
    status: snap.status,
    value: snap.value,
    historyValue: {},
    context: snap.context,
    children,
    output: snap.output,
    error: snap.error,
  };
}

/** Opens a run from its persisted snapshot. */
export function openRun(snapshot: RunSnapshot): OpenRun {
  // With a snapshot, xstate restores it and ignores `input`.
  return host(
    createActor(runMachine, { snapshot: snapshot as never, input: undefined as never }),
    snapshot,
  );
}

function host(
  actor: Actor<typeof runMachine>,
  initial: RunSnapshot | null,
): OpenRun & { first: RunTransition | null } {
  let planned: PlannedAction[] = [];
  let failure: unknown;
  actor.on('planned', (e) => planned.push(e.action));
  actor.subscribe({ error: (err) => (failure = err) });
  actor.start();
  let current = initial ?? read();
  const first = initial === null ? transitionFrom(null) : null;

  function read(): RunSnapshot {
    const snap = persistedSnapshot(actor);
    if (failure !== undefined || snap.status === 'error') {
      throw new InvariantError(`run machine failed: ${String(failure ?? snap['error'])}`, {
        cause: failure,
      });
    }
    return snap;
  }

  function transitionFrom(before: RunContext | null): RunTransition {
    const snapshot = before === null ? current : read();
    const context = snapshot.context;
    const changes = diffSteps(before, context);
    const t: RunTransition = {
      snapshot,
      status: statusOf(context),
      planned,
      changes,
      accepted:
        before === null ||
        changes.length > 0 ||
        before.cancel !== context.cancel ||
        before.stop !== context.stop ||
        before.resumes !== context.resumes,
    };
    planned = [];
    return t;
  }

  return {
    first,
    get snapshot() {
      return current;
    },
    send(event) {
      // A run that has ended never changes.
      if (current.status !== 'active') {
        return {
          snapshot: current,
          status: statusOf(current.context),
          planned: [],
          changes: [],
          accepted: false,
        };
      }
      const before = current.context;
      actor.send(event);
      const t = transitionFrom(before);
      current = t.snapshot;
      return t;
    },
    close() {
      actor.stop();
    },
  };
}

function diffSteps(before: RunContext | null, after: RunContext): StepChange[] {
  const changes: StepChange[] = [];
  for (const id of after.order) {
    const prev = before?.steps[id] ?? { status: 'PENDING' as const, attempt: 0 };
    const next = after.steps[id];
    if (next === undefined) continue;
    if (prev.status !== next.status || prev.attempt !== next.attempt) {
      changes.push({ stepId: id, from: prev.status, to: next.status, attempt: next.attempt });
    }
  }
  return changes;
}

function statusOf(context: RunContext): RunStatus {
  return deriveRunStatus({
    steps: context.steps,
    dependsOn: context.dependsOn,
    cancelRequested: context.cancel !== null,
    stopped: context.stop !== null,
  });
}

/** Options of {@link startRun}. */
export interface StartRunOptions {
  runId: string;
  /** Creation time, epoch ms. */
  at: number;
}

/** Creates a run from a parsed plan: spawns its steps and starts those with no dependencies. */
export function startRun(plan: Plan, { runId, at }: StartRunOptions): RunTransition {
  const run = host(createActor(runMachine, { input: { runId, plan, at } }), null);
  run.close();
  return run.first!;
}

/** Checks that `event` is a run event and names a step of this run; throws `EventValidationError`. */
export function validateRunEvent(snapshot: RunSnapshot, event: unknown): RunEvent {
  const parsed = runEventSchema.safeParse(event);
  if (!parsed.success) {
    throw new EventValidationError(zodIssuesToValidationIssues(parsed.error.issues, 'event'));
  }
  const e = parsed.data;
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
  const run = openRun(snapshot);
  try {
    return run.send(valid);
  } finally {
    run.close();
  }
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
    return { ...child.snapshot.context, status: child.snapshot.value };
  });
}
