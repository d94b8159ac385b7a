import { randomUUID } from 'node:crypto';
import { summarize, type RunSummary } from './actors/run-host.js';
import type { Operator } from './actors/execute-step.js';
import {
  ConfigurationError,
  InputValidationError,
  RunAlreadyExistsError,
  RunNotResumableError,
  StepNotWaitingError,
} from './errors.js';
import { assertPlainJson, type JsonValue } from './internal/json.js';
import { runSteps, runStatus, type StepState } from './machines/kernel.js';
import type { RunStatus } from './machines/types.js';
import { parsePlan } from './plan/parse-plan.js';
import type { Plan, PlanInput } from './plan/schema.js';
import { assertRunId, assertTenantId } from './persistence/keys.js';
import type { LedgerEntry } from './persistence/ledger.js';
import type { Reservation, UsageTotals } from './persistence/quota-store.js';
import type { StoredRunEvent } from './persistence/snapshot-store.js';
import type { StepOutcome } from './schemas/outcomes.js';
import type { ToolDefinition } from './tools/define-tool.js';
import type { AgentDefinition } from './agents/define-agent.js';
import { RuntimeCore, type CoreOptions } from './worker/core.js';
import { eventsOf, outcomesOf } from './worker/streams.js';
import { startWorker, type FlujoWorker, type WorkerOptions } from './worker/worker.js';

/** Options of {@link createRuntime}. */
export interface RuntimeOptions extends CoreOptions {
  /** Operators by name (more with `runtime.operator`). */
  operators?: Record<string, Operator>;
  /** Tools (more with `runtime.tool`). */
  tools?: readonly ToolDefinition[];
  /** Agents (more with `runtime.agent`). */
  agents?: readonly AgentDefinition[];
}

/** Options of {@link Runtime.start}. */
export interface StartOptions {
  /** The run id. @defaultValue a random UUID */
  runId?: string;
  /** Same key, same run: a second start with it returns the first run. */
  requestKey?: string;
  /** @defaultValue the runtime's tenant */
  tenantId?: string;
  /** With a request key whose run failed: resume that run. @defaultValue false */
  resumeFailed?: boolean;
}

/** A run as it stands. */
export interface RunReport {
  runId: string;
  planName: string;
  tenantId: string;
  status: RunStatus;
  /** The snapshot version (number of commits). */
  version: number;
  steps: StepState[];
  summary: RunSummary;
  createdAt: number;
  updatedAt: number;
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
  by: string;
  comment?: string;
}

/** Starts, steers and observes durable runs; workers created from it execute them. */
export interface Runtime {
  /** Registers an operator under `name`. */
  operator(name: string, fn: Operator): Runtime;
  /** Registers a tool. */
  tool(definition: ToolDefinition): Runtime;
  /** Registers an agent (see `defineAgent`); agent steps name it. */
  agent(definition: AgentDefinition): Runtime;
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
  /** Rejects the gate of a step that waits for approval: the step fails finally. */
  reject(runId: string, stepId: string, decision: DecisionInput): Promise<RunReport>;
  /** Cancels a run: open steps are cancelled, running attempts aborted. */
  cancel(runId: string, options?: { by?: string; reason?: string }): Promise<RunReport>;
  /** Resumes a failed run: its failed and cancelled steps start again. */
  resume(runId: string, options?: { by?: string }): Promise<RunReport>;
  /** The run's status report. */
  status(runId: string): Promise<RunReport>;
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
  /** The run's tool-call ledger. */
  ledger(runId: string): Promise<LedgerEntry[]>;
  /** The run's model usage: every reservation (per step and turn) and the run's totals. */
  usage(runId: string): Promise<RunUsage>;
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

const SETTLED: readonly RunStatus[] = ['succeeded', 'failed', 'cancelled', 'waiting'];

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
  const core = new RuntimeCore(options);
  for (const [name, fn] of Object.entries(options.operators ?? {})) core.operators.set(name, fn);
  for (const tool of options.tools ?? []) core.tools.register(tool);
  for (const agent of options.agents ?? []) core.agents.set(agent.name, agent);

  async function report(runId: string): Promise<RunReport> {
    const env = await core.store.load(runId);
    const meta = await core.meta(runId);
    const status = runStatus(env.snapshot);
    return {
      runId,
      planName: env.snapshot.context.planName,
      tenantId: meta.tenantId,
      status,
      version: env.version,
      steps: runSteps(env.snapshot),
      summary: summarize(env.snapshot, status, env.updatedAt),
      createdAt: env.snapshot.context.createdAt,
      updatedAt: env.updatedAt,
    };
  }

  async function settled(runId: string, timeoutMs = 0): Promise<RunReport> {
    const deadline = timeoutMs > 0 ? core.clock() + timeoutMs : Infinity;
    for (let wait = 10; ; wait = Math.min(wait * 2, 200)) {
      const r = await report(runId);
      if (SETTLED.includes(r.status)) return r;
      if (core.clock() > deadline) return r;
      await new Promise((ok) => setTimeout(ok, wait));
    }
  }

