/**
 * Plans as data: zod schemas and the types inferred from them. Code is
 * referenced by name (operators, agents, policies), so a plan can be stored, diffed and resumed.
 * Every object is strict: a misspelt key is refused, not ignored.
 */
import { z } from 'zod';
import { STEP_ID_PATTERN } from '../internal/ids.js';
import { jsonValueSchema } from '../internal/json.js';
import { findDependencyCycles } from './graph.js';

export { STEP_ID_PATTERN };

/** The only plan schema version this release reads and writes. */
export const PLAN_SCHEMA_VERSION = 1;
/** Most steps a plan may have. */
export const MAX_PLAN_STEPS = 1000;

/** A step id: 1–128 letters, digits, `_`, `.` or `-`, starting with a letter or digit. */
export const stepIdSchema = z.string().regex(STEP_ID_PATTERN, {
  error: (issue) =>
    `step id ${JSON.stringify(issue.input)} is not allowed: use 1 to 128 letters, digits, "_", "." or "-", ` +
    'starting with a letter or digit (ids go into Redis keys and job ids, so no ":", "{", "}" or spaces)',
});

const nonEmpty = () => z.string().min(1);
const positiveInt = () => z.number().int().positive();

/** The classes of side effect a step declares. */
export const effectClassSchema = z.enum(['read_only', 'local', 'memory', 'external']);
/** A step's risk level. */
export const riskLevelSchema = z.enum(['low', 'medium', 'high', 'critical']);
/** The kinds of step. */
export const stepKindSchema = z.enum([
  'operator',
  'agent',
  'policy_check',
  'human_gate',
  'wait',
  'map',
  'run',
]);

/**
 * How a step's output is cached, tenant-wide, under the step's code identity, input and
 * dependencies' outputs: `deterministic` (a hit skips the step; a re-run whose output differs
 * fails with `NonDeterminismError`), `stable_nondeterministic` (stored with its inputs; a hit is
 * used only when the step or the run allows it), `external` (kept `ttlMs`, with its provenance).
 */
export const cachePolicySchema = z.discriminatedUnion('class', [
  z.object({ class: z.literal('none') }).strict(),
  z.object({ class: z.literal('deterministic') }).strict(),
  z
    .object({
      class: z.literal('stable_nondeterministic'),
      /** Use a stored output of this step (else only when the run's start allows it). */
      allowCacheHit: z.boolean().default(false),
    })
    .strict(),
  // External results are cached only with an explicit TTL and provenance.
  z.object({ class: z.literal('external'), ttlMs: positiveInt(), provenance: nonEmpty() }).strict(),
]);

/**
 * What runs once the step's primary operator or agent has failed finally (after its retries):
 * one attempt of the named operator or agent, told the primary's error.
 */
export const fallbackSchema = z.union([
  z.object({ operator: nonEmpty() }).strict(),
  z.object({ agent: nonEmpty() }).strict(),
]);

/** A retry policy as written: every field optional, merged over plan defaults and built-ins. */
export const retryPolicyInputSchema = z
  .object({
    maxAttempts: z.number().int().min(1).max(100).optional(),
    initialDelayMs: z.number().int().min(0).optional(),
    backoffCoefficient: z.number().min(1).max(100).optional(),
    maxDelayMs: z.number().int().min(0).optional(),
    /** A fraction of the delay, in [0, 1]. */
    jitter: z.number().min(0).max(1).optional(),
  })
  .strict();

/** A retry policy as written. */
export type RetryPolicyInput = z.input<typeof retryPolicyInputSchema>;

/** A fully resolved retry policy. */
export interface RetryPolicy {
  maxAttempts: number;
  initialDelayMs: number;
  backoffCoefficient: number;
  maxDelayMs: number;
  jitter: number;
}

/** The built-in retry policy, under plan defaults and step settings. */
export const DEFAULT_RETRY_POLICY: Readonly<RetryPolicy> = Object.freeze({
  maxAttempts: 3,
  initialDelayMs: 1000,
  backoffCoefficient: 2,
  maxDelayMs: 300_000,
  jitter: 0.2,
});

const RETRY_FIELDS = Object.keys(DEFAULT_RETRY_POLICY) as (keyof RetryPolicy)[];

/** Merges retry layers, most specific first (step, then plan defaults), over the built-ins. */
export function resolveRetryPolicy(...layers: (RetryPolicyInput | undefined)[]): RetryPolicy {
  const out = { ...DEFAULT_RETRY_POLICY };
  for (const field of RETRY_FIELDS) {
    for (const layer of layers) {
      const value = layer?.[field];
      if (value !== undefined) {
        out[field] = value;
        break;
      }
    }
  }
  return out;
}

function retryOrderMessage(
  maxDelayMs: number,
  maxFrom: string,
  initialDelayMs: number,
  initialFrom: string,
): string {
  const note = (from: string): string => (from === '' ? '' : `, ${from}`);
  return (
    `retry.maxDelayMs (${maxDelayMs}${note(maxFrom)}) is below retry.initialDelayMs ` +
    `(${initialDelayMs}${note(initialFrom)}): raise maxDelayMs or lower initialDelayMs`
  );
}

