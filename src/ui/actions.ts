/**
 * What a person may do to a run from the web view, each through the runtime function the CLI's
 * command uses, with its checks (the gate's `approvers`, `authorizeDecision`): approve and reject
 * (`flujo approve|reject`), skip (`flujo skip`), cancel (`flujo cancel`), resume a failed run and
 * retry a step that failed finally (`flujo resume`, whose `runtime.resume` reopens every step that
 * failed finally: the kernel has no event that reopens one step alone), queue a stalled run's due
 * work again (what a worker does when it starts), send the run's input again as a new run, and
 * send a signal to a run (`flujo signal`).
 */
import { isFlujoError } from '../errors.js';
import {
  readMetaField,
  readRunModule,
  RUN_MODULE_FIELD,
  writeMetaField,
} from '../persistence/run-lookups.js';
import { runtimeCore, type DecisionInput, type Runtime } from '../runtime.js';

/** The actions of a run: `<runId>/<action>`. */
export const RUN_ACTIONS = ['resume', 'cancel', 'again', 'signal'] as const;
/** The actions of a step: `<runId>/steps/<stepId>/<action>`. */
export const STEP_ACTIONS = ['approve', 'reject', 'skip', 'retry'] as const;
export type RunAction = (typeof RUN_ACTIONS)[number];
export type StepAction = (typeof STEP_ACTIONS)[number];

/**
 * The field of a run's meta hash where the web view records the run a "Send again" started it
 * from, and who sent it: `{"runId":"…","by":"…"}`.
 */
export const AGAIN_FIELD = 'uiAgainOf';

/** An action the view refuses, with the HTTP status of the page that says why. */
export class ActionRefused extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** What an action came to: the run whose page shows next, and what was done (see {@link DONE}). */
export interface ActionResult {
  runId: string;
  done: keyof typeof DONE;
}

/**
 * The line over the page an action leads to (`?done=<key>` of its address: a fixed text, so that
 * a link cannot make the page say anything else).
 */
export const DONE = {
  approve: 'Approved: the step goes on.',
  reject: 'Rejected.',
  skip: 'Skipped the step: its dependents go on with its output null.',
  retry:
    'Retried: the run is resumed, and every step that failed finally gets one more attempt (a worker of its job module runs them).',
  resume:
    'Resumed: every step that failed finally or was cancelled is reopened (a worker of its job module runs them).',
  requeue: 'Queued the run’s due work again: a worker of its job module runs it.',
  cancel: 'Cancelled the run.',
  again:
    'Started: a new run of the same plan with the same input (a worker of its job module runs it).',
  signal: 'Sent the signal: a worker of its job module wakes the step that waits for it.',
  signalAgain: 'That signal id was sent before with this payload: nothing more was delivered.',
} as const;

/** The HTTP status of a refusal the runtime throws; undefined for an error that is no refusal. */
const REFUSALS: Record<string, number> = {
  approval_not_allowed: 403,
  step_not_waiting: 409,
  step_not_skippable: 409,
  run_not_resumable: 409,
  input_invalid: 400,
  plan_invalid: 400,
  run_ended: 409,
  signal_id_conflict: 409,
};

/** The error as a refusal shown on the run's page, when it is one. */
export function refusalOf(error: unknown): ActionRefused | null {
  if (error instanceof ActionRefused) return error;
  if (!isFlujoError(error)) return null;
  const status = REFUSALS[error.code];
  return status === undefined ? null : new ActionRefused(status, error.message);
}

const VERB: Record<RunAction | StepAction, string> = {
  approve: 'approve',
  reject: 'reject',
  skip: 'skip',
  retry: 'retry',
  resume: 'resume',
  cancel: 'cancel',
  again: 'send again',
  signal: 'send the signal',
};

/** The form's `by`, trimmed; refused when empty. */
function whoDecides(form: URLSearchParams, action: RunAction | StepAction): string {
  const by = form.get('by')?.trim() ?? '';
  if (by === '') {
    throw new ActionRefused(
      400,
      `Say who decides: fill in "by" (your name), then ${VERB[action]} again.`,
    );
  }
  return by;
}

/**
 * Sends the form's signal (`name`, `payload` as JSON, empty: null; `id`, empty: none) through
 * `runtime.signal`, which checks it as `flujo signal` does; `declare` first declares the run's
 * signals (the job module's, when the view knows it).
 */
async function sendSignal(
  runtime: Runtime,
  runId: string,
  form: URLSearchParams,
  declare: ((runId: string) => Promise<void>) | undefined,
): Promise<ActionResult> {
  const name = form.get('name')?.trim() ?? '';
  const text = form.get('payload')?.trim() ?? '';
  const id = form.get('id')?.trim() ?? '';
  let payload: unknown = null;
  if (text !== '') {
    try {
      payload = JSON.parse(text);
    } catch (error) {
      const why = (error as Error).message.split('\n')[0] ?? 'invalid JSON';
      throw new ActionRefused(
        400,
        `The payload is not JSON (${why}); write JSON, e.g. {"ok":true}.`,
      );
    }
  }
  await declare?.(runId);
  const receipt = await runtime.signal(runId, name, payload, id === '' ? {} : { id });
  return { runId, done: receipt.duplicate ? 'signalAgain' : 'signal' };
}

