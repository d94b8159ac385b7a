/**
 * Reproduce, replay and regenerate a run, and fork one from a step.
 *
 * - reproduce: what the run stored (outcomes, events, journaled model replies), read and never
 *   recomputed or written, with an integrity check: the run's state folded again from its events
 *   by the machines and compared with the stored snapshot.
 * - replay: a new run of the same plan and input in the same lineage. Steps run again (cached
 *   ones too, as with `refreshCache`: a deterministic one is checked against its stored output);
 *   a tool call that is not read-only returns the original's receipt when the original made the
 *   same call (same step, tool and arguments), else waits for a person's approval. An effectful
 *   operator step (one that declares an effect other than read-only, and so may act directly)
 *   whose inputs are the original's does not run: its output is the original's, its calls'
 *   receipts are recorded in the replay's ledger; with other inputs it waits for approval.
 * - regenerate: the same in a new lineage, where draft-producing steps (agents, stable
 *   nondeterministic steps) get new keys: none of their calls is the original's.
 * - fromStep: the steps that do not depend on it keep the original's outputs (SUCCEEDED from
 *   the start, listed as reused); it and its dependents run as the mode says.
 */
import { randomUUID } from 'node:crypto';
import { factsOf } from '../actors/run-host.js';
import {
  recordedEffect,
  replayMetaFields,
  type RecordedEffect,
  type ReplayOrigin,
} from '../execution/replay-calls.js';
import { InputValidationError, InvariantError, type ValidationIssue } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import { advanceRun, runStatus, runSteps, startRun, type RunSnapshot } from '../machines/kernel.js';
import { refoldRun, snapshotDifferences, type SnapshotDifference } from '../machines/refold.js';
import type { RunStatus } from '../machines/types.js';
import { forkScope, isEffectfulOperator } from '../plan/replay-scope.js';
import {
  createLineageStore,
  type LineageStore,
  type ReplayLink,
} from '../persistence/lineage-store.js';
import type { JournaledReply } from '../persistence/model-journal.js';
import type { RunEventRecord, StoredRunEvent } from '../persistence/snapshot-store.js';
import type { RunEvent } from '../schemas/events.js';
import type { StepOutcome } from '../schemas/outcomes.js';
import type { RuntimeCore } from '../actors/core.js';
import { eventsOf, outcomesOf } from './streams.js';

/** The replay modes. */
export const ReplayMode = {
  Reproduce: 'reproduce',
  Replay: 'replay',
  Regenerate: 'regenerate',
} as const;
/** A value of {@link ReplayMode}. */
export type ReplayMode = (typeof ReplayMode)[keyof typeof ReplayMode];

/** Options of `runtime.replay`. */
export interface ReplayOptions {
  mode: ReplayMode;
  /** Fork: reuse the outputs of the steps that do not depend on this one. @defaultValue none */
  fromStep?: string;
  /**
   * A tool call the original did not make (e.g. its arguments changed with a new draft) runs
   * without waiting for a person's approval. @defaultValue false
   */
  allowEffects?: boolean;
}

/** The integrity check of a reproduced run. */
export interface RunIntegrity {
  /** True when the events lead to the stored snapshot exactly. */
  ok: boolean;
  /** Events the machines refused or could not read. */
  problems: string[];
  /** Where the stored snapshot and the one the events lead to differ (at most 20). */
  differences: SnapshotDifference[];
}

/** What `reproduce` returns: the run as stored, nothing recomputed. */
export interface ReproducedRun {
  mode: 'reproduce';
  runId: string;
  status: RunStatus;
  /** The snapshot version the check and the events are as of. */
  version: number;
  outcomes: StepOutcome[];
  events: StoredRunEvent[];
  /** The model replies the run's journal holds. */
  modelReplies: JournaledReply[];
  integrity: RunIntegrity;
}

/** What `replay` and `regenerate` return: the new run and how it relates to the original. */
export interface ReplayedRun {
  mode: 'replay' | 'regenerate';
  /** The new run. */
  runId: string;
  /** The run it replays. */
  replayOf: string;
  /** The first run of the new run's lineage. */
  lineage: string;
  fromStep: string | null;
  /** Steps whose outputs the new run took from the original. */
  reusedSteps: string[];
  allowEffects: boolean;
}

/** A run's place in its lineage. */
export interface RunLineage {
  /** The run this one replays, or null for an original. */
  replayOf: string | null;
  mode: 'replay' | 'regenerate' | null;
  /** The first run of its lineage (itself for an original or a regenerated run). */
  lineage: string;
  fromStep: string | null;
  reusedSteps: string[];
  /** The runs that replay this one, oldest first. */
  replays: ReplayLink[];
}

const MODES: readonly string[] = Object.values(ReplayMode);