/** A retry policy as written, resolved over the built-ins; output is a full {@link RetryPolicy}. */
export const retryPolicySchema = retryPolicyInputSchema
  .transform((input): RetryPolicy => resolveRetryPolicy(input))
  .superRefine((policy, ctx) => {
    if (policy.maxDelayMs < policy.initialDelayMs) {
      ctx.addIssue({
        code: 'custom',
        message: retryOrderMessage(policy.maxDelayMs, '', policy.initialDelayMs, ''),
      });
    }
  });

/** Limits of a whole run: steps, tool calls, wall clock, tokens and cost over all its steps. */
export const runBudgetsSchema = z
  .object({
    maxWallClockMs: positiveInt().optional(),
    maxSteps: positiveInt().optional(),
    maxToolCalls: positiveInt().optional(),
    maxTokens: positiveInt().optional(),
    maxCostUsd: z.number().positive().optional(),
  })
  .strict();

/** Limits of one step. */
export const stepBudgetsSchema = z
  .object({
    maxWallClockMs: positiveInt().optional(),
    maxToolCalls: positiveInt().optional(),
    maxTokens: positiveInt().optional(),
    maxCostUsd: z.number().positive().optional(),
  })
  .strict();

/** What a concurrency key names: the run's tenant, or a path into the run's input. */
export const CONCURRENCY_KEY_PATTERN = /^(tenant|input(\.[^.\s]+)+)$/;

/**
 * A limit of concurrency per key value. On a plan, at most `limit` of its runs with one value
 * of `key` are live at once (a run holds its slot from its first unit until it ends); on a step,
 * at most `limit` attempts of that step run at once across runs with one value of `key`. Runs or
 * attempts over the limit wait in arrival order, without holding a worker. `key` is `tenant`
 * (the run's tenant) or `input.<path>` (a dotted path into the run's input, e.g.
 * `input.customer.id`; a value that is not there is the value `null`).
 */
export const concurrencySchema = z
  .object({
    key: z.string().regex(CONCURRENCY_KEY_PATTERN, {
      error: (issue) =>
        `concurrency key ${JSON.stringify(issue.input)} is not allowed: use "tenant" or "input.<path>" (a dotted path into the run's input, e.g. "input.customer")`,
    }),
    limit: z.number().int().positive({ error: 'must be a positive whole number' }),
  })
  .strict();

/** Which parts of a step's input derive its idempotency key. */
export const idempotencySchema = z
  .object({
    /** Paths into the step input; each at most once. */
    keyInputs: z.array(nonEmpty()).default(() => []),
  })
  .strict()
  .superRefine((value, ctx) => {
    const first = new Map<string, number>();
    value.keyInputs.forEach((key, i) => {
      const at = first.get(key);
      if (at === undefined) first.set(key, i);
      else {
        ctx.addIssue({
          code: 'custom',
          path: ['keyInputs', i],
          message: `duplicate key input ${JSON.stringify(key)} (already listed at keyInputs[${at}])`,
        });
      }
    });
  });

/**
 * A step that waits for a person's approval before it runs. With `approvers`, only those names
 * may approve, reject or skip it (and decide on its tool calls); `reason` is shown wherever a
 * person decides.
 */
export const gateSchema = z
  .object({
    approvers: z
      .array(nonEmpty())
      .min(1, {
        error: 'list at least one approver, or leave approvers out to let anyone decide',
      })
      .optional(),
    reason: z.string().optional(),
  })
  .strict();

const WHEN_FIX = 'give exactly one of equals: <JSON>, in: [<JSON>, ...] or exists: true|false';

/**
 * A condition on a step: the output of step `step` (an ancestor of the step), at `path` (dot-separated
 * keys and array indexes; the whole output when absent), tested with exactly one of `equals` (deep
 * JSON equality), `in` (equal to one of the values) or `exists` (the value is there and not null,
 * or, with `false`, is not). A false condition skips the step (reason `condition_false`).
 */
export const whenSchema = z
  .object({
    step: nonEmpty(),
    path: nonEmpty().optional(),
    equals: jsonValueSchema.optional(),
    in: z.array(jsonValueSchema).min(1).optional(),
    exists: z.boolean().optional(),
  })
  .strict()
  .superRefine((w, ctx) => {
    const given = [w.equals, w.in, w.exists].filter((v) => v !== undefined).length;
    if (given !== 1) ctx.addIssue({ code: 'custom', message: WHEN_FIX });
  });
/** A step's condition (see {@link whenSchema}). */
export type StepCondition = z.output<typeof whenSchema>;

