/**
 * The start of a unit of work (phase 3 of those in `unit.ts`) and what its commit records
 * besides its result: the note beside the run that shows the unit RUNNING and tells a unit taken
 * over from one run for the first time, the unit's tool and model calls, its run (worker and
 * duration), and the model calls of an execution of it that died before its commit.
 */
import type { RunEventRecord } from '../persistence/snapshot-store.js';
import type { Reservation } from '../persistence/quota-store.js';
import { formatUnitNote, parseUnitNote } from '../persistence/unit-notes.js';
import type { StepState } from '../machines/kernel.js';
import type { ModelReply } from '../llm/messages.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import type { RuntimeCore } from './core.js';
import { reservationUnit } from '../execution/usage-meter.js';
import type { Unit, UnitHost } from './unit.js';

const NOTHING: Promise<null> = Promise.resolve(null);

/**
 * The start of an execution of a READY step. Not a commit of its own (a commit per step would
 * cost about as much as the step's own commit): the worker notes it beside the run with one
 * write it does not wait for, which status reads to show the step RUNNING, and returns the
 * `step.started` (READY → RUNNING, stamped now) that it commits with the execution's first
 * result, so the event stream records the interval the attempt ran. Nothing decides on the
 * note: which execution may run is still only the job's guard against the snapshot. The write
 * returns the note it replaced: the same execution noted by another worker is a unit taken over.
 * The unit's tool and model calls and its run (worker, duration) are recorded in its commit.
 */
export function startUnit(
  host: UnitHost,
  state: StepState,
  runId: string,
  stepId: string,
  turn?: number,
  noted = false,
  agent?: AgentUnit,
): Unit {
  const { core, identity } = host;
  const at = core.clock();
  const began = performance.now();
  const { attempt } = state;
  const pauses = state.pauses ?? 0;
  const where = { stepId, attempt, ...(turn === undefined ? {} : { turn }) };
  // The note is also written for every turn: a turn taken over is a unit of its own. A unit
  // that a commit of this job handed to it was noted by that commit: no other worker has run it.
  const previous =
    !noted && (state.status === 'READY' || turn !== undefined)
      ? core.stores.unitNotes
          .swap(runId, stepId, formatUnitNote(attempt, pauses, at, turn, identity))
          .catch(() => null)
      : NOTHING;
  const done: RunEventRecord[] = [];
  const worker = { host: identity.host, pid: identity.pid };
  return {
    started: state.status === 'READY' ? [{ type: 'step.started', stepId, attempt, at }] : [],
    recorder: {
      toolCalled: (c) => done.push({ type: 'tool.called', ...where, ...c, at: core.clock() }),
      modelCalled: (c) => done.push({ type: 'model.called', ...where, ...c, at: core.clock() }),
      modelRateLimited: (w) =>
        done.push({ type: 'model.rate_limited', ...where, ...w, at: core.clock() }),
    },
    async records() {
      const before = parseUnitNote(await previous);
      const out: RunEventRecord[] = [];
      // This unit was started before and never committed (a commit of it would have kept it
      // from running again): that execution died, lost its job's lock, or came back later.
      const again =
        before !== null &&
        before.attempt === attempt &&
        before.pauses === pauses &&
        before.turn === (turn ?? null);
      // Noted by another worker: it died (or lost its job's lock), and this worker runs the unit
      // again.
      if (again && before.worker != null && before.worker.id !== identity.id) {
        out.push({
          type: turn === undefined ? 'step.takenOver' : 'turn.takenOver',
          ...where,
          previousWorker: { host: before.worker.host, pid: before.worker.pid },
          previousStartedAt: before.at,
          worker,
          at,
        });
      }
      // The model calls those executions made are recorded here, since their commit never came.
      if (again && agent !== undefined) {
        const observed = new Set(done.map((d) => d['reservationId']));
        const unit = { runId, stepId, attempt, pauses, ...(turn === undefined ? {} : { turn }) };
        out.push(...(await uncommittedCalls(host, agent, unit, observed)));
      }
      out.push(...done, {
        type: turn === undefined ? 'step.ran' : 'turn.ran',
        ...where,
        worker,
        startedAt: at,
        durationMs: Math.round((performance.now() - began) * 1000) / 1000,
        at: core.clock(),
      });
      return out;
    },
  };
}

