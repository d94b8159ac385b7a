/**
 * `defineJob`: a job module's exports in one typed object, for `export default defineJob({ … })`.
 * The plan's operator names are checked against `operators` by the type checker: a step that
 * names an operator the job does not define does not compile (and `flujo validate <module>` says
 * so at run time too, as every command that loads the module does).
 */
import type { Operator } from './execution/execute-step.js';
import type { PolicyExport } from './execution/policies.js';
import type { AgentDefinition } from './agents/define-agent.js';
import type { JsonValue } from './internal/json.js';
import type { PricingTable } from './llm/pricing.js';
import type { RateLimits } from './execution/rate-limits.js';
import type { PlanInput } from './plan/schema.js';
import type { ScheduleOptions } from './worker/schedule-definition.js';
import type { ToolDefinition } from './tools/define-tool.js';
import type { SignalSchema } from './actors/runtime-registry.js';

/** The operator names the steps of plan `P` use. */
export type OperatorNamesOf<P> = P extends { steps: readonly (infer S)[] }
  ? S extends { kind: 'operator'; operator: infer N extends string }
    ? N
    : never
  : never;

/** What `setup` receives. */
export interface JobSetupContext {
  /** A directory the job may keep files in: `.flujo/data` of the project. */
  dataDir: string;
}

/** A job: what a job module exports. */
export interface JobDefinition<P extends PlanInput = PlanInput> {
  /** The plan. */
  plan: P;
  /**
   * The plans the job's `run` steps start child runs of, by the name the steps give
   * (`{ kind: 'run', plan: '<name>' }`); their operators are in `operators` too.
   */
  plans?: Record<string, PlanInput>;
  /** Every operator the plan's steps name, by name. */
  operators: Record<OperatorNamesOf<P>, Operator> & Record<string, Operator>;
  /** Tools the operators and agents call. */
  tools?: readonly ToolDefinition[];
  /** Agents the plan's agent steps name, or a function returning them, called after setup. */
  agents?: readonly AgentDefinition[] | ((ctx: JobSetupContext) => unknown);
  /** Policies the plan's policy_check steps and policy tags name. */
  policies?: Record<string, PolicyExport>;
  /** The default run input. */
  input?: JsonValue;
  /**
   * The signals the plan's runs take: signal name → a zod schema of the payload. Declared, a run
   * takes no other name, and a payload must pass its schema. @defaultValue any name, any JSON
   */
  signals?: Record<string, SignalSchema>;
  /** Called once before run, resume and worker; the function it returns is called on exit. */
  setup?: (ctx: JobSetupContext) => unknown;
  /** Prices per model, or the path of such a JSON file beside the module. */
  pricing?: PricingTable | string;
  /** A model without a price fails its step before any request. */
  strictPricing?: boolean;
  /**
   * Model rate limits by model or provider, as `createRuntime({ rateLimits })` takes them: the
   * runtime the CLI makes for the module (`flujo worker`, `run`, `resume`, …) applies them.
   */
  rateLimits?: RateLimits;
  /**
   * Schedules of the plan, by id: `flujo worker` defines (or updates) each when it starts, as
   * `runtime.schedule(id, { ...options, plan })` would. `plan`, if given, names the job's plan.
   */
  schedules?: Record<string, Omit<ScheduleOptions, 'plan'> & { plan?: string }>;
  /**
   * The BullMQ queue of the job's runs: the runs the CLI starts with the module record it, and
   * `flujo worker` takes units from it (and from the default queue `runs`). Give a start through
   * the API the same (`createRuntime({ queueName })` or `runtime.start(…, { queue })`).
   * @defaultValue `plan.<plan name>` (see `jobQueueName`)
   */
  queue?: string;
}

/**
 * Returns `job` as it is, typed: `export default defineJob({ plan, operators, … })`. A step that
 * names an operator missing from `operators` is a type error.
 *
 * @example
 * ```ts
 * export default defineJob({
 *   plan: { name: 'hello', steps: [{ id: 'greet', kind: 'operator', operator: 'greet' }] },
 *   operators: { greet: ({ input }) => ({ text: `Hello ${String(input)}` }) },
 * });
 * ```
 */
export function defineJob<const P extends PlanInput>(job: JobDefinition<P>): JobDefinition<P> {
  return job;
}
