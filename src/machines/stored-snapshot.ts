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
import type { RunSnapshot } from './kernel.js';
import type { RunContext } from './run-machine.js';
import { isFinalStepStatus, type StepContext, type StepStatus } from './types.js';

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
};

// The order a step machine lays its context out in, so an expanded snapshot reads the same.
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
    // Fields of a newer release (rare): found only when the context has more keys than known.
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
    // Fields of a newer release, kept as they are.
    for (const [field, value] of Object.entries(fields)) {
      if (!(field in context)) context[field] = value;
    }
    children[id] = {
      snapshot: {
        status: isFinalStepStatus(v) ? 'done' : 'active',
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
    value: stored.v,
    historyValue: {},
    context: stored.c,
    children,
  };
}
