import { describe, expect, it } from 'vitest';
import { PlanValidationError } from '../../src/errors.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import {
  concurrencyValue,
  runSlotOf,
  slotWaitText,
  stepSlotOf,
} from '../../src/plan/concurrency.js';

const op = { id: 'a', kind: 'operator', operator: 'o' } as const;

function issues(plan: object): string[] {
  try {
    parsePlan(plan);
  } catch (error) {
    if (error instanceof PlanValidationError) return error.issues.map((i) => i.path);
    throw error;
  }
  return [];
}

describe('concurrency in plans', () => {
  it('takes a limit on a plan or a step, keyed by tenant or an input path', () => {
    const plan = parsePlan({
      name: 'p',
      concurrency: { key: 'input.customer.id', limit: 2 },
      steps: [{ ...op, concurrency: { key: 'tenant', limit: 1 } }],
    });
    expect(runSlotOf(plan, { customer: { id: 'acme' } }, 't1')).toEqual({
      scope: 'run:p',
      value: 'acme',
      limit: 2,
      label: 'customer.id=acme',
    });
    expect(stepSlotOf(plan, plan.steps[0]!, null, 't1')).toEqual({
      scope: 'step:p:a',
      value: 't1',
      limit: 1,
      label: 'tenant=t1',
    });
    expect(runSlotOf(parsePlan({ name: 'q', steps: [op] }), {}, 't')).toBeNull();
    expect(slotWaitText({ label: 'customer=acme', limit: 1 })).toBe(
      'waiting for a concurrency slot of key customer=acme (limit 1)',
    );
  });

  it('reads a value at the path: strings as they are, others as JSON, a missing one as null', () => {
    expect(concurrencyValue('input.a.b', { a: { b: 'x' } }, 't')).toBe('x');
    expect(concurrencyValue('input.a', { a: 7 }, 't')).toBe('7');
    expect(concurrencyValue('input.a.1', { a: ['x', 'y'] }, 't')).toBe('y');
    expect(concurrencyValue('input.a.b', { a: 'x' }, 't')).toBe('null');
    expect(concurrencyValue('input.a', null, 't')).toBe('null');
  });

  it('refuses a limit that is not a positive whole number, a bad key, and a step that runs no code', () => {
    expect(issues({ name: 'p', concurrency: { key: 'tenant', limit: 0 }, steps: [op] })).toEqual([
      'concurrency.limit',
    ]);
    expect(issues({ name: 'p', concurrency: { key: 'tenant', limit: 1.5 }, steps: [op] })).toEqual([
      'concurrency.limit',
    ]);
    expect(issues({ name: 'p', concurrency: { key: 'customer', limit: 1 }, steps: [op] })).toEqual([
      'concurrency.key',
    ]);
    expect(issues({ name: 'p', concurrency: { key: 'input.', limit: 1 }, steps: [op] })).toEqual([
      'concurrency.key',
    ]);
    expect(
      issues({
        name: 'p',
        steps: [op, { id: 'g', kind: 'human_gate', concurrency: { key: 'tenant', limit: 1 } }],
      }),
    ).toEqual(['steps[1].concurrency']);
    expect(
      issues({ name: 'p', steps: [{ ...op, concurrency: { key: 'input.x', limit: -1 } }] }),
    ).toEqual(['steps[0].concurrency.limit']);
  });
});
