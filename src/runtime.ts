import { summarize, type RunSummary } from './actors/run-host.js';
import { actionScopesOf } from './execution/action-keys.js';
import type { Operator } from './execution/execute-step.js';
import {
  definePolicy,
  type Policy,
  type PolicyExport,
  type PolicyOptions,
} from './execution/policies.js';
import {
  ApprovalNotAllowedError,
  ConfigurationError,
  InputValidationError,
  RunNotResumableError,
  StepNotSkippableError,
  StepNotWaitingError,
} from './errors.js';
import type { JsonValue } from './internal/json.js';
import { buildRunTrace, type RunTrace } from './observability/run-trace.js';
import {
  runSteps,
  runStatus,
  type RunSnapshot,
  type StepChange,
  type StepState,
} from './machines/kernel.js';
import { isFinalStepStatus } from './machines/types.js';
import type { PendingCall, RunStatus } from './machines/types.js';
import type { Plan, PlanInput } from './plan/schema.js';
import { assertRunId, assertTenantId } from './persistence/keys.js';
import { lastStatusId, readRunStatus } from './persistence/run-lookups.js';
import type { LedgerEntry } from './persistence/ledger.js';
import type { Reservation, UsageTotals } from './persistence/quota-store.js';
import type { StoredRunEvent } from './persistence/snapshot-store.js';
import type { StreamEntry } from './persistence/stream-watcher.js';
import type { StepOutcome } from './schemas/outcomes.js';
import type { ToolDefinition } from './tools/define-tool.js';
import type { AgentDefinition } from './agents/define-agent.js';
import { RuntimeCore, type CoreOptions } from './actors/core.js';
import { outsideRedisDeadline, withRedisDeadline } from './persistence/redis-errors.js';
import { eventsOf, outcomesOf } from './worker/streams.js';
import {
  checkReplayOptions,
  lineageFrom,
  replaysOf,
  reproduceRun,
  startReplay,
  type ReplayedRun,
  type ReplayOptions,
  type ReproducedRun,
  type RunLineage,
} from './worker/replay.js';
import { listRuns, type RunListEntry, type RunListFilter } from './worker/run-list.js';
import { startWorker, type FlujoWorker, type WorkerOptions } from './worker/worker.js';
import { launchRun, type StartOptions } from './worker/start-run.js';

export type { StartOptions };
import {
  checkInspectOption,
  commitInspector,
  type InspectObserver,
} from './observability/inspect.js';

/** Options of {@link createRuntime}. */
export interface RuntimeOptions extends CoreOptions {
  /** Operators by name (more with `runtime.operator`). */
  operators?: Record<string, Operator>;
  /** Tools (more with `runtime.tool`). */
  tools?: readonly ToolDefinition[];
  /** Agents (more with `runtime.agent`). */
  agents?: readonly AgentDefinition[];
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
}

/** Options of {@link Runtime.operator} and {@link Runtime.agent}. */
export interface RegisterOptions {
  /**
   * The version of the code: part of the cache key of the steps it runs, so a new version never
   * hits an entry of an older one. @defaultValue none
   */
  version?: string;
}

/** What a person is asked to decide on: a step's gate, or one tool call of the step. */
export interface PendingApproval {
  stepId: string;
  /** The step's `gate.reason`, if any. */
  reason: string | null;
  /** Who may decide (the gate's `approvers`); null when anyone may. */
  approvers: string[] | null;
  /** The step's risk level. */
  riskLevel: string;
  /** The tool call that waits, with its tool, arguments and call id; null for the step's gate. */
  call: PendingCall | null;
}

