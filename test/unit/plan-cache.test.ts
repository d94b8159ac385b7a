import { describe, expect, it } from 'vitest';
import { PlanValidationError } from '../../src/errors.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import { PlanCache } from '../../src/plan/plan-cache.js';
import type { PlanInput } from '../../src/plan/schema.js';

const line = (name: string): PlanInput => ({
  name,
  steps: [
    { id: 'a', kind: 'operator', operator: 'op' },
    { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'] },
  ],
});

describe('PlanCache', () => {
  it('parses a plan as parsePlan does, once per text, into one frozen object', () => {
    const cache = new PlanCache();
    const first = cache.parse(line('p'));
    expect(first).toEqual(parsePlan(line('p')));
    // The same text, as another object or as JSON text: the same plan object.
    expect(cache.parse(line('p'))).toBe(first);
    expect(cache.parse(JSON.stringify(line('p')))).toEqual(first);
    expect(Object.isFrozen(first)).toBe(true);
    expect(Object.isFrozen(first.steps[1]!.dependsOn)).toBe(true);
    expect(() => {
      (first.steps as unknown as unknown[]).push({});
    }).toThrow(TypeError);
    // Another text: another plan.
    expect(cache.parse(line('q'))).not.toBe(first);
  });

  it('shares nothing with the object it was given', () => {
    const cache = new PlanCache();
    const input = line('shared');
    const plan = cache.parse(input);
    (input.steps[0] as { id: string }).id = 'changed';
    expect(plan.steps[0]!.id).toBe('a');
    // The changed object is another text: parsed anew, and refused for its own reasons.
    expect(() => cache.parse(input)).toThrow(PlanValidationError);
  });

  it('refuses a bad plan every time, and never keeps it', () => {
    const cache = new PlanCache();
    const bad = { name: 'bad', steps: [{ id: 'a', kind: 'operator' }] };
    for (let i = 0; i < 2; i++) {
      expect(() => cache.parse(bad as unknown as PlanInput)).toThrow(PlanValidationError);
    }
  });

  it('parses a plan that is not plain JSON every time, so that its problem is reported', () => {
    const cache = new PlanCache();
    // JSON text drops an undefined field: this plan must not pass for the plan without it.
    const withUndefined = { ...line('u'), extra: undefined } as unknown as PlanInput;
    let thrown: unknown;
    try {
      cache.parse(withUndefined);
    } catch (error) {
      thrown = error;
    }
    let expected: unknown;
    try {
      parsePlan(withUndefined);
    } catch (error) {
      expected = error;
    }
    expect(String(thrown)).toBe(String(expected));
  });

  it('keeps at most the plans it was sized for, the least recently used leaving first', () => {
    const cache = new PlanCache(2);
    const a = cache.parse(line('a'));
    const b = cache.parse(line('b'));
    expect(cache.parse(line('a'))).toBe(a); // a is now the most recent
    cache.parse(line('c')); // b leaves
    expect(cache.parse(line('a'))).toBe(a);
    expect(cache.parse(line('b'))).not.toBe(b);
  });
});
