/**
 * The `start` job: how a process that has only BullMQ (another service, another language) starts
 * a run. It adds a job named `start` to the runtime's queue; a worker validates its data and
 * starts the run through the same path as `runtime.start`.
 */
import { createHash } from 'node:crypto';
import { UnrecoverableError } from 'bullmq';
import { z } from 'zod';
import {
  FlujoError,
  InputValidationError,
  RunAlreadyExistsError,
  type ValidationIssue,
} from '../errors.js';
import { formatPath } from '../internal/json.js';
import { parsePlan } from '../plan/parse-plan.js';
import { closestMatch, type PlanInput } from '../plan/schema.js';
import { createKeys, DEFAULT_QUEUE_NAME } from '../persistence/keys.js';
import type { RuntimeCore } from '../actors/core.js';
import { JobName } from '../actors/jobs.js';
import { launchRun } from './start-run.js';

/** The name of the job that starts a run: `'start'`. */
export const START_JOB_NAME = JobName.start;

export { DEFAULT_QUEUE_NAME };

/** The data of a `start` job: what `runtime.start(plan, input, { runId, requestKey, tenantId, priority })` takes. */
export interface StartJobData {
  /** The plan: an object as `runtime.start` takes it, or its JSON text. */
  plan: PlanInput | string;
  /** The run input, plain JSON. @defaultValue null */
  input?: unknown;
  /**
   * The run id. @defaultValue a UUID derived from the job (its queue, id and creation time), so
   * a job that runs again after its worker died finds the run it started
   */
  runId?: string | undefined;
  /** Same key, same run (per tenant): a second start with it returns the first run. */
  requestKey?: string | undefined;
  /** @defaultValue the runtime's tenant */
  tenantId?: string | undefined;
  /**
   * The run's priority, an integer from -1000 to 1000: higher goes first (see
   * `StartOptions.priority`). @defaultValue 0
   */
  priority?: number | undefined;
}

/** The return value of a `start` job. */
export interface StartJobResult {
  runId: string;
  /** False when the request key led to a run that already existed. */
  created: boolean;
}

/** The fields a `start` job takes, for messages. */
const FIELDS = ['plan', 'input', 'runId', 'requestKey', 'tenantId', 'priority'] as const;

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/** What a value is, for messages: `a number`, `an array`, `null`. */
function kindOf(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (value === undefined) return 'nothing';
  const type = typeof value;
  return type === 'object' || type === 'undefined' ? `an ${type}` : `a ${type}`;
}

const idField = (field: string, example: string) =>
  z
    .string({
      error: (issue) => `must be a string, e.g. ${field}: "${example}", got ${kindOf(issue.input)}`,
    })
    .optional();

/**
 * The schema of {@link StartJobData}: an object with `plan`, and optionally `input`, `runId`,
 * `requestKey`, `tenantId` and `priority`; any other field is refused, so a misspelt one is caught. The plan,
 * the input and the ids are checked further by the start itself, as `runtime.start` checks them.
 */
export const startJobDataSchema: z.ZodType<StartJobData> = z.strictObject(
  {
    plan: z.custom<PlanInput | string>((value) => isRecord(value) || typeof value === 'string', {
      error: (issue) =>
        issue.input === undefined
          ? 'missing: add the plan to run, an object { name, steps: [...] } (as runtime.start takes it) or its JSON text'
          : `must be a plan object { name, steps: [...] } or its JSON text, got ${kindOf(issue.input)}`,
    }),
    input: z.unknown().optional(),
    runId: idField('runId', 'order-42'),
    requestKey: idField('requestKey', 'order-42'),
    tenantId: idField('tenantId', 'acme'),
    priority: z
      .number({
        error: (issue) =>
          `must be an integer from -1000 to 1000 (higher goes first), e.g. priority: 10, got ${kindOf(issue.input)}`,
      })
      .optional(),
  },
  {
    error: (issue) =>
      `the job data must be an object { plan, input?, runId?, requestKey?, tenantId?, priority? }, got ${kindOf(issue.input)}`,
  },
);

/** The issues of a refused start job, each naming its field. */
function issuesOf(issues: readonly z.core.$ZodIssue[]): ValidationIssue[] {
  return issues.flatMap((issue) => {
    if (issue.code !== 'unrecognized_keys') {
      return [{ path: formatPath('', issue.path), message: issue.message }];
    }
    return issue.keys.map((key) => {
      // A swapped pair of letters (`inptu`) is a typo too, however short the word.
      const letters = (word: string) => [...word.toLowerCase()].sort().join('');
      const near = closestMatch(key, FIELDS) ?? FIELDS.find((f) => letters(f) === letters(key));
      const hint = near === undefined ? '' : `did you mean "${near}"? `;
      return {
        path: formatPath('', [key]),
        message: `unknown field; ${hint}a start job takes ${FIELDS.join(', ')}`,
      };
    });
  });
}

/**
 * Reads the data of a `start` job. Throws `InputValidationError` ("Invalid start job") naming each
 * field that is missing, of the wrong type or unknown.
 */
