/**
 * How the tool calls of a replaying run find the original run's receipts. A call is the original's
 * when it has the same step, tool identity (`name@version`) and arguments, the idempotency-key
 * argument the runtime fills in aside (it names the run): so a call whose arguments changed, e.g.
 * because a new draft came out of a model, never gets a receipt for other arguments.
 */
import { IDEMPOTENCY_KEY_ARG } from '../agents/tool-schema.js';
import { canonicalHash } from '../internal/canonical-hash.js';
import type { JsonValue } from '../internal/json.js';
import { isDraftProducing } from '../plan/replay-scope.js';
import type { PlanStep } from '../plan/schema.js';
import { parseBlobRefs, refOfReceipt, type BlobStore } from '../persistence/blob-store.js';
import { ledgerCallId, type Ledger, type LedgerEntry } from '../persistence/ledger.js';
import type { ReplayedCalls } from '../tools/call-tool.js';

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

/**
 * The receipts the tool calls of `step` reuse in a run replaying `origin.of`; undefined when they
 * reuse none the usual way: the run is no replay, or the step records its calls in an action
 * ledger the tenant's runs share (same inputs, same keys, same receipts already). A regenerated
 * run's draft-producing steps get new keys: none of their calls is the original's.
 */
export function replayedCalls(
  ledger: Ledger,
  origin: ReplayOrigin | null,
  tenantId: string,
  step: PlanStep,
  blobs?: { store: BlobStore; runId: string },
): ReplayedCalls | undefined {
  if (origin === null || step.idempotency.keyInputs.length > 0) return undefined;
  const fresh = origin.mode === 'regenerate' && isDraftProducing(step);
  let entries: Promise<LedgerEntry[]> | undefined;
  // A receipt that stands for a blob of the original is of use only with the blob in this run.
  const reuse = async (receipt: JsonValue) => {
    const ref = refOfReceipt(receipt);
    if (blobs !== undefined && ref !== undefined) {
      for (const m of parseBlobRefs(ref)) {
        const content = await blobs.store.get(origin.of, m.id);
        // Gone from the original (its retention): this run meets a missing blob, as a resume would.
        if (content !== null) await blobs.store.put(blobs.runId, content);
      }
    }
    return { receipt };
  };
  return {
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
      entries ??= ledger.list(origin.of, tenantId);
      const hit = (await entries).find(matches);
      return hit === undefined ? null : reuse(hit.receipt);
    },
  };
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
  };
}

/** What a run's meta says it replays; null for a run that replays none. */
export function replayOriginOf(meta: Readonly<Record<string, string>>): ReplayOrigin | null {
  const of = meta['replayOf'];
  if (of === undefined || of === '') return null;
  const reused: unknown = JSON.parse(meta['reusedSteps'] ?? '[]');
  return {
    of,
    mode: meta['replayMode'] === 'regenerate' ? 'regenerate' : 'replay',
    allowEffects: meta['replayAllowEffects'] === '1',
    lineage: meta['lineage'] ?? of,
    fromStep:
      meta['replayFrom'] === undefined || meta['replayFrom'] === '' ? null : meta['replayFrom'],
    reusedSteps: Array.isArray(reused) ? reused.map(String) : [],
  };
}
