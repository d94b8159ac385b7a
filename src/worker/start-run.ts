import { randomUUID } from 'node:crypto';
import { keyInputIssues } from '../execution/action-keys.js';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  FlujoError,
  InputValidationError,
  RedisUnavailableError,
  RunAlreadyExistsError,
} from '../errors.js';
import { assertPlainJson } from '../internal/json.js';
import { runStatus } from '../machines/kernel.js';
import type { RunStatus } from '../machines/types.js';
import { startRunTrace } from '../observability/tracing.js';
import type { Plan, PlanInput } from '../plan/schema.js';
import { assertQueueName, assertRunId, assertTenantId } from '../persistence/keys.js';
import { runExists } from '../persistence/run-lookups.js';
import { isCluster } from '../persistence/connection.js';
import type { RuntimeCore } from '../actors/core.js';
import { assertPriority } from '../actors/jobs.js';

/** Options of `runtime.start`. */
export interface StartOptions {
  /** The run id. @defaultValue a random UUID */
  runId?: string;
  /** Same key, same run: a second start with it returns the first run. */
  requestKey?: string;
  /** @defaultValue the runtime's tenant */
  tenantId?: string;
  /** With a request key whose run failed: resume that run. @defaultValue false */
  resumeFailed?: boolean;
  /**
   * Steps of cache class `stable_nondeterministic` may use a stored output (as if each said
   * `allowCacheHit: true`). @defaultValue false
   */
  allowCacheHit?: boolean;
  /**
   * Cached steps run even when an entry would give their output, and store the new one; a
   * deterministic step's new output is checked against the stored one. @defaultValue false
   */
  refreshCache?: boolean;
  /**
   * The BullMQ queue the run's units go to, recorded with the run: the workers listening on it run
   * them. @defaultValue the runtime's `queueName`
   */
  queue?: string;
  /**
   * The run's priority: an integer from -1000 to 1000, higher goes first. Every unit of the run
   * (its first, those its commits make due, retries, wake-ups, a sweep's) goes before the units of
   * runs of lower priority waiting in the same queue; units already running are not interrupted.
   * Recorded with the run. @defaultValue 0
   */
  priority?: number;
}

/** What a start adds to the usual path: a singleton key to record and to claim (see `singleton.ts`). */
export interface LaunchHooks {
  /** The singleton key the run holds, recorded in its meta (released when it ends). */
  singleton?: string;
  /** More fields of the run's meta: a child run's link to its parent (`parentFields`). */
  links?: Readonly<Record<string, string>>;
  /**
   * Called once every check passed and before the first write, with the run id: a run it returns
   * is the start's result (nothing is created); null goes on.
   */
  claim?: (runId: string, tenantId: string) => Promise<LaunchedRun | null>;
}

/** What a start came to: the run, and whether this start created it. */
export interface LaunchedRun {
  runId: string;
  /** False when a request key (or a race on one) led to a run that already existed. */
  created: boolean;
  /** For a run a request key led to: its status when it was found. */
  found?: RunStatus;
  /** True when a singleton start found a live run of its key and started nothing. */
  skipped?: boolean;
}

/** How a start hands its run's first work to the queue: tries, and the pause before the first retry. */
const ENQUEUE_TRIES = 5;
const ENQUEUE_BACKOFF_MS = 50;

/**
 * Schedules the run's deadline and enqueues its due work (after `relist`, the run's listing, when
 * it is given), retried with backoff: the run exists already, so a start never gives up on it at
 * the first queue error. When every try fails, the error says the run exists and how it will be
 * driven.
 */
async function queueFirstWork(
  core: RuntimeCore,
  runId: string,
  plan: Plan,
  createdAt: number,
  envelope: Parameters<RuntimeCore['queues']['enqueueDue']>[1],
  requestKey: string | undefined,
  relist?: () => Promise<void>,
): Promise<void> {
  let unlisted = relist;
  for (let attempt = 1; ; attempt++) {
    try {
      if (unlisted !== undefined) {
        await unlisted();
        unlisted = undefined;
      }
      await core.queues.scheduleDeadline(runId, plan, createdAt);
      await core.queues.enqueueDue(runId, envelope);
      return;
    } catch (error) {
      if (error instanceof FlujoError && !error.retryable) throw error;
      if (attempt >= ENQUEUE_TRIES) {
        const again = requestKey === undefined ? 'run id' : 'run id or request key';
        throw new RedisUnavailableError(
          `Run "${runId}" was created but its first work could not be queued (${String(
            error instanceof Error ? error.message : error,
          )}). The run exists: start it again with the same ${again} to queue it, or any worker's sweep of active runs will drive it.`,
          { cause: error },
        );
      }
      await sleep(ENQUEUE_BACKOFF_MS * 2 ** (attempt - 1));
    }
  }
}

/**
 * Whether run `runId`, which exists, is the one this start asks for (same plan, input, tenant and
 * request key, as stored): a start tried again after it created the run.
 */
