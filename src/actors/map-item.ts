/**
 * The life of one item of a map step (one attempt of it), as one unit of work:
 *
 * 1. Admit: the map's attempt must still run (the step RUNNING that attempt, read from the run
 *    held in memory while its version is the stored one), the run's wall clock allow it, and the
 *    item be neither committed nor another of its attempts current (`MapStore.begin`, which also
 *    reads its element).
 * 2. Guard and execute: the item's operator or agent (`mapItemStep`: the element as its input, its
 *    own id `<map>.<index>`, hence its own ledger scope and idempotency key), bounded by the
 *    step's `timeoutMs` and aborted by a run cancel. A `run` item instead starts the child run of
 *    its attempt and returns; its child's end wakes the item's job, which takes the child's end
 *    as the attempt's result (`map-item-child.ts`).
 * 3. Commit: one script on the map's keys (`MapStore.commit`), the same work whatever the map's
 *    size: the output (or, for a retryable failure with attempts left, the next attempt's
 *    number; for a final failure, the error or its record), and the next index dispatched. An item
 *    committed already changes nothing.
 * 4. Next: the next item's job, the retry's delayed job, or the map's finish (`finishMap`).
 *
 * A kind of item is the step it runs as (`mapItemStep`) and its execution (`executeItem`): a new
 * kind is a case of each.
 */
import { randomInt } from 'node:crypto';
import { ConfigurationError, type SerializedError } from '../errors.js';
import { retryDelayMs } from '../internal/backoff.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import type { StepState } from '../machines/kernel.js';
import { itemErrorRecord, mapItemStep } from '../plan/map.js';
import type { MapStep, PlanStep } from '../plan/schema.js';
import type { ItemOutcome } from '../persistence/map-store.js';
import { executeStep, type StepResult } from '../execution/execute-step.js';
import { itemJob, type JobData } from './jobs.js';
import { treeBudgetOver } from './child-budgets.js';
import { finishMap } from './map.js';
import { itemChildResult } from './map-item-child.js';
import { abortMessage } from './runtime-queues.js';
import type { RunMeta } from './runtime-meta.js';
import { attemptLimit, executionDepsFor, guardUnit, stopForBudget, type UnitHost } from './unit.js';
import { planStep } from '../plan/graph.js';

/** What an item job came to: a word, or "come back later" (a tool call another worker holds). */
export type ItemOutcomeWord = string | { retryAfterMs: number };

/** The key under which a running item is aborted with its map's attempt (see `abortUnit`). */
export function itemAbortKey(
  runId: string,
  stepId: string,
  attempt: number,
  index: number,
): string {
  return `${abortMessage(runId, stepId, attempt)}\nitem\n${index}`;
}

/** How long an item that met Redis trouble, or a tool call another worker holds, waits. */
const ITEM_BUSY_MS = 500;

/**
 * An item job: one attempt of one item, or, for a job without an index, the map's finish. `self`
 * is the job's id.
 */
export async function runMapItemUnit(
  host: UnitHost,
  data: JobData,
  self: string,
  jobSignal?: AbortSignal,
): Promise<ItemOutcomeWord> {
  if (data.index === undefined) return finishMap(host, data, self);
  const { core } = host;
  const { runId } = data;
  const stepId = data.stepId!;
  const attempt = data.attempt!;
  const index = data.index;
  const itemAttempt = data.itemAttempt ?? 1;
  // 1. Admit.
  const env = await core.host.load(runId);
  const child = env.snapshot.children[stepId]?.snapshot;
  if (
    child === undefined ||
    (child.value !== 'RUNNING' && child.value !== 'READY') ||
    child.context.attempt !== attempt ||
    env.snapshot.status !== 'active'
  ) {
    return 'already-done';
  }
  const meta = await core.meta.read(runId);
  const max = meta.plan.budgets?.maxWallClockMs;
  if (max !== undefined && core.clock() - meta.createdAt > max) {
    await stopForBudget(host, runId, env, {
      budget: 'maxWallClockMs',
      limit: max,
      used: core.clock() - meta.createdAt,
    });
    return 'budget';
  }
  const begun = await core.stores.maps.begin(runId, stepId, attempt, index, itemAttempt);
  if (begun.kind !== 'run') return `item-${begun.kind}`;
  const map = planStep(meta.plan, stepId) as MapStep;
  const element = JSON.parse(begun.element) as JsonValue;
  // 2. Guard and execute (or, for a `run` item, start the child, and take its end once it ended).
  let result: StepResult;
  if (map.item.kind === 'run') {
    const item = { runId, stepId, attempt, index, itemAttempt, element };
    const ended = await itemChildResult(host, meta, map.item.plan, item);
    if (ended === null) return 'item-waiting';
    const over = await treeBudgetOver(core, runId, meta);
    if (over !== null) {
      await stopForBudget(host, over.runId, await core.host.load(over.runId), over.detail);
      return 'budget';
    }
    result = ended;
  } else {
    const item = { runId, map, attempt, index, itemAttempt, element };
    result = await executeItemAttempt(host, meta, item, child.context, jobSignal);
  }
  // 3. Commit.
  if (result.kind === 'budget') {
    await stopForBudget(host, runId, env, result.error.details as JsonValue);
    return 'budget';
  }
  if (result.kind === 'failed' && isBusy(result.error)) {
    return { retryAfterMs: Math.max(50, result.error.retryAfterMs ?? ITEM_BUSY_MS) };
  }
  const { outcome, payload, delayMs } = commitOf(map, index, itemAttempt, result);
  debugPoint(DebugPoint.beforeItemCommit, stepId);
  const committed = await core.stores.maps.commit(runId, stepId, attempt, {
    index,
    itemAttempt,
    outcome,
    payload,
  });
  debugPoint(DebugPoint.afterItemCommit, stepId);
  // 4. Next.
  switch (committed.kind) {
    case 'ok':
      if (committed.next.length > 0) {
        await core.queues.add(committed.next.map((i) => itemJob(runId, stepId, attempt, i, 1)));
      }
      return outcome === 'failed' ? 'item-failed' : 'item-succeeded';
    case 'retry':
      await core.queues.add([itemJob(runId, stepId, attempt, index, committed.attempt, delayMs)]);
      return 'item-retry';
    case 'finish':
      await finishMap(host, { runId, stepId, attempt }, self);
      return outcome === 'failed' ? 'item-failed' : 'item-succeeded';
    default:
      return `item-${committed.kind}`;
  }
}

