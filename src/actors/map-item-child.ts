/**
 * An item of a map step whose kind is `run`: each attempt of the item is a child run of the
 * item's plan, with the element as its input, awaited without holding a worker.
 *
 * The item's job starts the child (its id derived from the run, the map, the map's attempt, the
 * index and the item's attempt: `itemChildRunId`, so a job run again after a crash finds the child
 * it created), records it in the parent's meta (`child:<map>.<index>:<itemAttempt>`) and returns.
 * The child's end (`runEnded`) adds the item's wake job (`itemWakeJob`); the parent's sweep adds
 * the item's job again while the item is in flight, so a lost wake is healed. A job that finds the
 * child ended takes its end: the child's result is the item's output, a failed child a retryable
 * failure of the item's attempt, a cancelled child a final one (`child_failed` either way).
 */
import { ChildFailedError, FlujoError, type SerializedError } from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import { runStatus } from '../machines/kernel.js';
import { writeMetaField } from '../persistence/run-lookups.js';
import { itemStepId } from '../plan/map.js';
import type { StepResult } from '../execution/execute-step.js';
import { childResult, childSummary, itemChildRunId } from './child.js';
import { childField, parentFields, type RunMeta } from './runtime-meta.js';
import type { UnitHost } from './unit.js';

/** One attempt of one item of a map step's attempt, and its element. */
export interface ItemAttempt {
  runId: string;
  stepId: string;
  attempt: number;
  index: number;
  itemAttempt: number;
  element: JsonValue;
}

/** A failure of the item's attempt that no retry changes. */
const final = (error: SerializedError): StepResult => ({
  kind: 'failed',
  error: { ...error, retryable: false },
});

/**
 * Starts (or finds) the child of the item's attempt; its end as the item's result when it has
 * ended, else null (the child goes on: its end wakes the item).
 */
export async function itemChildResult(
  host: UnitHost,
  meta: RunMeta,
  planName: string,
  item: ItemAttempt,
): Promise<StepResult | null> {
  const { core } = host;
  const { runId } = item;
  const itemId = itemStepId(item.stepId, item.index);
  const childId = itemChildRunId(runId, item.stepId, item.attempt, item.index, item.itemAttempt);
  let child = await core.stores.store.tryLoad(childId);
  if (child === null) {
    const plan = core.registry.plans.get(planName);
    if (plan === undefined) {
      const registered = [...core.registry.plans.keys()].join(', ') || '(none)';
      const why = `no plan "${planName}" is registered in this worker (register it with runtime.plan("${planName}", plan), or plans in the job module; registered: ${registered})`;
      return final(new ChildFailedError(itemId, childId, 'failed', why).toJSON());
    }
    if (host.startRun === undefined) {
      throw new Error('this unit host cannot start child runs (created without startRun)');
    }
    try {
      await host.startRun(
        plan,
        item.element,
        { runId: childId, tenantId: meta.tenantId, queue: meta.queue },
        parentFields({
          runId,
          stepId: itemId,
          attempt: item.attempt,
          itemAttempt: item.itemAttempt,
        }),
      );
    } catch (error) {
      // A child that can never start fails the item for good; Redis trouble is thrown (the job
      // runs again and finds the child it may have created).
      if (error instanceof FlujoError && !error.retryable) return final(error.toJSON());
      throw error;
    }
  }
  await writeMetaField(
    core.redis,
    core.stores.keys,
    runId,
    childField(itemId, item.itemAttempt),
    childId,
  );
  if (child === null) {
    debugPoint(DebugPoint.afterChildStart, item.stepId);
    child = await core.stores.store.tryLoad(childId);
    if (child === null) return null;
  }
  const status = runStatus(child.snapshot);
  if (status === 'succeeded') {
    const childMeta = await core.meta.read(childId);
    return { kind: 'succeeded', output: childResult(childMeta.plan, child.snapshot) };
  }
  if (status !== 'failed' && status !== 'cancelled') return null;
  const error = new ChildFailedError(itemId, childId, status, childSummary(child.snapshot));
  return status === 'cancelled' ? final(error.toJSON()) : { kind: 'failed', error: error.toJSON() };
}