/** Fields every kind of step has. */
const commonStepShape = {
  id: stepIdSchema,
  description: z.string().optional(),
  /** Static input of the step. */
  input: jsonValueSchema.optional(),
  // Plain strings: an entry that names no step is reported as an unknown step.
  dependsOn: z.array(nonEmpty()).default(() => []),
  effects: z.array(effectClassSchema).default(() => []),
  policyTags: z.array(nonEmpty()).default(() => []),
  riskLevel: riskLevelSchema.default('low'),
  cachePolicy: cachePolicySchema.default(() => ({ class: 'none' as const })),
  /** Operator and agent steps only. */
  fallback: fallbackSchema.optional(),
  idempotency: idempotencySchema.default(() => ({ keyInputs: [] })),
  gate: gateSchema.optional(),
  retry: retryPolicyInputSchema.optional(),
  budgets: stepBudgetsSchema.optional(),
  timeoutMs: positiveInt().optional(),
  /** At most `limit` attempts of this step run at once across runs, per value of `key`. */
  concurrency: concurrencySchema.optional(),
  /** Run the step only when this condition on an ancestor's output holds; else it is skipped. */
  when: whenSchema.optional(),
};

/** A step that runs a registered operator. */
export const operatorStepSchema = z
  .object({ kind: z.literal('operator'), ...commonStepShape, operator: nonEmpty() })
  .strict();

/** A step that runs a registered agent. */
export const agentStepSchema = z
  .object({
    kind: z.literal('agent'),
    ...commonStepShape,
    agent: nonEmpty(),
    mode: z.enum(['atomic', 'granular']).default('atomic'),
    maxTurns: z.number().int().min(1).max(10_000).default(20),
    historyMaxTokens: z.number().int().min(1).default(128_000),
    blobThresholdBytes: z.number().int().min(1).default(20_000),
    enforceIdempotency: z.boolean().default(false),
    /**
     * When a blob of the history is gone (retention elapsed), replay with a marker in its place
     * instead of failing, for results of idempotent tools only.
     */
    degradedReplay: z.boolean().default(false),
    /**
     * Granular steps only: the signals of this name sent to the run are appended to the step's
     * history as user messages at the next turn boundary, each once, in send order.
     */
    inbox: z
      .string()
      .regex(STEP_ID_PATTERN, {
        error: (issue) =>
          `signal name ${JSON.stringify(issue.input)} is not allowed: use 1 to 128 letters, digits, "_", "." or "-", starting with a letter or digit`,
      })
      .optional(),
    /**
     * Granular steps with an `inbox` only: a reply without tool calls does not end the step, which
     * waits for its next message; it ends with the agent's `end` tool, an `end` signal, or at
     * `maxTurns`.
     */
    conversation: z.boolean().optional(),
    /**
     * Granular steps with an `inbox` only: what a message does while a model call is in flight:
     * wait for the turn boundary (`queue`, when absent), or abort the call and take the turn
     * again with it.
     */
    onBusy: z.enum(['queue', 'interrupt']).optional(),
  })
  .strict();

/** A step that evaluates a registered policy. */
export const policyCheckStepSchema = z
  .object({ kind: z.literal('policy_check'), ...commonStepShape, policy: nonEmpty() })
  .strict();

/** A step that only waits for a person's approval. */
export const humanGateStepSchema = z
  .object({ kind: z.literal('human_gate'), ...commonStepShape })
  .strict();

/** A signal's name: the same characters as a step id (it goes into Redis hash fields). */
export const signalNameSchema = z.string().regex(STEP_ID_PATTERN, {
  error: (issue) =>
    `signal name ${JSON.stringify(issue.input)} is not allowed: use 1 to 128 letters, digits, "_", "." or "-", starting with a letter or digit`,
});

const FOR_FIX =
  'give exactly one of { signal: "<name>" }, { durationMs: <ms> } or { until: "<ISO time, e.g. 2026-12-01T09:00:00Z>" }';

/**
 * What a wait step waits for: the next signal of a name, a duration from when the step starts
 * waiting, or a point in time (ISO 8601 with a zone, e.g. `2026-12-01T09:00:00Z`).
 */
export const waitForSchema = z
  .object(
    {
      signal: signalNameSchema.optional(),
      durationMs: positiveInt().optional(),
      until: z
        .string()
        .refine(
          (t) =>
            /^\d{4}-\d{2}-\d{2}T.*(Z|[+-]\d{2}:\d{2})$/.test(t) && !Number.isNaN(Date.parse(t)),
          {
            error: (issue) =>
              `until ${JSON.stringify(issue.input)} is not a time: write an ISO 8601 time with its zone, e.g. "2026-12-01T09:00:00Z"`,
          },
        )
        .optional(),
    },
    { error: () => `must be an object: ${FOR_FIX}` },
  )
  .strict()
  .superRefine((f, ctx) => {
    const given = [f.signal, f.durationMs, f.until].filter((v) => v !== undefined).length;
    if (given !== 1) ctx.addIssue({ code: 'custom', message: FOR_FIX });
  });
/** What a wait step waits for (see {@link waitForSchema}). */
export type WaitFor = z.output<typeof waitForSchema>;

/**
 * A step that waits: for a signal sent to the run (its output is the signal's payload), or for a
 * time (its output is `{ firedAt }`). `timeoutMs` bounds a signal wait (`wait_timeout`, final).
 */
export const waitStepSchema = z
  .object({
    kind: z.literal('wait'),
    ...commonStepShape,
    for: waitForSchema,
  })
  .strict();

/** Most items a map step runs over. */
export const MAX_MAP_ITEMS = 10_000;