/** A run as it stands. */
export interface RunReport {
  runId: string;
  planName: string;
  tenantId: string;
  status: RunStatus;
  /** The snapshot version (number of commits). */
  version: number;
  /**
   * Every step, in plan order. A READY step whose execution a worker has started shows RUNNING
   * (the start is committed with the execution's first result).
   */
  steps: StepState[];
  /** What waits for a person: one entry per step in WAITING_APPROVAL. */
  approvals: PendingApproval[];
  summary: RunSummary;
  createdAt: number;
  updatedAt: number;
  /** Present when the run replays another or has replays: the run it replays and its replays. */
  lineage?: RunLineage;
  /**
   * Work that is due (a READY step, a retry whose time came) and that no worker has taken for
   * {@link IDLE_WORK_MS} or more: no worker is running on this prefix, or all are busy. Null
   * otherwise.
   */
  idle: { stepId: string; dueSince: number; idleMs: number } | null;
  /** The latest progress each step's operator reported (`ctx.progress`), by step id. */
  progress: Record<string, StepProgress>;
}

/** What an operator last reported with `ctx.progress`. */
export interface StepProgress {
  attempt: number;
  info: JsonValue;
  at: number;
}

/** How long due work waits for a worker before a report calls it idle. */
export const IDLE_WORK_MS = 5000;

/** The first due step no worker has taken for {@link IDLE_WORK_MS}, if any. */
function idleWork(steps: readonly StepState[], now: number): RunReport['idle'] {
  for (const s of steps) {
    const dueSince =
      s.status === 'READY'
        ? s.updatedAt
        : s.status === 'FAILED_RETRYABLE' && s.retryAt !== null
          ? s.retryAt
          : null;
    if (dueSince !== null && now - dueSince >= IDLE_WORK_MS) {
      return { stepId: s.stepId, dueSince, idleMs: now - dueSince };
    }
  }
  return null;
}

/** The progress hash of a run, parsed (an unreadable field is left out). */
function progressOf(raw: Record<string, string>): Record<string, StepProgress> {
  const out: Record<string, StepProgress> = {};
  for (const [stepId, json] of Object.entries(raw)) {
    try {
      const p = JSON.parse(json) as StepProgress;
      out[stepId] = { attempt: p.attempt, info: p.info, at: p.at };
    } catch {
      // written by this module only; skip what cannot be read
    }
  }
  return out;
}

/** A started (or found) run. */
export interface RunHandle {
  runId: string;
  /** False when a request key led to a run that already existed. */
  created: boolean;
  /** The run's status report now. */
  status(): Promise<RunReport>;
  /** Resolves when the run succeeds, fails, is cancelled, or waits for a person. */
  settled(options?: { timeoutMs?: number }): Promise<RunReport>;
  /** The run's typed outcomes from its event stream; `follow` keeps reading until it ends. */
  outcomes(options?: { follow?: boolean; signal?: AbortSignal }): AsyncIterable<StepOutcome>;
}

/** A run's model usage. */
export interface RunUsage {
  runId: string;
  tenantId: string;
  /** Every usage reservation of the run, in the order they were made. */
  reservations: Reservation[];
  /** Tokens and micro-USD reserved (calls in flight) and spent, with the run's limits. */
  totals: UsageTotals;
}

/** Who decided on a gate, and why. */
export interface DecisionInput {
  /** Who decides: a claim the embedding service must authenticate (see `authorizeDecision`). */
  by: string;
  comment?: string;
  /**
   * The tool call decided on, when the step waits on one: the decision is refused unless that is
   * the call it waits on (so an approval never lands on a call its author did not see).
   */
  callId?: string;
}

