/**
 * The schema version of persisted run snapshots, and the migrations that bring snapshots written
 * by older releases up to it. Pure data transforms: the snapshot store applies them on read.
 */

/** The schema version this release writes. */
export const RUN_SNAPSHOT_SCHEMA_VERSION = 2;

/** One step of the chain `from → from + 1`, structurally a persistence `SnapshotMigration`. */
export interface RunSnapshotMigration {
  from: number;
  to: number;
  migrate(snapshot: unknown): unknown;
}

type Json = Record<string, unknown>;

/** Ordered migrations, v1 upwards. */
export const runSnapshotMigrations: readonly RunSnapshotMigration[] = [
  {
    // v2: runs can be stopped by the runtime (budgets) and resumed after failing.
    from: 1,
    to: 2,
    migrate(snapshot) {
      const s = snapshot as Json;
      const context = s['context'] as Json;
      return { ...s, context: { ...context, stop: null, resumes: 0 } };
    },
  },
];
