import { createActor, type AnyStateMachine } from 'xstate';
import { EventValidationError, InvariantError, type ValidationIssue } from '../errors.js';
import type { Plan } from '../plan/schema.js';
import { runEventSchema, type RunEvent } from '../schemas/events.js';
import { zodIssuesToValidationIssues } from '../schemas/issues.js';
import {
  runMachine,
  statusOf,
  stepInputs,
  type RunContext,
  type StepMessage,
  type StepReportedEvent,
} from './run-machine.js';
import { stepMachine, type StepEvent, type StepInput } from './step-machine.js';
import type { PlannedAction, RunStatus, StepContext, StepReport, StepStatus } from './types.js';

/**
 * A run's persisted snapshot: the run machine's state with one step machine snapshot per step
 * (under `children`, the shape xstate gives a machine's child actors). Plain JSON; this is what the
 * snapshot store keeps. Treat it as opaque outside `src/machines`.
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
 * A run held in memory: the run machine's snapshot and one step machine snapshot per step, fed one
 * event at a time. Pure: no clock, timer, randomness or I/O; what it returns for an event is a
 * function of its state and the event alone.
 *
 * Every next snapshot comes from the machines' own pure `transition` (xstate computes it; nothing
 * is started). Messages between the run and its steps are actions: a `toStep` action of the run
 * is delivered to that step at once, and each `report` action of a step is queued for the run as
 * `step.reported`, in the order an actor system would deliver them (a child takes a message as it
 * is sent; the parent takes its own queue in order). Opening a run from its persisted JSON resolves
 * each state from its value and context, so a worker may keep an `OpenRun` between events of the
 * same run (checking the stored version first) or open one per event (`advanceRun`).
 */
export interface OpenRun {
  /** The snapshot as of the last event (or as opened). */
  readonly snapshot: RunSnapshot;
  /** Feeds one valid event (see {@link validateRunEvent}). */
  send(event: RunEvent): RunTransition;
  /** Releases the run (kept for symmetry with hosts that pool open runs). */
  close(): void;
}

type RunState = MachineSnapshotOf<typeof runMachine>;
type StepState_ = MachineSnapshotOf<typeof stepMachine>;
type MachineSnapshotOf<M extends AnyStateMachine> = ReturnType<M['resolveState']>;

interface Collected {
  type: string;
  params: unknown;
}

/**
 * The scope a machine's pure `transition` runs in: it collects the executable actions instead of
 * executing them. One per machine, reused (building one per call costs an actor construction).
 */
function pureScope(machine: AnyStateMachine): { scope: never; taken: Collected[] } {
  const taken: Collected[] = [];
  // An actor that is never started, for the `self` and `system` the scope must name.
  const self = createActor(machine);
  const scope = {
    self,
    system: self.system,
    id: '',
    sessionId: '',
    defer: () => {},
    logger: () => {},
    emit: () => {},
    stopChild: () => {},
    actionExecutor: (action: Collected) => {
      taken.push(action);
    },
  };
  return { scope: scope as never, taken };
}

const runScope = pureScope(runMachine);
const stepScope = pureScope(stepMachine);

function take(taken: Collected[]): Collected[] {
  return taken.splice(0, taken.length);
}

function check<S extends { status: string; error?: unknown }>(snapshot: S, what: string): S {
  if (snapshot.status === 'error') {
    const cause = snapshot.error;
    throw new InvariantError(`${what} failed: ${String(cause)}`, { cause });
  }
  return snapshot;
}

function persistStep(state: StepState_): PersistedStep {
  return {
    snapshot: {
      status: state.status,
      value: state.value,
      historyValue: {},
      context: state.context,
      children: {},
      output: state.output,
      error: state.error,
    },
    src: 'step',
    syncSnapshot: false,
  };
}

type PersistedStep = RunSnapshot['children'][string];

function restoreStep(persisted: PersistedStep): StepState_ {
  const { value, context } = persisted.snapshot;
  return stepMachine.resolveState({ value, context });
}

/** A run in memory, from its machine snapshots. */
class LiveRun implements OpenRun {
  #run: RunState;
  readonly #steps: Map<string, StepState_>;
  // The persisted form of each step, rebuilt only for steps that moved.
  readonly #persisted: Map<string, PersistedStep>;
  #snapshot: RunSnapshot;

  constructor(run: RunState, steps: Map<string, StepState_>, persisted?: RunSnapshot) {
    this.#run = run;
    this.#steps = steps;
    this.#persisted = new Map();
    if (persisted === undefined) {
      for (const [id, state] of steps) this.#persisted.set(id, persistStep(state));
    } else {
      for (const [id, child] of Object.entries(persisted.children)) this.#persisted.set(id, child);
    }
    this.#snapshot = persisted ?? this.#persist();
  }

  get snapshot(): RunSnapshot {
    return this.#snapshot;
  }

