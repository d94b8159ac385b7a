/**
 * A run's budgets over its children: the tokens, cost and tool calls of every run its `run` steps
 * started (and theirs, down the tree) count against the run's `maxTokens`, `maxCostUsd` and
 * `maxToolCalls` as well as its own. A run's own model calls and tool calls are refused ahead by its
 * own budgets (the reservation, the tool-call count); the sum over its tree is checked:
 *
 * - when any unit of the run or of one of its descendants is admitted (`admitLoaded`), for the run
 *   itself when it has children, and for each ancestor still going;
 * - when a child's end is about to be committed on its parent's step (`child.ts`).
 *
 * A sum over the limit stops that run (`run.stopped`, `budget_exceeded`, its detail naming the
 * budget with `scope: 'tree'`), which cancels its children still going. A child's call is not
 * refused ahead by its parent's budget: the sum may pass the limit by what the units running at
 * that moment spend before the next check.
 *
 * Each run's figures are read from its own keys (its usage hash in the tenant's slot, its counters
 * in its own): a separate read per run, never one script over several runs.
 */
import type { JsonValue } from '../internal/json.js';
import { readRunStatus } from '../persistence/run-lookups.js';
import type { RunBudgets } from '../plan/schema.js';
import type { RuntimeCore } from './core.js';
import { childrenOf, type RunMeta } from './runtime-meta.js';

/** What a run and its descendants used. */
interface TreeUsage {
  tokens: number;
  microUsd: number;
  toolCalls: number;
}

/** How deep a tree of runs is walked (a plan cannot start itself without end, but be safe). */
const MAX_DEPTH = 32;

/** What run `runId` and its descendants used, read run by run. */
async function treeUsage(
  core: RuntimeCore,
  tenantId: string,
  runId: string,
  depth = 0,
): Promise<TreeUsage> {
  const { quota, keys, store } = core.stores;
  const [usage, toolCalls, raw] = await Promise.all([
    quota.usage(tenantId, runId),
    core.redis.hget(keys.counters(runId), 'toolCalls'),
    store.loadMeta(runId),
  ]);
  const sum: TreeUsage = {
    tokens: usage.spentTokens + usage.reservedTokens,
    microUsd: usage.spentMicroUsd + usage.reservedMicroUsd,
    toolCalls: Number(toolCalls ?? 0),
  };
  if (depth >= MAX_DEPTH) return sum;
  for (const child of childrenOf(raw)) {
    const below = await treeUsage(core, tenantId, child.runId, depth + 1);
    sum.tokens += below.tokens;
    sum.microUsd += below.microUsd;
    sum.toolCalls += below.toolCalls;
  }
  return sum;
}

/** The budgets of a plan that a tree's sum is checked against. */
function treeBudgets(budgets: RunBudgets | undefined): boolean {
  return (
    budgets?.maxTokens !== undefined ||
    budgets?.maxCostUsd !== undefined ||
    budgets?.maxToolCalls !== undefined
  );
}

/** The first of `budgets` that `used` passes, as a stop's detail; null when none. */
function overOf(budgets: RunBudgets, used: TreeUsage): JsonValue | null {
  const scope = 'tree';
  if (budgets.maxTokens !== undefined && used.tokens > budgets.maxTokens) {
    return { budget: 'maxTokens', limit: budgets.maxTokens, used: used.tokens, scope };
  }
  if (budgets.maxCostUsd !== undefined && used.microUsd > budgets.maxCostUsd * 1_000_000) {
    return {
      budget: 'maxCostUsd',
      limit: budgets.maxCostUsd,
      used: used.microUsd / 1_000_000,
      scope,
    };
  }
  if (budgets.maxToolCalls !== undefined && used.toolCalls > budgets.maxToolCalls) {
    return { budget: 'maxToolCalls', limit: budgets.maxToolCalls, used: used.toolCalls, scope };
  }
  return null;
}

/** Whether a run may have children: its plan has a run step, or a map step of `run` items. */
const hasRunSteps = (meta: RunMeta): boolean => {
  let has = plansWithRunSteps.get(meta.plan);
  if (has === undefined) {
    has = meta.plan.steps.some(
      (s) => s.kind === 'run' || (s.kind === 'map' && s.item.kind === 'run'),
    );
    plansWithRunSteps.set(meta.plan, has);
  }
  return has;
};

// Whether each plan has run steps, computed once per plan object (asked at each unit's admission).
const plansWithRunSteps = new WeakMap<RunMeta['plan'], boolean>();

/**
 * The first run, from `runId` (when it has run steps) up through its ancestors still going, whose
 * tree passes one of its budgets, with the stop's detail; null when none does (see the module).
 */
export async function treeBudgetOver(
  core: RuntimeCore,
  runId: string,
  meta: RunMeta,
): Promise<{ runId: string; detail: JsonValue } | null> {
  let current: { runId: string; meta: RunMeta } | null = { runId, meta };
  for (let depth = 0; current !== null && depth < MAX_DEPTH; depth++) {
    const id: string = current.runId;
    const m: RunMeta = current.meta;
    if (depth > 0) {
      // An ancestor that ended no longer spends: its budget binds nothing (an abandoned child).
      const status = await readRunStatus(core.redis, core.stores.keys, id);
      if (status !== 'running' && status !== 'waiting') return null;
    }
    const budgets = m.plan.budgets;
    if (hasRunSteps(m) && budgets !== undefined && treeBudgets(budgets)) {
      const detail = overOf(budgets, await treeUsage(core, m.tenantId, id));
      if (detail !== null) return { runId: id, detail };
    }
    const parent: RunMeta['parent'] = m.parent;
    current =
      parent === null ? null : { runId: parent.runId, meta: await core.meta.read(parent.runId) };
  }
  return null;
}

/** Whether admitting a unit of this run needs {@link treeBudgetOver}: it has a parent or children. */
export function inTree(meta: RunMeta): boolean {
  return meta.parent !== null || hasRunSteps(meta);
}