/** Who skips a step, and why. */
export interface SkipInput {
  by: string;
  reason: string;
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
   * Registers a policy: `policy_check` steps name it; with `appliesTo: { tags }` it is also checked
   * before every step whose `policyTags` include one of the tags. It returns `{ allow: true }` or
   * `{ allow: false, reason }`; a denial fails the step finally with `policy_denied`.
   */
  policy(name: string, fn: Policy, options?: PolicyOptions): Runtime;
  /** Starts a run of `plan` (validated) with `input` (plain JSON). */
  start(
    plan: Plan | PlanInput | string,
    input?: unknown,
    options?: StartOptions,
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
  replay(
    runId: string,
    options: ReplayOptions & { mode: 'replay' | 'regenerate' },
  ): Promise<ReplayedRun>;
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
  /** Starts a worker on this runtime's queue. */
  createWorker(options?: WorkerOptions): FlujoWorker;
  /** Closes the runtime's connections (not a Redis client passed in). */
  close(): Promise<void>;
  /** @internal */
  readonly core: RuntimeCore;
}

/** The steps a transition reopened (a resume, a skip of a step that failed): final, then open. */
function reopenedSteps(changes: readonly StepChange[]): string[] {
  return changes
    .filter((c) => isFinalStepStatus(c.from) && !isFinalStepStatus(c.to))
    .map((c) => c.stepId);
}

/** The `version` of registration options; refuses one that is not a non-empty string. */
function checkVersion(options: RegisterOptions | undefined, what: string): string | undefined {
  const version: unknown = options?.version;
  if (version === undefined) return undefined;
  if (typeof version !== 'string' || version === '') {
    throw new InputValidationError(what, [
      {
        path: 'version',
        message: `must be a non-empty string, e.g. runtime.${what}(…, { version: "2" }), got ${JSON.stringify(version)}`,
      },
    ]);
  }
  return version;
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
  'ledger',
  'usage',
  'setTenantQuota',
  'resolveToolCall',
  'list',
] as const satisfies readonly (keyof Runtime)[];

const SETTLED: readonly RunStatus[] = ['succeeded', 'failed', 'cancelled', 'waiting'];

/** Whether a raw stream entry is a change of the run's status to a settled one. */
function settles([, fields]: StreamEntry): boolean {
  const t = fields.indexOf('t');
  if (t < 0 || fields[t + 1] !== 'run.status') return false;
  const d = fields.indexOf('d');
  try {
    const to = (JSON.parse(fields[d + 1] ?? '{}') as { to?: RunStatus }).to;
    return to !== undefined && SETTLED.includes(to);
  } catch {
    return false;
  }
}

/** What the steps waiting for approval wait on, with what the plan says about who decides. */
function pendingApprovals(steps: readonly StepState[], plan: Plan): PendingApproval[] {
  const out: PendingApproval[] = [];
  for (const s of steps) {
    if (s.status !== 'WAITING_APPROVAL') continue;
    const planStep = plan.steps.find((p) => p.id === s.stepId);
    out.push({
      stepId: s.stepId,
      reason: planStep?.gate?.reason ?? null,
      approvers: planStep?.gate?.approvers === undefined ? null : [...planStep.gate.approvers],
      riskLevel: planStep?.riskLevel ?? 'low',
      call: s.pendingCall ?? null,
    });
  }
  return out;
}

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
  for (const [name, fn] of Object.entries(options.operators ?? {})) core.operators.set(name, fn);
  for (const tool of options.tools ?? []) core.tools.register(tool);
  for (const agent of options.agents ?? []) core.agents.set(agent.name, agent);
  for (const [name, exported] of Object.entries(options.policies ?? {})) {
    const policy =
      typeof exported === 'function'
        ? definePolicy(name, exported)
        : definePolicy(name, exported?.check, exported);
    core.policies.set(name, policy);
  }

  /** Loads a run; a run removed by retention throws `RunRemovedError`. */
  async function load(runId: string) {
    const env = await core.store.tryLoad(runId);
    if (env === null) throw await core.notFound(runId);
    return env;
  }

