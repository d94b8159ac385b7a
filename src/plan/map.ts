/** Map steps as data: the list a map runs over, and the step each of its items runs as. Pure. */
import type { SerializedError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import { valueAtPath } from './condition.js';
import {
  agentStepSchema,
  MAX_MAP_ITEMS,
  splitOver,
  type MapStep,
  type PlanStep,
} from './schema.js';

/**
 * The id an item of a map step runs under (ledger scope, idempotency key, journal):
 * `<map>.<index>`, a step id no other step of the plan may have (see `checkPlanSemantics`).
 */
export function itemStepId(mapStepId: string, index: number): string {
  return `${mapStepId}.${index}`;
}

/**
 * The step item `index` of `step` runs as: its operator, (atomic) agent or child run (a `run` step
 * of the item's plan), with the element as its
 * input, no dependencies, the map's effects, tags, retry, budgets and timeout, uncached; its id is
 * {@link itemStepId}, so each item has its own ledger scope and idempotency key.
 */
export function mapItemStep(step: MapStep, index: number, element: JsonValue): PlanStep {
  const common = {
    id: itemStepId(step.id, index),
    input: element,
    dependsOn: [],
    effects: step.effects,
    policyTags: step.policyTags,
    riskLevel: 'low' as const,
    cachePolicy: { class: 'none' as const },
    idempotency: { keyInputs: [] },
    retry: step.retry,
    ...(step.budgets === undefined ? {} : { budgets: step.budgets }),
    ...(step.timeoutMs === undefined ? {} : { timeoutMs: step.timeoutMs }),
  };
  if (step.item.kind === 'operator') {
    return { ...common, kind: 'operator', operator: step.item.operator };
  }
  if (step.item.kind === 'run') {
    return { ...common, kind: 'run', plan: step.item.plan, onParentCancel: 'cancel' };
  }
  const defaults = agentStepSchema.parse({ kind: 'agent', id: 'item', agent: step.item.agent });
  return { ...defaults, ...common, kind: 'agent', agent: step.item.agent, mode: 'atomic' };
}

/** Where a map's list is: the step `over` names and the path in its output. */
export function mapSource(
  step: MapStep,
  stepIds: Iterable<string>,
): { step: string; path: string | undefined } {
  return splitOver(step.over, stepIds) ?? { step: step.over, path: undefined };
}

/** A JSON value's type as a person names it: `object`, `array`, `string`, `null`, … */
export function jsonTypeOf(value: JsonValue | undefined): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'null';
  return Array.isArray(value) ? 'array' : typeof value;
}

/**
 * The list a map runs over, read from its source's output; or, when that is not an array or has
 * more than {@link MAX_MAP_ITEMS} elements, what is wrong, for the step's failure.
 */
export function mapListOf(
  step: MapStep,
  output: JsonValue | null | undefined,
  path: string | undefined,
): { list: JsonValue[] } | { problem: string } {
  const value = output === undefined ? undefined : valueAtPath(output, path);
  if (!Array.isArray(value)) {
    return {
      problem: `map step "${step.id}" runs over ${JSON.stringify(step.over)}, which holds ${jsonTypeOf(value)}, not an array: make that step return an array there, or point over at one`,
    };
  }
  if (value.length > MAX_MAP_ITEMS) {
    return {
      problem: `map step "${step.id}" runs over ${JSON.stringify(step.over)}, which holds ${value.length} elements, more than the ${MAX_MAP_ITEMS} a map takes: split the list over several steps`,
    };
  }
  return { list: value };
}

/**
 * What a map with `itemFailures: 'collect'` holds in place of the output of an item that failed
 * finally: `{ itemFailed: true, index, attempts, error: { code, message } }`.
 */
export function itemErrorRecord(
  index: number,
  attempts: number,
  error: SerializedError,
): JsonValue {
  return { itemFailed: true, index, attempts, error: { code: error.code, message: error.message } };
}