export function parseStartJobData(data: unknown): StartJobData {
  const parsed = startJobDataSchema.safeParse(data);
  if (!parsed.success) throw new InputValidationError('start job', issuesOf(parsed.error.issues));
  return parsed.data;
}

/** The BullMQ queue of a runtime: its name and its BullMQ `prefix`. */
export interface RunQueue {
  /** The queue name: `queueName`, else `'runs'`. */
  name: string;
  /** BullMQ's key prefix: `{<prefix>:q}`, e.g. `{flujo:q}` for the default key prefix. */
  prefix: string;
}

/**
 * The queue that a runtime created with these options reads: give both to BullMQ
 * (`new Queue(name, { connection, prefix })`) to add `start` jobs. The prefix is hash-tagged so
 * that every key of the queue lives in one Redis Cluster slot. Refuses a key prefix the runtime
 * would refuse.
 */
export function runQueue(options: { prefix?: string; queueName?: string } = {}): RunQueue {
  const name = options.queueName ?? DEFAULT_QUEUE_NAME;
  if (typeof name !== 'string' || name === '' || name.includes(':')) {
    throw new InputValidationError('queue', [
      {
        path: 'queueName',
        message: `must be a non-empty string without ":", e.g. "runs", got ${JSON.stringify(name)}`,
      },
    ]);
  }
  return { name, prefix: createKeys(options.prefix).queuePrefix() };
}

/** What the worker knows of a `start` job. */
export interface StartJob {
  id?: string | undefined;
  /** When the job was added (epoch ms): the same every time it runs. */
  timestamp: number;
  /** How many times the job was taken (1 the first time; more after its worker died or it failed). */
  attemptsStarted: number;
  data: unknown;
  /** The queue the job was taken from. */
  queueName?: string;
}

/**
 * The run id of a start job that names none: a UUID (version 8, the form for ids made by a rule)
 * from the job's queue, id and creation time. Every run of the job gets the same one, and no other
 * job does.
 */
export function startJobRunId(core: RuntimeCore, job: StartJob): string {
  const h = createHash('sha256')
    .update(
      `${core.stores.keys.queuePrefix()}\n${core.queues.queueName}\n${job.id ?? ''}\n${job.timestamp}`,
    )
    .digest('hex');
  const variant = ((parseInt(h[16]!, 16) & 0x3) | 0x8).toString(16);
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-8${h.slice(13, 16)}-${variant}${h.slice(17, 20)}-${h.slice(20, 32)}`;
}

/**
 * Whether the run `runId` is the one `data` asks for (same plan, input and tenant): the run an
 * earlier execution of the same job created before its worker died.
 */
async function sameStart(core: RuntimeCore, runId: string, data: StartJobData): Promise<boolean> {
  // Compared as stored: the start writes the plan as validated and the input, each as JSON text.
  const stored = await core.stores.store.loadMeta(runId);
  return (
    stored['tenantId'] === (data.tenantId ?? core.tenantId) &&
    stored['plan'] === JSON.stringify(parsePlan(data.plan)) &&
    stored['input'] === JSON.stringify(data.input ?? null)
  );
}

/**
 * Handles a `start` job: starts the run its data asks for through the path of `runtime.start`
 * (same validation, request keys, run list, events, first units enqueued) and returns
 * `{ runId, created }`. A refused start (bad data, a plan or input `runtime.start` refuses, a run
 * id that exists) writes nothing and fails the job with the refusal's message, with no retry
 * (`UnrecoverableError`); trouble with Redis is thrown as is, and the job's own `attempts` decide
 * whether it is tried again. A job that runs again (its worker died mid-start) and finds the run it
 * created goes on with it: its due units are enqueued again (ids make that harmless).
 */
export async function processStartJob(core: RuntimeCore, job: StartJob): Promise<StartJobResult> {
  try {
    const data = parseStartJobData(job.data);
    const runId = data.runId ?? startJobRunId(core, job);
    const options = {
      runId,
      // The run's units go where its start job was: the workers of that queue run them.
      ...(job.queueName === undefined ? {} : { queue: job.queueName }),
      ...(data.requestKey === undefined ? {} : { requestKey: data.requestKey }),
      ...(data.tenantId === undefined ? {} : { tenantId: data.tenantId }),
      ...(data.priority === undefined ? {} : { priority: data.priority }),
    };
    try {
      const started = await launchRun(core, data.plan, data.input ?? null, options);
      return { runId: started.runId, created: started.created };
    } catch (error) {
      if (
        !(error instanceof RunAlreadyExistsError) ||
        job.attemptsStarted < 2 ||
        !(await sameStart(core, runId, data))
      ) {
        throw error;
      }
      const env = await core.stores.store.load(runId, { outputs: false });
      const meta = await core.meta.read(runId);
      await core.queues.scheduleDeadline(runId, meta.plan, meta.createdAt);
      await core.stores.acknowledgeRead(runId);
      await core.queues.enqueueDue(runId, env);
      return { runId, created: true };
    }
  } catch (error) {
    if (error instanceof FlujoError && !error.retryable)
      throw new UnrecoverableError(error.message);
    throw error;
  }
}