  async function report(runId: string): Promise<RunReport> {
    const [env, started, replays, progress] = await Promise.all([
      load(runId),
      core.unitNotes.read(runId),
      replaysOf(core, runId),
      core.channels.readProgress(runId),
    ]);
    const meta = await core.meta(runId);
    const lineage = lineageFrom(runId, meta.replay, replays);
    const status = runStatus(env.snapshot);
    const steps = runSteps(env.snapshot).map((s) => {
      // Started by a worker, not yet committed as RUNNING (see the worker's `startOf`).
      const note = started[s.stepId]?.split(' ');
      const mine = note?.[0] === String(s.attempt) && note[1] === String(s.pauses ?? 0);
      return s.status === 'READY' && mine ? { ...s, status: 'RUNNING' as const } : s;
    });
    return {
      runId,
      planName: env.snapshot.context.planName,
      tenantId: meta.tenantId,
      status,
      version: env.version,
      steps,
      approvals: pendingApprovals(steps, meta.plan),
      summary: summarize(env.snapshot, status, env.updatedAt),
      createdAt: env.snapshot.context.createdAt,
      updatedAt: env.updatedAt,
      ...(lineage === undefined ? {} : { lineage }),
      idle: status === 'running' ? idleWork(steps, core.clock()) : null,
      progress: progressOf(progress),
    };
  }

  /**
   * The run's report once it settles, learned from its status stream (its `run.status` events
   * alone): a change to a settled status wakes it, never a timer; nothing is read while the run
   * works, however many steps it commits.
   */
  async function settled(runId: string, timeoutMs = 0): Promise<RunReport> {
    // The run's status changes alone: a commit that changes nothing of it wakes no waiter.
    const key = core.keys.status(runId);
    // The newest status change before the status (same connection, so read in this order):
    // nothing committed after the status was read can be missed. The status alone is read first (one
    // field): the whole report only once the run settled, or when that field does not say (no
    // run: the report says why; a run stored by an older version).
    const [last, stored] = await withRedisDeadline(
      () =>
        Promise.all([
          lastStatusId(core.redis, core.keys, runId),
          readRunStatus(core.redis, core.keys, runId),
        ]),
      core.redisTimeoutMs,
      core.redis,
    );
    if (stored === null || SETTLED.includes(stored as RunStatus)) {
      const first = await withRedisDeadline(() => report(runId), core.redisTimeoutMs, core.redis);
      if (SETTLED.includes(first.status)) return first;
    }
    return new Promise<RunReport>((resolve, reject) => {
      let done = false;
      let timer: NodeJS.Timeout | undefined;
      const stop = () => {
        done = true;
        unwatch();
        clearTimeout(timer);
      };
      const check = (anyway: boolean) => {
        report(runId).then(
          (r) => {
            if (done || (!anyway && !SETTLED.includes(r.status))) return;
            stop();
            resolve(r);
          },
          (error: unknown) => {
            if (done) return;
            stop();
            reject(error instanceof Error ? error : new Error(String(error)));
          },
        );
      };
      const unwatch = core.watcher().watch(
        key,
        last ?? '0-0',
        (entries) => {
          if (entries.some(settles)) check(false);
        },
        () => {
          if (done) return;
          stop();
          reject(new Error(`the runtime was closed while waiting for run "${runId}" to settle`));
        },
      );
      if (timeoutMs > 0) timer = setTimeout(() => check(true), timeoutMs);
    });
  }

  function handle(runId: string, created: boolean): RunHandle {
    return {
      runId,
      created,
      status: () => withRedisDeadline(() => report(runId), core.redisTimeoutMs, core.redis),
      settled: (o) => settled(runId, o?.timeoutMs),
      outcomes: (o) => outcomesOf(core, runId, o),
    };
  }

  /**
   * Refuses a decision on `stepId` by `by` unless the step's gate lists `by` among its approvers
   * (when it lists any) and the `authorizeDecision` hook allows it. Reads only; writes nothing.
   */
  async function authorize(
    runId: string,
    stepId: string,
    by: string,
    decision: 'approve' | 'reject' | 'skip',
  ): Promise<void> {
    const planStep = (await core.meta(runId)).plan.steps.find((s) => s.id === stepId);
    const approvers = planStep?.gate?.approvers;
    if (approvers !== undefined && !approvers.includes(by)) {
      throw new ApprovalNotAllowedError(runId, stepId, by, approvers);
    }
    const hook = options.authorizeDecision;
    if (
      hook !== undefined &&
      (await outsideRedisDeadline(() => hook(runId, stepId, by, decision))) !== true
    ) {
      throw new ApprovalNotAllowedError(runId, stepId, by, null);
    }
  }

