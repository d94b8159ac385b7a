import {
  BudgetExceededError,
  ConfigurationError,
  FallbackFailedError,
  InputValidationError,
  describeThrown,
  InvariantError,
  MissingContextError,
  ModelError,
  type SerializedError,
} from '../errors.js';
import { canonicalHash } from '../internal/canonical-hash.js';
import { assertPlainJson, findNonJson, type JsonValue } from '../internal/json.js';
import type { CacheSource } from '../machines/types.js';
import { agentStepSchema, type AgentStep, type PlanStep } from '../plan/schema.js';
import type { FingerprintStore } from '../persistence/fingerprint-store.js';
import type { JournaledCall, ModelJournal } from '../persistence/model-journal.js';
import type { Ledger } from '../persistence/ledger.js';
import {
  callTool,
  type CallToolContext,
  type ReplayedCalls,
  type ResultStore,
  type ToolRunGuard,
} from '../tools/call-tool.js';
import { classifyFailure } from '../tools/classify-failure.js';
import type { ToolRegistry } from '../tools/registry.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { actionCallId, actionKeyOf, actionLedgerScope, keyInputValue } from './action-keys.js';
import { claimFingerprint, stepFingerprint } from './agent-fingerprint.js';
import { runAtomicAgent } from './atomic-agent.js';
import type { AgentLoopDeps, AttemptCallJournal, ModelClients, ReplyStream } from './model-call.js';
import type { CallRecorder, HistoryReader, LiveFeed, ToolCallCounter } from './ports.js';
import type { AttemptInputs } from './step-cache.js';
import {
  enforcePolicy,
  enforceTaggedPolicies,
  resolvePolicy,
  type RegisteredPolicy,
} from './policies.js';
import type { ModelContext } from './model-context.js';
import type { RunUsageBudget, UsageMeter } from './usage-meter.js';
import type { ModelRateLimiter } from './rate-limits.js';
import { callGate, type CallGate, type CallToApprove } from './call-approval.js';
import type { ReplayedEffect, ReplayedStep } from './replay-calls.js';
import { traceAttempt } from '../observability/spans.js';
import { tokenizerReady } from '../llm/tokens.js';

/** What an operator receives. */
export interface OperatorContext {
  /** The step's input: the plan's `input` for the step when it has one, else the run's input. */
  input: JsonValue;
  /** The run's input. */
  runInput: JsonValue;
  /** Outputs of the steps this one depends on, by step id. */
  deps: Record<string, JsonValue>;
  runId: string;
  stepId: string;
  /** 1 for the first attempt. */
  attempt: number;
  tenantId: string;
  /** The same for every attempt of this step (or, with `idempotency.keyInputs`, for these inputs). */
  idempotencyKey: string;
  /** Aborted when the run is cancelled or the worker shuts down. */
  signal: AbortSignal;
  /** Registered tools, every call recorded in the ledger: a recorded call returns its receipt. */
  tools: StepTools;
  /**
   * The output of dependency `stepId`, or the value at the dotted `path` inside it. Throws
   * `MissingContextError` (final: code `missing_context`) when the dependency produced nothing
   * there (also when it was skipped), and `ConfigurationError` when the step does not depend on it.
   */
  need: (stepId: string, path?: string) => JsonValue;
  /**
   * Set when this operator runs as a step's fallback: the error the step's primary failed with
   * finally (its message verbatim).
   */
  fallbackOf?: { error: SerializedError };
  /**
   * Reports how far the step has come (plain JSON, at most 8 KiB), for people watching: the latest
   * value is shown live by `flujo run` and by `status`; it is not part of the run's history.
   */
  progress: (info: JsonValue) => void;
}

/** Ledger-guarded tool calls from inside a step. */
export interface StepTools {
  /** Calls tool `name` with `args` at most once per identical call in this run. */
  call<T = unknown>(name: string, args: unknown): Promise<T>;
}

/** A registered operator: an async function from its context to a JSON result. */
export type Operator = (context: OperatorContext) => unknown;

