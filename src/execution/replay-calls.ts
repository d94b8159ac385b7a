/**
 * How the steps of a replaying run find what the original run recorded.
 *
 * - Tool calls: a call is the original's when it has the same step, tool identity (`name@version`)
 *   and arguments, the idempotency-key argument the runtime fills in aside (it names the run): so a
 *   call whose arguments changed, e.g. because a new draft came out of a model, never gets a
 *   receipt for other arguments.
 * - Effectful operator steps (see `isEffectfulOperator`), which may act outside directly: such a
 *   step does not run when its inputs are the original's; it takes the original's recorded
 *   output (and its tool calls' receipts, recorded in this run's ledger). With other inputs, or
 *   none recorded, it runs only once a person approved it, unless the replay allows effects.
 */
import { IDEMPOTENCY_KEY_ARG } from '../agents/tool-schema.js';
import { canonicalHash } from '../internal/canonical-hash.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import { isDraftProducing, isEffectfulOperator } from '../plan/replay-scope.js';
import type { PlanStep } from '../plan/schema.js';
import { parseBlobRefs, refOfReceipt, type BlobStore } from '../persistence/blob-store.js';
import { ledgerCallId, type Ledger, type LedgerEntry } from '../persistence/ledger.js';
import type { ReplayedCalls } from '../tools/call-tool.js';
import type { CallToApprove } from './call-approval.js';

/** What the original recorded of an effectful operator step that succeeded there. */
export interface RecordedEffect {
  /** The hash of the step's inputs there (see {@link effectInputs}). */
  inputs: string;
  /** The hash of each dependency's output there, by step id (to name the ones that changed). */
  deps: Record<string, string>;
  /** Its output there. */
  output: JsonValue;
}

/** What a run that replays another was started as (stored with it). */
export interface ReplayOrigin {
  /** The run it replays. */
  of: string;
  mode: 'replay' | 'regenerate';
  /** Calls the original did not make run without a person's approval. */
  allowEffects: boolean;
  /** The first run of its lineage: the original's lineage for a replay, itself when regenerated. */
  lineage: string;
  /** The step it was forked from, or null when every step runs again. */
  fromStep: string | null;
  /** The steps whose recorded outputs it reused (SUCCEEDED from the start). */
  reusedSteps: string[];
  /**
   * The effectful operator steps (see `isEffectfulOperator`) that succeeded in the original, as
   * it recorded them when the replay was created, by step id.
   */
  recorded: Record<string, RecordedEffect>;
}

/** A dependency's output as a step sees it: null when it produced nothing or was skipped. */
function depsOf(
  step: PlanStep,
  depOutputs: Readonly<Record<string, JsonValue>>,
): Record<string, JsonValue> {
  return Object.fromEntries(step.dependsOn.map((d) => [d, depOutputs[d] ?? null]));
}

/**
 * The hash of what an effectful step acts on: its input (the plan's `input` for the step, else
 * the run's) and its dependencies' outputs.
 */
export function effectInputs(
  step: PlanStep,
  runInput: JsonValue,
  depOutputs: Readonly<Record<string, JsonValue>>,
): string {
  const input = step.input === undefined ? runInput : step.input;
  return canonicalHash({ input, deps: depsOf(step, depOutputs) }, 'replayed step inputs');
}

/** What a replay records of an effectful step that succeeded in the original. */
export function recordedEffect(
  step: PlanStep,
  runInput: JsonValue,
  depOutputs: Readonly<Record<string, JsonValue>>,
  output: JsonValue,
): RecordedEffect {
  const deps = Object.fromEntries(
    Object.entries(depsOf(step, depOutputs)).map(([d, v]) => [d, canonicalHash(v, 'step output')]),
  );
  return { inputs: effectInputs(step, runInput, depOutputs), deps, output };
}

/** A receipt of the original recorded in the replaying run's ledger when its step was reused. */
export interface ReusedReceipt {
  /** The call's id in this run's ledger. */
  callId: string;
  /** The tool identity (`name@version`). */
  tool: string;
  durationMs: number;
}

