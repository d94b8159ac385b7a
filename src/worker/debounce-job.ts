/**
 * Debounced starts: each start of a burst records its start in the burst (`persistence/debounces.ts`)
 * and adds the burst's one delayed `debounce` job (a deterministic id per burst: adds after the
 * first are no-ops). The job, when its delay ends, starts the run with the burst's last start, or
 * goes back to the delayed set until the burst's due time when later starts pushed it back.
 *
 * BullMQ's own debounce (`deduplication` with `extend` and `replace`) replaces the delayed job by
 * the newest start's job, so a burst has no id the first caller could be told, and nothing caps
 * how long extensions postpone it; hence the burst state of our own, with BullMQ's delayed job as
 * its timer.
 */
import { UnrecoverableError } from 'bullmq';
import type { RuntimeCore } from '../actors/core.js';
import { JobName } from '../actors/jobs.js';
import { FlujoError } from '../errors.js';
import { launchRun, type StartOptions } from './start-run.js';

/** The data of a `debounce` job: which burst of which key. */
export interface DebounceJobData {
  tenantId: string;
  key: string;
  burst: string;
}

/** What a burst keeps of its last start: what `launchRun` takes. */
export interface DebouncedStart {
  /** The plan as validated, JSON text. */
  plan: string;
  input: unknown;
  options: StartOptions;
}

/** The id of the job of burst `burst` (a run id, URI-encoded: a job id holds no ':'). */
export function debounceJobId(burst: string): string {
  return `d|${encodeURIComponent(burst)}`;
}

/**
 * Adds the delayed job of burst `burst` to `queue`, due at `due` (a no-op when the burst has it).
 */
export async function addDebounceJob(
  core: RuntimeCore,
  queue: string,
  data: DebounceJobData,
  due: number,
): Promise<void> {
  await core.queues.queueNamed(queue).add(JobName.debounce, data, {
    jobId: debounceJobId(data.burst),
    delay: Math.max(0, due - core.clock()),
  });
}

/**
 * Handles a `debounce` job: `{ retryAt }` when the burst is not due yet (later starts pushed it
 * back); else starts the burst's run (run id: the burst's) with its last start and returns its run
 * id, or `'gone'` for a burst that started already. A redelivered job (its worker died mid-start)
 * finds the burst among the firing ones and finishes its start (the same run id: no second run).
 * A start refused here (a fallback this worker does not register) fails the job at once.
 */
export async function processDebounceJob(
  core: RuntimeCore,
  data: DebounceJobData,
): Promise<string | { retryAt: number }> {
  const store = core.stores.debounces;
  const taken = await store.take(data.tenantId, data.key, data.burst, core.clock());
  if (taken.kind === 'gone') return 'gone';
  if (taken.kind === 'wait') return { retryAt: taken.due };
  const start = JSON.parse(taken.start) as DebouncedStart;
  try {
    const run = await launchRun(
      core,
      start.plan,
      start.input,
      { ...start.options, runId: data.burst },
      true,
    );
    await store.fired(data.tenantId, data.burst);
    return run.runId;
  } catch (error) {
    if (error instanceof FlujoError && !error.retryable) {
      await store.fired(data.tenantId, data.burst);
      throw new UnrecoverableError(error.message);
    }
    throw error;
  }
}
