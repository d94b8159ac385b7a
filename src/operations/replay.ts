/**
 * Replay: reproduce a run from what it stored, or replay or regenerate it as a new run. A plain
 * function of the runtime core over the replay module of the worker layer.
 */
import type { RuntimeCore } from '../actors/core.js';
import {
  checkReplayOptions,
  reproduceRun,
  startReplay,
  type ReplayedRun,
  type ReplayOptions,
  type ReproducedRun,
} from '../worker/replay.js';

/**
 * Reproduces (`mode: 'reproduce'`, writes nothing), replays or regenerates run `runId`
 * (`runtime.replay`). The options are checked before anything is read.
 */
export async function replayRun(
  core: RuntimeCore,
  runId: string,
  options: ReplayOptions,
): Promise<ReproducedRun | ReplayedRun> {
  const checked = checkReplayOptions(options);
  if (checked.mode === 'reproduce') return reproduceRun(core, runId);
  return startReplay(core, runId, { ...checked, mode: checked.mode });
}
