/**
 * The sweep's check of the runs that ended lately against their snapshots. A run that ends leaves
 * the active runs and is noted, in the same slot, as ended (`persistence/active-runs.ts`). Its own
 * keys live in another slot: on Redis Cluster, a failover of that slot to a replica that lagged can
 * take back the run's last commits, its end included, while the note and the removal stay. Such a
 * run is back at a status that goes on, yet no job and no active-runs entry would ever drive it.
 *
 * Each sweep reads the status of every run noted within the window and whether its tombstone is
 * there (one HGET and one EXISTS each, a page at a time) and settles the notes:
 * - the run still ended (succeeded, failed, cancelled): its note stays until the window drops it;
 *   if it has no tombstone while retention applies to it, its end is done again
 *   (`actors/runtime-meta.ts`: `ended`): a run's end notes it here in the same round trip as it
 *   gives its keys their expiry (`persistence/run-end.ts`), and a crash may have let the note
 *   land without the expiry;
 * - the run goes on: one script puts it back among the active runs unless its note changed (it
 *   ended again since), and the worker whose script added it logs a warning; then its keys in other
 *   slots lose the expiry its end gave them, its run-list entry is reopened, the run's finished
 *   unit jobs are removed from the queue (BullMQ would ignore an add under their ids, and the units
 *   it does again have them), its due units are enqueued, and its note is dropped. All of it is
 *   harmless to repeat (a unit's guard makes a second job of it a no-op), so a run already active
 *   (resumed, or put back by a sweep that did not finish) gets the same; a crash or a Redis error
 *   before the note is dropped leaves it for the next sweep (an error is logged, and the sweep goes
 *   on with the next run);
 * - the run is gone: when retention removed it (its tombstone is there), the note is dropped;
 *   otherwise its start was taken back too (nothing is left to drive: no plan, no input), the note
 *   is dropped and a warning is logged.
 */
import type { RuntimeCore } from '../actors/core.js';
import type { EndedRun } from '../persistence/active-runs.js';
import { readRunStatus } from '../persistence/run-lookups.js';

const ENDED_STATUSES = new Set(['succeeded', 'failed', 'cancelled']);

/** Checks the runs that ended within the window (see the module comment). */
export async function reconcileEnded(core: RuntimeCore, closing: AbortSignal): Promise<void> {
  const { activeRuns, keys, retention } = core.stores;
  await activeRuns.forEachEnded(async (runs) => {
    if (closing.aborted) return;
    // One HGET and one EXISTS per run, sent at once (a pipeline on one server; per node on a cluster).
    const [statuses, tombstones] = await Promise.all([
      Promise.all(runs.map((r) => readRunStatus(core.redis, keys, r.runId))),
      Promise.all(runs.map((r) => core.redis.exists(keys.removed(r.runId)))),
    ]);
    for (const [i, run] of runs.entries()) {
      const status = statuses[i] ?? null;
      const kept = status === 'failed' && retention.failedRunsMs === null;
      if (status !== null && ENDED_STATUSES.has(status) && (kept || tombstones[i] === 1)) continue;
      if (closing.aborted) return;
      try {
        if (status !== null && ENDED_STATUSES.has(status)) await core.meta.ended(run.runId, status);
        else await settleEnded(core, run, status);
      } catch (error) {
        core.log.warn(
          { runId: run.runId, endedAt: run.endedAt, err: error },
          'checking a run that ended failed; the next sweep tries again',
        );
      }
    }
  });
}

/** A run noted as ended whose status (`status`, null: none stored) says otherwise. */
async function settleEnded(core: RuntimeCore, run: EndedRun, status: string | null): Promise<void> {
  const { runId, endedAt } = run;
  const { activeRuns, store, retention } = core.stores;
  const env = await store.tryLoad(runId, { outputs: false });
  if (env === null) {
    if ((await retention.removed(runId)) !== null) {
      await activeRuns.forget(run);
      return;
    }
    if (await activeRuns.forget(run)) {
      core.log.warn(
        { runId, endedAt },
        'a run that ended has no keys left and was not removed by retention: its start was lost with its end (a failover to a replica that lagged?); it cannot be driven again',
      );
    }
    return;
  }
  const { snapshot } = env;
  // A snapshot stored before the run's status was kept apart: the whole snapshot tells.
  if (snapshot.status !== 'active' || snapshot.value === 'failed') return;
  const reinstated = await activeRuns.reinstate(run);
  if (reinstated === 'changed') return;
  if (reinstated === 'reinstated') {
    core.log.warn(
      { runId, endedAt, status },
      'a run that ended is going on again (its last commits were lost, as by a failover to a replica that lagged, or a resume did not finish): it is active again and driven on',
    );
  }
  await core.meta.resumed(runId);
  await core.stores.runs.reopened(runId);
  await core.stores.acknowledgeRead(runId);
  await core.queues.redriveDue(runId, env);
  await activeRuns.forget(run);
}
