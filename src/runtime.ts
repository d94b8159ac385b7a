/**
 * The runtime a user creates: the types of its API, and `createRuntime`, which wires the
 * operations of `operations/` (starting runs, decisions, reading runs, replay, registration) to one
 * runtime core and bounds the calls that wait on Redis.
 */
import type { Operator } from './execution/execute-step.js';
import type { Policy, PolicyExport, PolicyOptions } from './execution/policies.js';
import type { JsonValue } from './internal/json.js';
import type { RunTrace } from './observability/run-trace.js';
import type { RunSnapshot } from './machines/kernel.js';
import type { Plan, PlanInput } from './plan/schema.js';
import type { LedgerEntry } from './persistence/ledger.js';
import type { StoredRunEvent } from './persistence/snapshot-store.js';
import type { StepOutcome } from './schemas/outcomes.js';
import type { ToolDefinition } from './tools/define-tool.js';
import type { AgentDefinition } from './agents/define-agent.js';
import { RuntimeCore, type CoreOptions } from './actors/core.js';
import { withRedisDeadline } from './persistence/redis-errors.js';
import { eventsOf, outcomesOf } from './worker/streams.js';
import type { ReplayedRun, ReplayOptions, ReproducedRun } from './worker/replay.js';
import { listRuns, type RunListEntry, type RunListFilter } from './worker/run-list.js';
import { startWorker, type FlujoWorker, type WorkerOptions } from './worker/worker.js';
import type { StartOptions } from './worker/start-run.js';
import { liveWorkers, type WorkerInfo } from './worker/heartbeat.js';
import {
  checkInspectOption,
  commitInspector,
  type InspectObserver,
} from './observability/inspect.js';
import {
  cancelRun,
  decide,
  resolveToolCall,
  resumeRun,
  setTenantQuota,
  skipStep,
  type DecisionInput,
  type SkipInput,
} from './operations/decisions.js';
import {
  readLedger,
  readReport,
  readSnapshot,
  readTrace,
  readUsage,
  type RunReport,
  type RunUsage,
} from './operations/reading.js';
import {
  registerAgent,
  registerPlan,
  registerAll,
  registerSignals,
  registerOperator,
  registerPolicy,
} from './operations/registration.js';
import { replayRun } from './operations/replay.js';
import { sendSignal, type SignalOptions, type SignalReceipt } from './operations/signals.js';
import type { SignalSchema } from './actors/runtime-registry.js';
import { attachRun, beginRun, type BeginOptions, type RunHandle } from './operations/starting.js';
import {
  defineSchedule,
  listSchedules,
  pauseSchedule,
  removeSchedule,
  resumeSchedule,
  triggerSchedule,
  type ScheduleInfo,
} from './operations/schedules.js';
import type { ScheduleOptions } from './worker/schedule-definition.js';
import type { ScheduleFire } from './worker/schedule-store.js';

export type { StartOptions, WorkerInfo };
export type { DecisionInput, SkipInput } from './operations/decisions.js';
export {
  IDLE_WORK_MS,
  type ConcurrencyWait,
  type PendingApproval,
  type PendingWait,
  type RunChild,
  type RunReport,
  type RunRouting,
  type RunUsage,
  type StepProgress,
} from './operations/reading.js';
export type { BeginOptions, RunHandle } from './operations/starting.js';
export type { SingletonOptions } from './operations/singleton.js';
export type { DebounceInfo, DebounceOptions } from './operations/debounce.js';
export type { SignalOptions, SignalReceipt, StartSignal } from './operations/signals.js';
export type { SignalSchema } from './actors/runtime-registry.js';
export type { RunParent } from './actors/runtime-meta.js';
export type { ScheduleInfo } from './operations/schedules.js';
export type { OverlapPolicy, ScheduleOptions } from './worker/schedule-definition.js';
export type { FireOutcome, ScheduleFire } from './worker/schedule-store.js';

