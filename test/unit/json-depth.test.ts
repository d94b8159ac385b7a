import { describe, expect, it } from 'vitest';
import { InputValidationError, PlanValidationError } from '../../src/errors.js';
import {
  assertPlainJson,
  findNonJson,
  isPlainJson,
  MAX_JSON_DEPTH,
} from '../../src/internal/json.js';
import { parsePlan } from '../../src/plan/parse-plan.js';

/** `levels` nested arrays around 1, built without recursion. */
function nested(levels: number): unknown {
  let value: unknown = 1;
  for (let i = 0; i < levels; i++) value = [value];
  return value;
}

describe('the nesting limit of JSON values', () => {
  it(`accepts ${MAX_JSON_DEPTH} levels and refuses one more, once, at the first place past the limit`, () => {
    expect(findNonJson(nested(MAX_JSON_DEPTH), 'input')).toEqual([]);
    expect(isPlainJson(nested(MAX_JSON_DEPTH))).toBe(true);
    const issues = findNonJson(nested(MAX_JSON_DEPTH + 1), 'input');
    expect(issues).toHaveLength(1);
    expect(issues[0]!.path).toBe('input[0][0][0][0][0][0]');
    expect(issues[0]!.message).toMatch(
      new RegExp(
        `^nested deeper than ${MAX_JSON_DEPTH} levels .* \\(at depth ${MAX_JSON_DEPTH} from the root, below this path\\)$`,
      ),
    );
    expect(isPlainJson(nested(MAX_JSON_DEPTH + 1))).toBe(false);
  });

  it('refuses 100,000 levels without overflowing the stack', () => {
    expect(() => assertPlainJson(nested(100_000), 'run input', 'input')).toThrow(
      InputValidationError,
    );
    const text = `{"name":"p","steps":[{"id":"a","kind":"operator","operator":"x","input":${'['.repeat(100_000)}${']'.repeat(100_000)}}]}`;
    let error: unknown;
    try {
      parsePlan(text);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(PlanValidationError);
    expect((error as PlanValidationError).issues.map((i) => i.path)).toEqual([
      'steps[0].input[0][0][0]',
    ]);
  });
});
