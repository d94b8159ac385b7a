/**
 * Which steps of a plan a replay runs again and which it reuses, and which steps produce drafts
 * (their output may differ from one run to the next). Pure.
 */
import { InputValidationError } from '../errors.js';
import { dependentsOf } from './graph.js';
import type { OperatorStep, Plan, PlanStep } from './schema.js';

/**
 * `fromStep` and every step that depends on it, directly or through other steps: what a fork from
 * `fromStep` runs again. Throws `InputValidationError` naming `fromStep` when the plan has no such
 * step.
 */
export function forkScope(plan: Plan, fromStep: string): Set<string> {
  if (!plan.steps.some((s) => s.id === fromStep)) {
    throw new InputValidationError('replay options', [
      {
        path: 'fromStep',
        message: `plan "${plan.name}" has no step "${fromStep}"; it has: ${plan.steps.map((s) => s.id).join(', ')}`,
      },
    ]);
  }
  const dependents = dependentsOf(plan);
  const scope = new Set([fromStep]);
  const todo = [fromStep];
  for (let id = todo.pop(); id !== undefined; id = todo.pop()) {
    for (const next of dependents[id] ?? []) {
      if (scope.has(next)) continue;
      scope.add(next);
      todo.push(next);
    }
  }
  return scope;
}

/**
 * Whether a step produces a draft: an agent step, or a step whose cache policy says its result is
 * stable but not deterministic. A regenerated run gives such steps new keys.
 */
export function isDraftProducing(step: PlanStep): boolean {
  return step.kind === 'agent' || step.cachePolicy.class === 'stable_nondeterministic';
}

/**
 * Whether a replay takes the original's recorded output of the step instead of running it: an
 * operator step that declares an effect other than read-only, which may act outside directly,
 * not only through tool calls (an agent step acts only through tool calls, which a replay matches
 * to the original's receipts call by call).
 */
export function isEffectfulOperator(step: PlanStep): step is OperatorStep {
  return step.kind === 'operator' && step.effects.some((effect) => effect !== 'read_only');
}
