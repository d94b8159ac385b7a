/**
 * The life of a map step's attempt, apart from its items (`map-item.ts`):
 *
 * 1. Start (`runMapUnit`, the step's own job, admitted like any step attempt): the list at `over`
 *    is read and checked (an array of at most 10,000 elements, else the step fails with
 *    `map_over_invalid`); the items are stored beside the run and the first `maxConcurrency`
 *    dispatched (`MapStore.start`, one script, idempotent); then `step.started` with the number
 *    of items is committed (READY → RUNNING): from then on the step itself has no unit due, its
 *    items are the units, and the run's snapshot is not written again until the map ends.
 * 2. Items: each commits with one script on the map's keys and dispatches the next index.
 * 3. Finish (`finishMap`, run by the item whose commit ended the map, or by its own job, which a
 *    sweep adds when that item died before it): the outputs are read in order and the step's
 *    success committed (or, for an item that failed finally, the step's failure `item_failed`),
 *    by the ordinary compare-and-set commit.
 *
 * What heals a crash: the step's job run again finds its items started and dispatches those in
 * flight again; an item's job is deterministic per index and attempt, and an item committed is
 * never run again (its start and its commit check it); what a sweep finds in flight without a job
 * (`RuntimeQueues.enqueueDue`) is enqueued again, and a map that ended without its finish gets its finish job.
 */
import { ItemFailedError, MapOverError, type SerializedError } from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import type { RunSnapshot } from '../machines/kernel.js';
import { mapListOf, mapSource } from '../plan/map.js';
import type { MapStep } from '../plan/schema.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import type { RunEvent } from '../schemas/events.js';
import { itemJob, mapEndJob, type JobData } from './jobs.js';
import {
  commitUnit,
  failed,
  nextUnit,
  notifyFailures,
  outputsOf,
  type Admitted,
  type Chain,
  NO_RUN,
  type UnitHost,
  type UnitOutcome,
} from './unit.js';

/** Commits `events` of the map step's unit, then what follows (as a step attempt does). */
async function commitMapEvents(
  host: UnitHost,
  data: JobData,
  admitted: { env: SnapshotEnvelope<RunSnapshot>; meta: Admitted['meta'] },
  events: RunEvent[],
  chain: Chain,
  ended: string,
): Promise<UnitOutcome> {
  const { core } = host;
  const { runId } = data;
  debugPoint(DebugPoint.beforeCommit, data.stepId);
  const { applied, next } = await commitUnit(host, {
    data,
    env: admitted.env,
    unit: NO_RUN,
    events,
    chain,
  });
  notifyFailures(host, runId, events, applied);
  debugPoint(DebugPoint.afterCommit, data.stepId);
  if (next !== null) return nextUnit(host, next, applied, chain, ended);
  await core.queues.enqueuePlanned(runId, applied);
  return ended;
}

/**
 * The step job of an admitted map step: reads its list, starts its items and commits its start
 * (or its failure, for a list that is not one; its success, for an empty list).
 */
export async function runMapUnit(
  host: UnitHost,
  data: JobData,
  admitted: Admitted,
  chain: Chain,
): Promise<UnitOutcome> {
  const { core } = host;
  const { env, meta } = admitted;
  const step = admitted.step as MapStep;
  const { runId } = data;
  const stepId = data.stepId!;
  const attempt = data.attempt!;
  const source = mapSource(
    step,
    meta.plan.steps.map((s) => s.id),
  );
  const outputs = await outputsOf(core, runId, env, [source.step]);
  const read = mapListOf(step, outputs[source.step], source.path);
  const at = core.clock();
  if ('problem' in read) {
    const error = new MapOverError(stepId, read.problem).toJSON();
    return commitMapEvents(
      host,
      data,
      admitted,
      [failed(host, stepId, attempt, error)],
      chain,
      'failed',
    );
  }
  if (read.list.length === 0) {
    const events: RunEvent[] = [{ type: 'step.succeeded', stepId, attempt, output: [], at }];
    return commitMapEvents(host, data, admitted, events, chain, 'succeeded');
  }
  const inflight = await core.stores.maps.start(runId, stepId, attempt, {
    maxConcurrency: step.maxConcurrency,
    mode: step.itemFailures,
    elements: read.list.map((element) => JSON.stringify(element)),
  });
  debugPoint(DebugPoint.afterMapStart, stepId);
  const started: RunEvent = { type: 'step.started', stepId, attempt, items: read.list.length, at };
  const outcome = await commitMapEvents(host, data, admitted, [started], chain, 'map-started');
  // A resumed map whose items all kept their outputs from an earlier attempt has none to run:
  // its finish is due at once.
  await core.queues.add(
    inflight.length === 0
      ? [mapEndJob(runId, stepId, attempt)]
      : inflight.map((i) => itemJob(runId, stepId, attempt, i.index, i.attempt)),
  );
  return outcome;
}

/**
 * The finish of attempt `attempt` of a map step whose items are over: its output (the items'
 * outputs in element order) committed as its success, or the item that failed it committed as
 * its failure (`item_failed`). A map that is not over, or a step no longer running that attempt,
 * commits nothing.
 */
export async function finishMap(host: UnitHost, data: JobData, self: string): Promise<string> {
  const { core } = host;
  const { runId } = data;
  const stepId = data.stepId!;
  const attempt = data.attempt!;
  const env = await core.host.load(runId);
  const child = env.snapshot.children[stepId]?.snapshot;
  if (child === undefined || child.value !== 'RUNNING' || child.context.attempt !== attempt) {
    await core.queues.enqueueDue(runId, env, self);
    return 'already-done';
  }
  const results = await core.stores.maps.results(runId, stepId, attempt);
  if (results.kind === 'none') return 'map-running';
  const meta = await core.meta.read(runId);
  const at = core.clock();
  let event: RunEvent;
  if (results.kind === 'done') {
    const output = results.outputs.map((o) => JSON.parse(o) as JsonValue);
    event = { type: 'step.succeeded', stepId, attempt, output, at };
  } else {
    const itemError = JSON.parse(results.error) as SerializedError;
    const error = new ItemFailedError(stepId, results.index, results.attempts, itemError);
    event = failed(host, stepId, attempt, error.toJSON());
  }
  const chain: Chain = { self, until: -Infinity };
  const outcome = await commitMapEvents(host, data, { env, meta }, [event], chain, 'map-finished');
  return typeof outcome === 'string' ? outcome : 'map-finished';
}