async function sameStart(
  core: RuntimeCore,
  runId: string,
  meta: Record<string, string>,
): Promise<boolean> {
  const stored = await core.stores.store.loadMeta(runId);
  return ['plan', 'input', 'tenantId', 'requestKey'].every((k) => (stored[k] ?? '') === meta[k]);
}

/**
 * Re-enqueues the due work of an existing run that has not ended (ids make repeats harmless);
 * returns its status, or null when it does not exist.
 */
async function continueRun(core: RuntimeCore, runId: string): Promise<RunStatus | null> {
  const env = await core.stores.store.tryLoad(runId, { outputs: false });
  if (env === null) return null;
  const { snapshot } = env;
  if (snapshot.status !== 'active' || snapshot.value === 'failed') return runStatus(snapshot);
  const meta = await core.meta.read(runId);
  await core.queues.scheduleDeadline(runId, meta.plan, meta.createdAt);
  await core.stores.acknowledgeRead(runId);
  await core.queues.enqueueDue(runId, env);
  return runStatus(snapshot);
}

/** Refuses a plan whose fallbacks name an operator or agent not registered here. */
function checkFallbacks(core: RuntimeCore, plan: Plan): void {
  const issues: { path: string; message: string }[] = [];
  plan.steps.forEach((step, i) => {
    const fallback = 'fallback' in step ? step.fallback : undefined;
    if (fallback === undefined) return;
    const [what, name, known] =
      'operator' in fallback
        ? (['operator', fallback.operator, core.registry.operators] as const)
        : (['agent', fallback.agent, core.registry.agents] as const);
    if (known.has(name)) return;
    const registered = [...known.keys()].join(', ') || '(none)';
    const how =
      what === 'operator'
        ? `runtime.operator("${name}", fn)`
        : `runtime.agent(defineAgent({ name: "${name}", … }))`;
    issues.push({
      path: `steps[${i}].fallback.${what}`,
      message: `no ${what} "${name}" is registered for the fallback of step "${step.id}"; register it with ${how} before starting. Registered: ${registered}`,
    });
  });
  if (issues.length > 0) throw new InputValidationError('plan', issues);
}

/**
 * Refuses a plan whose `run` steps (or map items of kind `run`) name a plan not registered here (`runtime.plan`, or `plans` in
 * the job module): the child could never start.
 */
export function checkChildPlans(core: RuntimeCore, plan: Plan): void {
  const issues: { path: string; message: string }[] = [];
  plan.steps.forEach((step, i) => {
    const runs = step.kind === 'map' ? step.item : step;
    if (runs.kind !== 'run' || core.registry.plans.has(runs.plan)) return;
    const registered = [...core.registry.plans.keys()].join(', ') || '(none)';
    const what =
      step.kind === 'map' ? `the items of map step "${step.id}"` : `run step "${step.id}"`;
    issues.push({
      path: step.kind === 'map' ? `steps[${i}].item.plan` : `steps[${i}].plan`,
      message: `no plan "${runs.plan}" is registered for ${what}; register it with runtime.plan("${runs.plan}", plan), or export plans: { "${runs.plan}": plan } from the job module, before starting. Registered: ${registered}`,
    });
  });
  if (issues.length > 0) throw new InputValidationError('plan', issues);
}

/** The start's cache flags as stored beside the run; refuses a flag that is not a boolean. */
function checkCacheFlags(opts: StartOptions): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [field, stored] of [
    ['allowCacheHit', 'allowCacheHit'],
    ['refreshCache', 'refreshCache'],
  ] as const) {
    const value: unknown = opts[field];
    if (value === undefined) continue;
    if (typeof value !== 'boolean') {
      throw new InputValidationError('start options', [
        { path: field, message: `must be true or false, got ${JSON.stringify(value)}` },
      ]);
    }
    if (value) out[stored] = '1';
  }
  return out;
}

/** What a start checked: the parsed plan and what goes into the run's meta. */
export interface CheckedStart {
  plan: Plan;
  tenantId: string;
  queue: string;
  /** The meta fields that depend on the start's options (cache flags, priority). */
  fields: Record<string, string>;
}

/**
 * Every check of a start that needs no read: the plan, the input and its key inputs, the
 * fallbacks, the cache flags, the tenant, the queue and the priority. Throws
 * `InputValidationError` naming the field; writes nothing.
 */
export function checkStart(
  core: RuntimeCore,
  planSource: Plan | PlanInput | string,
  input: unknown,
  opts: StartOptions,
): CheckedStart {
  const plan = core.meta.plans.parse(planSource);
  assertPlainJson(input, 'run input', 'input');
  const missingKeys = keyInputIssues(plan, input);
  if (missingKeys.length > 0) throw new InputValidationError('run input', missingKeys);
  checkFallbacks(core, plan);
  const fields = checkCacheFlags(opts);
  if (opts.priority !== undefined) {
    assertPriority(opts.priority);
    if (opts.priority !== 0) fields['priority'] = String(opts.priority);
  }
  const tenantId = opts.tenantId ?? core.tenantId;
  assertTenantId(tenantId);
  const queue = opts.queue ?? core.queues.queueName;
  assertQueueName(queue, 'queue');
  return { plan, tenantId, queue, fields };
}

