/**
 * Parsed plans kept by their JSON text. A service starts the same plan many times, and every run's
 * stored plan is read back by the workers: parsing a plan (its schema, its graph) costs more than
 * the rest of a start, and it is a function of the text alone, so a plan parsed once stands for
 * every later one with the same text. A kept plan is frozen, because every run started from it
 * shares it, and it is the same object each time, so what is derived from a plan can be kept by
 * plan object (the kernel keeps each plan's first transition).
 */
import { findNonJson } from '../internal/json.js';
import { parsePlan } from './parse-plan.js';
import type { Plan, PlanInput } from './schema.js';

/** Freezes `value` and everything in it. */
function deepFreeze<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const child of Object.values(value)) deepFreeze(child);
  }
  return value;
}

/** `parsePlan` over a bounded cache of the plans it parsed, least recently used out first. */
export class PlanCache {
  readonly #plans = new Map<string, Plan>();
  readonly #max: number;

  constructor(max = 256) {
    this.#max = max;
  }

  /**
   * `parsePlan(source)`: throws `PlanValidationError` as it does. A source that is not plain JSON
   * is parsed every time, so that its errors are reported.
   */
  parse(source: Plan | PlanInput | string): Plan {
    let text: string | undefined;
    if (typeof source === 'string') text = source;
    else if (findNonJson(source, '').length === 0) text = JSON.stringify(source);
    if (typeof text !== 'string') return parsePlan(source);
    const known = this.#plans.get(text);
    if (known !== undefined) {
      this.#plans.delete(text);
      this.#plans.set(text, known);
      return known;
    }
    const plan = deepFreeze(parsePlan(source));
    this.#plans.set(text, plan);
    if (this.#plans.size > this.#max) {
      this.#plans.delete(this.#plans.keys().next().value as string);
    }
    return plan;
  }
}