/** Everything a step execution needs from the worker. */
export interface StepExecutionDeps {
  operators: ReadonlyMap<string, Operator>;
  /** Policies by name: `policy_check` steps name one; tagged ones guard steps with those tags. */
  policies: ReadonlyMap<string, RegisteredPolicy>;
  agents: ReadonlyMap<string, AgentDefinition>;
  /** The model client of each agent (the runtime's registry). */
  clients: ModelClients;
  tools: ToolRegistry;
  ledger: Ledger;
  /** Counts the tool calls that will really run, against the run's and the step's budgets. */
  counter: ToolCallCounter;
  /** The run's trace context (a `traceparent`): the parent of the execution's span. */
  trace?: string | null;
  /** The run's `budgets.maxToolCalls`. */
  maxToolCalls: number | undefined;
  leaseMs: number;
  journal: ModelJournal;
  fingerprints: FingerprintStore;
  /** Granular steps' committed histories. */
  histories: HistoryReader;
  /** Fed an agent step's streamed reply text and an operator's progress (not persisted). */
  live?: LiveFeed;
  /** Reserves and reconciles the usage of every model call. */
  meter?: UsageMeter;
  /** Shapes what the model is sent: truncation, blobs put back. */
  context?: ModelContext;
  /** The runtime's model rate limits. */
  rateLimits?: ModelRateLimiter;
  /** Stores a large tool result of a granular step as a blob; returns what the history keeps. */
  results?: ResultStore;
  /** The run's usage budget. */
  budget?: RunUsageBudget;
  /** The runtime's `policyVersion`, part of an agent step's fingerprint. */
  policyVersion?: string | undefined;
  /** Records each tool and model call of the execution (the unit's). */
  recorder?: CallRecorder;
}

/** The most bytes of JSON one `ctx.progress` call may report. */
const MAX_PROGRESS_BYTES = 8192;

/** Checks what `ctx.progress` was given; throws `InputValidationError` naming the fix. */
function checkProgress(info: unknown): JsonValue {
  assertPlainJson(info, 'progress', 'info');
  const size = Buffer.byteLength(JSON.stringify(info));
  if (size > MAX_PROGRESS_BYTES) {
    throw new InputValidationError('progress', [
      {
        path: 'info',
        message: `is ${size} bytes of JSON, more than ${MAX_PROGRESS_BYTES}; report a small summary, e.g. { done: 3, of: 10 }`,
      },
    ]);
  }
  return info;
}

/** What every agent loop gets from the step's deps. */
export function loopDeps(
  deps: StepExecutionDeps,
  where: { runId: string; step: PlanStep; attempt: number },
  gate: CallGate,
  replay: ReplayedCalls | undefined,
): AgentLoopDeps {
  return {
    gate,
    ...(replay === undefined ? {} : { replay }),
    ledger: deps.ledger,
    leaseMs: deps.leaseMs,
    clients: deps.clients,
    ...toolBudget(deps, where.runId, where.step),
    ...replyStream(deps, { runId: where.runId, stepId: where.step.id, attempt: where.attempt }),
    ...(deps.meter === undefined ? {} : { meter: deps.meter }),
    ...(deps.context === undefined ? {} : { context: deps.context }),
    ...(deps.rateLimits === undefined ? {} : { rateLimits: deps.rateLimits }),
    ...(deps.recorder === undefined ? {} : { recorder: deps.recorder }),
  };
}

/** Numbers the pieces of each turn's reply and feeds them to `deps.live`. */
function replyStream(
  deps: StepExecutionDeps,
  where: { runId: string; stepId: string; attempt: number },
): { stream?: ReplyStream } {
  const live = deps.live;
  if (live === undefined) return {};
  let turnOf = -1;
  let seq = 0;
  return {
    stream: {
      text(text, turn) {
        if (turn !== turnOf) {
          turnOf = turn;
          seq = 0;
        }
        live.chunk({ ...where, turn, seq: seq++, text });
      },
    },
  };
}