/** What an execution of an effectful operator step of a replaying run does. */
export type ReplayedEffect =
  /** Not an effectful operator step: it runs, its tool calls looked up call by call. */
  | { kind: 'run' }
  /**
   * Its inputs are the original's: it does not run, its output is the original's, and the
   * original's receipts of its calls are now in this run's ledger.
   */
  | {
      kind: 'reuse';
      output: JsonValue;
      sourceRunId: string;
      /** The id under which the step's reuse is recorded (its approval's, had it asked). */
      callId: string;
      receipts: ReusedReceipt[];
    }
  /**
   * Its inputs changed (or the original recorded no output of it): it acts only once a person
   * approved `call` (then, or with `allowEffects`, its calls run without asking again).
   */
  | { kind: 'approve'; call: CallToApprove }
  /** The same, in a replay that allows effects: it runs, its calls without asking. */
  | { kind: 'act' };

/** The original's records, as one step of a replaying run looks them up. */
export interface ReplayedStep extends ReplayedCalls {
  /** The run it replays. */
  readonly of: string;
  /**
   * False for a step whose calls are recorded in an action's ledger (`idempotency.keyInputs`):
   * the tenant's runs share those receipts already, so its calls are not looked up here.
   */
  readonly matchesCalls: boolean;
  /** What this execution of the step does, given its inputs in this run (see {@link ReplayedEffect}). */
  effect(args: {
    runId: string;
    runInput: JsonValue;
    depOutputs: Readonly<Record<string, JsonValue>>;
  }): Promise<ReplayedEffect>;
}

/** A call's identity for matching: tool and arguments without the idempotency-key argument. */
function identity(tool: string, args: JsonValue | null): string {
  let normal = args;
  if (normal !== null && typeof normal === 'object' && !Array.isArray(normal)) {
    const { [IDEMPOTENCY_KEY_ARG]: _key, ...rest } = normal;
    normal = rest;
  }
  return canonicalHash({ tool, args: normal }, 'tool call identity');
}

/** A tool's name (what its debug points name), from its identity `[namespace/]name@version`. */
function toolName(identity: string): string {
  const at = identity.lastIndexOf('@');
  const name = at < 0 ? identity : identity.slice(0, at);
  return name.slice(name.lastIndexOf('/') + 1);
}

/**
 * What `step` of a run replaying `origin.of` takes from the original: its tool calls' receipts
 * and, for an effectful operator step, its recorded output; undefined when the run is no replay,
 * and for a step (not an effectful operator) whose calls are recorded in an action ledger the
 * tenant's runs share (same inputs, same keys, same receipts already). A regenerated run's
 * draft-producing steps get new keys: none of their calls, and no output, is the original's.
 */
