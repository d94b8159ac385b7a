/**
 * What differs between two plans, step by step and field by field: what a resume tells its user
 * when the job module's plan is no longer the one the run was started with. Pure.
 */
import canonicalize from 'canonicalize';
import type { Plan } from './schema.js';

/** One difference: a step added or removed, or a field whose value differs. */
export interface PlanDifference {
  /** The step, or null for a plan-level field. */
  stepId: string | null;
  /** `added`, `removed`, or the dotted path of the field that differs (e.g. `retry.maxAttempts`). */
  what: string;
}

const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

// Plans are plain JSON, so their canonical forms are equal exactly when the values are.
const same = (a: unknown, b: unknown): boolean =>
  canonicalize(a ?? null) === canonicalize(b ?? null);

/** The dotted paths under which `a` and `b` differ, descending into objects (not arrays). */
function fieldPaths(a: unknown, b: unknown, at: string, out: string[]): void {
  if (same(a, b)) return;
  if (isRecord(a) && isRecord(b)) {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
    for (const key of keys) fieldPaths(a[key], b[key], at === '' ? key : `${at}.${key}`, out);
    return;
  }
  out.push(at);
}

/** Every difference between the `stored` plan and the `current` one, in plan order. */
export function diffPlans(stored: Plan, current: Plan): PlanDifference[] {
  const out: PlanDifference[] = [];
  const { steps: storedSteps, ...storedTop } = stored;
  const { steps: currentSteps, ...currentTop } = current;
  const top: string[] = [];
  fieldPaths(storedTop, currentTop, '', top);
  for (const what of top) out.push({ stepId: null, what });
  const now = new Map(currentSteps.map((s) => [s.id, s]));
  const before = new Set(storedSteps.map((s) => s.id));
  for (const step of storedSteps) {
    const other = now.get(step.id);
    if (other === undefined) {
      out.push({ stepId: step.id, what: 'removed' });
      continue;
    }
    const fields: string[] = [];
    fieldPaths(step, other, '', fields);
    for (const what of fields) out.push({ stepId: step.id, what });
  }
  for (const step of currentSteps) {
    if (!before.has(step.id)) out.push({ stepId: step.id, what: 'added' });
  }
  return out;
}

/** The differences as one line: `step "b": retry.maxAttempts, input; step "d": added`. */
export function describePlanDifferences(differences: readonly PlanDifference[]): string {
  const groups = new Map<string | null, string[]>();
  for (const d of differences) groups.set(d.stepId, [...(groups.get(d.stepId) ?? []), d.what]);
  return [...groups]
    .map(([stepId, whats]) =>
      stepId === null ? `plan: ${whats.join(', ')}` : `step "${stepId}": ${whats.join(', ')}`,
    )
    .join('; ');
}
