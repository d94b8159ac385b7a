/** Conditions on steps (`when`): where they read an output, and whether they hold. Pure. */
import type { JsonValue } from '../internal/json.js';
import type { StepCondition } from './schema.js';

/** The reason a step skipped by a false condition ends with. */
export const CONDITION_FALSE = 'condition_false';

/**
 * The value at `path` (dot-separated object keys and array indexes) of `output`, or undefined when
 * there is none there.
 */
export function valueAtPath(
  output: JsonValue | null,
  path: string | undefined,
): JsonValue | undefined {
  if (path === undefined) return output;
  let at: JsonValue | undefined = output;
  for (const key of path.split('.')) {
    if (Array.isArray(at)) {
      at = /^\d+$/.test(key) ? at[Number(key)] : undefined;
    } else if (typeof at === 'object' && at !== null) {
      at = Object.prototype.hasOwnProperty.call(at, key) ? at[key] : undefined;
    } else {
      return undefined;
    }
  }
  return at;
}

/** Deep equality of two JSON values (object keys in any order). */
export function jsonEqual(a: JsonValue | undefined, b: JsonValue | undefined): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) || Array.isArray(b)) {
    return (
      Array.isArray(a) &&
      Array.isArray(b) &&
      a.length === b.length &&
      a.every((v, i) => jsonEqual(v, b[i]))
    );
  }
  const keys = Object.keys(a);
  return (
    keys.length === Object.keys(b).length &&
    keys.every((k) => Object.prototype.hasOwnProperty.call(b, k) && jsonEqual(a[k], b[k]))
  );
}

/**
 * Whether `when` holds of the named step's output (`null` for a step that was skipped): `equals`
 * compares deeply, `in` holds when one of its values equals, `exists: true` holds when the value
 * is there and not null (`exists: false`, when it is not).
 */
export function conditionHolds(when: StepCondition, output: JsonValue | null): boolean {
  const value = valueAtPath(output, when.path);
  if (when.exists !== undefined) return (value !== undefined && value !== null) === when.exists;
  if (when.in !== undefined) return when.in.some((v) => jsonEqual(value, v));
  return jsonEqual(value, when.equals);
}

/**
 * Attempts the steps made: a step skipped by a false condition made none (its skip names the
 * attempt that would have run).
 */
export function attemptsMade(
  steps: readonly { status: string; attempt: number; reason: string | null }[],
): number {
  let n = 0;
  for (const s of steps) {
    if (s.status !== 'SKIPPED' || s.reason !== CONDITION_FALSE) n += s.attempt;
  }
  return n;
}