/**
 * What one step execution came to: an output, a failure, a budget stop of the whole run, or a
 * pause at a tool call that waits for a person's approval.
 */
export type StepResult =
  | { kind: 'succeeded'; output: JsonValue; cacheHit?: CacheSource }
  | { kind: 'failed'; error: SerializedError }
  | { kind: 'budget'; error: BudgetExceededError }
  | { kind: 'paused'; call: CallToApprove };

/**
 * What an agent step is asked: its input (the plan's `input` for the step, else the run's), and,
 * when it depends on steps that produced something, `{ input, results: { <stepId>: output } }`, so
 * the agent works from what came before it. Part of the fingerprint, like any input.
 */
export function agentInput(
  step: AgentStep,
  runInput: JsonValue,
  depOutputs: Readonly<Record<string, JsonValue>>,
): JsonValue {
  const input = step.input === undefined ? runInput : step.input;
  if (Object.keys(depOutputs).length === 0) return input;
  return { input, results: { ...depOutputs } };
}

/** The registered agent an agent step names; `ConfigurationError` naming the fix when there is none. */
export function resolveAgent(deps: StepExecutionDeps, step: AgentStep): AgentDefinition {
  const agent = deps.agents.get(step.agent);
  if (agent === undefined) {
    const known = [...deps.agents.keys()].join(', ') || '(none)';
    throw new ConfigurationError(
      `no agent "${step.agent}" is registered in this worker (step "${step.id}"); register it with runtime.agent(defineAgent({ name: "${step.agent}", … })). Registered: ${known}`,
    );
  }
  return agent;
}

/**
 * The journal of the model calls of attempt `attempt` of the atomic step: its records are read
 * once, in one round trip, when the execution first asks for one (an execution that runs the
 * attempt for the first time finds none).
 */
function attemptJournal(
  journal: ModelJournal,
  runId: string,
  step: AgentStep,
  attempt: number,
): AttemptCallJournal {
  let recorded: Promise<(JournaledCall | null)[]> | undefined;
  return {
    get: async (call) => {
      recorded ??= journal.attemptCalls(runId, step.id, attempt, step.maxTurns);
      return (await recorded)[call] ?? null;
    },
    record: (call, request, reply) =>
      journal.recordCall(runId, step.id, attempt, call, request, reply),
  };
}

/**
 * The failure a thrown value stands for, or the budget stop of the run it is (the exception choke
 * point). A step's own budget is a final failure of the step, not a stop of the run. An execution
 * that stopped at a call waiting for approval pauses, whatever it threw after that.
 */
export function failureOf(
  thrown: unknown,
  gate: CallGate,
): Exclude<StepResult, { kind: 'succeeded' }> {
  if (gate.pending !== null) return { kind: 'paused', call: gate.pending };
  if (thrown instanceof BudgetExceededError && thrown.stepId === undefined) {
    return { kind: 'budget', error: thrown };
  }
  const error = classifyFailure(thrown).toJSON();
  // The class, stack and causes of what was thrown, which the classification does not keep. A
  // model error's cause is the provider's answer, whose text may echo the request's credentials
  // (a 401 names the API key it refused): its own message says what happened, without it.
  const origin = describeThrown(thrown, { causes: !(thrown instanceof ModelError) });
  return { kind: 'failed', error: origin === undefined ? error : { ...error, thrown: origin } };
}

/**
 * The idempotency key of a step: per run and step, or, with `idempotency.keyInputs`, the action key
 * of the tenant, the operator and the values the key inputs read from the step's input.
 */
export function stepIdempotencyKey(
  tenantId: string,
  runId: string,
  step: PlanStep,
  input: JsonValue,
): string {
  if (step.idempotency.keyInputs.length === 0) {
    return canonicalHash({ tenant: tenantId, run: runId, step: step.id }, 'idempotency key inputs');
  }
  return actionKeyOf(tenantId, step, input);
}

