/**
 * Registration: the operators, tools, agents and policies a runtime is given, in its options or
 * one by one. Each a plain function of the runtime's registry.
 */
import type { RuntimeRegistry, SignalSchema } from '../actors/runtime-registry.js';
import { signalNameSchema, type Plan, type PlanInput } from '../plan/schema.js';
import { parsePlan } from '../plan/parse-plan.js';
import type { Operator } from '../execution/execute-step.js';
import {
  definePolicy,
  type Policy,
  type PolicyExport,
  type PolicyOptions,
} from '../execution/policies.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { ConfigurationError, InputValidationError, type ValidationIssue } from '../errors.js';
import type { ToolDefinition } from '../tools/define-tool.js';

/** What the runtime's options register. */
export interface Registrations {
  operators?: Record<string, Operator>;
  plans?: Record<string, Plan | PlanInput>;
  tools?: readonly ToolDefinition[];
  agents?: readonly AgentDefinition[];
  policies?: Record<string, PolicyExport>;
}

/** The `version` of registration options; refuses one that is not a non-empty string. */
export function checkVersion(
  options: { version?: string } | undefined,
  what: 'operator' | 'agent',
): string | undefined {
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

/** Registers what the runtime's options name, as given (a policy export becomes a policy). */
export function registerAll(registry: RuntimeRegistry, given: Registrations): void {
  for (const [name, fn] of Object.entries(given.operators ?? {})) registry.operators.set(name, fn);
  for (const tool of given.tools ?? []) registry.tools.register(tool);
  for (const agent of given.agents ?? []) registry.agents.set(agent.name, agent);
  for (const [name, plan] of Object.entries(given.plans ?? {})) registerPlan(registry, name, plan);
  for (const [name, exported] of Object.entries(given.policies ?? {})) {
    const policy =
      typeof exported === 'function'
        ? definePolicy(name, exported)
        : definePolicy(name, exported?.check, exported);
    registry.policies.set(name, policy);
  }
}

/** Registers an operator under `name` (`runtime.operator`); its `version` replaces any earlier. */
export function registerOperator(
  registry: RuntimeRegistry,
  name: string,
  fn: Operator,
  options: { version?: string } | undefined,
): void {
  if (typeof name !== 'string' || name === '' || typeof fn !== 'function') {
    throw new InputValidationError('operator', [
      {
        path: 'operator',
        message: 'register an operator as runtime.operator(name, async (ctx) => result)',
      },
    ]);
  }
  const version = checkVersion(options, 'operator');
  registry.operators.set(name, fn);
  if (version === undefined) registry.operatorVersions.delete(name);
  else registry.operatorVersions.set(name, version);
}

/** Registers a policy (`runtime.policy`); refuses a second policy of one name. */
export function registerPolicy(
  registry: RuntimeRegistry,
  name: string,
  fn: Policy,
  options: PolicyOptions | undefined,
): void {
  const policy = definePolicy(name, fn, options);
  if (registry.policies.has(policy.name)) {
    throw new ConfigurationError(
      `a policy named "${policy.name}" is already registered; give each policy its own name`,
    );
  }
  registry.policies.set(policy.name, policy);
}

/** Registers an agent (`runtime.agent`); refuses a second agent of one name. */
export function registerAgent(
  registry: RuntimeRegistry,
  definition: AgentDefinition,
  options: { version?: string } | undefined,
): void {
  if (registry.agents.has(definition.name)) {
    throw new ConfigurationError(
      `an agent named "${definition.name}" is already registered; give each agent its own name`,
    );
  }
  const version = checkVersion(options, 'agent');
  registry.agents.set(definition.name, definition);
  if (version !== undefined) registry.agentVersions.set(definition.name, version);
}

/**
 * Declares the signals of plan `planName` (`runtime.signals`): each name must be a valid signal
 * name and each schema have zod's `safeParse`. Replaces what the plan declared before.
 */
export function registerSignals(
  registry: RuntimeRegistry,
  planName: string,
  schemas: Record<string, SignalSchema>,
): void {
  const issues: ValidationIssue[] = [];
  if (typeof planName !== 'string' || planName.length === 0) {
    issues.push({ path: 'planName', message: 'must be the name of a plan' });
  }
  if (typeof schemas !== 'object' || schemas === null) {
    issues.push({ path: 'signals', message: 'must be an object: signal name → zod schema' });
  } else {
    for (const [name, schema] of Object.entries(schemas)) {
      if (!signalNameSchema.safeParse(name).success) {
        issues.push({
          path: `signals.${name}`,
          message: 'is not a signal name: use 1 to 128 letters, digits, "_", "." or "-"',
        });
      }
      if (typeof (schema as { safeParse?: unknown } | null)?.safeParse !== 'function') {
        issues.push({ path: `signals.${name}`, message: 'must be a zod schema (z.object({ … }))' });
      }
    }
  }
  if (issues.length > 0) throw new InputValidationError('signals', issues);
  registry.signals.set(planName, { ...schemas });
}

/**
 * Registers `plan` under `name` (`runtime.plan`): the plan `run` steps naming `name` start child
 * runs of. Checked now (a plan that does not parse is refused with its issues); a later one of the
 * same name replaces it.
 */
export function registerPlan(
  registry: RuntimeRegistry,
  name: string,
  plan: Plan | PlanInput | string,
): void {
  if (typeof name !== 'string' || name === '' || name.length > 200) {
    throw new InputValidationError('plan', [
      {
        path: 'name',
        message: `must be a non-empty string of at most 200 characters, e.g. runtime.plan("research", plan), got ${JSON.stringify(name)}`,
      },
    ]);
  }
  registry.plans.set(name, parsePlan(plan));
}
