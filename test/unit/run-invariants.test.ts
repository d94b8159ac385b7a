import { getAdjacencyMap, getSimplePaths } from '@xstate/graph';
import { describe, expect, it } from 'vitest';
import type { SnapshotFrom } from 'xstate';
import { advanceRun, runStatus, runSteps, type RunSnapshot } from '../../src/machines/kernel.js';
import { isFinalStepStatus } from '../../src/machines/types.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { candidateEvents, nodesOf, runLogic, serializeRun } from '../helpers/run-graph.js';
import { planOf } from '../helpers/run-trace.js';

type Logic = ReturnType<typeof runLogic>;
type Wrapped = SnapshotFrom<Logic>;

const retry = { maxAttempts: 2 };
const diamondWithGate = planOf([
  { id: 'a', kind: 'operator', operator: 'op', retry },
  { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'], gate: {}, retry },
  { id: 'c', kind: 'operator', operator: 'op', dependsOn: ['a'], retry },
  { id: 'd', kind: 'operator', operator: 'op', dependsOn: ['b', 'c'], retry },
]);
const gatedLine = planOf([
  { id: 'a', kind: 'operator', operator: 'op', retry },
  { id: 'b', kind: 'human_gate', dependsOn: ['a'], retry },
]);

/** Run states that never change. */
const FINAL_RUN = ['succeeded', 'cancelled'];
/** Run states with only final steps: `failed` too, which a resume, a cancel or a skip leaves. */
const ENDED_RUN = ['succeeded', 'cancelled', 'failed'];

/** Invariants of one state. */
function checkState(s: RunSnapshot): void {
  const steps = runSteps(s);
  // The machine's state is the status derived from its steps.
  expect(s.value).toBe(runStatus(s));
  // A run succeeds only when every step SUCCEEDED or was SKIPPED.
  if (s.value === 'succeeded') {
    for (const step of steps) expect(['SUCCEEDED', 'SKIPPED']).toContain(step.status);
  }
  // An ended run has only final steps.
  if (ENDED_RUN.includes(s.value)) {
    for (const step of steps) expect(isFinalStepStatus(step.status)).toBe(true);
  }
  // The run's view of each step agrees with the step's own actor.
  for (const step of steps) {
    expect(s.context.steps[step.stepId]).toEqual({ status: step.status, attempt: step.attempt });
  }
}

/**
 * The step a skip request of an ended step is about, when the run takes it: the step failed
 * finally or was cancelled, and the run is neither over nor cancelled. Null otherwise.
 */
function endedStepSkipped(prev: RunSnapshot, event: RunEvent): string | null {
  if (event.type !== 'step.skipped' || event.attempt !== undefined) return null;
  if (FINAL_RUN.includes(prev.value) || prev.context.cancel !== null) return null;
  const status = prev.context.steps[event.stepId]?.status;
  return status === 'FAILED_FINAL' || status === 'CANCELLED' ? event.stepId : null;
}

/** Invariants of one edge. */
function checkEdge(prev: RunSnapshot, event: RunEvent, next: RunSnapshot): void {
  const t = advanceRun(prev, event);
  expect(t.snapshot).toEqual(next);
  const before = new Map(runSteps(prev).map((x) => [x.stepId, x]));
  const after = new Map(runSteps(next).map((x) => [x.stepId, x]));
  // A final run stays final and unchanged; a failed run changes only when resumed, when one of
  // its steps that failed or was cancelled is skipped, or when cancelled: it then ends cancelled
  // with every step as it was, and nothing planned.
  const resumed = prev.value === 'failed' && event.type === 'run.resumed';
  const skipped = endedStepSkipped(prev, event);
  const cancelledWhileFailed = prev.value === 'failed' && event.type === 'run.cancelled';
  if (cancelledWhileFailed) {
    expect(next.value).toBe('cancelled');
    expect(next.children).toEqual(prev.children);
    expect(t.planned).toEqual([]);
  } else if (
    FINAL_RUN.includes(prev.value) ||
    (prev.value === 'failed' && !resumed && skipped === null)
  ) {
    expect(next).toEqual(prev);
    expect(t.planned).toEqual([]);
  }
  // Only a resume of a failed run is accepted to re-open steps.
  if (event.type === 'run.resumed') expect(t.accepted).toBe(resumed);
  // A skip of a step that failed or was cancelled is taken: the step is SKIPPED, its attempts as
  // they were.
  if (skipped !== null) {
    expect(t.accepted).toBe(true);
    expect(after.get(skipped)).toMatchObject({ status: 'SKIPPED', reason: 'not needed' });
    expect(after.get(skipped)!.attempt).toBe(before.get(skipped)!.attempt);
  }
  for (const [id, b] of before) {
    const a = after.get(id)!;
    // A final step stays final and unchanged, unless a resume handed its id to a fresh actor
    // (which starts from PENDING, its attempt count going on), or a skip did: the skipped step
    // itself, and dependents that were cancelled because something upstream failed.
    const reopenedBySkip =
      skipped !== null && id !== skipped && b.status === 'CANCELLED' && a.status !== b.status;
    if (isFinalStepStatus(b.status) && !resumed && id !== skipped && !reopenedBySkip) {
      expect(a).toEqual(b);
    }
    if (resumed && (b.status === 'FAILED_FINAL' || b.status === 'CANCELLED')) {
      expect(isFinalStepStatus(a.status)).toBe(false);
    }
    if (reopenedBySkip) {
      expect(b.reason).toBe('upstream_failed');
      expect(isFinalStepStatus(a.status)).toBe(false);
      // It depends on what was skipped or reopened with it, and on nothing that failed.
      const deps = prev.context.dependsOn[id] ?? [];
      expect(deps.some((d) => d === skipped || before.get(d)!.status === 'CANCELLED')).toBe(true);
      for (const d of deps) {
        expect(['FAILED_FINAL', 'CANCELLED']).not.toContain(after.get(d)!.status);
      }
    }
    // Attempts only grow, by at most one per event.
    expect(a.attempt - b.attempt).toBeGreaterThanOrEqual(0);
    expect(a.attempt - b.attempt).toBeLessThanOrEqual(1);
  }
  // Each planned execution is exactly the next attempt of a step that had none due: the step
  // waits READY for a worker, and one step never has two attempts due.
  const due = (status: string) => status === 'READY' || status === 'RUNNING';
  const executes = t.planned.filter((p) => p.type === 'step.execute');
  const perStep = new Set(executes.map((p) => p.stepId));
  expect(perStep.size).toBe(executes.length);
  for (const p of executes) {
    const b = before.get(p.stepId)!;
    const a = after.get(p.stepId)!;
    expect(due(b.status)).toBe(false);
    expect(p.attempt).toBe(b.attempt + 1);
    expect(a).toMatchObject({ status: 'READY', attempt: p.attempt });
  }
  // An attempt that may be executing (READY or RUNNING) and gets cancelled or skipped is aborted
  // outside, exactly once.
  const aborts = t.planned.filter((p) => p.type === 'step.abort');
  const stoppedWhileDue = [...after].filter(
    ([id, a]) =>
      (a.status === 'CANCELLED' || a.status === 'SKIPPED') && due(before.get(id)!.status),
  );
  expect(aborts.map((p) => `${p.stepId}#${p.attempt}`).sort()).toEqual(
    stoppedWhileDue.map(([id, a]) => `${id}#${a.attempt}`).sort(),
  );
  // No step becomes READY without a planned execution, and RUNNING only from READY, same attempt.
  for (const [id, a] of after) {
    const b = before.get(id)!;
    if (a.status === 'READY' && (b.status !== 'READY' || b.attempt !== a.attempt)) {
      expect(executes.map((p) => p.stepId)).toContain(id);
    }
    if (a.status === 'RUNNING' && b.status !== 'RUNNING') {
      expect(b).toMatchObject({ status: 'READY', attempt: a.attempt });
    }
  }
}

const traversal = {
  events: (s: Wrapped) => candidateEvents(s.context),
  serializeState: (s: Wrapped) => serializeRun(s.context),
};

describe('run machine invariants over the graph xstate enumerates', () => {
  it('every reachable edge of a gated diamond keeps the invariants', () => {
    const logic = runLogic(diamondWithGate);
    const map = getAdjacencyMap(logic, traversal);
    let edges = 0;
    let resumes = 0;
    // Skips of a step that ended in a failed run, by what the run became; and reopened dependents.
    const skipsOfFailedRun = new Set<string>();
    let reopened = 0;
    const finals = new Set<string>();
    for (const { state, edges: out } of nodesOf<Wrapped, RunEvent>(map)) {
      checkState(state.context);
      for (const { event, next } of out) {
        checkEdge(state.context, event, next.context);
        edges++;
        if (event.type === 'run.resumed' && state.context.value === 'failed') resumes++;
        if (endedStepSkipped(state.context, event) !== null) {
          if (state.context.value === 'failed') skipsOfFailedRun.add(next.context.value);
          const was = runSteps(state.context);
          reopened += runSteps(next.context).filter(
            (s, i) => was[i]!.status === 'CANCELLED' && !isFinalStepStatus(s.status),
          ).length;
        }
        if (ENDED_RUN.includes(next.context.value)) finals.add(next.context.value);
      }
    }
    // Enough of the space was walked for the checks to mean something.
    expect(Object.keys(map).length).toBeGreaterThan(100);
    expect(edges).toBeGreaterThan(500);
    expect([...finals].sort()).toEqual(['cancelled', 'failed', 'succeeded']);
    expect(resumes).toBeGreaterThan(0);
    // A skip lets a failed run go on (a dependent reopened), succeed, or stay failed (another
    // step failed too). (Waiting on a reopened gate takes two skips: see run-machine.test.ts.)
    expect([...skipsOfFailedRun].sort()).toEqual(['failed', 'running', 'succeeded']);
    expect(reopened).toBeGreaterThan(0);
  }, 120_000);

  it('every simple path of a gated line keeps the invariants, and no attempt runs twice on a path', () => {
    const logic = runLogic(gatedLine);
    const paths = getSimplePaths(logic, traversal);
    expect(paths.length).toBeGreaterThan(20);
    const endings = new Set<string>();
    for (const path of paths) {
      const executed = new Set<string>();
      // path.steps[i].state is the state after path.steps[i].event; the first is the initial state.
      path.steps.forEach(({ state, event }, i) => {
        checkState(state.context);
        if (i === 0) return;
        const prev = path.steps[i - 1]!.state.context;
        // Once the run is final, it stays as it ended.
        if (FINAL_RUN.includes(prev.value)) expect(state.context.value).toBe(prev.value);
        // A failed run leaves only by a resume, a skip of a step that failed or was cancelled, or
        // a cancel (it then ends cancelled).
        if (prev.value === 'failed' && state.context.value !== 'failed') {
          if (event.type === 'run.cancelled') expect(state.context.value).toBe('cancelled');
          else if (event.type !== 'run.resumed')
            expect(endedStepSkipped(prev, event)).not.toBeNull();
        }
      });
      // Replay the path's events and count planned executions per (step, attempt).
      let snap = path.steps[0]!.state.context;
      for (const { event } of path.steps.slice(1)) {
        const t = advanceRun(snap, event);
        for (const p of t.planned) {
          if (p.type !== 'step.execute') continue;
          const key = `${p.stepId}#${p.attempt}`;
          expect(executed.has(key)).toBe(false);
          executed.add(key);
        }
        snap = t.snapshot;
      }
      endings.add(path.state.context.value);
    }
    expect([...endings].sort()).toEqual(['cancelled', 'failed', 'running', 'succeeded', 'waiting']);
  }, 120_000);
});