  /**
   * Whether a skip of `step` can be taken: a step that has not succeeded or been skipped, in a run
   * that was not cancelled (a cancelled run is over).
   */
  function skippable(snapshot: RunSnapshot, step: StepState): boolean {
    if (step.status === 'SUCCEEDED' || step.status === 'SKIPPED') return false;
    return !isFinalStepStatus(step.status) || snapshot.context.cancel === null;
  }

  function checkBy(by: unknown, what: string): asserts by is string {
    if (typeof by !== 'string' || by === '') {
      throw new InputValidationError(what, [
        { path: 'by', message: 'say who decides, e.g. { by: "ana" } (--by NAME on the CLI)' },
      ]);
    }
  }

  async function decide(
    runId: string,
    stepId: string,
    decision: DecisionInput,
    type: 'gate.approved' | 'gate.rejected',
  ): Promise<RunReport> {
    checkBy(decision?.by, 'decision');
    const env = await core.store.load(runId, { outputs: false });
    const step = runSteps(env.snapshot).find((s) => s.stepId === stepId);
    if (step === undefined) {
      throw new StepNotWaitingError(runId, stepId, null, env.snapshot.context.order);
    }
    if (step.status !== 'WAITING_APPROVAL') {
      throw new StepNotWaitingError(runId, stepId, step.status, env.snapshot.context.order);
    }
    const pending = step.pendingCall ?? null;
    if (decision.callId !== undefined && decision.callId !== pending?.callId) {
      throw new InputValidationError('decision', [
        {
          path: 'callId',
          message:
            pending === null
              ? `step "${stepId}" waits on its gate, not on a tool call; leave callId out`
              : `step "${stepId}" waits on tool call ${pending.callId} (${pending.tool}), not ${decision.callId}; see \`flujo status ${runId}\``,
        },
      ]);
    }
    await authorize(runId, stepId, decision.by, type === 'gate.approved' ? 'approve' : 'reject');
    const event = {
      type,
      stepId,
      by: decision.by,
      ...(decision.comment === undefined ? {} : { comment: decision.comment }),
      // Bound to the call the step waits on as loaded: a decision never lands on another call.
      ...(pending === null ? {} : { callId: pending.callId }),
      at: core.clock(),
    };
    const applied = await core.host.apply(runId, event, env);
    if (!applied.committed) {
      const now = runSteps(applied.envelope.snapshot).find((s) => s.stepId === stepId);
      throw new StepNotWaitingError(runId, stepId, now?.status ?? null, env.snapshot.context.order);
    }
    await core.enqueueDue(runId, applied.envelope);
    return report(runId);
  }

