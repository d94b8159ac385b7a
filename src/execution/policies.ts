/**
 * Policies: named functions that allow or deny a step. A `policy_check` step runs the policy it
 * names; a policy registered with `appliesTo: { tags }` is checked before every step that carries
 * one of those tags in its `policyTags`. A denial is final (`PolicyDeniedError`, `policy_denied`).
 */
import { ConfigurationError, InputValidationError, PolicyDeniedError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import type { PlanStep } from '../plan/schema.js';

/** What a policy sees. */
export interface PolicyContext {
  /** The step's input: the plan's `input` for the step when it has one, else the run's input. */
  input: JsonValue;
  /** The run's input. */
  runInput: JsonValue;
  /** Outputs of the steps the checked step depends on, by step id. */
  deps: Record<string, JsonValue>;
  runId: string;
  /** The step being checked (the `policy_check` step itself, or the tagged step). */
  stepId: string;
  tenantId: string;
  /** The checked step's `policyTags`. */
  tags: readonly string[];
  /** Aborted when the run is cancelled or the worker shuts down. */
  signal: AbortSignal;
}

/** A policy's verdict. */
export type PolicyDecision = { allow: true } | { allow: false; reason: string };

/** A policy: a function from what it sees to its verdict. */
export type Policy = (context: PolicyContext) => PolicyDecision | Promise<PolicyDecision>;

/** Options of a policy's registration. */
export interface PolicyOptions {
  /** Check this policy before every step whose `policyTags` include one of these tags. */
  appliesTo?: { tags: readonly string[] };
}

/** A registered policy. */
export interface RegisteredPolicy {
  name: string;
  check: Policy;
  /** The tags it applies to (empty: it runs only where a `policy_check` step names it). */
  tags: readonly string[];
}

/** A policy as a job module exports it: the function, or `{ check, appliesTo }`. */
export type PolicyExport = Policy | ({ check: Policy } & PolicyOptions);

/** Checks a registration and returns it; `InputValidationError` naming the field and the fix. */
export function definePolicy(
  name: unknown,
  check: unknown,
  options: unknown = {},
  where = 'policy',
): RegisteredPolicy {
  const refuse = (path: string, message: string): never => {
    throw new InputValidationError(where, [{ path, message }]);
  };
  if (typeof name !== 'string' || name === '') {
    refuse('name', 'name the policy: runtime.policy("name", (ctx) => ({ allow: true }))');
  }
  if (typeof check !== 'function') {
    refuse('check', 'a policy is a function returning { allow: true } or { allow: false, reason }');
  }
  const opts = (options ?? {}) as { appliesTo?: unknown };
  if (typeof opts !== 'object' || Array.isArray(opts)) {
    refuse('options', 'pass { appliesTo: { tags: ["…"] } } or nothing');
  }
  let tags: string[] = [];
  if (opts.appliesTo !== undefined) {
    const applies: unknown = opts.appliesTo;
    const list: unknown =
      typeof applies === 'object' && applies !== null ? Reflect.get(applies, 'tags') : undefined;
    if (
      !Array.isArray(list) ||
      list.length === 0 ||
      !list.every((t) => typeof t === 'string' && t !== '')
    ) {
      refuse(
        'appliesTo.tags',
        'must be a non-empty array of tags, e.g. { appliesTo: { tags: ["pii"] } }',
      );
    }
    tags = [...new Set(list as string[])];
  }
  return { name: name as string, check: check as Policy, tags };
}

/** Reads a policy's verdict; `ConfigurationError` naming the policy when it is malformed. */
function verdictOf(name: string, value: unknown): PolicyDecision {
  const v = value as { allow?: unknown; reason?: unknown } | null;
  if (typeof v === 'object' && v !== null && !Array.isArray(v)) {
    if (v.allow === true) return { allow: true };
    if (v.allow === false && typeof v.reason === 'string' && v.reason !== '') {
      return { allow: false, reason: v.reason };
    }
  }
  let shown: string;
  try {
    shown = JSON.stringify(value) ?? String(value);
  } catch {
    shown = String(value);
  }
  throw new ConfigurationError(
    `policy "${name}" returned ${shown.length > 120 ? `${shown.slice(0, 117)}...` : shown}; a policy returns { allow: true } or { allow: false, reason: "why" } (a denial without a reason is refused too)`,
    { field: 'policy' },
  );
}

/** What a step's policies need beside the registry. */
export type PolicyArgs = Omit<PolicyContext, 'tags' | 'stepId'>;

/** Runs one policy; throws `PolicyDeniedError` when it denies. */
export async function enforcePolicy(
  policy: RegisteredPolicy,
  step: PlanStep,
  args: PolicyArgs,
): Promise<void> {
  const verdict = verdictOf(
    policy.name,
    await policy.check({ ...args, stepId: step.id, tags: step.policyTags }),
  );
  if (!verdict.allow) throw new PolicyDeniedError(policy.name, step.id, verdict.reason);
}

/**
 * Checks, before the step runs, every registered policy bound to one of its `policyTags`. A tag
 * that no registered policy applies to fails the step (`ConfigurationError`): a declared check
 * that nothing makes is refused, never skipped.
 */
export async function enforceTaggedPolicies(
  policies: ReadonlyMap<string, RegisteredPolicy>,
  step: PlanStep,
  args: PolicyArgs,
): Promise<void> {
  if (step.policyTags.length === 0) return;
  const bound = [...policies.values()].filter((p) =>
    p.tags.some((t) => step.policyTags.includes(t)),
  );
  const unbound = step.policyTags.filter((t) => !bound.some((p) => p.tags.includes(t)));
  if (unbound.length > 0) {
    throw new ConfigurationError(
      `step "${step.id}" carries policy tag ${unbound.map((t) => JSON.stringify(t)).join(', ')}, which no policy registered in this worker applies to; register one with runtime.policy(name, fn, { appliesTo: { tags: [${unbound.map((t) => JSON.stringify(t)).join(', ')}] } }) or remove the tag`,
      { field: 'policyTags' },
    );
  }
  for (const policy of bound) await enforcePolicy(policy, step, args);
}

/** The policy a `policy_check` step names; `ConfigurationError` naming the fix when there is none. */
export function resolvePolicy(
  policies: ReadonlyMap<string, RegisteredPolicy>,
  name: string,
  stepId: string,
): RegisteredPolicy {
  const policy = policies.get(name);
  if (policy === undefined) {
    const known = [...policies.keys()].join(', ') || '(none)';
    throw new ConfigurationError(
      `no policy "${name}" is registered in this worker (step "${stepId}"); register it with runtime.policy("${name}", fn). Registered: ${known}`,
      { field: 'policy' },
    );
  }
  return policy;
}
