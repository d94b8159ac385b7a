/**
 * The run's step views (`context.steps`) as the run machine changes them, at a cost that does not
 * grow with the run's size. Pure.
 *
 * Two things would: copying the views on every step's report (a run of 1,000 steps copies 1,000
 * entries per report, and its root's success makes 1,000 reports at once), and deriving the run's
 * status from every view after each report. So:
 * - Views copied while the kernel feeds one event are changed in place by the reports that follow
 *   in the same event: no snapshot of the run between them is kept (only the event's last one is),
 *   while a snapshot from an earlier event keeps its views as they were.
 * - Each views object carries a tally (how many steps are open, failed, active, or pending with
 *   their dependencies met), updated by each report from the one before; the status is read off it.
 *   Views made otherwise (a resume, a restore) are tallied whole once, when first asked.
 */
import { isFinalStepStatus, type RunStatus, type StepView } from './types.js';

/** What a run's status is derived from, counted over its steps (see `deriveRunStatus`). */
interface Tally {
  /** Steps not final. */
  open: number;
  /** Steps that failed finally or were cancelled. */
  failed: number;
  /** Steps running, ready, due for a retry, or waiting for a child run. */
  active: number;
  /** PENDING steps whose dependencies are all met. */
  pendingMet: number;
}

/** The parts of a run's context the views are read with. */
export interface ViewsContext {
  order: readonly string[];
  dependsOn: Readonly<Record<string, readonly string[]>>;
  steps: Record<string, StepView>;
}

const tallies = new WeakMap<object, Tally>();
// The event (while the kernel feeds one) each views object was copied in.
const copiedIn = new WeakMap<object, object>();
let currentEvent: object | null = null;

/** Runs `work`, the feeding of one event to a run held by the kernel (see the module). */
export function withinOneEvent<T>(work: () => T): T {
  const outer = currentEvent;
  currentEvent = {};
  try {
    return work();
  } finally {
    currentEvent = outer;
  }
}

const satisfied = (view: StepView | undefined): boolean =>
  view !== undefined && (view.status === 'SUCCEEDED' || view.status === 'SKIPPED');

const isActive = (view: StepView): boolean =>
  view.status === 'RUNNING' ||
  view.status === 'READY' ||
  view.status === 'FAILED_RETRYABLE' ||
  (view.status === 'WAITING' && view.child === true);

/** Whether every dependency of `id` is met in `steps`, counting `assumeMet` as met. */
function depsMet(
  context: ViewsContext,
  steps: Readonly<Record<string, StepView>>,
  id: string,
  assumeMet?: string,
): boolean {
  for (const d of context.dependsOn[id] ?? []) {
    if (d !== assumeMet && !satisfied(steps[d])) return false;
  }
  return true;
}

/** Adds (`sign` 1) or takes away (-1) one step's part of a tally. */
function count(tally: Tally, view: StepView, met: boolean, sign: 1 | -1): void {
  if (!isFinalStepStatus(view.status)) tally.open += sign;
  if (view.status === 'FAILED_FINAL' || view.status === 'CANCELLED') tally.failed += sign;
  if (isActive(view)) tally.active += sign;
  if (view.status === 'PENDING' && met) tally.pendingMet += sign;
}

function tallyWhole(context: ViewsContext): Tally {
  const tally: Tally = { open: 0, failed: 0, active: 0, pendingMet: 0 };
  const { steps } = context;
  for (const id of context.order) {
    const view = steps[id];
    if (view === undefined) continue;
    count(tally, view, view.status === 'PENDING' && depsMet(context, steps, id), 1);
  }
  return tally;
}

function tallyOf(context: ViewsContext): Tally {
  let tally = tallies.get(context.steps);
  if (tally === undefined) {
    tally = tallyWhole(context);
    tallies.set(context.steps, tally);
  }
  return tally;
}

/** How many of the run's steps have not ended. */
export function openSteps(context: ViewsContext): number {
  return tallyOf(context).open;
}

/** The run's status from its views (the same as `deriveRunStatus`'s). */
export function viewsStatus(
  context: ViewsContext,
  cancelRequested: boolean,
  stopped: boolean,
): RunStatus {
  const tally = tallyOf(context);
  if (tally.open === 0) {
    if (cancelRequested) return 'cancelled';
    return tally.failed > 0 || stopped ? 'failed' : 'succeeded';
  }
  return tally.active > 0 || tally.pendingMet > 0 ? 'running' : 'waiting';
}

/**
 * How many more of `id`'s PENDING dependents have their dependencies met once its view goes from
 * `before` to `after` (negative: fewer); nothing else changes.
 */
function dependentsMetChange(
  context: ViewsContext,
  id: string,
  dependents: readonly string[],
  before: StepView | undefined,
  after: StepView,
): number {
  const was = satisfied(before);
  if (was === satisfied(after)) return 0;
  let change = 0;
  for (const d of dependents) {
    if (context.steps[d]?.status !== 'PENDING') continue;
    // Met but for `id`: then whether it is met follows `id`.
    if (depsMet(context, context.steps, d, id)) change += was ? -1 : 1;
  }
  return change;
}

/**
 * A copy of the views, to change one or several (a report; a resume, a skip): key by key into an
 * object without a prototype, far cheaper than a spread of 1,000 keys.
 */
export function viewsCopy(context: ViewsContext): Record<string, StepView> {
  const copy = Object.create(null) as Record<string, StepView>;
  const { steps } = context;
  for (const id of context.order) {
    const view = steps[id];
    if (view !== undefined) copy[id] = view;
  }
  return copy;
}

/**
 * The views of `context` with `view` for step `id` (whose direct dependents are `dependents`): a
 * copy, or `context.steps` itself, changed, when it was copied in the event being fed (see the
 * module). Its tally is the one before, moved by this step.
 */
export function withView(
  context: ViewsContext,
  id: string,
  view: StepView,
  dependents: readonly string[],
): Record<string, StepView> {
  const steps = context.steps;
  const before = steps[id];
  const base = tallies.get(steps);
  let tally: Tally | undefined;
  if (base !== undefined) {
    tally = { ...base };
    const pending = before?.status === 'PENDING' || view.status === 'PENDING';
    const met = pending && depsMet(context, steps, id);
    if (before !== undefined) count(tally, before, met, -1);
    count(tally, view, met, 1);
    tally.pendingMet += dependentsMetChange(context, id, dependents, before, view);
  }
  let next = steps;
  if (currentEvent === null || copiedIn.get(steps) !== currentEvent) {
    next = viewsCopy(context);
    if (currentEvent !== null) copiedIn.set(next, currentEvent);
  }
  next[id] = view;
  if (tally === undefined) tallies.delete(next);
  else tallies.set(next, tally);
  return next;
}
