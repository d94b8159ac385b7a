/**
 * Which steps moved from one run snapshot to the next, when the kernel knows it: a run held in
 * memory persists an event's snapshot by its steps that moved (see the kernel), and a commit that
 * writes the difference from the snapshot before reads the same list instead of visiting every
 * step. Pure; a snapshot without a note is compared step by step.
 */
import type { RunSnapshot } from './kernel.js';

/** The steps of a snapshot that may differ from `previous`'s; every other step is the same object. */
interface MovedSteps {
  // Weakly: a snapshot must not keep every snapshot before it alive.
  previous: WeakRef<RunSnapshot>;
  steps: readonly string[];
}

const notes = new WeakMap<RunSnapshot, MovedSteps>();

/** Notes that `next` differs from `previous` in `steps` at most (their entries and views). */
export function noteMovedSteps(
  next: RunSnapshot,
  previous: RunSnapshot,
  steps: readonly string[],
): void {
  notes.set(next, { previous: new WeakRef(previous), steps });
}

/** The steps in which `next` may differ from `previous`; undefined when not known. */
export function movedSteps(
  next: RunSnapshot,
  previous: RunSnapshot,
): readonly string[] | undefined {
  const note = notes.get(next);
  return note !== undefined && note.previous.deref() === previous ? note.steps : undefined;
}