export function replayedCalls(
  ledger: Ledger,
  origin: ReplayOrigin | null,
  tenantId: string,
  step: PlanStep,
  blobs?: { store: BlobStore; runId: string },
): ReplayedStep | undefined {
  if (origin === null) return undefined;
  const matchesCalls = step.idempotency.keyInputs.length === 0;
  if (!matchesCalls && !isEffectfulOperator(step)) return undefined;
  const fresh = origin.mode === 'regenerate' && isDraftProducing(step);
  let entries: Promise<LedgerEntry[]> | undefined;
  const originalEntries = () => (entries ??= ledger.list(origin.of, tenantId));
  // What stands for a blob of the original is of use only with the blob in this run.
  const copyBlobs = async (text: string | undefined) => {
    if (blobs === undefined || text === undefined) return;
    for (const m of parseBlobRefs(text)) {
      const content = await blobs.store.get(origin.of, m.id);
      // Gone from the original (its retention): this run meets a missing blob, as a resume would.
      if (content !== null) await blobs.store.put(blobs.runId, content);
    }
  };
  const reuse = async (receipt: JsonValue) => {
    await copyBlobs(refOfReceipt(receipt));
    return { receipt };
  };
  return {
    of: origin.of,
    matchesCalls,
    allowEffects: origin.allowEffects,
    async receiptOf(tool, args) {
      if (fresh) return null;
      const wanted = identity(tool, args);
      const matches = (e: LedgerEntry | null): e is LedgerEntry =>
        e !== null &&
        e.stepId === step.id &&
        e.state === 'SUCCEEDED' &&
        identity(e.tool, e.args) === wanted;
      // An operator's or atomic agent's call has the same id in the original, but for its run id.
      const callId = ledgerCallId({ tenantId, runId: origin.of, stepId: step.id, tool, args });
      const direct = await ledger.get(origin.of, tenantId, callId);
      if (matches(direct)) return reuse(direct.receipt);
      // Else (a granular turn's call, keyed by the model's call id): the step's calls, read once
      // per execution of the step.
      const hit = (await originalEntries()).find(matches);
      return hit === undefined ? null : reuse(hit.receipt);
    },
    async effect({ runId, runInput, depOutputs }) {
      if (!isEffectfulOperator(step)) return { kind: 'run' };
      const inputs = effectInputs(step, runInput, depOutputs);
      const callId = canonicalHash(
        { replayOf: origin.of, run: runId, step: step.id, inputs },
        'replayed step call',
      );
      const recorded = fresh ? undefined : origin.recorded[step.id];
      if (recorded !== undefined && recorded.inputs === inputs) {
        await copyBlobs(JSON.stringify(recorded.output));
        return {
          kind: 'reuse',
          output: recorded.output,
          sourceRunId: origin.of,
          callId,
          receipts: await reuseReceipts(runId),
        };
      }
      if (origin.allowEffects) return { kind: 'act' };
      let why: JsonValue;
      if (recorded === undefined) {
        why = fresh
          ? 'it produces a new draft in a regenerated run'
          : `run ${origin.of} recorded no output of it`;
      } else {
        const changed = step.dependsOn.filter(
          (d) => canonicalHash(depOutputs[d] ?? null, 'step output') !== recorded.deps[d],
        );
        why = `its inputs differ from run ${origin.of}'s (changed: ${changed.join(', ') || 'input'})`;
      }
      return {
        kind: 'approve',
        call: {
          callId,
          tool: `operator:${step.operator}`,
          args: { replayOf: origin.of, step: step.id, effects: step.effects, why },
        },
      };
    },
  };

  /**
   * The original's receipts of the step's calls, recorded in this run's ledger as a call of the
   * replay that found them would record them (a receipt recorded before stands).
   */
  async function reuseReceipts(runId: string): Promise<ReusedReceipt[]> {
    if (!matchesCalls) return [];
    const done: ReusedReceipt[] = [];
    const mine = (await originalEntries())
      .filter((e) => e.stepId === step.id && e.state === 'SUCCEEDED')
      .sort((x, y) => x.seq - y.seq);
    for (const e of mine) {
      const started = performance.now();
      const { receipt } = await reuse(e.receipt);
      const callId = ledgerCallId({ tenantId, runId, stepId: step.id, tool: e.tool, args: e.args });
      await ledger.record(
        { runId, stepId: step.id, tenantId, callId, tool: e.tool, args: e.args },
        { receipt },
      );
      debugPoint(DebugPoint.afterReceipt, toolName(e.tool));
      const durationMs = Math.round((performance.now() - started) * 1000) / 1000;
      done.push({ callId, tool: e.tool, durationMs });
    }
    return done;
  }
}

/** The meta fields a replaying run is stored with. */
export function replayMetaFields(origin: ReplayOrigin): Record<string, string> {
  return {
    replayOf: origin.of,
    replayMode: origin.mode,
    replayAllowEffects: origin.allowEffects ? '1' : '0',
    lineage: origin.lineage,
    replayFrom: origin.fromStep ?? '',
    reusedSteps: JSON.stringify(origin.reusedSteps),
    replayRecorded: JSON.stringify(origin.recorded),
  };
}

/** What a run's meta says it replays; null for a run that replays none. */
export function replayOriginOf(meta: Readonly<Record<string, string>>): ReplayOrigin | null {
  const of = meta['replayOf'];
  if (of === undefined || of === '') return null;
  const reused: unknown = JSON.parse(meta['reusedSteps'] ?? '[]');
  const recorded: unknown = JSON.parse(meta['replayRecorded'] ?? '{}');
  return {
    of,
    mode: meta['replayMode'] === 'regenerate' ? 'regenerate' : 'replay',
    allowEffects: meta['replayAllowEffects'] === '1',
    lineage: meta['lineage'] ?? of,
    fromStep:
      meta['replayFrom'] === undefined || meta['replayFrom'] === '' ? null : meta['replayFrom'],
    reusedSteps: Array.isArray(reused) ? reused.map(String) : [],
    recorded:
      typeof recorded === 'object' && recorded !== null && !Array.isArray(recorded)
        ? (recorded as Record<string, RecordedEffect>)
        : {},
  };
}
