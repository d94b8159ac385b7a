import { type RunSnapshot, type RunTransition } from '../../src/machines/kernel.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import type { Plan, PlanInput } from '../../src/plan/schema.js';
import type { RunEvent } from '../../src/schemas/events.js';
import {
  runEvents,
  traceTransitions,
  transitionLine,
  TRACE_T0,
} from '../../src/testing/transitions.js';

/** A plan from a few step fields; retries without jitter so traces are easy to read. */
export function planOf(steps: PlanInput['steps'], name = 'trace'): Plan {
  return parsePlan({
    name,
    defaults: { retry: { maxAttempts: 3, initialDelayMs: 1000, backoffCoefficient: 2, jitter: 0 } },
    steps,
  });
}

export const T0 = TRACE_T0;

/** Builders for run events at a fixed clock, so traces are stable (those of `flujo/testing`). */
export const e = runEvents;

/** One line per event: the event, the run's status, each step change, each planned action. */
export const traceLine = transitionLine;

/** Runs `events` through the kernel from the start and returns the trace and the last snapshot. */
export function trace(
  plan: Plan,
  events: RunEvent[],
): { text: string; snapshot: RunSnapshot; last: RunTransition } {
  const t = traceTransitions(plan, events);
  return { text: t.text, snapshot: t.snapshot, last: t.transitions[t.transitions.length - 1]! };
}
