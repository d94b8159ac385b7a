import { describe, expect, it } from 'vitest';
import { describePlanDifferences, diffPlans } from '../../src/plan/diff.js';
import { parsePlan } from '../../src/plan/parse-plan.js';

const base = {
  name: 'p',
  steps: [
    { id: 'a', kind: 'operator', operator: 'a', input: { url: 'x', n: 1 } },
    { id: 'b', kind: 'operator', operator: 'b', dependsOn: ['a'] },
    { id: 'c', kind: 'human_gate', dependsOn: ['b'] },
  ],
};

describe('diffPlans', () => {
  it('finds nothing between equal plans, whatever the key order', () => {
    const reordered = {
      steps: base.steps
        .map((s) => ({ ...s }))
        .reverse()
        .reverse(),
      name: 'p',
    };
    expect(diffPlans(parsePlan(base), parsePlan(reordered))).toEqual([]);
  });

  it('names the plan fields, the steps and their fields that differ, added and removed steps', () => {
    const changed = {
      name: 'p',
      budgets: { maxSteps: 10 },
      steps: [
        { id: 'a', kind: 'operator', operator: 'a', input: { url: 'y', n: 1 } },
        { id: 'b', kind: 'operator', operator: 'b2', dependsOn: ['a'], retry: { maxAttempts: 9 } },
        { id: 'd', kind: 'operator', operator: 'd' },
      ],
    };
    const differences = diffPlans(parsePlan(base), parsePlan(changed));
    expect(differences).toEqual([
      { stepId: null, what: 'budgets' },
      { stepId: 'a', what: 'input.url' },
      { stepId: 'b', what: 'operator' },
      { stepId: 'b', what: 'retry.maxAttempts' },
      { stepId: 'c', what: 'removed' },
      { stepId: 'd', what: 'added' },
    ]);
    expect(describePlanDifferences(differences)).toBe(
      'plan: budgets; step "a": input.url; step "b": operator, retry.maxAttempts; step "c": removed; step "d": added',
    );
  });
});
