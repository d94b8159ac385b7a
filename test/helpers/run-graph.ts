import { fromTransition } from 'xstate';
import { advanceRun, runSteps, startRun, type RunSnapshot } from '../../src/machines/kernel.js';
import type { Plan } from '../../src/plan/schema.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { e } from './run-trace.js';

/**
 * The kernel as xstate actor logic, so that @xstate/graph can walk it: the state is the run's
 * persisted snapshot, the transition is `advanceRun`.
 */
export function runLogic(plan: Plan) {
  const initial = startRun(plan, { runId: 'g', at: 0 }).snapshot;
  return fromTransition(
    (snapshot: RunSnapshot, event: RunEvent) => advanceRun(snapshot, event).snapshot,
    initial,
  );
}

/**
 * Every event that could matter in this state: each step's outcomes for its current attempt, a stale
 * attempt, approvals, retries due (right and wrong attempt), skip requests (of open steps, and of
 * steps that failed finally or were cancelled), and cancel.
 */
export function candidateEvents(snapshot: RunSnapshot): RunEvent[] {
  const out: RunEvent[] = [];
  const steps = runSteps(snapshot);
  const skips = steps.filter((s) => s.status === 'SKIPPED').length;
  for (const s of steps) {
    const n = s.attempt;
    switch (s.status) {
      case 'READY':
        out.push(e.start(s.stepId, n));
        break;
      case 'RUNNING':
        out.push(e.ok(s.stepId, n), e.fail(s.stepId, n, true), e.fail(s.stepId, n, false));
        if (n > 1) out.push(e.ok(s.stepId, n - 1));
        break;
      case 'WAITING_APPROVAL':
        out.push(e.approve(s.stepId), e.reject(s.stepId), e.skip(s.stepId));
        break;
      case 'FAILED_RETRYABLE':
        out.push(e.due(s.stepId, n + 1), e.due(s.stepId, n));
        break;
      case 'PENDING':
        out.push(e.skip(s.stepId));
        break;
      // Ended without succeeding: a person may still skip it (its dependents are reopened). Only
      // while no step is SKIPPED yet: that keeps the graph small.
      case 'FAILED_FINAL':
      case 'CANCELLED':
        out.push(e.ok(s.stepId, Math.max(n, 1)));
        if (skips === 0) out.push(e.skip(s.stepId));
        break;
      default:
        out.push(e.ok(s.stepId, Math.max(n, 1)));
    }
  }
  out.push(e.cancel(), e.stop());
  // One resume per path keeps the graph finite (each resume lets attempts grow again).
  if (snapshot.context.resumes === 0) out.push(e.resume());
  return out;
}

/** A stable key of a run state for graph traversal. */
export function serializeRun(snapshot: RunSnapshot): string {
  return JSON.stringify([
    snapshot.value,
    // Why a step was cancelled tells what a skip of its upstream step does to it.
    runSteps(snapshot).map((s) => [
      s.status,
      s.attempt,
      s.status === 'CANCELLED' ? s.reason : null,
    ]),
    snapshot.context.cancel !== null,
    snapshot.context.stop !== null,
    snapshot.context.resumes,
  ]);
}

/** A state of an adjacency map with its outgoing edges, typed. */
export interface Node<S, E> {
  state: S;
  edges: { event: E; next: S }[];
}

/** The adjacency map of @xstate/graph as a typed list of nodes (its index type is loose). */
export function nodesOf<S, E>(map: object): Node<S, E>[] {
  const values = Object.values(map) as {
    state: S;
    transitions: Record<string, { event: E; state: S }>;
  }[];
  return values.map(({ state, transitions }) => ({
    state,
    edges: Object.values(transitions).map(({ event, state: next }) => ({ event, next })),
  }));
}
