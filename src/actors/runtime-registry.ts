import type { z } from 'zod';
import type { Operator } from '../execution/execute-step.js';
import type { RegisteredPolicy } from '../execution/policies.js';
import { modelClients, type ModelClients } from '../execution/model-call.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import type { JsonValue } from '../internal/json.js';
import type { Logger } from '../logging.js';
import type { ModelClient } from '../llm/openai-client.js';
import { createTokenCounter, type TokenCounter } from '../llm/tokens.js';
import type { Plan, PlanStep } from '../plan/schema.js';

/** The schema of a signal's payload: a zod schema (anything with zod's `safeParse`). */
export interface SignalSchema {
  /** Checks a payload: its parsed value, or the issues that refuse it (zod's `safeParse`). */
  safeParse(
    value: unknown,
  ):
    | { success: true; data: unknown }
    | { success: false; error: { issues: readonly z.core.$ZodIssue[] } };
}
import { createToolRegistry, type ToolRegistry } from '../tools/registry.js';

/**
 * What a runtime knows by name: the operators, agents, policies and tools registered with it, the
 * versions they were registered with, and the model clients and token counters its agents use.
 * In memory, per process: every worker registers the same.
 */
export class RuntimeRegistry implements ModelClients {
  /** The operators, by name. */
  readonly operators = new Map<string, Operator>();
  /** The `version` an operator was registered with, by name: part of its cache key. */
  readonly operatorVersions = new Map<string, string>();
  /** The `version` an agent was registered with, by name: part of its cache key. */
  readonly agentVersions = new Map<string, string>();
  /** The tagged policies, by name. */
  readonly policies = new Map<string, RegisteredPolicy>();
  /** The agents, by name. */
  readonly agents = new Map<string, AgentDefinition>();
  /**
   * The signals each plan declares, by plan name: signal name → the schema its payload must pass.
   * A plan that declares any takes no other name.
   */
  readonly signals = new Map<string, Record<string, SignalSchema>>();
  /** The tools, by name. */
  readonly tools: ToolRegistry = createToolRegistry();
  /** The plans `run` steps start child runs of, by the name they are registered under. */
  readonly plans = new Map<string, Plan>();
  readonly #clients = modelClients();
  readonly #counters = new Map<string, TokenCounter>();
  readonly #log: Logger;

  /** `log` hears when a model's tokens are counted by a heuristic. */
  constructor(log: Logger) {
    this.#log = log;
  }

  /**
   * The code identity of a step's primary, part of its cache key: the operator or agent name and
   * the version it was registered with (for an agent also its model, prompt, settings and tools).
   */
  identityOf(step: PlanStep): JsonValue {
    if (step.kind === 'agent') {
      const agent = this.agents.get(step.agent);
      return {
        kind: 'agent',
        name: step.agent,
        version: this.agentVersions.get(step.agent) ?? null,
        model: agent?.model ?? null,
        systemPrompt: agent?.systemPrompt ?? null,
        settings: (agent?.settings ?? null) as JsonValue,
        tools: agent?.tools.map((t) => t.identity) ?? [],
      };
    }
    const name = step.kind === 'operator' ? step.operator : step.kind;
    return { kind: step.kind, name, version: this.operatorVersions.get(name) ?? null };
  }

  /** The model client of an agent (one per agent definition, made on first use). */
  clientFor(agent: AgentDefinition): ModelClient {
    return this.#clients.clientFor(agent);
  }

  /** The token counter of a model (one per model, shared by usage and context). */
  tokens(model: string): TokenCounter {
    let counter = this.#counters.get(model);
    if (counter === undefined) {
      counter = createTokenCounter(model, {
        onHeuristic: (info) => this.#log.info({ model: info.model }, info.reason),
      });
      this.#counters.set(model, counter);
    }
    return counter;
  }
}
