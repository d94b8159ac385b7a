import { describe, expect, it } from 'vitest';
import { runSteps } from '../../src/machines/kernel.js';
import { conditionHolds } from '../../src/plan/condition.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import { PlanValidationError } from '../../src/errors.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { e, planOf, T0, trace } from '../helpers/run-trace.js';

const untaken = (stepId: string, attempt = 1): RunEvent => ({
  type: 'step.skipped',
  stepId,
  attempt,
  reason: 'condition_false',
  at: T0 + 1500,
});

const triage = planOf([
  { id: 'triage', kind: 'operator', operator: 'triage' },
  {
    id: 'a1',
    kind: 'operator',
    operator: 'a',
    dependsOn: ['triage'],
    when: { step: 'triage', path: 'branch', equals: 'a' },
  },
  { id: 'a2', kind: 'operator', operator: 'a', dependsOn: ['a1'] },
  {
    id: 'b1',
    kind: 'operator',
    operator: 'b',
    dependsOn: ['triage'],
    when: { step: 'triage', path: 'branch', equals: 'b' },
  },
  { id: 'join', kind: 'operator', operator: 'join', dependsOn: ['a2', 'b1'] },
]);

describe('conditional steps in the run machine', () => {
  it('a step whose only dependency was skipped by its condition is skipped too; the join runs', () => {
    const t = trace(triage, [e.ok('triage'), untaken('a1'), e.ok('b1'), e.ok('join')]);
    const end = Object.fromEntries(
      runSteps(t.snapshot).map((s) => [s.stepId, [s.status, s.reason]]),
    );
    expect(end).toEqual({
      triage: ['SUCCEEDED', null],
      a1: ['SKIPPED', 'condition_false'],
      a2: ['SKIPPED', 'condition_false'],
      b1: ['SUCCEEDED', null],
      join: ['SUCCEEDED', null],
    });
    expect(t.text).toContain('a1:READY→SKIPPED a2:PENDING→SKIPPED');
    expect(t.text).not.toContain('execute a2');
    expect(t.last.status).toBe('succeeded');
  });

  it('a join all of whose dependencies were skipped by conditions is skipped, and the run succeeds', () => {
    const t = trace(triage, [e.ok('triage'), untaken('a1'), untaken('b1')]);
    const last = t.last;
    expect(last.status).toBe('succeeded');
    const join = runSteps(last.snapshot).find((s) => s.stepId === 'join')!;
    expect([join.status, join.reason, join.attempt]).toEqual(['SKIPPED', 'condition_false', 0]);
  });

  it("a person's skip does not cascade: the dependent runs with null", () => {
    const t = trace(
      planOf([
        { id: 'a', kind: 'operator', operator: 'a' },
        { id: 'b', kind: 'operator', operator: 'b', dependsOn: ['a'] },
      ]),
      [e.skip('a')],
    );
    expect(t.text).toContain('execute b#1');
  });
});

describe('conditions', () => {
  it('equals, in and exists, at a path', () => {
    const out = { branch: 'a', score: 3, tags: ['x'], none: null };
    expect(conditionHolds({ step: 's', path: 'branch', equals: 'a' }, out)).toBe(true);
    expect(conditionHolds({ step: 's', path: 'branch', equals: 'b' }, out)).toBe(false);
    expect(conditionHolds({ step: 's', equals: { ...out } }, out)).toBe(true);
    expect(conditionHolds({ step: 's', path: 'score', in: [1, 3] }, out)).toBe(true);
    expect(conditionHolds({ step: 's', path: 'score', in: [1, 2] }, out)).toBe(false);
    expect(conditionHolds({ step: 's', path: 'tags.0', equals: 'x' }, out)).toBe(true);
    expect(conditionHolds({ step: 's', path: 'tags', exists: true }, out)).toBe(true);
    expect(conditionHolds({ step: 's', path: 'none', exists: true }, out)).toBe(false);
    expect(conditionHolds({ step: 's', path: 'gone.deeper', exists: false }, out)).toBe(true);
    expect(conditionHolds({ step: 's', path: 'branch', exists: true }, null)).toBe(false);
  });
});

describe('plan validation of conditions', () => {
  const refused = (steps: unknown[]) => {
    try {
      parsePlan({ name: 'p', steps });
    } catch (error) {
      expect(error).toBeInstanceOf(PlanValidationError);
      return (error as PlanValidationError).issues;
    }
    throw new Error('plan accepted');
  };

  it('accepts a condition on a dependency or an ancestor of one', () => {
    const plan = parsePlan({
      name: 'p',
      steps: [
        { id: 't', kind: 'operator', operator: 'o' },
        { id: 'm', kind: 'operator', operator: 'o', dependsOn: ['t'] },
        {
          id: 'x',
          kind: 'operator',
          operator: 'o',
          dependsOn: ['m'],
          when: { step: 't', exists: true },
        },
      ],
    });
    expect(plan.steps[2]!.when).toEqual({ step: 't', exists: true });
  });

  it('refuses a condition naming a step that is not an ancestor, naming the path', () => {
    const issues = refused([
      { id: 't', kind: 'operator', operator: 'o' },
      { id: 'u', kind: 'operator', operator: 'o' },
      {
        id: 'x',
        kind: 'operator',
        operator: 'o',
        dependsOn: ['t'],
        when: { step: 'u', equals: 1 },
      },
    ]);
    expect(issues).toHaveLength(1);
    expect(issues[0]!.path).toBe('steps[2].when.step');
    expect(issues[0]!.message).toContain('"u"');
    expect(issues[0]!.message).toContain('neither a dependency');
  });

  it('refuses an unknown step, its own output, and other than exactly one test', () => {
    const issues = refused([
      { id: 'tri', kind: 'operator', operator: 'o' },
      {
        id: 'x',
        kind: 'operator',
        operator: 'o',
        dependsOn: ['tri'],
        when: { step: 'trix', equals: 1 },
      },
      {
        id: 'y',
        kind: 'operator',
        operator: 'o',
        dependsOn: ['tri'],
        when: { step: 'y', equals: 1 },
      },
      {
        id: 'z',
        kind: 'operator',
        operator: 'o',
        dependsOn: ['tri'],
        when: { step: 'tri', equals: 1, exists: true },
      },
      { id: 'w', kind: 'operator', operator: 'o', dependsOn: ['tri'], when: { step: 'tri' } },
      {
        id: 'v',
        kind: 'operator',
        operator: 'o',
        dependsOn: ['tri'],
        when: { step: 'tri', equal: 1 },
      },
    ]);
    const byPath = Object.fromEntries(issues.map((i) => [i.path, i.message]));
    expect(byPath['steps[1].when.step']).toMatch(/unknown step "trix" \(did you mean "tri"\?\)/);
    expect(byPath['steps[2].when.step']).toMatch(/its own output/);
    expect(byPath['steps[3].when']).toMatch(/exactly one of equals/);
    expect(byPath['steps[4].when']).toMatch(/exactly one of equals/);
    const typo = issues.filter((i) => i.path === 'steps[5].when').map((i) => i.message);
    expect(typo).toContainEqual(
      expect.stringMatching(/unrecognized key "equal" \(did you mean "equals"\?\)/),
    );
  });
});