/**
 * Starts a run of `planSource` with `input`: the one start path, shared by `runtime.start` and the
 * worker's `start` job. Every check comes before the first write, so a refused start leaves Redis
 * as it was. A request key already claimed leads to its run (`created: false`, `found` its
 * status); resuming it when it failed is the caller's choice.
 *
 * With `retried`, a start that finds its run already there (its run id with the same plan, input,
 * tenant and request key, or its request key) is taken as the same start tried again: the run's
 * due work is enqueued again (ids make that harmless), so a start whose create succeeded and
 * whose enqueue failed is finished by starting it again. `hooks.links` are more fields of the
 * run's meta (a child run's parent).
 */
export async function launchRun(
  core: RuntimeCore,
  planSource: Plan | PlanInput | string,
  input: unknown,
  opts: StartOptions,
  retried = false,
  hooks: LaunchHooks = {},
): Promise<LaunchedRun> {
  const { plan, tenantId, queue, fields } = checkStart(core, planSource, input, opts);
  checkChildPlans(core, plan);
  let runId = opts.runId ?? randomUUID();
  assertRunId(runId);
  const requestKey = opts.requestKey;
  const at = core.clock();
  const meta = {
    plan: JSON.stringify(plan),
    input: JSON.stringify(input),
    tenantId,
    requestKey: opts.requestKey ?? '',
    createdAt: String(at),
    ...fields,
    ...(hooks.singleton === undefined ? {} : { singleton: hooks.singleton }),
    ...hooks.links,
  };
  if (opts.runId !== undefined) {
    // A request key already claimed leads to its run below; else the run id must be new.
    const owner =
      requestKey === undefined ? null : await core.stores.requestKeys.owner(tenantId, requestKey);
    if (owner === null && (await runExists(core.redis, core.stores.keys, runId))) {
      if (!retried || !(await sameStart(core, runId, meta))) throw new RunAlreadyExistsError(runId);
      const found = await continueRun(core, runId);
      if (found !== null) return { runId, created: false, found };
    }
  }
  if (hooks.claim !== undefined) {
    const held = await hooks.claim(runId, tenantId);
    if (held !== null) return held;
  }

  if (requestKey !== undefined) {
    const owner = await core.stores.requestKeys.claim(tenantId, requestKey, runId);
    if (owner !== null) {
      runId = owner;
      if (retried) {
        const found = await continueRun(core, runId);
        if (found !== null) return { runId, created: false, found };
      } else {
        const existing = await core.stores.store.tryLoad(runId, { outputs: false });
        if (existing !== null) {
          return { runId, created: false, found: runStatus(existing.snapshot) };
        }
      }
      // The key was claimed but the run never got created (a crash in between): create it.
    }
  }
  // Listed before it exists: an entry whose run never got created is removed by the list.
  const list = async (): Promise<void> => {
    await Promise.all([
      core.stores.activeRuns.add(runId),
      core.stores.runs.add({
        runId,
        planName: plan.name,
        tenantId,
        createdAt: at,
        parentRunId: hooks.links?.['parentRunId'] ?? null,
      }),
    ]);
  };
  // On one server the listing and the creation go out in the same turn on the same connection
  // (nothing is awaited between the two): Redis runs a connection's commands in the order sent,
  // so the run is still listed before it exists, whatever a crash cuts short, and the start waits
  // on one round trip (and, with AOF `always`, one fsync) for both instead of one each. On a
  // cluster the two go to different nodes, with no order between them: the listing is awaited
  // first there.
  let listed: Promise<boolean> | undefined;
  if (isCluster(core.redis)) await list();
  else
    listed = list().then(
      () => true,
      () => false,
    );
  let created;
  const runTrace = startRunTrace(runId, {
    'flujo.plan': plan.name,
    'flujo.tenant_id': tenantId,
  });
  try {
    const stored = {
      ...meta,
      queue,
      trace: runTrace.traceparent,
      ...(runTrace.caller === null ? {} : { traceCaller: runTrace.caller }),
    };
    created = await core.host.create(runId, plan, at, stored);
    runTrace.end();
    // Its workers in this process need not read back what it was started with.
    core.meta.remember(runId, stored, plan);
  } catch (error) {
    runTrace.end(error);
    // Another start with the same request key created the run first: that run is the one.
    if (opts.requestKey !== undefined && error instanceof RunAlreadyExistsError) {
      return { runId, created: false };
    }
    throw error;
  }
  // The listing failed where the creation went through (a reply lost with its connection): it is
  // written again before the run's first job, with the same tries as that job.
  const relist = listed !== undefined && !(await listed) ? list : undefined;
  await queueFirstWork(core, runId, plan, at, created.envelope, requestKey, relist);
  return { runId, created: true };
}