/**
 * The policies bound to the step's tags, decided as before an execution: null when they allow it,
 * else the failure (or budget stop) the attempt ends with. A cache hit passes them first.
 */
export async function checkTaggedPolicies(
  deps: StepExecutionDeps,
  args: Omit<Parameters<typeof executeStep>[1], 'state'>,
): Promise<Exclude<StepResult, { kind: 'succeeded' | 'paused' }> | null> {
  const { step, runId, tenantId, runInput, depOutputs, signal } = args;
  const input = step.input === undefined ? runInput : step.input;
  try {
    await enforceTaggedPolicies(deps.policies, step, {
      input,
      runInput,
      deps: depOutputs,
      runId,
      tenantId,
      signal,
    });
    return null;
  } catch (thrown) {
    if (thrown instanceof BudgetExceededError && thrown.stepId === undefined) {
      return { kind: 'budget', error: thrown };
    }
    return { kind: 'failed', error: classifyFailure(thrown).toJSON() };
  }
}

/**
 * Runs one attempt of a step: the exception choke point. Whatever the operator throws becomes a
 * failure with its retryability (a runtime error says; anything else counts as transient unless it
 * carries `retryable: false`); a budget hit is returned apart, since it stops the whole run.
 */
export function executeStep(
  deps: StepExecutionDeps,
  args: Parameters<typeof runOneStep>[1],
): Promise<StepResult> {
  const { runId, step, state } = args;
  const ids = { runId, stepId: step.id, attempt: state.attempt };
  return traceAttempt(deps.trace ?? null, ids, step.kind, () => runOneStep(deps, args));
}

async function runOneStep(
  deps: StepExecutionDeps,
  args: AttemptInputs & {
    signal: AbortSignal;
    /** In a run that replays another: the original's receipts and recorded outputs. */
    replay?: ReplayedStep;
  },
): Promise<StepResult> {
  const { state } = args;
  const fallback = state.fallback?.active === true ? fallbackStep(args.step) : null;
  if (fallback === null) return executeOnce(deps, args);
  const primaryError = state.fallback?.primaryError ?? null;
  const result = await executeOnce(deps, { ...args, step: fallback }, primaryError);
  if (result.kind !== 'failed' || primaryError === null) return result;
  // Both failed: the step's error names both.
  const error = new FallbackFailedError(args.step.id, primaryError, result.error);
  return { kind: 'failed', error: error.toJSON() };
}

const AGENT_LOOP_KEYS = [
  'maxTurns',
  'historyMaxTokens',
  'blobThresholdBytes',
  'enforceIdempotency',
  'degradedReplay',
] as const;

/**
 * The step as its fallback runs it: the same step (id, input, dependencies, effects, budgets,
 * timeout) with the fallback's operator or agent in place of the primary, uncached. A fallback
 * agent runs atomically, with the step's loop settings when the step is an agent step, else the
 * defaults. Null for a step without a fallback. Its tool calls share the step's ledger: a call
 * the primary recorded with the same tool and arguments returns the recorded outcome.
 */
export function fallbackStep(step: PlanStep): PlanStep | null {
  if ((step.kind !== 'operator' && step.kind !== 'agent') || step.fallback === undefined) {
    return null;
  }
  const fallback = step.fallback;
  const common = {
    id: step.id,
    ...(step.description === undefined ? {} : { description: step.description }),
    ...(step.input === undefined ? {} : { input: step.input }),
    dependsOn: step.dependsOn,
    effects: step.effects,
    policyTags: step.policyTags,
    riskLevel: step.riskLevel,
    cachePolicy: { class: 'none' as const },
    idempotency: step.idempotency,
    ...(step.gate === undefined ? {} : { gate: step.gate }),
    retry: step.retry,
    ...(step.budgets === undefined ? {} : { budgets: step.budgets }),
    ...(step.timeoutMs === undefined ? {} : { timeoutMs: step.timeoutMs }),
  };
  if ('operator' in fallback) return { ...common, kind: 'operator', operator: fallback.operator };
  const defaults = agentStepSchema.parse({ kind: 'agent', id: step.id, agent: fallback.agent });
  const source = step.kind === 'agent' ? step : defaults;
  const loop = Object.fromEntries(AGENT_LOOP_KEYS.map((k) => [k, source[k]])) as Pick<
    AgentStep,
    (typeof AGENT_LOOP_KEYS)[number]
  >;
  // The turn's idempotency key exists only in granular mode.
  return {
    ...common,
    ...loop,
    enforceIdempotency: false,
    kind: 'agent',
    agent: fallback.agent,
    mode: 'atomic',
  };
}