/**
 * Runs attempt `itemAttempt` of an operator or agent item, guarded, bounded by the step's
 * `timeoutMs`; a cancel of the run aborts its map's attempt, hence its items.
 */
async function executeItemAttempt(
  host: UnitHost,
  meta: RunMeta,
  item: {
    runId: string;
    map: MapStep;
    attempt: number;
    index: number;
    itemAttempt: number;
    element: JsonValue;
  },
  context: Omit<StepState, 'status'>,
  jobSignal: AbortSignal | undefined,
): Promise<StepResult> {
  const { runId, map, index, itemAttempt } = item;
  const step = mapItemStep(map, index, item.element);
  const state: StepState = {
    ...context,
    status: 'RUNNING',
    stepId: step.id,
    attempt: itemAttempt,
    granular: false,
    needsApproval: false,
    fallback: null,
    pauses: 0,
    agent: null,
    pendingCall: null,
    callDecisions: null,
    map: null,
  };
  const cancel = new AbortController();
  const abortKey = itemAbortKey(runId, map.id, item.attempt, index);
  host.aborts.set(abortKey, cancel);
  try {
    const limit = await attemptLimit(host, runId, step, itemAttempt);
    const signal =
      jobSignal === undefined ? cancel.signal : AbortSignal.any([jobSignal, cancel.signal]);
    return await guardUnit(
      host,
      { runId, stepId: step.id, attempt: itemAttempt },
      signal,
      limit,
      (s) => executeItem(host, meta, { runId, step, state, signal: s }),
    );
  } finally {
    host.aborts.delete(abortKey);
  }
}

/** A failure that is no attempt of the item: a tool call another worker holds, Redis trouble. */
const isBusy = (error: SerializedError): boolean =>
  error.code === 'tool_call_busy' || error.code === 'redis_unavailable';

/** What the commit of an item's attempt records, and a retry's delay. */
function commitOf(
  map: MapStep,
  index: number,
  itemAttempt: number,
  result: Exclude<StepResult, { kind: 'budget' }>,
): { outcome: ItemOutcome; payload: string; delayMs: number } {
  if (result.kind === 'succeeded') {
    return { outcome: 'ok', payload: JSON.stringify(result.output), delayMs: 0 };
  }
  const error: SerializedError =
    result.kind === 'paused'
      ? new ConfigurationError(
          `item ${index} of map step "${map.id}" called tool "${result.call.tool}", which needs a person's approval: a map's items cannot wait for one. Lower the tool's risk level, or call it from a step of its own`,
        ).toJSON()
      : result.error;
  if (error.retryable && itemAttempt < map.retry.maxAttempts) {
    const delayMs = retryDelayMs(map.retry, itemAttempt, randomInt(0, 2 ** 32), error.retryAfterMs);
    return { outcome: 'retry', payload: '', delayMs };
  }
  const payload =
    map.itemFailures === 'collect'
      ? JSON.stringify(itemErrorRecord(index, itemAttempt, error))
      : JSON.stringify({ code: error.code, message: error.message, retryable: error.retryable });
  return { outcome: 'failed', payload, delayMs: 0 };
}

/**
 * The execution of one attempt of an item: its step as `mapItemStep` made it (an operator, or an
 * atomic agent), with no dependencies' outputs (the element is its input).
 */
function executeItem(
  host: UnitHost,
  meta: RunMeta,
  a: { runId: string; step: PlanStep; state: StepState; signal: AbortSignal },
): Promise<StepResult> {
  return executeStep(executionDepsFor(host, meta), {
    step: a.step,
    state: a.state,
    runId: a.runId,
    tenantId: meta.tenantId,
    runInput: meta.input,
    depOutputs: {},
    signal: a.signal,
  });
}
