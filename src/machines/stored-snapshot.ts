/**
 * The stored form of a run snapshot (schema version 3): the same state as the persisted
 * `RunSnapshot`, without what can be rebuilt. Every commit writes the whole snapshot, so its size
 * is paid on every step: in the xstate form, a 10-step run is about 5 KB, most of it the fields
 * every step repeats (an unchanged retry policy, nulls, empty history and children objects); the
 * stored form is about a third of that. Pure.
 *
 *   { v: run state value, c: run context, r: [retry policies], s: { stepId: step } }
 *   step: { v: state value, r: index into r, …every context field that is not its default }
 *
 * A field this release does not know is kept as it is, so a newer field survives an older reader.
 */
import { jsonText } from '../internal/json-text.js';
import { stepEntry, type RunSnapshot } from './kernel.js';
import { movedSteps } from './moved-steps.js';
import { statusOf, type RunContext } from './run-machine.js';
import {
  isFinalStepStatus,
  type StepContext,
  type StepStatus,
  type StepView,
  type WaitState,
} from './types.js';

/** The stored form (schema version 3). */
export interface StoredRunSnapshot {
  /** The run machine's state value. */
  v: string;
  /** The run machine's status when it is not `active`. */
  st?: string;
  c: RunContext;
  /** The distinct retry policies of the steps. */
  r: StepContext['retry'][];
  s: Record<string, StoredStep>;
}

/** A step in the stored form: its state value, its retry policy's index, its other context fields. */
export interface StoredStep {
  v: StepStatus;
  r: number;
  [field: string]: unknown;
}

// Context fields a step starts with and keeps for most of its life: left out while they hold it.
const DEFAULTS: Readonly<Record<string, unknown>> = {
  needsApproval: false,
  granular: false,
  approval: null,
  rejection: null,
  output: null,
  error: null,
  retryAt: null,
  reason: null,
  causeStepId: null,
  abortedAttempt: null,
  agent: null,
  pendingCall: null,
  callDecisions: null,
  pauses: 0,
  fallback: null,
};

// The order a step machine lays its context out in, so an expanded snapshot reads the same. The
// fields a step holds only at times (`wait`, `map`, `cachedFrom`) come after, when present.
const CONTEXT_ORDER = [
  'stepId',
  'needsApproval',
  'granular',
  'retry',
  'attempt',
  'approval',
  'rejection',
  'output',
  'error',
  'retryAt',
  'reason',
  'causeStepId',
  'abortedAttempt',
  'agent',
  'pendingCall',
  'callDecisions',
  'pauses',
  'fallback',
  'updatedAt',
] as const;

const KNOWN = new Set<string>(CONTEXT_ORDER);

function samePolicy(a: StepContext['retry'], b: StepContext['retry']): boolean {
  return (
    a.maxAttempts === b.maxAttempts &&
    a.initialDelayMs === b.initialDelayMs &&
    a.backoffCoefficient === b.backoffCoefficient &&
    a.maxDelayMs === b.maxDelayMs &&
    a.jitter === b.jitter
  );
}

/** The stored form of a persisted run snapshot. Runs on every commit: kept to plain loops. */
export function compactRunSnapshot(snapshot: RunSnapshot): StoredRunSnapshot {
  const policies: StepContext['retry'][] = [];
  const steps: Record<string, StoredStep> = {};
  const children = snapshot.children;
  for (const id in children) {
    const { value, context } = (children[id] as RunSnapshot['children'][string]).snapshot;
    let r = policies.length;
    for (let i = 0; i < policies.length; i++) {
      if (samePolicy(policies[i] as StepContext['retry'], context.retry)) {
        r = i;
        break;
      }
    }
    if (r === policies.length) policies.push(context.retry);
    const step: StoredStep = { v: value, r };
    const fields = context as unknown as Record<string, unknown>;
    for (let i = 0; i < CONTEXT_ORDER.length; i++) {
      const field = CONTEXT_ORDER[i] as string;
      if (field === 'stepId' || field === 'retry') continue;
      const fieldValue = fields[field];
      if (fieldValue !== DEFAULTS[field] && fieldValue !== undefined) step[field] = fieldValue;
    }
    // Fields a step holds only at times (a wait's, a map's, a cache hit's) or of a newer release:
    // found only when the context has more keys than known.
    if (Object.keys(fields).length > CONTEXT_ORDER.length) {
      for (const field of Object.keys(fields)) if (!KNOWN.has(field)) step[field] = fields[field];
    }
    steps[id] = step;
  }
  const stored: StoredRunSnapshot = {
    v: snapshot.value,
    c: snapshot.context,
    r: policies,
    s: steps,
  };
  if (snapshot.status !== 'active') stored.st = snapshot.status;
  return stored;
}