  const runtime: Runtime = {
    core,
    operator(name, fn, registerOptions) {
      if (typeof name !== 'string' || name === '' || typeof fn !== 'function') {
        throw new InputValidationError('operator', [
          {
            path: 'operator',
            message: 'register an operator as runtime.operator(name, async (ctx) => result)',
          },
        ]);
      }
      const version = checkVersion(registerOptions, 'operator');
      core.operators.set(name, fn);
      if (version === undefined) core.operatorVersions.delete(name);
      else core.operatorVersions.set(name, version);
      return runtime;
    },
    tool(definition) {
      core.tools.register(definition);
      return runtime;
    },
    policy(name, fn, policyOptions) {
      const policy = definePolicy(name, fn, policyOptions);
      if (core.policies.has(policy.name)) {
        throw new ConfigurationError(
          `a policy named "${policy.name}" is already registered; give each policy its own name`,
        );
      }
      core.policies.set(policy.name, policy);
      return runtime;
    },
    agent(definition, registerOptions) {
      if (core.agents.has(definition.name)) {
        throw new ConfigurationError(
          `an agent named "${definition.name}" is already registered; give each agent its own name`,
        );
      }
      const version = checkVersion(registerOptions, 'agent');
      core.agents.set(definition.name, definition);
      if (version !== undefined) core.agentVersions.set(definition.name, version);
      return runtime;
    },

    async start(planSource, input = null, opts = {}) {
      const started = await launchRun(core, planSource, input, opts);
      if (opts.resumeFailed === true && started.found === 'failed') {
        await runtime.resume(started.runId, { by: 'request-key' });
      }
      return handle(started.runId, started.created);
    },

    async attach(runId) {
      await load(runId);
      return handle(runId, false);
    },

    approve: (runId, stepId, decision) => decide(runId, stepId, decision, 'gate.approved'),
    reject: (runId, stepId, decision) => decide(runId, stepId, decision, 'gate.rejected'),

    async skip(runId, stepId, request) {
      checkBy(request?.by, 'skip');
      if (typeof request.reason !== 'string' || request.reason.trim() === '') {
        throw new InputValidationError('skip', [
          { path: 'reason', message: 'say why, e.g. { reason: "done by hand" } (--reason TEXT)' },
        ]);
      }
      const env = await core.store.load(runId, { outputs: false });
      const step = runSteps(env.snapshot).find((s) => s.stepId === stepId);
      if (step === undefined || !skippable(env.snapshot, step)) {
        throw new StepNotSkippableError(
          runId,
          stepId,
          step?.status ?? null,
          env.snapshot.context.order,
        );
      }
      await authorize(runId, stepId, request.by, 'skip');
      const before = runStatus(env.snapshot);
      const applied = await core.host.apply(
        runId,
        { type: 'step.skipped', stepId, reason: request.reason, by: request.by, at: core.clock() },
        env,
      );
      if (!applied.committed) {
        const now = runSteps(applied.envelope.snapshot).find((s) => s.stepId === stepId);
        throw new StepNotSkippableError(
          runId,
          stepId,
          now?.status ?? null,
          env.snapshot.context.order,
        );
      }
      // Dependents the skip reopened (a step that failed was skipped) start a fresh step budget.
      await core.counters.resetSteps(runId, reopenedSteps(applied.transition.changes));
      const after = applied.transition.status;
      if (before === 'failed' && after !== 'failed') {
        // The failed run goes on (or succeeded): as after a resume, it keeps its keys again.
        await core.resumed(runId);
        if (after !== 'succeeded') {
          await Promise.all([core.activeRuns.add(runId), core.runs.reopened(runId)]);
        }
      }
      if (after === 'succeeded') await core.runs.ended(runId, after, applied.envelope.updatedAt);
      await core.publishAborts(runId, applied.transition.planned);
      await core.enqueueDue(runId, applied.envelope);
      return report(runId);
    },

    async cancel(runId, o = {}) {
      const applied = await core.apply(runId, {
        type: 'run.cancelled',
        ...(o.by === undefined ? {} : { by: o.by }),
        ...(o.reason === undefined ? {} : { reason: o.reason }),
        at: core.clock(),
      });
      await core.publishAborts(runId, applied.transition.planned);
      if (applied.transition.status === 'cancelled') {
        await core.runs.ended(runId, 'cancelled', applied.envelope.updatedAt);
      }
      return report(runId);
    },

    async resume(runId, o = {}) {
      const applied = await core.host.apply(runId, {
        type: 'run.resumed',
        ...(o.by === undefined ? {} : { by: o.by }),
        at: core.clock(),
      });
      if (!applied.committed) {
        throw new RunNotResumableError(runId, runStatus(applied.envelope.snapshot));
      }
      // Each reopened step gets one more attempt, under a fresh step budget (tool calls, wall
      // clock): what its failed attempts counted would fail it again at once.
      await core.counters.resetSteps(runId, reopenedSteps(applied.transition.changes));
      // It goes on: its keys lose the expiry it got when it failed.
      await core.resumed(runId);
      await Promise.all([core.activeRuns.add(runId), core.runs.reopened(runId)]);
      await core.enqueueDue(runId, applied.envelope);
      return report(runId);
    },

    status: report,
    async snapshot(runId) {
      assertRunId(runId);
      return (await load(runId)).snapshot;
    },
    replay: (async (runId: string, options: ReplayOptions) => {
      const checked = checkReplayOptions(options);
      if (checked.mode === 'reproduce') return reproduceRun(core, runId);
      return startReplay(core, runId, { ...checked, mode: checked.mode });
    }) as Runtime['replay'],
    list: (filter = {}) => listRuns(core, filter, core.retention.finishedRunsMs),
    events: (runId, o) => eventsOf(core, runId, o),
    outcomes: (runId, o) => outcomesOf(core, runId, o),

    async ledger(runId) {
      const meta = await core.meta(runId);
      const own = await core.ledger.list(runId, meta.tenantId);
      // Calls of steps with key inputs are in their actions' ledgers, shared by the tenant's runs.
      const scopes = new Set(actionScopesOf(meta.plan, meta.input, meta.tenantId).values());
      const shared = await Promise.all(
        [...scopes].map((scope) => core.ledger.list(scope, meta.tenantId)),
      );
      return [...own, ...shared.flat()];
    },

    async usage(runId) {
      const meta = await core.meta(runId);
      const [reservations, totals] = await Promise.all([
        core.quota.list(meta.tenantId, runId),
        core.quota.usage(meta.tenantId, runId),
      ]);
      return { runId, tenantId: meta.tenantId, reservations, totals };
    },

    async trace(runId) {
      // The report first: a run that does not exist is refused as such.
      const current = await report(runId);
      const [meta, events, started] = await Promise.all([
        core.meta(runId),
        core.store.readEvents(runId),
        core.unitNotes.read(runId),
      ]);
      const [ledger, reservations] = await Promise.all([
        runtime.ledger(runId),
        core.quota.list(meta.tenantId, runId),
      ]);
      return buildRunTrace({
        runId,
        planName: current.planName,
        tenantId: meta.tenantId,
        status: current.status,
        createdAt: current.createdAt,
        traceparent: meta.trace,
        plan: meta.plan.steps,
        steps: current.steps,
        started,
        events: events.map((e) => e.data),
        ledger,
        reservations,
      });
    },

    async setTenantQuota(tenantId, quota) {
      assertTenantId(tenantId);
      const cost = quota.maxCostUsd;
      if (cost !== undefined && cost !== null && (typeof cost !== 'number' || !(cost >= 0))) {
        throw new InputValidationError('tenant quota', [
          {
            path: 'maxCostUsd',
            message: `must be a number ≥ 0 (USD) or null, got ${String(cost)}`,
          },
        ]);
      }
      const set = await core.quota.setTenantQuota(tenantId, {
        ...(quota.maxTokens === undefined ? {} : { maxTokens: quota.maxTokens }),
        ...(cost === undefined
          ? {}
          : { maxMicroUsd: cost === null ? null : Math.round(cost * 1_000_000) }),
      });
      return {
        maxTokens: set.maxTokens,
        maxCostUsd: set.maxMicroUsd === null ? null : set.maxMicroUsd / 1_000_000,
      };
    },

    async resolveToolCall(runId, callId, resolution, by) {
      const meta = await core.meta(runId);
      // The run's own ledger, else the action ledger of one of its steps with key inputs.
      const scopes = new Set(actionScopesOf(meta.plan, meta.input, meta.tenantId).values());
      if (scopes.size > 0 && (await core.ledger.get(runId, meta.tenantId, callId)) === null) {
        for (const scope of scopes) {
          if ((await core.ledger.get(scope, meta.tenantId, callId)) !== null) {
            return core.ledger.resolve(scope, meta.tenantId, callId, resolution, by);
          }
        }
      }
      return core.ledger.resolve(runId, meta.tenantId, callId, resolution, by);
    },

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
