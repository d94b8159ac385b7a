/**
 * Builders: `Step.operator`, `Step.agent`, `Step.granular`, `Step.gate` and
 * `Step.policy` compile to the plain step data of {@link PlanInput}; `plan`, `Pipeline.of` and
 * `Pipeline.line` assemble steps into a {@link Plan} through {@link parsePlan}, so a builder mistake
 * gets the same path-named error as a hand-written plan (`steps[0].maxTurns: must be at least 1`).
 *
 * Pure: no I/O, no clock. Builders never validate; `parsePlan` does, once, for the whole plan.
 */
import type { z } from 'zod';
import type { JsonValue } from '../internal/json.js';
import { parsePlan } from './parse-plan.js';
import type {
  agentStepSchema,
  humanGateStepSchema,
  operatorStepSchema,
  Plan,
  PlanInput,
  policyCheckStepSchema,
} from './schema.js';

/** A step as written, any kind: what the builders return and what `plan(...)` takes. */
export type StepInput = PlanInput['steps'][number];
/** An operator step as written. */
export type OperatorStepInput = z.input<typeof operatorStepSchema>;
/** An agent step as written. */
export type AgentStepInput = z.input<typeof agentStepSchema>;
/** A policy check step as written. */
export type PolicyCheckStepInput = z.input<typeof policyCheckStepSchema>;
/** A human gate step as written. */
export type HumanGateStepInput = z.input<typeof humanGateStepSchema>;

/**
 * Fields every kind of step takes: `dependsOn`, `effects`, `policyTags`, `riskLevel`,
 * `cachePolicy`, `idempotency`, `gate`, `retry`, `budgets`, `timeoutMs`, `when`, `description`,
 * `input`.
 * A field left out (or `undefined`) is left out of the step, so the schema default applies.
 */
export type StepOptions = Omit<HumanGateStepInput, 'kind' | 'id'>;

/** The agent loop settings of an agent step. */
export interface AgentLoopOptions {
  /**
   * Most model turns before the run fails with `max_turns_exceeded`.
   * @defaultValue `20`
   */
  maxTurns?: number;
  /**
   * Token budget of the history sent to the model.
   * @defaultValue `128000`
   */
  historyMaxTokens?: number;
  /**
   * Tool results larger than this many bytes are stored as blobs.
   * @defaultValue `20000`
   */
  blobThresholdBytes?: number;
  /**
   * Refuses any tool call whose arguments lack the turn's idempotency key.
   * @defaultValue `false`
   */
  enforceIdempotency?: boolean;
}

/** Options of {@link Step.agent}: the common fields (input is positional), the loop, the mode. */
export interface AgentStepOptions extends Omit<StepOptions, 'input'>, AgentLoopOptions {
  /**
   * A granular step whose history lost a blob (its retention elapsed) replays with a marker in
   * its place, for results of idempotent tools, instead of failing with `BlobMissingError`.
   * @defaultValue `false`
   */
  degradedReplay?: boolean;
  /**
   * `atomic`: the whole loop in one unit, one commit at the end. `granular`: one unit and one
   * commit per turn, resumable mid-loop (see {@link Step.granular}).
   * @defaultValue `'atomic'`
   */
  mode?: 'atomic' | 'granular';
  /**
   * Granular steps only: the signals of this name sent to the run join the step's history as
   * user messages at its next turn boundary, each once, in send order.
   */
  inbox?: string;
  /**
   * Granular steps with an `inbox` only: a reply without tool calls waits for the next message
   * instead of ending the step; the step ends when the model calls the `end` tool, when an `end`
   * signal arrives, or at `maxTurns`.
   * @defaultValue `false`
   */
  conversation?: boolean;
  /**
   * Granular steps with an `inbox` only: a message sent while a model call is in flight waits for
   * the turn boundary (`queue`), or aborts that call (never a tool call) and the turn is taken
   * again with it (`interrupt`).
   * @defaultValue `'queue'`
   */
  onBusy?: 'queue' | 'interrupt';
}

/** Options of {@link Step.granular}: as {@link AgentStepOptions}, the mode fixed to `granular`. */
export type GranularStepOptions = Omit<AgentStepOptions, 'mode'>;

/**
 * An agent, by definition or by the name it is registered under. Any object with a `name` will do
 * (an `AgentDefinition` is one): plans are data and know agents by name only.
 */
export type AgentRef = string | { readonly name: string };

/** The loop defaults every agent step the builders make carries explicitly. */
export const AGENT_LOOP_DEFAULTS: Readonly<Required<AgentLoopOptions>> = Object.freeze({
  maxTurns: 20,
  historyMaxTokens: 128_000,
  blobThresholdBytes: 20_000,
  enforceIdempotency: false,
});

/** The fields of `options` that are set (arrays copied), but for `skip`; unknown keys kept. */
function defined<T extends object>(options: T | undefined, skip: readonly string[] = []): T {
  const out: Record<string, unknown> = {};
  if (options === undefined) return out as T;
  for (const [key, value] of Object.entries(options)) {
    if (value === undefined || skip.includes(key)) continue;
    // Keys the builders do not know (a typo, a stray field) pass through, so parsePlan names them.
    out[key] = Array.isArray(value) ? [...(value as unknown[])] : value;
  }
  return out as T;
}