/** A plan name as a `run` step (or a map's `run` item) names it: a plan registered by that name. */
const planNameSchema = z.string().min(1).max(200);

/**
 * What a map step runs for each element of its list: a registered operator, a registered agent
 * (atomic), or a child run of a registered plan, given the element as its input.
 */
export const mapItemSchema = z.discriminatedUnion('kind', [
  z.object({ kind: z.literal('operator'), operator: nonEmpty() }).strict(),
  z.object({ kind: z.literal('agent'), agent: nonEmpty() }).strict(),
  z.object({ kind: z.literal('run'), plan: planNameSchema }).strict(),
]);
/** What a map step runs per element (see {@link mapItemSchema}). */
export type MapItem = z.output<typeof mapItemSchema>;

/**
 * A step that runs one unit per element of a list: the array at `over` (`<stepId>` or
 * `<stepId>.<path>`, the step a dependency of this one or an ancestor of one), each element the
 * input of an `item` (an operator, an agent, or a child run of a registered plan), each with its own retries (the step's `retry`),
 * at most `maxConcurrency` at a time. Its output is the array of the items' outputs in element
 * order. An item that fails finally fails the step (`item_failed`), unless `itemFailures` is
 * `collect`: then its place in the output holds an error record.
 */
export const mapStepSchema = z
  .object({
    kind: z.literal('map'),
    ...commonStepShape,
    over: nonEmpty(),
    item: mapItemSchema,
    maxConcurrency: z.number().int().min(1).max(1000).default(10),
    itemFailures: z.enum(['fail', 'collect']).default('fail'),
  })
  .strict();

/**
 * A step that starts a child run of the plan registered as `plan` (`runtime.plan(name, plan)`, or
 * `plans` in a job module), with the step's `input` or else its dependencies' outputs as the
 * child's input, and waits for it without holding a worker: the child's result is the step's
 * output; a child that fails or is cancelled fails the step (`child_failed`), and each retry
 * starts a new child. `onParentCancel` says what a cancel (or budget stop) of this run does to a
 * child still going: `cancel` it (the default) or `abandon` it (it goes on alone).
 */
export const runStepSchema = z
  .object({
    kind: z.literal('run'),
    ...commonStepShape,
    plan: planNameSchema,
    onParentCancel: z.enum(['cancel', 'abandon']).default('cancel'),
  })
  .strict();

/** One step as written (its `retry` not yet resolved; {@link planSchema} resolves it). */
export const stepSchema = z.discriminatedUnion('kind', [
  operatorStepSchema,
  agentStepSchema,
  policyCheckStepSchema,
  humanGateStepSchema,
  waitStepSchema,
  mapStepSchema,
  runStepSchema,
]);

/** The step schema of each kind. */
export const stepSchemasByKind = {
  operator: operatorStepSchema,
  agent: agentStepSchema,
  policy_check: policyCheckStepSchema,
  human_gate: humanGateStepSchema,
  wait: waitStepSchema,
  map: mapStepSchema,
  run: runStepSchema,
} as const;

/** Plan-wide defaults. */
export const planDefaultsSchema = z.object({ retry: retryPolicyInputSchema.optional() }).strict();

/** The plan object as written, before the semantic checks and retry resolution. */
export const planObjectSchema = z
  .object({
    schemaVersion: z
      .literal(PLAN_SCHEMA_VERSION, {
        error: (issue) =>
          `unsupported schemaVersion ${JSON.stringify(issue.input)}: this release reads schemaVersion ${PLAN_SCHEMA_VERSION}`,
      })
      .default(PLAN_SCHEMA_VERSION),
    name: z.string().min(1).max(200),
    description: z.string().optional(),
    budgets: runBudgetsSchema.optional(),
    /** At most `limit` live runs of this plan per value of `key`. */
    concurrency: concurrencySchema.optional(),
    defaults: planDefaultsSchema.optional(),
    steps: z.array(stepSchema).min(1).max(MAX_PLAN_STEPS),
  })
  .strict();

type WrittenPlan = z.output<typeof planObjectSchema>;

/** A parsed operator step. */
export interface OperatorStep extends Omit<z.output<typeof operatorStepSchema>, 'retry'> {
  /** Resolved: step over plan defaults over built-ins. */
  retry: RetryPolicy;
}
/** A parsed agent step. */
export interface AgentStep extends Omit<z.output<typeof agentStepSchema>, 'retry'> {
  /** Resolved: step over plan defaults over built-ins. */
  retry: RetryPolicy;
}
/** A parsed policy check step. */
export interface PolicyCheckStep extends Omit<z.output<typeof policyCheckStepSchema>, 'retry'> {
  /** Resolved: step over plan defaults over built-ins. */
  retry: RetryPolicy;
}
/** A parsed human gate step. */
export interface HumanGateStep extends Omit<z.output<typeof humanGateStepSchema>, 'retry'> {
  /** Resolved: step over plan defaults over built-ins. */
  retry: RetryPolicy;
}
/** A parsed wait step. */
export interface WaitStep extends Omit<z.output<typeof waitStepSchema>, 'retry'> {
  /** Resolved: step over plan defaults over built-ins. */
  retry: RetryPolicy;
}
/** A parsed map step. */
export interface MapStep extends Omit<z.output<typeof mapStepSchema>, 'retry'> {
  /** Resolved: step over plan defaults over built-ins; the policy of each item. */
  retry: RetryPolicy;
}
/** A parsed run step (a child run). */
export interface RunStep extends Omit<z.output<typeof runStepSchema>, 'retry'> {
  /** Resolved: step over plan defaults over built-ins. */
  retry: RetryPolicy;
}
/** A parsed step of any kind. */
export type PlanStep =
  OperatorStep | AgentStep | PolicyCheckStep | HumanGateStep | WaitStep | MapStep | RunStep;