/** The feedback an agent that runs as a fallback is given after the step's input. */
export function fallbackFeedback(error: SerializedError): string {
  return `The primary attempt of this step failed with this error: ${error.message}\nProduce the step's result another way.`;
}

/** {@link executeStep} of the step as given (the primary, or its fallback). */
async function executeOnce(
  deps: StepExecutionDeps,
  args: Parameters<typeof executeStep>[1],
  primaryError: SerializedError | null = null,
): Promise<StepResult> {
  const { step, state, runId, tenantId, runInput, depOutputs, signal, replay } = args;
  const input = step.input === undefined ? runInput : step.input;
  const gate = callGate(state);
  const policyArgs = { input, runInput, deps: depOutputs, runId, tenantId, signal };
  // What the operator's tool calls look up in a replay (not an action-keyed step's calls).
  let calls: ReplayedCalls | undefined = replay?.matchesCalls === false ? undefined : replay;
  try {
    // Policies bound to the step's tags decide before anything of the step runs.
    await enforceTaggedPolicies(deps.policies, step, policyArgs);
    if (replay !== undefined && step.kind === 'operator') {
      // In a replay, an effectful operator step acts again only as the replay allows.
      const effect = await replay.effect({ runId, runInput, depOutputs });
      if (effect.kind === 'reuse') {
        observeReuse(deps, step, effect);
        return { kind: 'succeeded', output: effect.output };
      }
      // Waits for a person's approval (the execution pauses here until then).
      if (effect.kind === 'approve') gate.check(effect.call);
      // Approved (or allowed): its calls run without asking again; the original's still return
      // their receipts.
      const from = calls;
      if (effect.kind !== 'run' && from !== undefined) {
        calls = { allowEffects: true, receiptOf: (tool, args) => from.receiptOf(tool, args) };
      }
    }
    const output = await run();
    // The operator caught the pause and went on: it still waits for the call's approval.
    if (gate.pending !== null) return { kind: 'paused', call: gate.pending };
    const problems = findNonJson(output, 'output');
    if (problems.length > 0) {
      const what = problems.map((p) => `${p.path}: ${p.message}`).join('; ');
      throw new ConfigurationError(
        `step "${step.id}" returned a value that is not JSON (${what}); return plain JSON`,
      );
    }
    return { kind: 'succeeded', output: (output ?? null) as JsonValue };
  } catch (thrown) {
    return failureOf(thrown, gate);
  }

  async function run(): Promise<unknown> {
    switch (step.kind) {
      case 'human_gate':
        // The gate was approved (that is how the step got to run): its output is the decision.
        return { approvedBy: state.approval?.by ?? null, comment: state.approval?.comment ?? null };
      case 'agent': {
        const agent = resolveAgent(deps, step);
        if (step.mode === 'granular') {
          // Granular steps run one turn per job (see the worker's turn jobs), never here.
          throw new InvariantError(`granular step "${step.id}" was given to a step job`);
        }
        await tokenizerReady(agent.model);
        const { attempt } = state;
        const input = agentInput(step, runInput, depOutputs);
        // Before the attempt persists anything: an execution under another configuration than
        // the step's first one (a resume after a crash or a pause) runs nothing.
        const current = stepFingerprint(agent, step, input, {
          price: deps.meter?.priceOf(agent.model) ?? null,
          policyVersion: deps.policyVersion,
        });
        await claimFingerprint(deps.fingerprints, runId, step.id, current, primaryError !== null);
        return await runAtomicAgent(
          {
            ...loopDeps(deps, { runId, step, attempt }, gate, calls),
            callJournal: attemptJournal(deps.journal, runId, step, attempt),
          },
          {
            agent,
            step,
            input,
            runId,
            tenantId,
            attempt: state.attempt,
            pause: state.pauses ?? 0,
            signal,
            ...(deps.budget === undefined ? {} : { budget: deps.budget }),
            ...(primaryError === null ? {} : { feedback: fallbackFeedback(primaryError) }),
          },
        );
      }
      case 'policy_check': {
        const policy = resolvePolicy(deps.policies, step.policy, step.id);
        await enforcePolicy(policy, step, policyArgs);
        return { policy: policy.name, allow: true };
      }
      case 'wait':
        // A wait step is driven by its own unit (actors/wait.ts), never executed.
        throw new InvariantError(`wait step "${step.id}" was handed to an operator's execution`);
      case 'map':
        // A map step runs its items, each a unit of its own (actors/map-item.ts).
        throw new InvariantError(`map step "${step.id}" was handed to an operator's execution`);
      case 'run':
        // A run step is driven by its own unit (actors/child.ts), never executed.
        throw new InvariantError(`run step "${step.id}" was handed to an operator's execution`);
      default: {
        const name = step.operator;
        const op = deps.operators.get(name);
        if (op === undefined) {
          const known = [...deps.operators.keys()].join(', ') || '(none)';
          throw new ConfigurationError(
            `no operator "${name}" is registered in this worker (step "${step.id}"); register it with runtime.operator("${name}", fn). Registered: ${known}`,
          );
        }
        let key: string | undefined;
        return await op({
          input,
          runInput,
          deps: depOutputs,
          runId,
          stepId: step.id,
          attempt: state.attempt,
          tenantId,
          // A hash of canonical JSON: computed when the operator asks for it.
          get idempotencyKey() {
            return (key ??= stepIdempotencyKey(tenantId, runId, step, input));
          },
          signal,
          need: (dependency, path) => needed(step, depOutputs, dependency, path),
          ...(primaryError === null ? {} : { fallbackOf: { error: primaryError } }),
          progress: (info) => {
            const checked = checkProgress(info);
            deps.live?.progress({ runId, stepId: step.id, attempt: state.attempt }, checked);
          },
          tools: stepTools(
            deps,
            step,
            {
              runId,
              stepId: step.id,
              tenantId,
              attempt: state.attempt,
              signal,
              effects: step.effects,
            },
            gate,
            step.idempotency.keyInputs.length === 0
              ? undefined
              : stepIdempotencyKey(tenantId, runId, step, input),
            calls,
          ),
        });
      }
    }
  }
}