  function handle(runId: string, created: boolean): RunHandle {
    return {
      runId,
      created,
      status: () => report(runId),
      settled: (o) => settled(runId, o?.timeoutMs),
      outcomes: (o) => outcomesOf(core, runId, o),
    };
  }

  async function decide(
    runId: string,
    stepId: string,
    decision: DecisionInput,
    type: 'gate.approved' | 'gate.rejected',
  ): Promise<RunReport> {
    if (typeof decision?.by !== 'string' || decision.by === '') {
      throw new InputValidationError('decision', [
        { path: 'by', message: 'say who decides, e.g. { by: "ana" } (--by NAME on the CLI)' },
      ]);
    }
    const env = await core.store.load(runId);
    const step = runSteps(env.snapshot).find((s) => s.stepId === stepId);
    if (step === undefined) {
      throw new StepNotWaitingError(runId, stepId, null, env.snapshot.context.order);
    }
    if (step.status !== 'WAITING_APPROVAL') {
      throw new StepNotWaitingError(runId, stepId, step.status, env.snapshot.context.order);
    }
    const event = {
      type,
      stepId,
      by: decision.by,
      ...(decision.comment === undefined ? {} : { comment: decision.comment }),
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
    operator(name, fn) {
      if (typeof name !== 'string' || name === '' || typeof fn !== 'function') {
        throw new InputValidationError('operator', [
          {
            path: 'operator',
            message: 'register an operator as runtime.operator(name, async (ctx) => result)',
          },
        ]);
      }
      core.operators.set(name, fn);
      return runtime;
    },
    tool(definition) {
      core.tools.register(definition);
      return runtime;
    },
    agent(definition) {
      if (core.agents.has(definition.name)) {
        throw new ConfigurationError(
          `an agent named "${definition.name}" is already registered; give each agent its own name`,
        );
      }
      core.agents.set(definition.name, definition);
      return runtime;
    },

    async start(planSource, input = null, opts = {}) {
      const plan = parsePlan(planSource);
      assertPlainJson(input, 'run input', 'input');
      const tenantId = opts.tenantId ?? core.tenantId;
      assertTenantId(tenantId);
      let runId = opts.runId ?? randomUUID();
      assertRunId(runId);
      if (opts.requestKey !== undefined) {
        const key = core.keys.requestKey(tenantId, opts.requestKey);
        const claimed = await core.redis.set(key, runId, 'NX');
        if (claimed === null) {
          runId = (await core.redis.get(key)) ?? runId;
          const existing = await core.store.tryLoad(runId);
          if (existing !== null) {
            if (opts.resumeFailed === true && runStatus(existing.snapshot) === 'failed') {
              await runtime.resume(runId, { by: 'request-key' });
            }
            return handle(runId, false);
          }
          // The key was claimed but the run never got created (a crash in between): create it.
        }
      }
      const at = core.clock();
      await core.redis.sadd(core.keys.activeRuns(), runId);
      let created;
      try {
        created = await core.host.create(runId, plan, at, {
          plan: JSON.stringify(plan),
          input: JSON.stringify(input),
          tenantId,
          requestKey: opts.requestKey ?? '',
          createdAt: String(at),
        });
      } catch (error) {
        // Another start with the same request key created the run first: that run is the one.
        if (opts.requestKey !== undefined && error instanceof RunAlreadyExistsError) {
          return handle(runId, false);
        }
        throw error;
      }
      await core.scheduleDeadline(runId, plan, at);
      await core.enqueueDue(runId, created.envelope);
      return handle(runId, true);
    },

    async attach(runId) {
      await core.store.load(runId);
      return handle(runId, false);
    },

    approve: (runId, stepId, decision) => decide(runId, stepId, decision, 'gate.approved'),
    reject: (runId, stepId, decision) => decide(runId, stepId, decision, 'gate.rejected'),

    async cancel(runId, o = {}) {
      const applied = await core.apply(runId, {
        type: 'run.cancelled',
        ...(o.by === undefined ? {} : { by: o.by }),
        ...(o.reason === undefined ? {} : { reason: o.reason }),
        at: core.clock(),
      });
      await core.publishAborts(runId, applied.transition.planned);
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
      await core.redis.sadd(core.keys.activeRuns(), runId);
      await core.enqueueDue(runId, applied.envelope);
      return report(runId);
    },

    status: report,
    events: (runId, o) => eventsOf(core, runId, o),
    outcomes: (runId, o) => outcomesOf(core, runId, o),

    async ledger(runId) {
      const meta = await core.meta(runId);
      return core.ledger.list(runId, meta.tenantId);
    },

    async usage(runId) {
      const meta = await core.meta(runId);
      const [reservations, totals] = await Promise.all([
        core.quota.list(meta.tenantId, runId),
        core.quota.usage(meta.tenantId, runId),
      ]);
      return { runId, tenantId: meta.tenantId, reservations, totals };
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
      return core.ledger.resolve(runId, meta.tenantId, callId, resolution, by);
    },

    createWorker: (o) => startWorker(core, o),
    close: () => core.close(),
  };
  return runtime;
}
