import { runSteps, type RunSnapshot } from '../machines/kernel.js';
import type { PlannedAction } from '../machines/types.js';

/** The kinds of BullMQ job that drive runs: one unit of work each. */
export const JobName = {
  /** Execute attempt `attempt` of step `stepId`. */
  step: 'step',
  /** Take turn `turn` of attempt `attempt` of granular agent step `stepId`. */
  turn: 'turn',
  /** The backoff of a failed attempt elapsed: feed `retry.due`. */
  retry: 'retry',
  /** The run's wall-clock budget ran out: stop it if it is still going. */
  deadline: 'deadline',
} as const;
/** A value of {@link JobName}. */
export type JobName = (typeof JobName)[keyof typeof JobName];

/** The data of every job: which run, for step and retry jobs which step attempt, for turn jobs which turn. */
export interface JobData {
  runId: string;
  stepId?: string;
  attempt?: number;
  turn?: number;
}

/** A job to add, with its deterministic id. */
export interface JobSpec {
  name: JobName;
  data: JobData;
  opts: { jobId: string; delay?: number };
}

// Step ids never contain '|' (see STEP_ID_PATTERN) and run ids are URI-encoded, so ids cannot
// collide; BullMQ job ids must not contain ':'.
const enc = (runId: string) => encodeURIComponent(runId);

/** The id of the job that runs attempt `attempt` of `stepId`: the same for every enqueuer. */
export function stepJobId(runId: string, stepId: string, attempt: number): string {
  return `s|${enc(runId)}|${stepId}|${attempt}`;
}

/** The id of the job that takes turn `turn` (0-based) of attempt `attempt` of `stepId`. */
export function turnJobId(runId: string, stepId: string, attempt: number, turn: number): string {
  return `t|${enc(runId)}|${stepId}|${attempt}|${turn}`;
}

/** The id of the delayed job that makes attempt `attempt` of `stepId` due. */
export function retryJobId(runId: string, stepId: string, attempt: number): string {
  return `r|${enc(runId)}|${stepId}|${attempt}`;
}

/** The id of the run's wall-clock deadline job. */
export function deadlineJobId(runId: string): string {
  return `d|${enc(runId)}`;
}

/**
 * Every unit of work the run's snapshot says is due: each RUNNING step attempt (for a granular
 * agent step, its next turn), each scheduled retry. Derived from the snapshot rather than from one transition's planned actions, so that
 * enqueueing it again (a redelivered job, a restarted worker) re-creates exactly what is missing
 * and nothing else: the ids are deterministic and BullMQ ignores an id it already holds.
 */
export function dueJobs(runId: string, snapshot: RunSnapshot, now: number): JobSpec[] {
  if (snapshot.status !== 'active') return [];
  const jobs: JobSpec[] = [];
  for (const step of runSteps(snapshot)) {
    if (step.status === 'RUNNING' && step.granular) {
      const turn = step.agent?.turns ?? 0;
      jobs.push({
        name: JobName.turn,
        data: { runId, stepId: step.stepId, attempt: step.attempt, turn },
        opts: { jobId: turnJobId(runId, step.stepId, step.attempt, turn) },
      });
    } else if (step.status === 'RUNNING') {
      jobs.push({
        name: JobName.step,
        data: { runId, stepId: step.stepId, attempt: step.attempt },
        opts: { jobId: stepJobId(runId, step.stepId, step.attempt) },
      });
    } else if (step.status === 'FAILED_RETRYABLE' && step.retryAt !== null) {
      const attempt = step.attempt + 1;
      jobs.push({
        name: JobName.retry,
        data: { runId, stepId: step.stepId, attempt },
        opts: {
          jobId: retryJobId(runId, step.stepId, attempt),
          delay: Math.max(0, step.retryAt - now),
        },
      });
    }
  }
  return jobs;
}

/**
 * The units of work a transition planned: what became due with one commit. After a commit whose
 * transition is known this is all that is new (a unit that was already due has its job, or heals
 * through the guard of a redelivered job), so the snapshot need not be walked again.
 */
export function plannedJobs(
  runId: string,
  snapshot: RunSnapshot,
  planned: readonly PlannedAction[],
  now: number,
): JobSpec[] {
  const jobs: JobSpec[] = [];
  for (const p of planned) {
    if (p.type === 'step.execute') {
      const context = snapshot.children[p.stepId]?.snapshot.context;
      if (context?.granular === true) {
        const turn = context.agent?.turns ?? 0;
        jobs.push({
          name: JobName.turn,
          data: { runId, stepId: p.stepId, attempt: p.attempt, turn },
          opts: { jobId: turnJobId(runId, p.stepId, p.attempt, turn) },
        });
      } else {
        jobs.push({
          name: JobName.step,
          data: { runId, stepId: p.stepId, attempt: p.attempt },
          opts: { jobId: stepJobId(runId, p.stepId, p.attempt) },
        });
      }
    } else if (p.type === 'step.scheduleRetry') {
      jobs.push({
        name: JobName.retry,
        data: { runId, stepId: p.stepId, attempt: p.attempt },
        opts: { jobId: retryJobId(runId, p.stepId, p.attempt), delay: Math.max(0, p.at - now) },
      });
    }
  }
  return jobs;
}