/**
 * Records that a replay took an effectful step's output from the original instead of running
 * it, as a replay records a reused receipt (`tool.called`, `replayed: true`): one for each of
 * the original's receipts now in this run's ledger, and one for the step itself, its `tool` the
 * operator (`operator:NAME`), with `reusedFrom` naming the original run.
 */
function observeReuse(
  deps: StepExecutionDeps,
  step: PlanStep & { kind: 'operator' },
  effect: Extract<ReplayedEffect, { kind: 'reuse' }>,
): void {
  const recorder = deps.recorder;
  if (recorder === undefined) return;
  for (const r of effect.receipts) {
    const tool = deps.tools.list().find((t) => t.identity === r.tool);
    recorder.toolCalled({
      callId: r.callId,
      tool: r.tool,
      class: tool?.class ?? 'unknown',
      replayed: true,
      durationMs: r.durationMs,
      outcome: 'succeeded',
    });
  }
  const reused = {
    callId: effect.callId,
    tool: `operator:${step.operator}`,
    class: step.effects.find((e) => e !== 'read_only') ?? 'read_only',
    replayed: true,
    durationMs: 0,
    outcome: 'succeeded' as const,
    reusedFrom: effect.sourceRunId,
  };
  recorder.toolCalled(reused);
}

/** What `ctx.need(dependency, path)` returns or throws for `step`. */
function needed(
  step: PlanStep,
  depOutputs: Readonly<Record<string, JsonValue>>,
  dependency: string,
  path: string | undefined,
): JsonValue {
  if (!step.dependsOn.includes(dependency)) {
    throw new ConfigurationError(
      `step "${step.id}" asked for the output of "${dependency}", which it does not depend on; add "${dependency}" to its dependsOn`,
      { field: 'dependsOn' },
    );
  }
  const output = depOutputs[dependency];
  const value = output === undefined || path === undefined ? output : keyInputValue(output, path);
  if (value === undefined || value === null) {
    throw new MissingContextError(
      dependency,
      path === undefined ? 'its output' : `output.${path}`,
      {
        stepId: step.id,
      },
    );
  }
  return value;
}

