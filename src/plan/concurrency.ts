/**
 * The value of a concurrency key for one run (see `concurrencySchema`): what a run's or step's
 * slots are counted per, and the words that name it in a status.
 */
import type { JsonValue } from '../internal/json.js';
import type { Plan, PlanStep } from './schema.js';

/** A plan's or step's concurrency limit, as written. */
export interface ConcurrencySpec {
  key: string;
  limit: number;
}

/** The slots one run or step attempt takes: whose (`scope`), for which value, and how many there are. */
export interface ConcurrencySlot {
  /** `run:<plan name>` for a plan's limit, `step:<plan name>:<step id>` for a step's. */
  scope: string;
  /** The key's value for the run: a string as it is, anything else as JSON (`null` when absent). */
  value: string;
  limit: number;
  /** How a status names the key and value: `customer=acme`, `tenant=t1`. */
  label: string;
}

/** The key's value in the run: its tenant, or the input at the key's path. */
export function concurrencyValue(key: string, input: JsonValue, tenantId: string): string {
  if (key === 'tenant') return tenantId;
  let at: JsonValue | undefined = input;
  for (const part of key.split('.').slice(1)) {
    if (at !== null && typeof at === 'object' && !Array.isArray(at)) at = at[part];
    else if (Array.isArray(at) && /^\d+$/.test(part)) at = at[Number(part)];
    else at = undefined;
    if (at === undefined) break;
  }
  if (at === undefined) return 'null';
  return typeof at === 'string' ? at : JSON.stringify(at);
}

/** The name a status gives the key: `tenant`, or the input path without `input.`. */
export const concurrencyKeyName = (key: string): string =>
  key === 'tenant' ? 'tenant' : key.slice('input.'.length);

function slotOf(
  spec: ConcurrencySpec,
  scope: string,
  input: JsonValue,
  tenantId: string,
): ConcurrencySlot {
  const value = concurrencyValue(spec.key, input, tenantId);
  return { scope, value, limit: spec.limit, label: `${concurrencyKeyName(spec.key)}=${value}` };
}

/** The run-level slot a run of `plan` takes, or null when the plan sets no concurrency. */
export function runSlotOf(plan: Plan, input: JsonValue, tenantId: string): ConcurrencySlot | null {
  return plan.concurrency === undefined
    ? null
    : slotOf(plan.concurrency, `run:${plan.name}`, input, tenantId);
}

/** The slot an attempt of `step` takes, or null when the step sets no concurrency. */
export function stepSlotOf(
  plan: Plan,
  step: PlanStep,
  input: JsonValue,
  tenantId: string,
): ConcurrencySlot | null {
  return step.concurrency === undefined
    ? null
    : slotOf(step.concurrency, `step:${plan.name}:${step.id}`, input, tenantId);
}

/** The words a status shows for a unit waiting on `slot`. */
export const slotWaitText = (slot: Pick<ConcurrencySlot, 'label' | 'limit'>): string =>
  `waiting for a concurrency slot of key ${slot.label} (limit ${slot.limit})`;