/** The persisted run snapshot a stored form stands for. */
export function expandRunSnapshot(stored: StoredRunSnapshot): RunSnapshot {
  const children: RunSnapshot['children'] = {};
  for (const [id, step] of Object.entries(stored.s)) {
    const { v, r, ...fields } = step;
    const retry = stored.r[r];
    if (retry === undefined)
      throw new Error(`step "${id}" names retry policy ${r}, which is absent`);
    const context: Record<string, unknown> = {};
    for (const field of CONTEXT_ORDER) {
      if (field === 'stepId') context[field] = id;
      else if (field === 'retry') context[field] = retry;
      else context[field] = field in fields ? fields[field] : DEFAULTS[field];
    }
    // Fields a step holds only at times, or of a newer release, kept as they are.
    for (const [field, value] of Object.entries(fields)) {
      if (!(field in context)) context[field] = value;
    }
    children[id] = {
      snapshot: {
        status: isFinalStepStatus(v) ? 'done' : 'active',
        output: undefined,
        error: undefined,
        value: v,
        historyValue: {},
        context: context as unknown as StepContext,
        children: {},
      },
      src: 'step',
      syncSnapshot: false,
    };
  }
  return {
    status: (stored.st ?? 'active') as RunSnapshot['status'],
    output: undefined,
    error: undefined,
    value: stored.v,
    historyValue: {},
    context: stored.c,
    children,
  };
}

/*
 * The layout of schema version 4: the stored form split over the fields of the snapshot's HASH,
 * so that a commit writes only what changed, and step outputs stored once, outside it.
 *
 *   plan      { order, dependsOn }                 written when the run is created
 *   run       { v, st?, rs, c: the rest of the run context }   small, written by every commit
 *   s:<step>  { v, r: retry policy, w?: the run's view when it differs, …other non-default fields }
 *   outputs   (a HASH of its own) step id → the step's output as JSON, written once
 *
 * A commit thus writes the run field, the fields of the steps that moved, and the output of a step
 * that succeeded: its size does not grow with the number of steps or with what earlier steps
 * produced.
 */

/** The HASH field of the run's static part (step order and dependencies). */
export const PLAN_PART = 'plan';
/** The HASH field of the run's own state. */
export const RUN_PART = 'run';
/** The prefix of each step's HASH field. */
export const STEP_PART_PREFIX = 's:';

/** What a commit writes in the split layout. */
export interface RunSnapshotDelta {
  /** HASH fields of the snapshot to set (field → JSON). */
  parts: Record<string, string>;
  /** Step outputs to store (step id → JSON). */
  outputs: Record<string, string>;
  /** Step ids whose stored output is to be removed (their output became null). */
  dropOutputs: string[];
}

/** The run part: the run's state without what grows with its steps (the views live in the steps). */
interface StoredRunPart {
  v: string;
  st?: string;
  /** The run's derived status, so that a reader can tell whether the run settled from this field alone. */
  rs: string;
  c: Omit<RunContext, 'order' | 'dependsOn' | 'steps'>;
}

function planPart(context: RunContext): string {
  return JSON.stringify({ order: context.order, dependsOn: context.dependsOn });
}

function runPart(snapshot: RunSnapshot): string {
  const { order: _order, dependsOn: _dependsOn, steps: _steps, ...rest } = snapshot.context;
  const part: StoredRunPart = { v: snapshot.value, rs: statusOf(snapshot.context), c: rest };
  if (snapshot.status !== 'active') part.st = snapshot.status;
  return JSON.stringify(part);
}

type Child = RunSnapshot['children'][string];

function stepPart(child: Child, view: StepView | undefined): string {
  const { value, context } = child.snapshot;
  const step: Record<string, unknown> = { v: value, r: context.retry };
  const fields = context as unknown as Record<string, unknown>;
  for (const field of CONTEXT_ORDER) {
    if (field === 'stepId' || field === 'retry' || field === 'output') continue;
    const fieldValue = fields[field];
    if (fieldValue !== DEFAULTS[field] && fieldValue !== undefined) step[field] = fieldValue;
  }
  if (Object.keys(fields).length > CONTEXT_ORDER.length) {
    for (const field of Object.keys(fields)) if (!KNOWN.has(field)) step[field] = fields[field];
  }
  if (view !== undefined && (view.status !== value || view.attempt !== context.attempt)) {
    step['w'] = view;
  }
  return JSON.stringify(step);
}