/** Options of {@link createRuntime}. */
export interface RuntimeOptions extends CoreOptions {
  /** Operators by name (more with `runtime.operator`). */
  operators?: Record<string, Operator>;
  /** Tools (more with `runtime.tool`). */
  tools?: readonly ToolDefinition[];
  /** Agents (more with `runtime.agent`). */
  agents?: readonly AgentDefinition[];
  /**
   * Plans by name (more with `runtime.plan`): what `run` steps start child runs of
   * (`{ kind: 'run', plan: '<name>' }`).
   */
  plans?: Record<string, Plan | PlanInput>;
  /**
   * Asked before every approve, reject and skip, after the gate's `approvers` allowed it: `by` is
   * only what the caller claims, so a service that takes decisions from people checks here who
   * is really asking. Return `false` to refuse (`ApprovalNotAllowedError`, nothing written), or
   * throw your own error. @defaultValue every decision the approvers allow
   */
  authorizeDecision?: (
    runId: string,
    stepId: string,
    by: string,
    decision: 'approve' | 'reject' | 'skip',
  ) => boolean | Promise<boolean>;
  /**
   * Policies by name (more with `runtime.policy`): a function, or `{ check, appliesTo: { tags } }`
   * for one that guards every step carrying one of those `policyTags`.
   */
  policies?: Record<string, PolicyExport>;
  /**
   * An xstate inspection observer, as `createActor(machine, { inspect })` takes (a function of the
   * event, or an observer with `next`), e.g. `createWebSocketInspector().inspect` from
   * `@statelyai/inspect`. Every transition this runtime and its workers commit is reported to it,
   * in commit order: the run as an actor of the run machine and each step as its child
   * (`@xstate.actor`, `@xstate.event`, `@xstate.snapshot`; session ids `<runId>` and
   * `<runId>.<stepId>`). Called in the commit's path: keep it quick. What it throws is logged once
   * and changes nothing. @defaultValue none
   */
  inspect?: InspectObserver;
  /**
   * The signals each plan declares, by plan name (more with `runtime.signals`): signal name → a
   * zod schema of its payload. A signal to a run of such a plan must use a declared name and pass
   * its schema. @defaultValue none: any name, any JSON payload
   */
  signals?: Record<string, Record<string, SignalSchema>>;
}

/** Options of {@link Runtime.operator} and {@link Runtime.agent}. */
export interface RegisterOptions {
  /**
   * The version of the code: part of the cache key of the steps it runs, so a new version never
   * hits an entry of an older one. @defaultValue none
   */
  version?: string;
}