/** The kind of a step. */
export type StepKind = z.output<typeof stepKindSchema>;
/** A parsed, validated plan. Each step's `retry` is resolved, so consumers never merge again. */
export interface Plan extends Omit<WrittenPlan, 'steps'> {
  steps: PlanStep[];
}
/** Limits of a whole run. */
export type RunBudgets = z.output<typeof runBudgetsSchema>;
/** Limits of one step. */
export type StepBudgets = z.output<typeof stepBudgetsSchema>;
/** How a step's result may be cached. */
export type CachePolicy = z.output<typeof cachePolicySchema>;
/** What runs when a step's primary failed finally. */
export type StepFallback = z.output<typeof fallbackSchema>;
/** A class of side effect. */
export type EffectClass = z.output<typeof effectClassSchema>;
/** A step's risk level. */
export type RiskLevel = z.output<typeof riskLevelSchema>;

/**
 * Whether a step waits for approval before it runs: a `human_gate`, a step with a `gate`, and a
 * step whose `riskLevel` is `high` or `critical` (as if it had a gate).
 */
export function stepNeedsApproval(step: PlanStep): boolean {
  return (
    step.kind === 'human_gate' ||
    step.gate !== undefined ||
    step.riskLevel === 'high' ||
    step.riskLevel === 'critical'
  );
}

/** A problem found by {@link checkPlanSemantics}, with its path as segments. */
export interface PlanSemanticIssue {
  path: (string | number)[];
  message: string;
}
type Issue = PlanSemanticIssue;

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/** Edit distance, for "did you mean" hints. */
function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      current[j] = Math.min(previous[j]! + 1, current[j - 1]! + 1, previous[j - 1]! + cost);
    }
    previous = current;
  }
  return previous[b.length]!;
}

/** @internal The candidate closest to `word` when it looks like a typo of it. */
export function closestMatch(word: string, candidates: Iterable<string>): string | undefined {
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const candidate of candidates) {
    if (candidate === word) continue;
    const distance =
      candidate.toLowerCase() === word.toLowerCase() ? 0.5 : editDistance(word, candidate);
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  // Short words are too close to everything: only a case-only difference counts for them.
  const limit = Math.min(2, Math.floor(word.length / 3));
  return bestDistance <= Math.max(limit, 0.5) ? best : undefined;
}

/** Reads `initialDelayMs` / `maxDelayMs` of a retry object as written; `ok` is false if either is malformed. */
function readDelays(retry: unknown): { ok: boolean; initial?: number; max?: number } {
  if (retry === undefined) return { ok: true };
  if (!isRecord(retry)) return { ok: false };
  const valid = (v: unknown): v is number | undefined =>
    v === undefined || (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0);
  const { initialDelayMs: initial, maxDelayMs: max } = retry;
  if (!valid(initial) || !valid(max)) return { ok: false };
  return {
    ok: true,
    ...(initial === undefined ? {} : { initial }),
    ...(max === undefined ? {} : { max }),
  };
}

/**
 * Semantic checks of a plan: duplicate ids, unknown, self and duplicate dependencies, dependency
 * cycles, retry delays out of order. They read the plan as written, tolerating malformed parts (zod
 * reports those), so one error lists every problem.
 */
