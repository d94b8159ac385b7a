import {
  BudgetExceededError,
  ConfigurationError,
  InvariantError,
  toFlujoError,
  type SerializedError,
} from '../errors.js';
import { canonicalHash } from '../internal/canonical-hash.js';
import { findNonJson, type JsonValue } from '../internal/json.js';
import type { StepState } from '../machines/kernel.js';
import type { AgentStep, PlanStep } from '../plan/schema.js';
import type { ChatMessage, ModelReply } from '../llm/messages.js';
import type { FingerprintStore } from '../persistence/fingerprint-store.js';
import type { ModelJournal } from '../persistence/model-journal.js';
import type { Ledger } from '../persistence/ledger.js';
import { callTool } from '../tools/call-tool.js';
import type { ToolRegistry } from '../tools/registry.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import type { ModelClient } from '../llm/openai-client.js';
import { runAtomicAgent, takeTurn, type AgentLoopDeps, type TurnResult } from './run-agent.js';
import type { ModelContext } from './model-context.js';
import type { RunUsageBudget, UsageMeter } from './usage-meter.js';

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
  agents: ReadonlyMap<string, AgentDefinition>;
  clientFor: (agent: AgentDefinition) => ModelClient;
  tools: ToolRegistry;
  ledger: Ledger;
  /** Counts a tool call against the run's budget; returns the count including this call. */
  countToolCall(runId: string): Promise<number>;
  maxToolCalls: number | undefined;
  leaseMs: number;
  journal: ModelJournal;
  fingerprints: FingerprintStore;
  /** A granular step's committed history, messages `[0, cursor)`. */
  readHistory: (runId: string, stepId: string, cursor: number) => Promise<ChatMessage[]>;
  /** Receives streamed reply text of an agent step (not persisted). */
  onChunk?: (chunk: StreamedText) => void;
  /** Reserves and reconciles the usage of every model call. */
  meter?: UsageMeter;
  /** Shapes what the model is sent: truncation, blobs put back. */
  context?: ModelContext;
  /** Stores a large tool result of a granular step as a blob; returns what the history keeps. */
  offload?: (runId: string, content: string, thresholdBytes: number) => Promise<string>;
  /** The run's usage budget. */
  budget?: RunUsageBudget;
}

/** What every agent loop gets from the step's deps. */
function loopDeps(
  deps: StepExecutionDeps,
  where: { runId: string; stepId: string; attempt: number },
): AgentLoopDeps {
  return {
    ledger: deps.ledger,
    leaseMs: deps.leaseMs,
    clientFor: deps.clientFor,
    ...(deps.maxToolCalls === undefined
      ? {}
      : { beforeToolRun: () => countToolCall(deps, where.runId) }),
    ...chunkSink(deps, where),
    ...(deps.meter === undefined ? {} : { meter: deps.meter }),
    ...(deps.context === undefined ? {} : { context: deps.context }),
  };
}

/** A piece of an agent's reply as it streams in. */
export interface StreamedText {
  runId: string;
  stepId: string;
  attempt: number;
  /** The turn (0-based) whose reply this is. */
  turn: number;
  /** Position of the piece within the turn's reply, from 0. */
  seq: number;
  text: string;
}

/** Numbers the pieces of each turn's reply and hands them to `deps.onChunk`. */
function chunkSink(
  deps: StepExecutionDeps,
  where: { runId: string; stepId: string; attempt: number },
): { onChunk?: (delta: string, turn: number) => void } {
  const sink = deps.onChunk;
  if (sink === undefined) return {};
  let turnOf = -1;
  let seq = 0;
  return {
    onChunk: (text, turn) => {
      if (turn !== turnOf) {
        turnOf = turn;
        seq = 0;
      }
      sink({ ...where, turn, seq: seq++, text });
    },
  };
}

/** What one step attempt came to: an output, a failure, or a budget stop of the whole run. */
export type StepResult =
  | { kind: 'succeeded'; output: JsonValue }
  | { kind: 'failed'; error: SerializedError }
  | { kind: 'budget'; error: BudgetExceededError };

/** What one granular turn came to: the turn to commit, a failure, or a budget stop. */
export type TurnOutcome =
  | { kind: 'turn'; turn: TurnResult }
  | { kind: 'failed'; error: SerializedError }
  | { kind: 'budget'; error: BudgetExceededError };

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
function resolveAgent(deps: StepExecutionDeps, step: AgentStep): AgentDefinition {
  const agent = deps.agents.get(step.agent);
  if (agent === undefined) {
    const known = [...deps.agents.keys()].join(', ') || '(none)';
    throw new ConfigurationError(
      `no agent "${step.agent}" is registered in this worker (step "${step.id}"); register it with runtime.agent(defineAgent({ name: "${step.agent}", … })). Registered: ${known}`,
    );
  }
  return agent;
}

/** The failure a thrown value stands for, or the budget stop it is (the exception choke point). */
function failureOf(thrown: unknown): Exclude<StepResult, { kind: 'succeeded' }> {
  if (thrown instanceof BudgetExceededError) return { kind: 'budget', error: thrown };
  return { kind: 'failed', error: toFlujoError(thrown, true).toJSON() };
}

/**
 * Takes turn `turn` of a granular agent step (see `takeTurn`), with the same choke point as a
 * step: whatever it throws becomes a failure with its retryability, a budget hit is returned apart.
 */