  #persist(): RunSnapshot {
    const children: RunSnapshot['children'] = {};
    for (const id of this.#run.context.order) {
      const child = this.#persisted.get(id);
      if (child !== undefined) children[id] = child;
    }
    const run = this.#run;
    return {
      status: run.status,
      value: run.value,
      historyValue: {},
      context: run.context,
      children,
      output: run.output,
      error: run.error,
    };
  }

  /** Delivers the run's actions; returns the planned ones. Reports queue for the run. */
  #carryOut(actions: Collected[], queue: StepReportedEvent[], planned: PlannedAction[]): boolean {
    let moved = false;
    for (const action of actions) {
      switch (action.type) {
        case 'toStep': {
          const { stepId, event } = action.params as StepMessage;
          moved = this.#deliver(stepId, event, queue) || moved;
          break;
        }
        case 'plan':
          planned.push(action.params as PlannedAction);
          break;
        case 'reopenStep': {
          const { stepId, at } = action.params as { stepId: string; at: number };
          const old = this.#steps.get(stepId);
          if (old === undefined) break;
          this.#setStep(stepId, initialStep(reopenInput(old.context, at)));
          moved = true;
          break;
        }
        default:
          break;
      }
    }
    return moved;
  }

  #deliver(stepId: string, event: StepEvent, queue: StepReportedEvent[]): boolean {
    const state = this.#steps.get(stepId);
    // Like an actor that has stopped, a step that has ended takes no more messages.
    if (state === undefined || state.status !== 'active') return false;
    const next = check(
      stepMachine.transition(state, event, stepScope.scope),
      `step machine "${stepId}"`,
    );
    for (const action of take(stepScope.taken)) {
      if (action.type === 'report') {
        queue.push({ type: 'step.reported', ...(action.params as StepReport) });
      }
    }
    if (next === state) return false;
    this.#setStep(stepId, next);
    return true;
  }

  #setStep(stepId: string, state: StepState_): void {
    this.#steps.set(stepId, state);
    this.#persisted.set(stepId, persistStep(state));
  }

  /** Runs the run machine on `first` and on every report that follows, to quiescence. */
  drain(first: RunEvent | StepReportedEvent | null, planned: PlannedAction[]): boolean {
    const queue: StepReportedEvent[] = [];
    let moved = false;
    if (first === null) {
      // The run's own entry actions (a new run starts its first steps).
      moved = this.#carryOut(take(runScope.taken), queue, planned);
    } else {
      queue.push(first as StepReportedEvent);
    }
    for (let i = 0; i < queue.length; i++) {
      const event = queue[i] as StepReportedEvent;
      const next = check(runMachine.transition(this.#run, event, runScope.scope), 'run machine');
      const actions = take(runScope.taken);
      if (next !== this.#run) {
        this.#run = next;
        moved = true;
      }
      moved = this.#carryOut(actions, queue, planned) || moved;
    }
    if (moved) this.#snapshot = this.#persist();
    return moved;
  }

  send(event: RunEvent): RunTransition {
    const before = this.#run.context;
    // A run that has ended never changes.
    if (this.#run.status !== 'active') {
      return {
        snapshot: this.#snapshot,
        status: statusOf(before),
        planned: [],
        changes: [],
        accepted: false,
      };
    }
    const planned: PlannedAction[] = [];
    const moved = this.drain(event, planned);
    const context = this.#run.context;
    return {
      snapshot: this.#snapshot,
      status: statusOf(context),
      planned,
      changes: moved ? diffSteps(before, context) : [],
      accepted: moved,
    };
  }

  close(): void {}
}

function initialStep(input: StepInput): StepState_ {
  const state = stepMachine.getInitialSnapshot(stepScope.scope, input);
  take(stepScope.taken);
  return check(state, 'step machine');
}

/** The input of a fresh step machine for a step reopened by a resume: its attempts go on. */
function reopenInput(old: StepContext, at: number): StepInput {
  return {
    stepId: old.stepId,
    needsApproval: old.needsApproval,
    granular: old.granular,
    retry: old.retry,
    at,
    attempt: old.attempt,
    agent: old.agent,
  };
}

/** Opens a run from its persisted snapshot. */
export function openRun(snapshot: RunSnapshot): OpenRun {
  const run = runMachine.resolveState({
    value: snapshot.value,
    context: snapshot.context,
  });
  const steps = new Map<string, StepState_>();
  for (const id of snapshot.context.order) {
    const child = snapshot.children[id];
    if (child === undefined) throw new InvariantError(`run snapshot has no child for step "${id}"`);
    steps.set(id, restoreStep(child));
  }
  return new LiveRun(run, steps, snapshot);
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

/** Options of {@link startRun}. */
export interface StartRunOptions {
  runId: string;
  /** Creation time, epoch ms. */
  at: number;
}

/** Creates a run from a parsed plan: one step machine per step; starts those with no dependencies. */
export function startRun(plan: Plan, { runId, at }: StartRunOptions): RunTransition {
  const steps = new Map<string, StepState_>();
  for (const input of stepInputs(plan, at)) steps.set(input.stepId, initialStep(input));
  take(runScope.taken);
  const run = check(
    runMachine.getInitialSnapshot(runScope.scope, { runId, plan, at }),
    'run machine',
  );
  const live = new LiveRun(run, steps);
  const planned: PlannedAction[] = [];
  live.drain(null, planned);
  const context = live.snapshot.context;
  return {
    snapshot: live.snapshot,
    status: statusOf(context),
    planned,
    changes: diffSteps(null, context),
    accepted: true,
  };
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
