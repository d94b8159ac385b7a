/**
 * Concurrency per key (a plan's or a step's `concurrency`): before a unit runs it takes its run's
 * slot (a plan's limit: held from the run's first unit until the run ends) and its step's slot (a
 * step's limit: held while the attempt or turn runs). A unit over a limit does not run and holds
 * no worker: it is parked (its job delayed, due again after {@link SLOT_RECHECK_MS} as a safety
 * check) among the key value's waiters, and woken when a slot is handed to it. The run notes the
 * wait (`flujo status` says for which key), and the unit's commit records how long it waited.
 *
 * Slots are leases. A step's slot lapses {@link STEP_SLOT_LEASE_MS} after its worker stopped
 * renewing it (a killed worker gives it back so). A run's slot is held across the run's waits, so
 * a lapsed one is checked before it is freed: a run still live keeps it, a run that ended (or is
 * gone) frees it. A run gives its slot back when it ends (`RuntimeQueues`: `releaseRunSlot`), and
 * its places among its steps' waiters.
 */
import type { JsonValue } from '../internal/json.js';
import { runSlotOf, stepSlotOf, type ConcurrencySlot } from '../plan/concurrency.js';
import type { SlotLease, Woken } from '../persistence/concurrency-store.js';
import type { RunEventRecord } from '../persistence/snapshot-store.js';
import type { RuntimeCore } from './core.js';
import { unitJobOf, type JobData, type JobSpec } from './jobs.js';
import type { RunMeta } from './runtime-meta.js';
import type { PlanStep } from '../plan/schema.js';

/** A step's slot lapses this long after its holder last renewed it (every third of it). */
export const STEP_SLOT_LEASE_MS = 5000;
/** A run's slot is renewed by each of its units; lapsed, it is checked against the run. */
export const RUN_SLOT_LEASE_MS = 30_000;
/** How long a waiter handed a slot has to come and take it. */
export const SLOT_HANDOVER_MS = 30_000;
/** A parked unit looks again after this long, even if no wake-up came. */
export const SLOT_RECHECK_MS = 5000;
/** How long a run's note of a waiting unit holds unless the unit parks again. */
const WAIT_NOTE_TTL_MS = 60_000;
/** The field of a run-level wait in the run's wait notes (no step id has a `:`). */
export const RUN_WAIT_FIELD = ':run';

/** The lease of a run's slot. */
export const RUN_LEASE: SlotLease = {
  leaseMs: RUN_SLOT_LEASE_MS,
  handoverMs: SLOT_HANDOVER_MS,
  freeLapsed: false,
};
/** The lease of a step's slot. */
export const STEP_LEASE: SlotLease = {
  leaseMs: STEP_SLOT_LEASE_MS,
  handoverMs: SLOT_HANDOVER_MS,
  freeLapsed: true,
};

/** A run's note of one of its units waiting for a slot (see `RunKeyKind.SlotWaits`). */
export interface SlotWaitNote {
  scope: 'run' | 'step';
  label: string;
  limit: number;
  since: number;
}

/** The slots a unit holds while it runs, and the records of its waits for them. */
export interface HeldSlots {
  /** A `concurrency.waited` record per slot the unit waited for. */
  records: RunEventRecord[];
  /** Gives back the step's slot (the run's is kept until the run ends). */
  release(): Promise<void>;
}

/** A unit parked for a slot: its job comes back after `retryAfterMs`, or when woken. */
export interface Parked {
  retryAfterMs: number;
  unit: JobSpec;
  /** Whether the unit was handed a slot meanwhile (then its job is woken at once). */
  parked: () => Promise<boolean>;
}

/**
 * The job that runs a unit again once it is parked: the job's own (delayed), or for a unit the
 * job carried (`held`), the job of its own it is given.
 */
export function wakeJobIdOf(chain: { self: string }, held: unknown, data: JobData): string {
  return held === undefined ? chain.self : unitJobOf(data).opts.jobId;
}

/** `unit` with `records` (its waits for slots) before its own in its commit. */
export function withRecords<U extends { records(): Promise<RunEventRecord[]> }>(
  unit: U,
  records: readonly RunEventRecord[],
): U {
  if (records.length === 0) return unit;
  return { ...unit, records: async () => [...records, ...(await unit.records())] };
}

/** The holder id of a step's slot: the run and the step (no step id has a `/`). */
export const stepHolder = (runId: string, stepId: string): string => `${runId}/${stepId}`;

/** Wakes the parked units a slot was handed to (their jobs, promoted). */
export async function wakeSlotWaiters(core: RuntimeCore, woken: readonly Woken[]): Promise<void> {
  for (const w of woken) await core.queues.wakeParked(w.wake);
}

/** Whether a run still holds its slot by right: it is there and has not ended. */
async function runIsLive(core: RuntimeCore, runId: string): Promise<boolean> {
  const env = await core.stores.store.tryLoad(runId, { outputs: false });
  return env !== null && env.snapshot.status === 'active' && env.snapshot.value !== 'failed';
}