/** Performs a run's action; throws {@link ActionRefused} (or the runtime's error) when refused. */
export async function runAction(
  runtime: Runtime,
  runId: string,
  action: RunAction,
  form: URLSearchParams,
  declareSignals?: (runId: string) => Promise<void>,
): Promise<ActionResult> {
  // A signal is no decision: it names no one.
  if (action === 'signal') return sendSignal(runtime, runId, form, declareSignals);
  const by = whoDecides(form, action);
  if (action === 'resume') {
    const report = await runtime.status(runId);
    if (report.status === 'running' && report.idle !== null) {
      // A stalled run: its due work is queued again, as a worker that starts does for every
      // active run (a unit already queued or done is not run twice).
      const core = runtimeCore(runtime);
      await core.stores.acknowledgeRead(runId);
      await core.queues.enqueueDue(runId, await core.stores.store.load(runId, { outputs: false }));
      return { runId, done: 'requeue' };
    }
    // A failed run is resumed; any other is refused with the runtime's reason.
    await runtime.resume(runId, { by });
    return { runId, done: 'resume' };
  }
  if (action === 'cancel') {
    const reason = form.get('reason')?.trim() ?? '';
    const before = await runtime.status(runId);
    if (['succeeded', 'failed', 'cancelled'].includes(before.status)) {
      throw new ActionRefused(409, `Run ${runId} is already ${before.status}; nothing to cancel.`);
    }
    await runtime.cancel(runId, { by, ...(reason === '' ? {} : { reason }) });
    return { runId, done: 'cancel' };
  }
  // Send again: the plan and input the run was started with, in a new run of the same tenant.
  const core = runtimeCore(runtime);
  const meta = await core.meta.read(runId);
  const started = await runtime.start(meta.plan, meta.input, {
    tenantId: meta.tenantId,
    ...(meta.cache.allowCacheHit === true ? { allowCacheHit: true } : {}),
    ...(meta.cache.refresh === true ? { refreshCache: true } : {}),
  });
  const module = await readRunModule(core.redis, core.stores.keys, runId);
  await Promise.all([
    writeMetaField(
      core.redis,
      core.stores.keys,
      started.runId,
      AGAIN_FIELD,
      JSON.stringify({ runId, by }),
    ),
    // The job module that started the original runs this one too (for the commands shown).
    module === null
      ? null
      : writeMetaField(core.redis, core.stores.keys, started.runId, RUN_MODULE_FIELD, module),
  ]);
  return { runId: started.runId, done: 'again' };
}

/** Performs a step's action; throws {@link ActionRefused} (or the runtime's error) when refused. */
export async function stepAction(
  runtime: Runtime,
  runId: string,
  stepId: string,
  action: StepAction,
  form: URLSearchParams,
): Promise<ActionResult> {
  const by = whoDecides(form, action);
  if (action === 'approve' || action === 'reject') {
    const comment = form.get('comment')?.trim() ?? '';
    const callId = form.get('callId') ?? '';
    const input: DecisionInput = {
      by,
      ...(comment === '' ? {} : { comment }),
      ...(callId === '' ? {} : { callId }),
    };
    if (action === 'approve') await runtime.approve(runId, stepId, input);
    else await runtime.reject(runId, stepId, input);
    return { runId, done: action };
  }
  if (action === 'skip') {
    const reason = form.get('reason')?.trim() ?? '';
    if (reason === '') {
      throw new ActionRefused(
        400,
        `Say why step "${stepId}" is skipped: fill in "reason" (e.g. done by hand), then skip again.`,
      );
    }
    await runtime.skip(runId, stepId, { by, reason });
    return { runId, done: 'skip' };
  }
  // Retry: the kernel reopens failed steps only all together, with run.resumed.
  const report = await runtime.status(runId);
  const step = report.steps.find((s) => s.stepId === stepId);
  if (step === undefined) {
    throw new ActionRefused(
      404,
      `Run ${runId} has no step "${stepId}"; its steps: ${report.steps.map((s) => s.stepId).join(', ')}.`,
    );
  }
  if (step.status !== 'FAILED_FINAL') {
    const later =
      step.status === 'FAILED_RETRYABLE'
        ? ' (it waits for its next attempt, which a worker starts when it is due)'
        : '';
    throw new ActionRefused(
      409,
      `Step "${stepId}" is ${step.status}${later}; only a step that failed finally can be retried.`,
    );
  }
  if (report.status !== 'failed') {
    throw new ActionRefused(
      409,
      `Step "${stepId}" failed finally, but run ${runId} is ${report.status}: other steps go on. A retry resumes the run, which can be done once it has failed; or skip the step.`,
    );
  }
  await runtime.resume(runId, { by });
  return { runId, done: 'retry' };
}

/** The run a "Send again" started `runId` from, and who sent it; null when it was not. */
export async function againOf(
  runtime: Runtime,
  runId: string,
): Promise<{ runId: string; by: string } | null> {
  const core = runtimeCore(runtime);
  const raw = await readMetaField(core.redis, core.stores.keys, runId, AGAIN_FIELD);
  if (raw === null) return null;
  try {
    const parsed = JSON.parse(raw) as { runId?: unknown; by?: unknown };
    return typeof parsed.runId === 'string' && typeof parsed.by === 'string'
      ? { runId: parsed.runId, by: parsed.by }
      : null;
  } catch {
    return null;
  }
}