/** Checks the options (`InputValidationError` naming the field and the fix). */
export function checkReplayOptions(options: unknown): ReplayOptions {
  const issues: ValidationIssue[] = [];
  const o = (typeof options === 'object' && options !== null ? options : {}) as Record<
    string,
    unknown
  >;
  const mode = o['mode'];
  if (typeof mode !== 'string' || !MODES.includes(mode)) {
    issues.push({
      path: 'mode',
      message: `must be "reproduce", "replay" or "regenerate", got ${JSON.stringify(mode) ?? 'nothing'}`,
    });
  }
  const fromStep = o['fromStep'];
  if (fromStep !== undefined && (typeof fromStep !== 'string' || fromStep === '')) {
    issues.push({
      path: 'fromStep',
      message: 'must be the id of a step of the run, e.g. "render"',
    });
  }
  const allowEffects = o['allowEffects'];
  if (allowEffects !== undefined && typeof allowEffects !== 'boolean') {
    issues.push({ path: 'allowEffects', message: 'must be true or false' });
  }
  if (mode === ReplayMode.Reproduce) {
    if (fromStep !== undefined) {
      issues.push({
        path: 'fromStep',
        message: 'reproduce only reads the run; fork with mode "replay" or "regenerate"',
      });
    }
    if (allowEffects !== undefined) {
      issues.push({
        path: 'allowEffects',
        message: 'reproduce runs nothing; leave allowEffects out, or use mode "regenerate"',
      });
    }
  }
  if (issues.length > 0) throw new InputValidationError('replay options', issues);
  return {
    mode: mode as ReplayMode,
    ...(fromStep === undefined ? {} : { fromStep: fromStep as string }),
    ...(allowEffects === undefined ? {} : { allowEffects: allowEffects as boolean }),
  };
}

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

/** The run as stored, with its integrity check. Reads only. */
export async function reproduceRun(core: RuntimeCore, runId: string): Promise<ReproducedRun> {
  const env = await core.stores.store.load(runId);
  const meta = await core.meta.read(runId);
  const [events, outcomes, modelReplies] = await Promise.all([
    collect(eventsOf(core, runId)),
    collect(outcomesOf(core, runId)),
    core.stores.journal.list(runId),
  ]);
  // Events a commit wrote after the snapshot was read are not in it: the check stops there.
  const upTo = events.filter((e) => e.version <= env.version);
  const folded = refoldRun(meta.plan, upTo);
  const derived: unknown =
    folded.snapshot === null ? null : JSON.parse(JSON.stringify(folded.snapshot));
  const differences = snapshotDifferences(env.snapshot, derived);
  return {
    mode: 'reproduce',
    runId,
    status: runStatus(env.snapshot),
    version: env.version,
    outcomes,
    events,
    modelReplies,
    integrity: {
      ok: folded.problems.length === 0 && differences.length === 0,
      problems: folded.problems,
      differences,
    },
  };
}

/**
 * The first snapshot of a replaying run and the facts its creation records: the plan's initial
 * snapshot, with each reused step taken to SUCCEEDED with the original's output (its gate, if
 * any, approved by `replay`). Pure.
 */
function reusedStart(
  plan: Parameters<typeof startRun>[0],
  runId: string,
  at: number,
  created: { type: 'run.created'; at: number; [k: string]: unknown },
  reused: ReadonlyMap<string, JsonValue>,
  originalId: string,
): { snapshot: RunSnapshot; facts: RunEventRecord[] } {
  const first = startRun(plan, { runId, at });
  const facts = factsOf(created, null, first);
  let { snapshot, status } = first;
  const feed = (event: RunEvent): void => {
    const t = advanceRun(snapshot, event);
    if (!t.accepted) {
      throw new InvariantError(`a replay's reused step refused ${event.type}`);
    }
    facts.push(...factsOf(event, status, t));
    snapshot = t.snapshot;
    status = t.status;
  };
  for (let moved = true; moved;) {
    moved = false;
    for (const s of runSteps(snapshot)) {
      const output = reused.get(s.stepId);
      if (output === undefined) continue;
      if (s.status === 'WAITING_APPROVAL') {
        const comment = `output reused from run ${originalId}`;
        feed({ type: 'gate.approved', stepId: s.stepId, by: 'replay', comment, at });
        moved = true;
      } else if (s.status === 'READY') {
        feed({ type: 'step.started', stepId: s.stepId, attempt: s.attempt, at });
        feed({ type: 'step.succeeded', stepId: s.stepId, attempt: s.attempt, output, at });
        moved = true;
      }
    }
  }
  const stuck = runSteps(snapshot).filter((s) => reused.has(s.stepId) && s.status !== 'SUCCEEDED');
  if (stuck.length > 0) {
    throw new InvariantError(
      `a replay's reused steps did not all succeed: ${stuck.map((s) => `${s.stepId} ${s.status}`).join(', ')}`,
    );
  }
  return { snapshot, facts };
}