export function checkPlanSemantics(plan: unknown): PlanSemanticIssue[] {
  const issues: Issue[] = [];
  if (!isRecord(plan)) return issues;
  const defaults = isRecord(plan.defaults) ? readDelays(plan.defaults.retry) : { ok: true };
  const defaultsFrom = (field: 'initial' | 'max'): string =>
    defaults[field] === undefined ? 'the default' : 'from defaults.retry';
  if (defaults.ok) {
    const initial = defaults.initial ?? DEFAULT_RETRY_POLICY.initialDelayMs;
    const max = defaults.max ?? DEFAULT_RETRY_POLICY.maxDelayMs;
    if (max < initial && (defaults.initial !== undefined || defaults.max !== undefined)) {
      const from = (field: 'initial' | 'max'): string =>
        defaults[field] === undefined ? 'the default' : '';
      issues.push({
        path: ['defaults', 'retry'],
        message: retryOrderMessage(max, from('max'), initial, from('initial')),
      });
    }
  }

  const steps = plan.steps;
  // Past the limit zod already refuses the plan; skip the graph work.
  if (!Array.isArray(steps) || steps.length > MAX_PLAN_STEPS) return issues;

  const firstIndex = new Map<string, number>();
  let allIdsReadable = true;
  steps.forEach((step: unknown, i) => {
    const id = isRecord(step) ? step.id : undefined;
    if (typeof id !== 'string') {
      allIdsReadable = false;
      return;
    }
    const first = firstIndex.get(id);
    if (first === undefined) firstIndex.set(id, i);
    else {
      issues.push({
        path: ['steps', i, 'id'],
        message: `duplicate step id ${JSON.stringify(id)} (first used by steps[${first}])`,
      });
    }
  });

  // The turn's idempotency key is handed to tools per turn, which only granular steps have.
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step) || step.kind !== 'agent' || step.enforceIdempotency !== true) return;
    if (step.mode === 'granular') return;
    issues.push({
      path: ['steps', i, 'enforceIdempotency'],
      message:
        'only granular agent steps take the turn\'s idempotency key: set mode: "granular", or leave enforceIdempotency out (atomic steps pass ctx.idempotencyKey, the call\'s own key)',
    });
  });

  // An inbox is read at turn boundaries, which only granular steps have; a conversation waits on
  // its inbox.
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step) || step.kind !== 'agent') return;
    const granular = step.mode === 'granular';
    for (const field of ['inbox', 'conversation', 'onBusy'] as const) {
      const set = field === 'conversation' ? step.conversation === true : step[field] !== undefined;
      if (!set || granular) continue;
      issues.push({
        path: ['steps', i, field],
        message: `only granular agent steps take ${field} (it is read at turn boundaries): set mode: "granular", or remove ${field}`,
      });
    }
    if (granular && step.onBusy !== undefined && step.inbox === undefined) {
      issues.push({
        path: ['steps', i, 'onBusy'],
        message:
          'onBusy says what a message of the inbox does while a model call is in flight: name its signal with inbox, or remove onBusy',
      });
    }
    if (granular && step.conversation === true && step.inbox === undefined) {
      issues.push({
        path: ['steps', i, 'inbox'],
        message:
          'a conversation waits for the messages of its inbox: name its signal with inbox, or remove conversation',
      });
    }
    if (step.inbox === 'end' && step.conversation === true) {
      issues.push({
        path: ['steps', i, 'inbox'],
        message:
          'the signal "end" ends a conversation and cannot be its inbox: name the messages\' signal otherwise',
      });
    }
  });

  // A signal name read by an inbox is read by that step alone (a wait step or another inbox would
  // take its messages), and one conversation at most listens for `end`.
  const readers = new Map<string, number>();
  let talking: number | undefined;
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step)) return;
    const name =
      step.kind === 'agent' ? step.inbox : isRecord(step.for) ? step.for.signal : undefined;
    if (typeof name !== 'string') return;
    const first = readers.get(name);
    if (first === undefined) readers.set(name, i);
    else if (step.kind === 'agent' || (steps[first] as Record<string, unknown>).kind === 'agent') {
      issues.push({
        path: step.kind === 'agent' ? ['steps', i, 'inbox'] : ['steps', i, 'for', 'signal'],
        message: `signal "${name}" is already read by steps[${first}]; an agent step's inbox is read by that step alone: give each its own signal name`,
      });
    }
    if (step.kind !== 'agent' || step.conversation !== true) return;
    if (talking !== undefined) {
      issues.push({
        path: ['steps', i, 'conversation'],
        message: `a plan has one conversation step at most (steps[${talking}] is one; the signal "end" ends it): make this step a granular step with an inbox, without conversation`,
      });
    } else talking = i;
  });

  // Key inputs key the tool calls an operator makes through ctx.tools; no other kind makes them.
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step) || step.kind === 'operator' || !isRecord(step.idempotency)) return;
    const keyInputs = step.idempotency.keyInputs;
    if (!Array.isArray(keyInputs) || keyInputs.length === 0) return;
    issues.push({
      path: ['steps', i, 'idempotency', 'keyInputs'],
      message: `only operator steps take key inputs (they key the tool calls of ctx.tools across runs); remove idempotency.keyInputs from this ${String(step.kind)} step`,
    });
  });

  // A concurrency limit counts running attempts: a wait or a person's gate runs none.
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step) || step.concurrency === undefined) return;
    if (step.kind !== 'wait' && step.kind !== 'human_gate') return;
    issues.push({
      path: ['steps', i, 'concurrency'],
      message: `a ${String(step.kind)} step runs no code, so it has no attempts to limit: remove concurrency (a plan's concurrency limits whole runs)`,
    });
  });

  // A wait's time is its own: timeoutMs bounds a signal wait only.
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step) || step.kind !== 'wait' || step.timeoutMs === undefined) return;
    if (isRecord(step.for) && step.for.signal !== undefined) return;
    issues.push({
      path: ['steps', i, 'timeoutMs'],
      message:
        'timeoutMs bounds a wait for a signal only; a timer waits exactly its for.durationMs or for.until: remove timeoutMs',
    });
  });

  // Only what an operator or an atomic agent computes is cached, or replaced by a fallback.
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step)) return;
    const kind = String(step.kind);
    const computes = kind === 'operator' || kind === 'agent';
    if (step.fallback !== undefined && !computes) {
      issues.push({
        path: ['steps', i, 'fallback'],
        message: `only operator and agent steps take a fallback; remove fallback from this ${kind} step`,
      });
    }
    const cacheClass = isRecord(step.cachePolicy) ? step.cachePolicy.class : undefined;
    if (cacheClass === undefined || cacheClass === 'none') return;
    if (!computes) {
      issues.push({
        path: ['steps', i, 'cachePolicy'],
        message: `only operator and agent steps are cached; remove cachePolicy from this ${kind} step`,
      });
    } else if (kind === 'agent' && step.mode === 'granular') {
      issues.push({
        path: ['steps', i, 'cachePolicy'],
        message:
          'granular agent steps are not cached (their turns are committed one by one): set mode: "atomic", or remove cachePolicy',
      });
    }
  });

  const edges = new Map<string, string[]>();
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step)) return;
    const id = typeof step.id === 'string' ? step.id : undefined;
    const own: string[] | undefined = id !== undefined && firstIndex.get(id) === i ? [] : undefined;
    if (own !== undefined) edges.set(id!, own);

    if (Array.isArray(step.dependsOn)) {
      const seen = new Map<string, number>();
      step.dependsOn.forEach((dep: unknown, j) => {
        if (typeof dep !== 'string') return;
        const path = ['steps', i, 'dependsOn', j];
        const earlier = seen.get(dep);
        if (earlier !== undefined) {
          issues.push({
            path,
            message: `duplicate dependency ${JSON.stringify(dep)} (already listed at dependsOn[${earlier}])`,
          });
          return;
        }
        seen.set(dep, j);
        if (dep === id) {
          issues.push({ path, message: `step ${JSON.stringify(dep)} depends on itself` });
          return;
        }
        if (!firstIndex.has(dep)) {
          // With an unreadable id somewhere, "unknown" might be wrong: zod reports the id instead.
          if (!allIdsReadable) return;
          const guess = closestMatch(dep, firstIndex.keys());
          issues.push({
            path,
            message: `unknown step ${JSON.stringify(dep)}${guess === undefined ? '' : ` (did you mean ${JSON.stringify(guess)}?)`}`,
          });
          return;
        }
        own?.push(dep);
      });
    }

    if (isRecord(step.retry) && defaults.ok) {
      const mine = readDelays(step.retry);
      if (mine.ok && (mine.initial !== undefined || mine.max !== undefined)) {
        const initial = mine.initial ?? defaults.initial ?? DEFAULT_RETRY_POLICY.initialDelayMs;
        const max = mine.max ?? defaults.max ?? DEFAULT_RETRY_POLICY.maxDelayMs;
        if (max < initial) {
          issues.push({
            path: ['steps', i, 'retry'],
            message: retryOrderMessage(
              max,
              mine.max === undefined ? defaultsFrom('max') : '',
              initial,
              mine.initial === undefined ? defaultsFrom('initial') : '',
            ),
          });
        }
      }
    }
  });

  issues.push(...checkConditions(steps, edges, firstIndex, allIdsReadable));
  issues.push(...checkMapSources(steps, edges, firstIndex, allIdsReadable));
  issues.push(...checkRunSteps(steps));

  const ids = [...edges.keys()];
  for (const { cycle, component } of findDependencyCycles(ids, (id) => edges.get(id) ?? [])) {
    const start = cycle[0]!;
    const others = component.filter((id) => !cycle.includes(id));
    issues.push({
      path: ['steps', firstIndex.get(start)!, 'dependsOn'],
      message:
        `dependency cycle ${[...cycle, start].join(' → ')} (each step depends on the next; remove one of these dependencies)` +
        (others.length === 0 ? '' : `; also caught in cycles with them: ${others.join(', ')}`),
    });
  }
  return issues;
}