export async function executeTurn(
  deps: StepExecutionDeps,
  args: {
    step: AgentStep;
    state: StepState;
    runId: string;
    tenantId: string;
    runInput: JsonValue;
    /** Outputs of the steps this one depends on, by step id. */
    depOutputs: Record<string, JsonValue>;
    turn: number;
    signal: AbortSignal;
    journaled?: Promise<ModelReply | null>;
  },
): Promise<TurnOutcome> {
  const { step, state, runId, tenantId, signal } = args;
  try {
    const agent = resolveAgent(deps, step);
    const offload = deps.offload;
    const turn = await takeTurn(
      {
        ...loopDeps(deps, { runId, stepId: step.id, attempt: state.attempt }),
        journal: deps.journal,
        fingerprints: deps.fingerprints,
        readHistory: deps.readHistory,
        ...(offload === undefined
          ? {}
          : { storeResult: (content: string) => offload(runId, content, step.blobThresholdBytes) }),
      },
      {
        agent,
        step,
        input: agentInput(step, args.runInput, args.depOutputs),
        runId,
        tenantId,
        attempt: state.attempt,
        signal,
        turn: args.turn,
        cursor: state.agent?.cursor ?? 0,
        fingerprint: state.agent?.fingerprint ?? null,
        ...(deps.budget === undefined ? {} : { budget: deps.budget }),
        ...(args.journaled === undefined ? {} : { journaled: args.journaled }),
      },
    );
    return { kind: 'turn', turn };
  } catch (thrown) {
    return failureOf(thrown);
  }
}

const sha256 = (value: unknown): string => canonicalHash(value, 'idempotency key inputs');

function pick(input: JsonValue, path: string): JsonValue | null {
  let cur: JsonValue | undefined = input;
  for (const seg of path.split('.')) {
    if (cur === null || typeof cur !== 'object' || Array.isArray(cur)) return null;
    cur = cur[seg];
  }
  return cur ?? null;
}

/** The idempotency key of a step: per run and step, or derived from the declared key inputs. */
export function stepIdempotencyKey(
  tenantId: string,
  runId: string,
  step: PlanStep,
  input: JsonValue,
): string {
  const keyInputs = step.idempotency.keyInputs;
  if (keyInputs.length === 0) return sha256({ tenant: tenantId, run: runId, step: step.id });
  const operator = step.kind === 'operator' ? step.operator : step.kind;
  return sha256({
    tenant: tenantId,
    operator,
    inputs: Object.fromEntries(keyInputs.map((p) => [p, pick(input, p)])),
  });
}

/**
 * Runs one attempt of a step: the exception choke point. Whatever the operator throws becomes a
 * failure with its retryability (a runtime error says; anything else counts as transient unless it
 * carries `retryable: false`); a budget hit is returned apart, since it stops the whole run.
 */
export async function executeStep(
  deps: StepExecutionDeps,
  args: {
    step: PlanStep;
    state: StepState;
    runId: string;
    tenantId: string;
    runInput: JsonValue;
    depOutputs: Record<string, JsonValue>;
    signal: AbortSignal;
  },
): Promise<StepResult> {
  const { step, state, runId, tenantId, runInput, depOutputs, signal } = args;
  const input = step.input === undefined ? runInput : step.input;
  try {
    const output = await run();
    const problems = findNonJson(output, 'output');
    if (problems.length > 0) {
      const what = problems.map((p) => `${p.path}: ${p.message}`).join('; ');
      throw new ConfigurationError(
        `step "${step.id}" returned a value that is not JSON (${what}); return plain JSON`,
      );
    }
    return { kind: 'succeeded', output: (output ?? null) as JsonValue };
  } catch (thrown) {
    return failureOf(thrown);
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
        return await runAtomicAgent(
          loopDeps(deps, { runId, stepId: step.id, attempt: state.attempt }),
          {
            agent,
            step,
            input: agentInput(step, runInput, depOutputs),
            runId,
            tenantId,
            attempt: state.attempt,
            signal,
            ...(deps.budget === undefined ? {} : { budget: deps.budget }),
          },
        );
      }
      default: {
        const name = step.kind === 'operator' ? step.operator : step.policy;
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
          tools: stepTools(deps, {
            runId,
            stepId: step.id,
            tenantId,
            attempt: state.attempt,
            signal,
          }),
        });
      }
    }
  }
}

function stepTools(
  deps: StepExecutionDeps,
  ctx: { runId: string; stepId: string; tenantId: string; attempt: number; signal: AbortSignal },
): StepTools {
  return {
    async call<T>(name: string, args: unknown): Promise<T> {
      const tool = deps.tools.get(name);
      const result = await callTool({
        ledger: deps.ledger,
        tool,
        args,
        ctx,
        leaseMs: deps.leaseMs,
        // Only calls that will really run count; a replayed receipt is free.
        ...(deps.maxToolCalls === undefined
          ? {}
          : { beforeRun: () => countToolCall(deps, ctx.runId) }),
      });
      return result.receipt as T;
    },
  };
}

/** Counts a tool call that will really run against the run's budget. */
async function countToolCall(deps: StepExecutionDeps, runId: string): Promise<void> {
  const used = await deps.countToolCall(runId);
  if (deps.maxToolCalls !== undefined && used > deps.maxToolCalls) {
    throw new BudgetExceededError('maxToolCalls', deps.maxToolCalls, used);
  }
}