/**
 * What to write to go from `previous` (the snapshot stored at the expected version; undefined: the
 * whole snapshot is written) to `next`. Steps whose persisted object is the same as before are not
 * even serialized: a run held in memory keeps the object of every step that did not move.
 */
export function runSnapshotDelta(
  previous: RunSnapshot | undefined,
  next: RunSnapshot,
): RunSnapshotDelta {
  const parts: Record<string, string> = {};
  const outputs: Record<string, string> = {};
  const dropOutputs: string[] = [];
  const ctx = next.context;
  const prevCtx = previous?.context;
  if (
    prevCtx === undefined ||
    ((prevCtx.order !== ctx.order || prevCtx.dependsOn !== ctx.dependsOn) &&
      planPart(prevCtx) !== planPart(ctx))
  ) {
    parts[PLAN_PART] = planPart(ctx);
  }
  parts[RUN_PART] = runPart(next);
  // The steps that moved, when the kernel noted them (the others are the same objects): a commit
  // of a run of 1,000 steps visits the few its event moved.
  const moved = previous === undefined ? undefined : movedSteps(next, previous);
  for (const id of moved ?? Object.keys(next.children)) {
    const child = stepEntry(next, id);
    if (child === undefined) continue;
    const view = ctx.steps[id];
    const before = previous === undefined ? undefined : stepEntry(previous, id);
    const output = child.snapshot.context.output;
    if (before === undefined) {
      parts[STEP_PART_PREFIX + id] = stepPart(child, view);
      if (output !== null) outputs[id] = jsonText(output);
      continue;
    }
    const prevView = prevCtx?.steps[id];
    if (before !== child || prevView !== view) {
      const text = stepPart(child, view);
      if (text !== stepPart(before, prevView)) parts[STEP_PART_PREFIX + id] = text;
    }
    const prevOutput = before.snapshot.context.output;
    if (output === prevOutput) continue;
    if (output === null) dropOutputs.push(id);
    else if (prevOutput === null || jsonText(output) !== jsonText(prevOutput)) {
      outputs[id] = jsonText(output);
    }
  }
  return { parts, outputs, dropOutputs };
}

/**
 * The stored form (schema version 3's shape) that the HASH fields of the split layout and the
 * run's stored outputs stand for. Throws when a part is missing or malformed.
 */
export function joinRunParts(
  fields: Readonly<Record<string, string>>,
  outputs: Readonly<Record<string, string>>,
): StoredRunSnapshot {
  const planText = fields[PLAN_PART];
  const runText = fields[RUN_PART];
  if (planText === undefined) throw new Error(`field "${PLAN_PART}" is missing`);
  if (runText === undefined) throw new Error(`field "${RUN_PART}" is missing`);
  const plan = JSON.parse(planText) as Pick<RunContext, 'order' | 'dependsOn'>;
  const run = JSON.parse(runText) as StoredRunPart;
  const policies: StepContext['retry'][] = [];
  const steps: Record<string, StoredStep> = {};
  const views: Record<string, StepView> = {};
  for (const id of plan.order) {
    const text = fields[STEP_PART_PREFIX + id];
    if (text === undefined) throw new Error(`field "${STEP_PART_PREFIX}${id}" is missing`);
    const {
      r: retry,
      w,
      ...rest
    } = JSON.parse(text) as Record<string, unknown> & {
      v: StepStatus;
      r: StepContext['retry'];
      w?: StepView;
      attempt?: number;
    };
    let r = policies.findIndex((p) => samePolicy(p, retry));
    if (r < 0) r = policies.push(retry) - 1;
    const step = { ...rest, r } as StoredStep;
    const output = outputs[id];
    if (output !== undefined) step['output'] = JSON.parse(output) as unknown;
    steps[id] = step;
    const waitsForChild =
      rest.v === 'WAITING' && typeof (rest['wait'] as WaitState | undefined)?.child === 'string';
    views[id] =
      w ??
      (waitsForChild
        ? { status: rest.v, attempt: rest.attempt ?? 0, child: true }
        : { status: rest.v, attempt: rest.attempt ?? 0 });
  }
  const { runId, planName, ...rest } = run.c;
  const context = {
    runId,
    planName,
    order: plan.order,
    dependsOn: plan.dependsOn,
    steps: views,
    ...rest,
  };
  const stored: StoredRunSnapshot = { v: run.v, c: context, r: policies, s: steps };
  if (run.st !== undefined) stored.st = run.st;
  return stored;
}

/** The run's derived status as a run part records it (null when the text is not one). */
export function runPartStatus(text: string): string | null {
  try {
    const part = JSON.parse(text) as Partial<StoredRunPart>;
    return typeof part.rs === 'string' ? part.rs : null;
  } catch {
    return null;
  }
}