/** Creates the run that replays (or regenerates) `runId`, and sets it going. */
export async function startReplay(
  core: RuntimeCore,
  runId: string,
  options: ReplayOptions & { mode: 'replay' | 'regenerate' },
): Promise<ReplayedRun> {
  const original = await core.stores.store.load(runId);
  const meta = await core.meta.read(runId);
  const { plan } = meta;
  const scope = options.fromStep === undefined ? null : forkScope(plan, options.fromStep);
  const reused = new Map<string, JsonValue>();
  const steps = new Map(runSteps(original.snapshot).map((s) => [s.stepId, s]));
  if (scope !== null) {
    for (const step of plan.steps) {
      if (scope.has(step.id)) continue;
      const s = steps.get(step.id);
      if (s?.status !== 'SUCCEEDED') {
        throw new InputValidationError('replay options', [
          {
            path: 'fromStep',
            message: `step "${step.id}" does not depend on "${options.fromStep}" and did not succeed in run ${runId} (it is ${s?.status ?? 'missing'}), so there is no output of it to reuse; fork from "${step.id}" or a step it depends on`,
          },
        ]);
      }
      reused.set(step.id, s.output ?? null);
    }
  }
  // What the original's effectful operator steps acted on and produced: such a step of the replay
  // with the same inputs takes that output instead of acting again.
  const recorded: Record<string, RecordedEffect> = {};
  for (const step of plan.steps) {
    const s = steps.get(step.id);
    if (reused.has(step.id) || !isEffectfulOperator(step) || s?.status !== 'SUCCEEDED') continue;
    const depOutputs: Record<string, JsonValue> = {};
    for (const d of step.dependsOn) {
      const dep = steps.get(d);
      depOutputs[d] = dep?.status === 'SUCCEEDED' ? (dep.output ?? null) : null;
    }
    recorded[step.id] = recordedEffect(step, meta.input, depOutputs, s.output ?? null);
  }
  const newRunId = randomUUID();
  const at = core.clock();
  const origin: ReplayOrigin = {
    of: runId,
    mode: options.mode,
    allowEffects: options.allowEffects ?? false,
    lineage: options.mode === 'replay' ? (meta.replay?.lineage ?? runId) : newRunId,
    fromStep: options.fromStep ?? null,
    reusedSteps: [...reused.keys()],
    recorded,
  };
  const created = {
    type: 'run.created',
    runId: newRunId,
    plan: plan.name,
    replayOf: runId,
    mode: options.mode,
    at,
  } as const;
  const { snapshot, facts } = reusedStart(plan, newRunId, at, created, reused, runId);
  const fields = {
    plan: JSON.stringify(plan),
    input: JSON.stringify(meta.input),
    tenantId: meta.tenantId,
    requestKey: '',
    createdAt: String(at),
    // Steps run again, not from the tenant's cache: a deterministic one is checked against its
    // stored output (NonDeterminismError when it differs).
    refreshCache: '1',
    // On the queue of the run it replays: the workers of that run's job module run it.
    queue: meta.queue ?? core.queues.queueName,
    ...replayMetaFields(origin),
  };
  // Listed before it exists, as a start lists its run: the list removes an entry whose run never
  // got created.
  await Promise.all([
    core.stores.activeRuns.add(newRunId),
    core.stores.runs.add({
      runId: newRunId,
      planName: plan.name,
      tenantId: meta.tenantId,
      createdAt: at,
    }),
  ]);
  const envelope = await core.host.createFrom(newRunId, { snapshot, facts, created, meta: fields });
  await lineageStore(core).add(runId, { runId: newRunId, mode: options.mode, at });
  await core.queues.scheduleDeadline(newRunId, plan, at);
  await core.queues.enqueueDue(newRunId, envelope);
  return {
    mode: options.mode,
    runId: newRunId,
    replayOf: runId,
    lineage: origin.lineage,
    fromStep: origin.fromStep,
    reusedSteps: origin.reusedSteps,
    allowEffects: origin.allowEffects,
  };
}

const lineageStores = new WeakMap<RuntimeCore, LineageStore>();

function lineageStore(core: RuntimeCore): LineageStore {
  let store = lineageStores.get(core);
  if (store === undefined) {
    store = createLineageStore({ redis: core.redis, prefix: core.stores.keys.prefix });
    lineageStores.set(core, store);
  }
  return store;
}

/** The runs that replay `runId`, oldest first. Reads only. */
export function replaysOf(core: RuntimeCore, runId: string): Promise<ReplayLink[]> {
  return lineageStore(core).list(runId);
}

/** The run's lineage; undefined for a run that replays none and has no replays. */
export function lineageFrom(
  runId: string,
  origin: ReplayOrigin | null,
  replays: ReplayLink[],
): RunLineage | undefined {
  if (origin === null && replays.length === 0) return undefined;
  return {
    replayOf: origin?.of ?? null,
    mode: origin?.mode ?? null,
    lineage: origin?.lineage ?? runId,
    fromStep: origin?.fromStep ?? null,
    reusedSteps: origin?.reusedSteps ?? [],
    replays,
  };
}