function agentName(agent: AgentRef): unknown {
  if (typeof agent === 'string') return agent;
  // A JavaScript caller may pass anything; parsePlan reports whatever this yields at `.agent`.
  return (agent as { name?: unknown } | null | undefined)?.name;
}

const AGENT_KEYS = ['mode', ...Object.keys(AGENT_LOOP_DEFAULTS)];

/** Builders of plan steps. Each returns a plain, JSON-safe step object. */
export const Step = {
  /** A step that runs the operator registered as `operator`. */
  operator(id: string, operator: string, options?: StepOptions): OperatorStepInput {
    return { kind: 'operator', id, operator, ...defined(options) };
  },

  /**
   * A step that runs an agent; `atomic` unless `options.mode` says otherwise. The loop settings
   * (`maxTurns`, `historyMaxTokens`, `blobThresholdBytes`, `enforceIdempotency`) are written out,
   * defaults included, so the stored plan says what runs.
   */
  agent(
    id: string,
    agent: AgentRef,
    input?: JsonValue,
    options?: AgentStepOptions,
  ): AgentStepInput {
    const loop: AgentLoopOptions = options ?? {};
    return {
      kind: 'agent',
      id,
      agent: agentName(agent) as string,
      ...defined(options, AGENT_KEYS),
      ...(input === undefined ? {} : { input }),
      mode: options?.mode ?? 'atomic',
      maxTurns: loop.maxTurns ?? AGENT_LOOP_DEFAULTS.maxTurns,
      historyMaxTokens: loop.historyMaxTokens ?? AGENT_LOOP_DEFAULTS.historyMaxTokens,
      blobThresholdBytes: loop.blobThresholdBytes ?? AGENT_LOOP_DEFAULTS.blobThresholdBytes,
      enforceIdempotency: loop.enforceIdempotency ?? AGENT_LOOP_DEFAULTS.enforceIdempotency,
    };
  },

  /**
   * A granular agent step: one unit and one commit per turn, so a crash resumes after the last
   * committed turn. Defaults: `maxTurns` 20, `historyMaxTokens` 128000, `blobThresholdBytes` 20000,
   * `enforceIdempotency` false. The first argument is the step id.
   */
  granular(
    id: string,
    agent: AgentRef,
    input?: JsonValue,
    options?: GranularStepOptions,
  ): AgentStepInput {
    return Step.agent(id, agent, input, { ...defined(options, ['mode']), mode: 'granular' });
  },

  /** A step that only waits for a person's approval (`human_gate`). */
  gate(id: string, options?: StepOptions): HumanGateStepInput {
    return { kind: 'human_gate', id, ...defined(options) };
  },

  /** A step that evaluates the policy registered as `policy` (`policy_check`). */
  policy(id: string, policy: string, options?: StepOptions): PolicyCheckStepInput {
    return { kind: 'policy_check', id, policy, ...defined(options) };
  },
} as const;

/** Plan-level options of {@link plan}. */
export interface PlanOptions {
  description?: PlanInput['description'];
  budgets?: PlanInput['budgets'];
  defaults?: PlanInput['defaults'];
}

/**
 * A parsed {@link Plan} of `steps`, through {@link parsePlan} (throws its `PlanValidationError`).
 * Never infers dependencies: a step runs after exactly the steps its `dependsOn` names.
 */
export function plan(name: string, steps: readonly StepInput[], options?: PlanOptions): Plan {
  return parsePlan({ name, ...defined(options), steps: [...steps] });
}

/**
 * Chains steps in a line: each step after the first that has no `dependsOn` of its own (the key
 * absent or `undefined`) gets `dependsOn: [<id of the step before it>]`. A step with an explicit
 * `dependsOn`, even `[]`, keeps it. Returns new step objects; the given ones are not changed.
 */
function chain(steps: readonly StepInput[]): StepInput[] {
  return steps.map((step, i) => {
    const previous = steps[i - 1];
    if (previous === undefined || step.dependsOn !== undefined) return step;
    return { ...step, dependsOn: [previous.id] };
  });
}

/** Plans from steps. Only {@link Pipeline.line} adds dependencies; see {@link Pipeline.chain}. */
export const Pipeline = {
  /** A plan of the steps as given, like {@link plan}: no dependency is inferred. */
  of(name: string, ...steps: StepInput[]): Plan {
    return plan(name, steps);
  },
  /**
   * A plan of the steps in a line: each step without an explicit `dependsOn` depends on the step
   * before it (see {@link Pipeline.chain}).
   */
  line(name: string, ...steps: StepInput[]): Plan {
    return plan(name, chain(steps));
  },
  /** The chaining {@link Pipeline.line} does, for `plan(name, Pipeline.chain(steps), options)`. */
  chain,
} as const;
