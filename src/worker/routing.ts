/**
 * A unit taken by a worker that cannot run it: its step names an operator or an agent this
 * worker does not know. With each job module on a queue of its own that happens only when a
 * deployment is misconfigured (or for a run on a queue several modules' workers share), and the
 * unit is not failed for it: it goes back to its queue for a while, untried, and the run notes why
 * (`flujo status` says so) until a worker that knows the name takes it.
 */
import type { RuntimeCore } from '../actors/core.js';
import { InputValidationError } from '../errors.js';
import { JobName, type JobData } from '../actors/jobs.js';
import type { WorkerIdentity } from '../persistence/unit-notes.js';
import { planStep } from '../plan/graph.js';

/** How long a unit no worker here can run stays back in its queue before it is looked at again. */
export const PUT_BACK_MS = 2000;

/** How long a run's note of a unit put back holds unless a worker puts one back again. */
const NOTE_TTL_MS = 60_000;

/** What a worker lacks to run a unit. */
export interface Missing {
  operator?: string;
  agent?: string;
  /** The plan a run step starts a child run of. */
  plan?: string;
}

/**
 * What this runtime lacks to run the unit of a step or turn job: the operator or agent its step
 * names, or null when it has them all (or the step is no longer in the
 * plan: the unit's own guard deals with it).
 */
export async function missingFor(
  core: RuntimeCore,
  name: string,
  data: JobData,
): Promise<Missing | null> {
  if ((name !== JobName.step && name !== JobName.turn) || data.stepId === undefined) return null;
  let meta;
  try {
    meta = await core.meta.read(data.runId);
  } catch (error) {
    // A run whose meta is gone: the unit's own guard finds no run.
    if (error instanceof InputValidationError) return null;
    throw error;
  }
  const step = planStep(meta.plan, data.stepId);
  if (step === undefined) return null;
  const { operators, agents } = core.registry;
  // A map step's units (its start and its items) need what its items run.
  const runs = step.kind === 'map' ? step.item : step;
  if (runs.kind === 'agent') {
    return agents.has(runs.agent) ? null : { agent: runs.agent };
  }
  if (runs.kind === 'operator' && !operators.has(runs.operator)) return { operator: runs.operator };
  if (runs.kind === 'run' && !core.registry.plans.has(runs.plan)) return { plan: runs.plan };
  return null;
}

/** The words of a note: `no worker knows operator "x"` and where it was put back. */
export function missingText(m: Missing): string {
  if (m.plan !== undefined) return `plan "${m.plan}"`;
  return m.operator !== undefined ? `operator "${m.operator}"` : `agent "${m.agent ?? '?'}"`;
}

/** Notes on the run that a worker put one of its units back for want of `missing`. */
export async function notePutBack(
  core: RuntimeCore,
  runId: string,
  missing: Missing,
  queue: string,
  worker: WorkerIdentity,
): Promise<void> {
  const note = {
    reason: `no worker knows ${missingText(missing)}`,
    ...missing,
    queue,
    host: worker.host,
    pid: worker.pid,
    at: core.clock(),
  };
  await core.redis.set(core.stores.keys.unrouted(runId), JSON.stringify(note), 'PX', NOTE_TTL_MS);
}
