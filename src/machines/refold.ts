/**
 * The integrity check of a stored run: its state derived again from its stored events alone, by
 * folding them through the machines from the initial snapshot of its plan, and compared with the
 * stored snapshot. Pure: events in, snapshot and differences out.
 */
import type { JsonValue } from '../internal/json.js';
import type { Plan } from '../plan/schema.js';
import { runEventSchema } from '../schemas/events.js';
import { openRun, startRun, validateRunEvent, type OpenRun, type RunSnapshot } from './kernel.js';

/** The event types a run accepts (the others in a stream are facts derived from them). */
const RUN_EVENT_TYPES: ReadonlySet<string> = new Set(
  runEventSchema.options.map((o) => o.shape.type.value),
);

/** An event as read from a run's stream. */
export interface FoldedEvent {
  /** The stream entry id, to name the event in a problem. */
  id: string;
  type: string;
  data: Readonly<Record<string, unknown>>;
}

/** One place where the stored snapshot and the derived one differ. */
export interface SnapshotDifference {
  /** A JSON path into the snapshot, e.g. `children.send.snapshot.value`. */
  path: string;
  /** The stored value there (undefined: absent). */
  stored: JsonValue | undefined;
  /** The derived value there (undefined: absent). */
  derived: JsonValue | undefined;
}

/** What folding a run's events gave. */
export interface RefoldResult {
  /** The snapshot the events lead to; null when the stream has no `run.created` event. */
  snapshot: RunSnapshot | null;
  /** Events the machines refused or could not read, with why. */
  problems: string[];
}

/**
 * Folds a run's stored events through the machines: `run.created` gives the initial snapshot of
 * `plan`, and every event a run accepts from outside is fed in stream order. Derived facts
 * (`step.changed`, `run.status`, `run.finished`) are skipped: the machines produce them again.
 */
export function refoldRun(plan: Plan, events: readonly FoldedEvent[]): RefoldResult {
  const problems: string[] = [];
  // One run held open for the whole fold: opening it per event would cost a restore each time.
  let run: OpenRun | null = null;
  for (const e of events) {
    if (e.type === 'run.created') {
      const { runId, at } = e.data;
      if (run !== null || typeof runId !== 'string' || typeof at !== 'number') {
        problems.push(`event ${e.id}: a second or unreadable run.created`);
        continue;
      }
      run = openRun(startRun(plan, { runId, at }).snapshot);
      continue;
    }
    if (!RUN_EVENT_TYPES.has(e.type)) continue;
    if (run === null) {
      problems.push(`event ${e.id} (${e.type}) comes before run.created`);
      continue;
    }
    try {
      const t = run.send(validateRunEvent(run.snapshot, e.data));
      if (!t.accepted) problems.push(`event ${e.id} (${e.type}) was refused by the machines`);
    } catch (error) {
      problems.push(`event ${e.id} (${e.type}) is unreadable: ${(error as Error).message}`);
    }
  }
  if (run === null) problems.push('the stream has no run.created event');
  const snapshot: RunSnapshot | null = run?.snapshot ?? null;
  run?.close();
  return { snapshot, problems };
}

/** Where two JSON values differ, as paths (at most `limit` of them), depth first. */
export function snapshotDifferences(
  stored: unknown,
  derived: unknown,
  limit = 20,
): SnapshotDifference[] {
  const out: SnapshotDifference[] = [];
  const walk = (a: unknown, b: unknown, path: string): void => {
    if (out.length >= limit) return;
    if (a === b) return;
    const objects = typeof a === 'object' && a !== null && typeof b === 'object' && b !== null;
    if (objects && Array.isArray(a) === Array.isArray(b)) {
      const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
      for (const k of [...keys].sort()) {
        const va = (a as Record<string, unknown>)[k];
        const vb = (b as Record<string, unknown>)[k];
        // A field set to undefined is not stored: absent and undefined are the same.
        if (va === undefined && vb === undefined) continue;
        walk(va, vb, path === '' ? k : `${path}.${k}`);
      }
      return;
    }
    out.push({
      path: path === '' ? '(root)' : path,
      stored: a as JsonValue | undefined,
      derived: b as JsonValue | undefined,
    });
  };
  walk(stored, derived, '');
  return out;
}