/**
 * A run step's child is bounded by its own plan's budgets: the step takes no time limit or budget
 * of its own (its attempts are children, which its retry policy numbers).
 */
function checkRunSteps(steps: unknown[]): Issue[] {
  const issues: Issue[] = [];
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step) || step.kind !== 'run') return;
    for (const field of ['timeoutMs', 'budgets'] as const) {
      if (step[field] === undefined) continue;
      issues.push({
        path: ['steps', i, field],
        message: `a run step is bounded by its child plan's own budgets (budgets.maxWallClockMs, maxTokens, …): remove ${field} and set the child plan's budgets instead`,
      });
    }
  });
  return issues;
}

/** The steps `id` depends on, directly or through others (cycles tolerated). */
function ancestorsOf(id: string, edges: ReadonlyMap<string, string[]>): Set<string> {
  const seen = new Set<string>();
  const todo = [...(edges.get(id) ?? [])];
  while (todo.length > 0) {
    const next = todo.pop()!;
    if (seen.has(next)) continue;
    seen.add(next);
    todo.push(...(edges.get(next) ?? []));
  }
  return seen;
}

/**
 * A condition names a step whose output is known when the step is about to run: one of its
 * dependencies, or an ancestor of one.
 */
function checkConditions(
  steps: unknown[],
  edges: ReadonlyMap<string, string[]>,
  firstIndex: ReadonlyMap<string, number>,
  allIdsReadable: boolean,
): Issue[] {
  const issues: Issue[] = [];
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step) || !isRecord(step.when) || typeof step.when.step !== 'string') return;
    const named = step.when.step;
    const id = typeof step.id === 'string' ? step.id : undefined;
    const path = ['steps', i, 'when', 'step'];
    if (!firstIndex.has(named)) {
      if (!allIdsReadable) return;
      const guess = closestMatch(named, firstIndex.keys());
      issues.push({
        path,
        message: `unknown step ${JSON.stringify(named)}${guess === undefined ? '' : ` (did you mean ${JSON.stringify(guess)}?)`}`,
      });
      return;
    }
    if (id === undefined || firstIndex.get(id) !== i) return;
    if (ancestorsOf(id, edges).has(named)) return;
    issues.push({
      path,
      message:
        named === id
          ? `step ${JSON.stringify(id)} has a condition on its own output: name a step it depends on`
          : `the condition names step ${JSON.stringify(named)}, which is neither a dependency of step ${JSON.stringify(id)} nor an ancestor of one, so its output may not be there when the condition is tested: add ${JSON.stringify(named)} to dependsOn`,
    });
  });
  return issues;
}

