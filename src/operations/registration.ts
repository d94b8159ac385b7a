/**
 * Registration: the operators, tools, agents and policies a runtime is given, in its options or
 * one by one. Each a plain function of the runtime core's registries.
 */
import type { RuntimeCore } from '../actors/core.js';
import type { Operator } from '../execution/execute-step.js';
import {
  definePolicy,
  type Policy,
  type PolicyExport,
  type PolicyOptions,
} from '../execution/policies.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { ConfigurationError, InputValidationError } from '../errors.js';
import type { ToolDefinition } from '../tools/define-tool.js';

/** What the runtime's options register. */
export interface Registrations {
  operators?: Record<string, Operator>;
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
export function registerAll(core: RuntimeCore, given: Registrations): void {
  for (const [name, fn] of Object.entries(given.operators ?? {})) core.operators.set(name, fn);
  for (const tool of given.tools ?? []) core.tools.register(tool);
  for (const agent of given.agents ?? []) core.agents.set(agent.name, agent);
  for (const [name, exported] of Object.entries(given.policies ?? {})) {
    const policy =
      typeof exported === 'function'
        ? definePolicy(name, exported)
        : definePolicy(name, exported?.check, exported);
    core.policies.set(name, policy);
  }
}

/** Registers an operator under `name` (`runtime.operator`); its `version` replaces any earlier. */
export function registerOperator(
  core: RuntimeCore,
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
  core.operators.set(name, fn);
  if (version === undefined) core.operatorVersions.delete(name);
  else core.operatorVersions.set(name, version);
}

/** Registers a policy (`runtime.policy`); refuses a second policy of one name. */
export function registerPolicy(
  core: RuntimeCore,
  name: string,
  fn: Policy,
  options: PolicyOptions | undefined,
): void {
  const policy = definePolicy(name, fn, options);
  if (core.policies.has(policy.name)) {
    throw new ConfigurationError(
      `a policy named "${policy.name}" is already registered; give each policy its own name`,
    );
  }
  core.policies.set(policy.name, policy);
}

/** Registers an agent (`runtime.agent`); refuses a second agent of one name. */
export function registerAgent(
  core: RuntimeCore,
  definition: AgentDefinition,
  options: { version?: string } | undefined,
): void {
  if (core.agents.has(definition.name)) {
    throw new ConfigurationError(
      `an agent named "${definition.name}" is already registered; give each agent its own name`,
    );
  }
  const version = checkVersion(options, 'agent');
  core.agents.set(definition.name, definition);
  if (version !== undefined) core.agentVersions.set(definition.name, version);
}
