/**
 * The schema version of persisted run snapshots, and the migrations that bring snapshots written
 * by older releases up to it. Pure data transforms: the snapshot store applies them on read.
 */
import type { RunSnapshot } from './kernel.js';
import {
  compactRunSnapshot,
  expandRunSnapshot,
  joinRunParts,
  runSnapshotDelta,
  type StoredRunSnapshot,
} from './stored-snapshot.js';

/** The schema version this release writes. */
export const RUN_SNAPSHOT_SCHEMA_VERSION = 4;

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
  {
    // v3: the stored form (see stored-snapshot.ts); steps gain `agent` (granular progress).
    from: 2,
    to: 3,
    migrate: (snapshot) => compactRunSnapshot(snapshot as RunSnapshot),
  },
  {
    // v4: the same stored form, split over the snapshot's fields with step outputs kept apart
    // (see stored-snapshot.ts); a v3 envelope's one field reads as it is and is split when written.
    from: 3,
    to: 4,
    migrate: (snapshot) => snapshot,
  },
];

/** Everything a snapshot codec needs for run snapshots (`createSnapshotCodec(runSnapshotCodec)`). */
export const runSnapshotCodec = {
  schemaVersion: RUN_SNAPSHOT_SCHEMA_VERSION,
  migrations: runSnapshotMigrations,
  deflate: (snapshot: RunSnapshot): unknown => compactRunSnapshot(snapshot),
  parse: (stored: unknown): RunSnapshot => expandRunSnapshot(stored as StoredRunSnapshot),
  layout: { delta: runSnapshotDelta, join: joinRunParts },
};