/** What the records of an agent step's unit need: the run's tenant, the step's model. */
export interface AgentUnit {
  tenantId: string;
  agent: AgentDefinition;
  mode: 'atomic' | 'granular';
}

/**
 * The reply the journal holds for the model call of reservation `r` of a step of mode `mode`:
 * a granular turn's, or, for an atomic attempt's call (its attempt named in the reservation's
 * id), that call's; null when there is none.
 */
export async function journaledReplyOf(
  core: RuntimeCore,
  runId: string,
  mode: 'atomic' | 'granular',
  r: Reservation,
): Promise<ModelReply | null> {
  if (mode === 'granular') return core.stores.journal.get(runId, r.stepId, r.turn);
  const unit = reservationUnit(r.id);
  if (unit === null) return null;
  const calls = await core.stores.journal.attemptCalls(runId, r.stepId, unit.attempt, r.turn + 1);
  return calls[r.turn]?.reply ?? null;
}

/**
 * The `model.called` records of the model calls that earlier executions of this unit made and
 * never committed (they stopped before their commit): its reservations (the reservation ids name
 * the attempt and pause that made them, and a granular turn's reservations its turn) that this
 * execution did not make. Those still open are settled first (a reply in the journal for it: its
 * usage; sent and unanswered: the baseline; never sent: nothing). A reservation that sent no
 * request is released, not a call, and has no record. Read only for a unit that ran before.
 */
async function uncommittedCalls(
  host: UnitHost,
  agent: AgentUnit,
  unit: { runId: string; stepId: string; attempt: number; pauses: number; turn?: number },
  observed: ReadonlySet<unknown>,
): Promise<RunEventRecord[]> {
  const { core } = host;
  const { runId, stepId, attempt, pauses, turn } = unit;
  const theirs = (r: Reservation): boolean => {
    if (r.stepId !== stepId || observed.has(r.id)) return false;
    if (turn !== undefined && r.turn !== turn) return false;
    const made = reservationUnit(r.id);
    return made !== null && made.attempt === attempt && made.pause === pauses;
  };
  try {
    let list = (await core.stores.quota.list(agent.tenantId, runId)).filter(theirs);
    if (list.some((r) => r.outcome === null)) {
      const where = { tenantId: agent.tenantId, runId, stepId, agent: agent.agent };
      await core.meter.settle(where, (r) => journaledReplyOf(core, runId, agent.mode, r));
      list = (await core.stores.quota.list(agent.tenantId, runId)).filter(theirs);
    }
    const where = { stepId, attempt, ...(turn === undefined ? {} : { turn }) };
    return list
      .filter((r) => (r.outcome === 'usage' || r.outcome === 'baseline') && r.charged !== null)
      .map((r) => {
        const charged = r.charged!;
        const end = r.reconciledAt ?? r.createdAt;
        return {
          type: 'model.called',
          ...where,
          reservationId: r.id,
          model: agent.agent.model,
          turn: r.turn,
          charged: r.outcome as 'usage' | 'baseline',
          inputTokens: charged.inputTokens,
          outputTokens: charged.outputTokens,
          costUsd: charged.microUsd / 1_000_000,
          durationMs: Math.max(0, end - (r.sentAt ?? r.createdAt)),
          // Made by an execution of the unit that never committed; recorded by this one.
          uncommitted: true,
          at: end,
        };
      });
  } catch (error) {
    // The record of the unit is not worth failing its commit for.
    core.log.warn(
      { runId, stepId, attempt, error: error instanceof Error ? error.message : String(error) },
      'could not read the model calls of an earlier execution of the unit',
    );
    return [];
  }
}