/**
 * The tools of one attempt. With an action key (a step with key inputs), calls are recorded in the
 * action's ledger under the key, the tool's name and the call's place among that tool's calls in the
 * attempt, so any run of the tenant with the same key gets the same receipts.
 */
function stepTools(
  deps: StepExecutionDeps,
  step: PlanStep,
  ctx: CallToolContext,
  gate: CallGate,
  actionKey?: string,
  replay?: ReplayedCalls,
): StepTools {
  const calls = new Map<string, number>();
  return {
    async call<T>(name: string, args: unknown): Promise<T> {
      const tool = deps.tools.get(name);
      let action: { callId: string; ctx: CallToolContext } | undefined;
      if (actionKey !== undefined) {
        // Numbered when asked, so parallel calls are numbered in the order they were made.
        const n = calls.get(tool.name) ?? 0;
        calls.set(tool.name, n + 1);
        action = {
          callId: actionCallId(actionKey, tool.name, n),
          ctx: { ...ctx, ledgerScope: actionLedgerScope(actionKey) },
        };
      }
      const result = await callTool({
        ledger: deps.ledger,
        tool,
        args,
        ctx: action?.ctx ?? ctx,
        ...(action === undefined ? {} : { callId: action.callId }),
        leaseMs: deps.leaseMs,
        ...(deps.recorder === undefined ? {} : { observer: deps.recorder }),
        // A risky tool's call runs only once a person approved it (else the step pauses here).
        approve: (call) => gate.check(call),
        // Only calls that will really run count; a replayed receipt is free.
        ...toolBudget(deps, ctx.runId, step),
        ...(replay === undefined ? {} : { replay }),
      });
      return result.receipt as T;
    },
  };
}

/**
 * The guard that counts each tool call of `step` that will really run against the budgets, when
 * the run or the step has a `maxToolCalls`; none otherwise.
 */
function toolBudget(
  deps: StepExecutionDeps,
  runId: string,
  step: PlanStep,
): { guard?: ToolRunGuard } {
  if (deps.maxToolCalls === undefined && step.budgets?.maxToolCalls === undefined) return {};
  return { guard: { beforeRun: () => countToolCall(deps, runId, step) } };
}

/**
 * Counts a tool call that will really run against the run's and the step's `maxToolCalls`; throws
 * `BudgetExceededError` (naming the step for the step's budget) before the call runs.
 */
async function countToolCall(
  deps: StepExecutionDeps,
  runId: string,
  step: PlanStep,
): Promise<void> {
  const used = await deps.counter.countToolCall(runId, step.id);
  if (deps.maxToolCalls !== undefined && used.run > deps.maxToolCalls) {
    throw new BudgetExceededError('maxToolCalls', deps.maxToolCalls, used.run);
  }
  const stepMax = step.budgets?.maxToolCalls;
  if (stepMax !== undefined && used.step > stepMax) {
    throw new BudgetExceededError('maxToolCalls', stepMax, used.step, { stepId: step.id });
  }
}