/** Starts, steers and observes durable runs; workers created from it execute them. */
export interface Runtime {
  /** Registers an operator under `name` (its `version` keys the steps' cached outputs). */
  operator(name: string, fn: Operator, options?: RegisterOptions): Runtime;
  /** Registers a tool. */
  tool(definition: ToolDefinition): Runtime;
  /** Registers an agent (see `defineAgent`); agent steps name it. */
  agent(definition: AgentDefinition, options?: RegisterOptions): Runtime;
  /**
   * Registers `plan` under `name`: a `run` step naming `name` (`{ kind: 'run', plan: name }`)
   * starts a child run of it. Every worker that may take such a step registers the same plans.
   */
  plan(name: string, plan: Plan | PlanInput | string): Runtime;
  /**
   * Registers a policy: `policy_check` steps name it; with `appliesTo: { tags }` it is also checked
   * before every step whose `policyTags` include one of the tags. It returns `{ allow: true }` or
   * `{ allow: false, reason }`; a denial fails the step finally with `policy_denied`.
   */
  policy(name: string, fn: Policy, options?: PolicyOptions): Runtime;
  /**
   * Starts a run of `plan` (validated) with `input` (plain JSON). With `requestKey` and `signal`:
   * start or signal, the signal sent to the run the key leads to (started now or found).
   */
  start(
    plan: Plan | PlanInput | string,
    input?: unknown,
    options?: BeginOptions,
  ): Promise<RunHandle>;
  /** A handle on an existing run. */
  attach(runId: string): Promise<RunHandle>;
  /** Approves the gate of a step that waits for approval. */
  approve(runId: string, stepId: string, decision: DecisionInput): Promise<RunReport>;
  /**
   * Rejects what a step waits on: its gate (the step fails finally), or its pending tool call (an
   * agent is told the call was rejected; an operator's call throws `ToolCallRejectedError`).
   */
  reject(runId: string, stepId: string, decision: DecisionInput): Promise<RunReport>;
  /**
   * Skips a step that has not succeeded (pending, ready, running, waiting for approval or for a
   * retry, failed finally, or cancelled): it becomes SKIPPED, an execution in progress is aborted,
   * and its dependents run with its output `null`. Dependents that a failure of the step (or of
   * what it waited on) cancelled are reopened, so a failed run goes on. Refused
   * (`StepNotSkippableError`) for a step that succeeded or was skipped, and in a cancelled run.
   */
  skip(runId: string, stepId: string, skip: SkipInput): Promise<RunReport>;
  /**
   * Sends signal `name` (with `payload`, plain JSON) to run `runId`: appended to the run's inbox in
   * send order, taken by the first wait step for that name that has not taken one. With `id`, a
   * send again is a no-op. Refused, writing nothing, for an unknown run (`RunNotFoundError`), a run
   * that succeeded or was cancelled (`RunEndedError`), a bad name or payload
   * (`InputValidationError`), an id used with another payload (`SignalIdConflictError`).
   */
  signal(
    runId: string,
    name: string,
    payload?: unknown,
    options?: SignalOptions,
  ): Promise<SignalReceipt>;
  /**
   * Declares the signals of the runs of plan `planName`: signal name → a zod schema of its payload.
   * Such a run takes only these names, with payloads that pass.
   */
  signals(planName: string, schemas: Record<string, SignalSchema>): Runtime;
  /** Cancels a run: open steps are cancelled, running attempts aborted. */
  cancel(runId: string, options?: { by?: string; reason?: string }): Promise<RunReport>;
  /** Resumes a failed run: its failed and cancelled steps are reopened, their attempts going on. */
  resume(runId: string, options?: { by?: string }): Promise<RunReport>;
  /** The run's status report. */
  status(runId: string): Promise<RunReport>;
  /**
   * The run's persisted snapshot as stored, step outputs included: what
   * `createActor(runMachine, { snapshot })` restores (every step actor with its state and attempt).
   * Throws `RunNotFoundError` (or `RunRemovedError`) for a run that does not exist (any more).
   */
  snapshot(runId: string): Promise<RunSnapshot>;
  /**
   * The runs of this prefix, newest first: plan, tenant, status, start, duration and the step
   * that waits; filtered by status, plan, tenant and start time.
   */
  list(filter?: RunListFilter): Promise<RunListEntry[]>;
  /** The run's event stream; `follow` keeps reading new events until the run ends. */
  events(
    runId: string,
    options?: { after?: string; follow?: boolean; signal?: AbortSignal },
  ): AsyncIterable<StoredRunEvent>;
  /** The run's typed outcomes (from its event stream; any process can attach). */
  outcomes(
    runId: string,
    options?: { follow?: boolean; signal?: AbortSignal },
  ): AsyncIterable<StepOutcome>;
  /**
   * Reproduces, replays or regenerates a run. `reproduce` reads what the run stored (outcomes,
   * events, journaled model replies) and checks that its events lead to its stored snapshot; it
   * writes nothing. `replay` starts a new run of the same plan and input whose tool calls with
   * effects return the original's receipts; `regenerate` does so in a new lineage where
   * draft-producing steps get new keys. A call the original did not make waits for approval
   * unless `allowEffects`. `fromStep` reuses the outputs of the steps that do not depend on it.
   */
  replay(runId: string, options: { mode: 'reproduce' }): Promise<ReproducedRun>;
  /** Replays or regenerates a run as a new run (see the first signature). */
  replay(
    runId: string,
    options: ReplayOptions & { mode: 'replay' | 'regenerate' },
  ): Promise<ReplayedRun>;
  /** Reproduces, replays or regenerates a run, as `options.mode` says (see the first signature). */
  replay(runId: string, options: ReplayOptions): Promise<ReproducedRun | ReplayedRun>;
  /** The run's tool-call ledger. */
  ledger(runId: string): Promise<LedgerEntry[]>;
  /** The run's model usage: every reservation (per step and turn) and the run's totals. */
  usage(runId: string): Promise<RunUsage>;
  /**
   * The run's trace as JSON: every step, attempt, agent turn, model call, tool call and approval
   * wait, with start and end times and ids, built from what is stored about the run.
   */
  trace(runId: string): Promise<RunTrace>;
  /**
   * Sets a tenant's quota over all its runs (tokens and USD; `null` removes a limit, an omitted
   * field keeps it). A model call that would pass it is refused before it is sent.
   */
  setTenantQuota(
    tenantId: string,
    quota: { maxTokens?: number | null; maxCostUsd?: number | null },
  ): Promise<{ maxTokens: number | null; maxCostUsd: number | null }>;
  /** Resolves an in-doubt tool call: record its receipt, or let the step call it again. */
  resolveToolCall(
    runId: string,
    callId: string,
    resolution: { succeeded: JsonValue } | { retry: true },
    by: string,
  ): Promise<LedgerEntry>;
  /**
   * Defines (or redefines) schedule `id`: each fire of `cron` (in `tz`) or of `everyMs` starts one
   * run of `plan` with `input`, whose id is derived from the schedule and the fire time
   * (`schedule:<id>:<fire ms>`), so that any number of workers start it once. Every option is
   * checked first (`InputValidationError` naming the field; nothing written). A redefinition keeps
   * the schedule's paused state and its recorded fires. Fires are taken by workers.
   */
  schedule(id: string, options: ScheduleOptions): Promise<ScheduleInfo>;
  /** Every schedule of this prefix, by id, each with its next fire and its newest fires. */
  schedules(): Promise<ScheduleInfo[]>;
  /** Pauses a schedule: no fire until it is resumed. */
  pauseSchedule(id: string): Promise<ScheduleInfo>;
  /** Resumes a paused schedule from now on: the fires of the paused time are not run. */
  resumeSchedule(id: string): Promise<ScheduleInfo>;
  /** Removes a schedule (its runs go on). */
  removeSchedule(id: string): Promise<void>;
  /** Fires a schedule now (under its overlap policy, paused or not); returns the fire. */
  triggerSchedule(id: string): Promise<ScheduleFire>;
  /**
   * The live workers of this prefix (a heartbeat that has not lapsed): each one's host, pid,
   * queues, operators, agents, units in flight and latest beat, by host then pid.
   */
  workers(): Promise<WorkerInfo[]>;
  /** Starts a worker on this runtime's queue (or the queues `options.queues` names). */
  createWorker(options?: WorkerOptions): FlujoWorker;
  /** Closes the runtime's connections (not a Redis client passed in). */
  close(): Promise<void>;
  /** @internal */
  readonly core: RuntimeCore;
}

