/**
 * Signals: a message sent to a running run, appended to its inbox in send order (see
 * `persistence/inbox.ts`), then a wake-up for the wait step that may take it. A plain function of
 * the runtime core, beside the decisions.
 */
import type { RuntimeCore } from '../actors/core.js';
import {
  InputValidationError,
  RunEndedError,
  RunNotFoundError,
  SignalIdConflictError,
  type ValidationIssue,
} from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import { findNonJson, type JsonValue } from '../internal/json.js';
import { assertRunId } from '../persistence/keys.js';
import { signalNameSchema } from '../plan/schema.js';
import { zodIssuesToValidationIssues } from '../schemas/issues.js';
import { loadRun } from './reading.js';

/** Options of `runtime.signal`. */
export interface SignalOptions {
  /**
   * Makes the send idempotent: a send again with the same id (and the same name and payload)
   * delivers nothing more and returns the first send's place; another name or payload under the
   * same id is refused (`SignalIdConflictError`). 1 to 200 characters.
   */
  id?: string;
}

/** Where a signal went. */
export interface SignalReceipt {
  runId: string;
  name: string;
  /** Its index among the run's signals of this name (0-based, in send order). */
  index: number;
  /** Its place among all the run's signals (1-based). */
  seq: number;
  id: string | null;
  /** True when the id was sent before: nothing was appended this time. */
  duplicate: boolean;
}

/** The most bytes of JSON a signal's payload may have. */
export const MAX_SIGNAL_PAYLOAD_BYTES = 1_000_000;

function checkArguments(name: unknown, id: unknown): ValidationIssue[] {
  const issues: ValidationIssue[] = [];
  const parsed = signalNameSchema.safeParse(name);
  if (!parsed.success) issues.push(...zodIssuesToValidationIssues(parsed.error.issues, 'name'));
  if (id !== undefined && (typeof id !== 'string' || id.length === 0 || id.length > 200)) {
    issues.push({ path: 'id', message: 'must be a string of 1 to 200 characters, or left out' });
  }
  return issues;
}

/**
 * The payload as the run will see it: plain JSON, and when the run's plan declares signals, a
 * declared name whose schema the payload passes (its parsed value is what is stored).
 */
function checkedPayload(
  core: RuntimeCore,
  planName: string,
  name: string,
  payload: unknown,
): JsonValue {
  if (payload === undefined) payload = null;
  const nonJson = findNonJson(payload, 'payload');
  if (nonJson.length > 0) throw new InputValidationError('signal', nonJson);
  const declared = core.registry.signals.get(planName);
  if (declared === undefined || Object.keys(declared).length === 0) {
    return (payload ?? null) as JsonValue;
  }
  const schema = declared[name];
  if (schema === undefined) {
    const names = Object.keys(declared).join(', ');
    throw new InputValidationError('signal', [
      {
        path: 'name',
        message: `plan "${planName}" declares no signal "${name}"; it takes: ${names}`,
      },
    ]);
  }
  const parsed = schema.safeParse(payload);
  if (!parsed.success) {
    throw new InputValidationError(
      `signal "${name}"`,
      zodIssuesToValidationIssues(parsed.error.issues, 'payload'),
    );
  }
  return (parsed.data ?? null) as JsonValue;
}

/** A signal sent with a start (`runtime.start(…, { requestKey, signal })`). */
export interface StartSignal {
  name: string;
  /** Plain JSON. @defaultValue null */
  payload?: unknown;
  /** As {@link SignalOptions.id}. */
  id?: string;
}

/**
 * A signal checked against the runs of plan `planName` (its name, id and payload; see
 * {@link checkedPayload}): its payload's JSON text, ready to append. Throws
 * `InputValidationError` naming the field.
 */
export function checkSignal(
  core: RuntimeCore,
  planName: string,
  name: string,
  payload: unknown,
  id: string | undefined,
): string {
  const issues = checkArguments(name, id);
  if (issues.length > 0) throw new InputValidationError('signal', issues);
  const text = JSON.stringify(checkedPayload(core, planName, name, payload));
  if (text.length > MAX_SIGNAL_PAYLOAD_BYTES) {
    throw new InputValidationError('signal', [
      {
        path: 'payload',
        message: `is ${text.length} bytes of JSON; a signal carries at most ${MAX_SIGNAL_PAYLOAD_BYTES}: store large data elsewhere and send its reference`,
      },
    ]);
  }
  return text;
}

/**
 * Sends signal `name` with `payload` to run `runId`: checked (the name, the payload against the
 * plan's declared signals, the run going on), appended to the run's inbox, and the wait step that
 * may take it woken. A refused signal writes nothing.
 */
export async function sendSignal(
  core: RuntimeCore,
  runId: string,
  name: string,
  payload?: unknown,
  options: SignalOptions = {},
): Promise<SignalReceipt> {
  assertRunId(runId);
  const early = checkArguments(name, options.id);
  if (early.length > 0) throw new InputValidationError('signal', early);
  // The run's plan says which signals it takes; whether it still takes any is the append's to
  // say (a send again with a known id gets its first answer, even once the run has ended).
  const env = await loadRun(core, runId);
  const text = checkSignal(core, env.snapshot.context.planName, name, payload, options.id);
  return appendSignal(core, runId, name, text, options.id ?? null);
}

/**
 * Appends a checked signal (its payload's JSON `text`) to the run's inbox, then wakes the wait
 * step that may take it.
 */
export async function appendSignal(
  core: RuntimeCore,
  runId: string,
  name: string,
  text: string,
  id: string | null,
): Promise<SignalReceipt> {
  const result = await core.stores.inbox.append(runId, {
    name,
    payload: text,
    id,
    at: core.clock(),
  });
  if (result.kind === 'missing') throw new RunNotFoundError(runId);
  if (result.kind === 'ended') throw new RunEndedError(runId, result.status);
  if (result.kind === 'conflict') throw new SignalIdConflictError(runId, id ?? '');
  debugPoint(DebugPoint.afterSignalAppend, name);
  // The wake-up: a waiting step gets a job for the signal it may take now (a sender that died
  // here is healed by the next guard or sweep of the run, which looks for the same).
  const now = await core.host.load(runId);
  const wakes = await core.queues.signalWakes(runId, now.snapshot);
  if (wakes.length > 0) await core.queues.add(wakes);
  // A granular step in a model call whose inbox takes this signal may interrupt the call.
  await core.queues.publishInterrupts(runId, now.snapshot, name);
  return {
    runId,
    name,
    index: result.index,
    seq: result.seq,
    id,
    duplicate: result.kind === 'duplicate',
  };
}