/**
 * The step a map's `over` names and the path inside its output: the longest step id among `ids`
 * that `over` is, or starts with followed by a dot (step ids may hold dots themselves). Null when
 * `over` names no step.
 */
export function splitOver(
  over: string,
  ids: Iterable<string>,
): { step: string; path: string | undefined } | null {
  let best: string | undefined;
  for (const id of ids) {
    if (over !== id && !over.startsWith(`${id}.`)) continue;
    if (best === undefined || id.length > best.length) best = id;
  }
  if (best === undefined) return null;
  return { step: best, path: over === best ? undefined : over.slice(best.length + 1) };
}

/**
 * A map's list is known when it starts: `over` names one of its dependencies, or an ancestor of
 * one.
 */
function checkMapSources(
  steps: unknown[],
  edges: ReadonlyMap<string, string[]>,
  firstIndex: ReadonlyMap<string, number>,
  allIdsReadable: boolean,
): Issue[] {
  const issues: Issue[] = [];
  steps.forEach((step: unknown, i) => {
    if (!isRecord(step) || step.kind !== 'map' || typeof step.over !== 'string') return;
    const id = typeof step.id === 'string' ? step.id : undefined;
    const path = ['steps', i, 'over'];
    const named = splitOver(step.over, firstIndex.keys());
    if (named === null) {
      if (!allIdsReadable) return;
      const head = step.over.split('.')[0]!;
      const guess = closestMatch(head, firstIndex.keys());
      issues.push({
        path,
        message: `over ${JSON.stringify(step.over)} names no step${guess === undefined ? '' : ` (did you mean ${JSON.stringify(guess)}?)`}: write "<stepId>" or "<stepId>.<path>", naming a step this one depends on`,
      });
      return;
    }
    if (id === undefined || firstIndex.get(id) !== i) return;
    // `<map>.<index>` names the map's items (their ledger scope and idempotency key).
    for (const [other, j] of firstIndex) {
      if (!other.startsWith(`${id}.`) || !/^\d+$/.test(other.slice(id.length + 1))) continue;
      issues.push({
        path: ['steps', j, 'id'],
        message: `step id ${JSON.stringify(other)} is the id of an item of map step ${JSON.stringify(id)} (its items run as "${id}.<index>"): rename the step`,
      });
    }
    if (ancestorsOf(id, edges).has(named.step)) return;
    issues.push({
      path,
      message:
        named.step === id
          ? `map step ${JSON.stringify(id)} runs over its own output: name a step it depends on`
          : `over names step ${JSON.stringify(named.step)}, which is neither a dependency of map step ${JSON.stringify(id)} nor an ancestor of one, so its output may not be there when the map starts: add ${JSON.stringify(named.step)} to dependsOn`,
    });
  });
  return issues;
}

function resolvePlan(plan: WrittenPlan): Plan {
  const defaults = plan.defaults?.retry;
  return {
    ...plan,
    steps: plan.steps.map((step) => ({ ...step, retry: resolveRetryPolicy(step.retry, defaults) })),
  };
}

/**
 * A plan: structure, then semantic checks, then each step's retry policy resolved. Zod skips the
 * semantic checks after some structural problems; `parsePlan` always runs them, and reports with
 * paths like `steps[2].dependsOn[0]`.
 */
export const planSchema = planObjectSchema
  .superRefine(
    (plan, ctx) => {
      for (const issue of checkPlanSemantics(plan)) ctx.addIssue({ code: 'custom', ...issue });
    },
    // Also after most structural problems (zod still skips it after an aborting one).
    { when: () => true },
  )
  .transform(resolvePlan);

/** A plan as an author writes it (defaults may be left out). */
export type PlanInput = z.input<typeof planSchema>;