/** The runtime's calls that wait on Redis (answered at once by a healthy server). */
const BOUNDED = [
  'start',
  'attach',
  'approve',
  'reject',
  'skip',
  'cancel',
  'resume',
  'status',
  'workers',
  'ledger',
  'usage',
  'setTenantQuota',
  'resolveToolCall',
  'list',
  'signal',
  'schedule',
  'schedules',
  'pauseSchedule',
  'resumeSchedule',
  'removeSchedule',
  'triggerSchedule',
] as const satisfies readonly (keyof Runtime)[];

/**
 * Creates a runtime over Redis.
 *
 * @example
 * ```ts
 * const runtime = createRuntime({ redis: 'redis://127.0.0.1:6379' })
 *   .operator('fetch', async ({ input }) => ({ pages: 3 }));
 * const worker = runtime.createWorker({ concurrency: 8 });
 * const run = await runtime.start(plan, { url: 'https://…' });
 * console.log((await run.settled()).status);
 * ```
 */
export function createRuntime(options: RuntimeOptions): Runtime {
  // Checked before the core connects: a refused option leaves nothing open.
  const inspect = checkInspectOption(options.inspect);
  const core = new RuntimeCore(options);
  if (inspect !== undefined) core.host.observe(commitInspector(inspect, core.log));
  registerAll(core.registry, options);
  for (const [planName, schemas] of Object.entries(options.signals ?? {})) {
    registerSignals(core.registry, planName, schemas);
  }
  const hook = options.authorizeDecision;
  const runtime: Runtime = {
    core,
    operator(name, fn, registerOptions) {
      registerOperator(core.registry, name, fn, registerOptions);
      return runtime;
    },
    tool(definition) {
      core.registry.tools.register(definition);
      return runtime;
    },
    policy(name, fn, policyOptions) {
      registerPolicy(core.registry, name, fn, policyOptions);
      return runtime;
    },
    agent(definition, registerOptions) {
      registerAgent(core.registry, definition, registerOptions);
      return runtime;
    },
    plan(name, plan) {
      registerPlan(core.registry, name, plan);
      return runtime;
    },
    signals(planName, schemas) {
      registerSignals(core.registry, planName, schemas);
      return runtime;
    },
    signal: (runId, name, payload, o) => sendSignal(core, runId, name, payload, o),
    start: (planSource, input, opts) => beginRun(core, planSource, input, opts),
    attach: (runId) => attachRun(core, runId),
    approve: (runId, stepId, decision) =>
      decide(core, hook, runId, stepId, decision, 'gate.approved'),
    reject: (runId, stepId, decision) =>
      decide(core, hook, runId, stepId, decision, 'gate.rejected'),
    skip: (runId, stepId, request) => skipStep(core, hook, runId, stepId, request),
    cancel: (runId, o) => cancelRun(core, runId, o),
    resume: (runId, o) => resumeRun(core, runId, o),
    status: (runId) => readReport(core, runId),
    snapshot: (runId) => readSnapshot(core, runId),
    replay: ((runId: string, o: ReplayOptions) => replayRun(core, runId, o)) as Runtime['replay'],
    list: (filter = {}) => listRuns(core, filter, core.stores.retention.finishedRunsMs),
    events: (runId, o) => eventsOf(core, runId, o),
    outcomes: (runId, o) => outcomesOf(core, runId, o),
    ledger: (runId) => readLedger(core, runId),
    usage: (runId) => readUsage(core, runId),
    trace: (runId) => readTrace(core, runId),
    setTenantQuota: (tenantId, quota) => setTenantQuota(core, tenantId, quota),
    resolveToolCall: (runId, callId, resolution, by) =>
      resolveToolCall(core, runId, callId, resolution, by),
    schedule: (id, o) => defineSchedule(core, id, o),
    schedules: () => listSchedules(core),
    pauseSchedule: (id) => pauseSchedule(core, id),
    resumeSchedule: (id) => resumeSchedule(core, id),
    removeSchedule: (id) => removeSchedule(core, id),
    triggerSchedule: (id) => triggerSchedule(core, id),
    workers: () => liveWorkers(core.redis, core.stores.keys, core.clock()),
    createWorker: (o) => startWorker(core, o),
    close: () => core.close(),
  };
  // A call that waits on Redis fails within redisTimeoutMs with RedisUnavailableError, whatever
  // the client's own options.
  for (const name of BOUNDED) {
    const call = (runtime[name] as (...args: unknown[]) => Promise<unknown>).bind(runtime);
    (runtime as unknown as Record<string, unknown>)[name] = (...args: unknown[]) =>
      withRedisDeadline(() => call(...args), core.redisTimeoutMs, core.redis);
  }
  return runtime;
}

/**
 * The core behind `runtime`: its connections, stores and registries, shared with its workers. For
 * the command line and the tests, which reach past the public API; the package does not export it.
 *
 * @internal
 */
export function runtimeCore(runtime: Runtime): RuntimeCore {
  return runtime.core;
}