/**
 * Takes `holder`'s slot of `slot`, or parks it. A run's slot whose holders' leases lapsed: each is
 * checked (a live run's lease renewed, an ended run's slot freed), then the slot asked for again.
 */
async function acquire(
  core: RuntimeCore,
  slot: ConcurrencySlot,
  holder: string,
  lease: SlotLease,
  wake: string,
): Promise<number | null | false> {
  const slots = core.stores.slots;
  let got = await slots.acquire(slot, holder, lease, wake);
  await wakeSlotWaiters(core, got.woken);
  if (!got.granted && got.lapsed.length > 0) {
    for (const other of got.lapsed) {
      if (await runIsLive(core, other)) await slots.renew(slot, other, lease.leaseMs);
      else await wakeSlotWaiters(core, await slots.release(slot, other, lease));
    }
    got = await slots.acquire(slot, holder, lease, wake);
    await wakeSlotWaiters(core, got.woken);
  }
  return got.granted ? got.waitedSince : false;
}

/**
 * Takes the slots a unit needs before it runs: its run's (a plan's `concurrency`), then its
 * step's (a step's `concurrency`). Returns the slots held, or the unit parked: `wakeJobId` is the
 * job that will run it again (its own job, or the one a carried unit is given).
 */
export async function takeSlots(
  core: RuntimeCore,
  data: JobData,
  admitted: { meta: RunMeta; step: PlanStep },
  wakeJobId: string,
): Promise<HeldSlots | Parked> {
  const { meta, step } = admitted;
  const { runId } = data;
  const runSlot = runSlotOf(meta.plan, meta.input, meta.tenantId);
  const stepSlot = stepSlotOf(meta.plan, step, meta.input, meta.tenantId);
  const held: HeldSlots = { records: [], release: () => Promise.resolve() };
  if (runSlot === null && stepSlot === null) return held;
  const wake = JSON.stringify({ runId, jobId: wakeJobId });
  const wants: [ConcurrencySlot, string, SlotLease, 'run' | 'step'][] = [];
  if (runSlot !== null) wants.push([runSlot, runId, RUN_LEASE, 'run']);
  if (stepSlot !== null) wants.push([stepSlot, stepHolder(runId, step.id), STEP_LEASE, 'step']);
  for (const [slot, holder, lease, scope] of wants) {
    const field = scope === 'run' ? RUN_WAIT_FIELD : step.id;
    const got = await acquire(core, slot, holder, lease, wake);
    if (got === false) return park(core, data, { slot, holder, scope, field }, wakeJobId);
    if (got !== null) {
      await core.redis.hdel(core.stores.keys.slotWaits(runId), field);
      held.records.push(waitedRecord(core, data, slot, scope, got));
    }
  }
  if (stepSlot !== null) held.release = holdStepSlot(core, stepSlot, stepHolder(runId, step.id));
  return held;
}

/** Renews a step's slot while its unit runs; the function returned gives it back. */
function holdStepSlot(core: RuntimeCore, slot: ConcurrencySlot, holder: string) {
  const renewing = setInterval(() => {
    core.stores.slots.renew(slot, holder, STEP_SLOT_LEASE_MS).catch(() => {});
  }, STEP_SLOT_LEASE_MS / 3);
  renewing.unref();
  return async () => {
    clearInterval(renewing);
    // A release that Redis does not take lapses with the lease.
    const woken = await core.stores.slots.release(slot, holder, STEP_LEASE).catch(() => []);
    await wakeSlotWaiters(core, woken);
  };
}

/** The record a unit's commit carries of its wait for a slot. */
function waitedRecord(
  core: RuntimeCore,
  data: JobData,
  slot: ConcurrencySlot,
  scope: 'run' | 'step',
  since: number,
): RunEventRecord {
  const at = core.clock();
  return {
    type: 'concurrency.waited',
    stepId: data.stepId!,
    attempt: data.attempt!,
    ...(data.turn === undefined ? {} : { turn: data.turn }),
    scope,
    key: slot.label,
    limit: slot.limit,
    since,
    waitedMs: Math.max(0, at - since),
    at,
  } satisfies Record<string, JsonValue>;
}

/** Notes the wait on the run (for status) and parks the unit until it is woken or rechecks. */
async function park(
  core: RuntimeCore,
  data: JobData,
  w: { slot: ConcurrencySlot; holder: string; scope: 'run' | 'step'; field: string },
  wakeJobId: string,
): Promise<Parked> {
  const note: SlotWaitNote = {
    scope: w.scope,
    label: w.slot.label,
    limit: w.slot.limit,
    since: core.clock(),
  };
  const key = core.stores.keys.slotWaits(data.runId);
  await core.redis
    .multi()
    .hsetnx(key, w.field, JSON.stringify(note))
    .pexpire(key, WAIT_NOTE_TTL_MS)
    .exec();
  const unit = unitJobOf(data);
  return {
    retryAfterMs: SLOT_RECHECK_MS,
    unit: { ...unit, opts: { ...unit.opts, jobId: wakeJobId } },
    parked: () => core.stores.slots.holds(w.slot, w.holder),
  };
}
