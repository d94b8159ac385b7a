/**
 * Action keys: an operator step with `idempotency.keyInputs` is one action of its tenant, keyed by
 * the operator's name and the values those paths read from the step's input. Its tool calls are
 * recorded in that action's ledger, shared by every run of the tenant, so a second run with the
 * same values gets the first run's receipts and no second effect.
 *
 * A key input is a dot-separated path into the step's input as the operator receives it
 * (`ctx.input`: the step's `input` from the plan when it has one, else the run's input); a segment
 * of digits indexes an array. Every path must lead to a value when the run starts.
 */
import { canonicalHash } from '../internal/canonical-hash.js';
import type { ValidationIssue } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import type { Plan, PlanStep } from '../plan/schema.js';

/** The input a step's operator receives: its own `input` when the plan gives one, else the run's. */
export function stepInputOf(step: PlanStep, runInput: JsonValue): JsonValue {
  return step.input === undefined ? runInput : step.input;
}

/** The value at a key input path, or undefined when the path leads nowhere. */
export function keyInputValue(input: JsonValue, path: string): JsonValue | undefined {
  let at: JsonValue | undefined = input;
  for (const segment of path.split('.')) {
    if (Array.isArray(at)) {
      if (!/^(0|[1-9][0-9]*)$/.test(segment)) return undefined;
      at = at[Number(segment)];
    } else if (at !== null && typeof at === 'object') {
      at = Object.prototype.hasOwnProperty.call(at, segment) ? at[segment] : undefined;
    } else {
      return undefined;
    }
    if (at === undefined) return undefined;
  }
  return at;
}

/** The action key of a step with key inputs: its tenant, operator and the values the paths read. */
export function actionKeyOf(tenantId: string, step: PlanStep, input: JsonValue): string {
  const operator = step.kind === 'operator' ? step.operator : step.kind;
  return canonicalHash(
    {
      tenant: tenantId,
      operator,
      inputs: Object.fromEntries(
        step.idempotency.keyInputs.map((p) => [p, keyInputValue(input, p) ?? null]),
      ),
    },
    'idempotency key inputs',
  );
}

/** The ledger scope of an action key (used where a run id names a run's own ledger). */
export function actionLedgerScope(actionKey: string): string {
  return `action:${actionKey}`;
}

/**
 * Every key input path of the plan that leads to no value in its step's input, with the fix: a
 * missing value would give every such run the same action key, and so the first run's receipts.
 */
export function keyInputIssues(plan: Plan, runInput: JsonValue): ValidationIssue[] {
  const issues: ValidationIssue[] = [];
  plan.steps.forEach((step, i) => {
    const input = stepInputOf(step, runInput);
    const from = step.input === undefined ? 'the run input' : `steps[${i}].input`;
    step.idempotency.keyInputs.forEach((path, j) => {
      if (keyInputValue(input, path) !== undefined) return;
      issues.push({
        path: `steps[${i}].idempotency.keyInputs[${j}]`,
        message: `"${path}" leads to no value in ${from} of step "${step.id}": pass it in the input, or fix the path (dot-separated keys, digits index arrays)`,
      });
    });
  });
  return issues;
}

/** The action ledger scopes of a run's steps with key inputs, by step id. */
export function actionScopesOf(
  plan: Plan,
  runInput: JsonValue,
  tenantId: string,
): Map<string, string> {
  const scopes = new Map<string, string>();
  for (const step of plan.steps) {
    if (step.idempotency.keyInputs.length === 0) continue;
    const key = actionKeyOf(tenantId, step, stepInputOf(step, runInput));
    scopes.set(step.id, actionLedgerScope(key));
  }
  return scopes;
}

/** The ledger call id of the `n`-th call (from 0) of tool `tool` in an action. */
export function actionCallId(actionKey: string, tool: string, n: number): string {
  return canonicalHash({ action: actionKey, tool, n }, 'action call');
}
