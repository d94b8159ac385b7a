import { describe, expect, it } from 'vitest';
import { InvariantError, RedisUnavailableError } from '../../src/errors.js';
import {
  failureFrom,
  parseOutcome,
  stepOutcomeSchema,
  type StepOutcome,
} from '../../src/schemas/outcomes.js';

const at = 1_700_000_000_000;
const where = { runId: 'r', stepId: 's', at };

const samples: StepOutcome[] = [
  { type: 'success', ...where, attempt: 1, output: { rows: [1, 2], note: 'ok ✓' } },
  {
    type: 'failure',
    ...where,
    attempt: 2,
    error: { name: 'TimeoutError', code: 'timeout', message: 'slow', retryable: true },
    feedback: 'TimeoutError: slow',
    partial: { rows: [1] },
    final: false,
  },
  { type: 'paused', ...where, message: 'waiting for approval', stateToken: { gate: 's' } },
  { type: 'aborted', ...where, reason: 'budget_exceeded', message: 'max steps reached' },
  { type: 'chunk', ...where, attempt: 1, seq: 0, data: 'Hel' },
];

describe('typed outcomes', () => {
  it.each(samples.map((s) => [s.type, s] as const))('%s survives JSON', (_, outcome) => {
    const text = JSON.stringify(outcome);
    expect(parseOutcome(text)).toEqual(outcome);
    expect(parseOutcome(JSON.parse(text))).toEqual(outcome);
  });

  it('refuses an outcome of an unknown type or with a missing field, naming it', () => {
    expect(() => parseOutcome({ type: 'exploded', ...where })).toThrow(/type/);
    const r = stepOutcomeSchema.safeParse({ type: 'success', ...where, attempt: 1 });
    expect(r.success).toBe(false);
    expect(r.error?.issues.map((i) => i.path.join('.'))).toEqual(['output']);
  });

  it('refuses a non-JSON output', () => {
    const r = stepOutcomeSchema.safeParse({
      type: 'success',
      ...where,
      attempt: 1,
      output: { when: new Date(0) },
    });
    expect(r.success).toBe(false);
  });

  it('the choke point turns anything thrown into a Failure that keeps code and retryability', () => {
    const f = failureFrom(new RedisUnavailableError('redis down'), {
      ...where,
      attempt: 3,
      final: false,
    });
    expect(f).toEqual({
      type: 'failure',
      ...where,
      attempt: 3,
      error: {
        name: 'RedisUnavailableError',
        code: 'redis_unavailable',
        message: 'redis down',
        retryable: true,
      },
      feedback: 'RedisUnavailableError: redis down',
      final: false,
    });
    expect(parseOutcome(JSON.stringify(f))).toEqual(f);
    const fromPlain = failureFrom(new TypeError('boom'), { ...where, attempt: 1, final: true });
    expect(fromPlain.error).toMatchObject({
      name: 'UnknownError',
      code: 'unknown',
      retryable: false,
    });
    expect(
      failureFrom(new InvariantError('x'), { ...where, attempt: 1, final: true }).error.message,
    ).toBe('INVARIANT: x');
  });
});
