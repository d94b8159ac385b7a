/**
 * The life of one turn of a granular agent step, as one unit of work, with every rule of a turn
 * beside it. A granular step runs one turn per unit; its history, its turn count and its
 * fingerprint are committed with each turn, so a turn that did not commit changes nothing.
 *
 * 1. Admit: the turn must still be due and the run's budgets allow it (`admitUnit`), unless the
 *    job's chain admitted it already; the turn's journaled reply is asked for beside that read.
 *    Then the turn's own guard: it must be the turn the snapshot says comes next
 *    (`checkTurnOrder`): a committed turn runs nothing, and a gap is never appended over.
 * 2. Guard: the attempt's time limit and aborts (`attemptLimit`, `guardUnit`).
 * 3. Execute (`executeTurn`): the policies bound to the step's tags, before every turn; the
 *    fingerprint (the first turn claims it, every later one must match it, before anything is
 *    persisted); the model's reply, taken from the journal or asked for and journaled before any
 *    tool runs; the reply's tool calls, each through the ledger (`runToolCalls`).
 * 4. Commit (`commitTurn`): the turn's messages, `turn.committed`, and `step.succeeded` for a
 *    final answer or `step.failed` when the turn was the last one `maxTurns` allows
 *    (`turnEvents`), with the last read-only call's receipt, in one commit. A failed turn commits
 *    only the step's failure (`commitFailedTurn`); a pause commits the wait.
 * 5. Next: the next turn goes on in the same job when the chain may take it, else the queue
 *    gets what is due.
 *
 * The next turn's reservation (its model call's usage, reserved against the budgets) is the one
 * thing a turn does for the turn after it, and it is all here: prepared by the execution when the
 * job may go on (`prepareNext`), sent beside the commit when the job does go on with that turn
 * (`commitTurn`), and released wherever the next turn does not take it: when the commit hands on
 * nothing (`commitTurn`), and, in the turn that received it, after its guard and when it ends
 * (`runTurnUnit`, `turnUnit`).
 *
 * The phases every kind of unit shares are in `unit.ts`.
 */
import { MaxTurnsExceededError, ResumeError } from '../errors.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import type { JsonValue } from '../internal/json.js';
import type { StepState } from '../machines/kernel.js';
import type { AgentStep } from '../plan/schema.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import type { LedgerEntry, LedgerRecordOp } from '../persistence/ledger.js';
import type { ModelJournal, RecordedReply } from '../persistence/model-journal.js';
import type { FingerprintStore } from '../persistence/fingerprint-store.js';
import type { RunSnapshot } from '../machines/kernel.js';
import type { RunEvent } from '../schemas/events.js';
import { compareFingerprints, type AgentFingerprint } from '../agents/fingerprint.js';
import { toolCallsOf, type ChatMessage, type ModelReply } from '../llm/messages.js';
import { tokenizerReady } from '../llm/tokens.js';
import { traceAttempt } from '../observability/spans.js';
import type { ReplayedCalls } from '../tools/call-tool.js';
import { callGate } from '../execution/call-approval.js';
import { readOnlyEntries, runToolCalls } from '../execution/agent-tools.js';
import {
  agentInput,
  failureOf,
  loopDeps,
  resolveAgent,
  type StepExecutionDeps,
  type StepResult,
} from '../execution/execute-step.js';
import { enforceTaggedPolicies } from '../execution/policies.js';
import {
  conversationAgent,
  END,
  pendingSignals,
  signalMessage,
  type InboxReader,
} from '../execution/conversation.js';
import type { StoredSignal } from '../persistence/inbox.js';
import type { HistoryReader } from '../execution/ports.js';
import { claimFingerprint, stepFingerprint } from '../execution/agent-fingerprint.js';
import {
  askModel,
  shaped,
  toolContext,
  totalUsage,
  userMessage,
  type AgentLoopDeps,
  type AgentResult,
  type AgentStepArgs,
} from '../execution/model-call.js';
import type { JobData, JobSpec } from './jobs.js';
import { interruptMessage } from './runtime-queues.js';
import { startUnit } from './unit-start.js';
import { takeSlots, wakeJobIdOf, withRecords } from './concurrency.js';
import type { RunEventRecord } from '../persistence/snapshot-store.js';
import {
  admitUnit,
  agentUnit,
  attemptLimit,
  commitUnit,
  endsEarly,
  executionDepsFor,
  failed,
  guardUnit,
  mayGoOn,
  nextUnit,
  notifyFailures,
  outputsOf,
  pauseUnit,
  recording,
  replayOf,
  type Admitted,
  type Chain,
  type Unit,
  type UnitHost,
  type UnitOutcome,
} from './unit.js';
import { skipIfUntaken } from './condition.js';

const NOTHING: Promise<null> = Promise.resolve(null);

/** How many times one turn's model call is interrupted at most; then messages wait for the boundary. */
const MAX_INTERRUPTS = 10;

/** What one granular turn came to: the turn to commit, a failure, a budget stop, or a pause. */
export type TurnOutcome =
  { kind: 'turn'; turn: TurnResult } | Exclude<StepResult, { kind: 'succeeded' }>;

/**
 * One turn of a granular agent step, whole: the turn guard against the turns the snapshot says
 * are committed, the turn itself (its journaled model call and ledger-guarded tool calls), then
 * one commit of the turn's messages and its `turn.committed` (with `step.succeeded` for a final
 * answer, or `step.failed` when the turn was the last one allowed), and the next unit.
 */
export async function runTurnUnit(
  host: UnitHost,
  data: JobData,
  chain: Chain,
  jobSignal?: AbortSignal,
  held?: Admitted,
): Promise<UnitOutcome> {
  if (held === undefined) return turnUnit(host, data, chain, jobSignal);
  try {
    return await turnUnit(host, data, chain, jobSignal, held);
  } finally {
    // Release: a turn this job went on with may have had its reservation sent with the commit
    // before it, and ended without its model call taking it (a guard that stopped it, a throw).
    await host.core.meter.release(data.runId, data.stepId!, data.turn!);
  }
}

async function turnUnit(
  host: UnitHost,
  data: JobData,
  chain: Chain,
  jobSignal?: AbortSignal,
  held?: Admitted,
): Promise<UnitOutcome> {
  const { core } = host;
  // 1. Admit. The journaled reply is asked for beside the guard's read (one round trip for both):
  // a turn that runs needs it. A turn this job goes on with has nothing journaled: its turn was
  // committed a moment ago, by this job, so no worker can have taken the next one (a racing
  // worker's reply would still win when this one is recorded: the journal keeps the first).
  const journaled =
    held === undefined ? core.stores.journal.get(data.runId, data.stepId!, data.turn!) : NOTHING;
  journaled.catch(() => {});
  const admitted = held ?? (await admitUnit(host, data, chain.self));
  if (typeof admitted === 'string') return admitted;
  // A step whose condition is false is skipped before its first turn.
  const untaken = await skipIfUntaken(host, data, admitted, chain);
  if (untaken !== null) return untaken;
  const out = await checkTurnOrder(host, admitted, data, chain);
  if (out !== null) return out;
  // The run's and the step's concurrency slots, or the turn parked until it gets them.
  const slots = await takeSlots(core, data, admitted, wakeJobIdOf(chain, held, data));
  if ('parked' in slots) return slots;
  try {
    return await heldTurn(
      host,
      { data, chain, admitted, journaled, records: slots.records },
      {
        jobSignal,
        held,
      },
    );
  } finally {
    await slots.release();
  }
}

/** A turn admitted, with its slots: guarded, executed, and committed. */
async function heldTurn(
  host: UnitHost,
  a: {
    data: JobData;
    chain: Chain;
    admitted: Admitted;
    journaled: Promise<ModelReply | null>;
    records: RunEventRecord[];
  },
  job: { jobSignal: AbortSignal | undefined; held: Admitted | undefined },
): Promise<UnitOutcome> {
  const { core } = host;
  const { data, chain, admitted, journaled } = a;
  const { jobSignal, held } = job;
  const { env, state, meta } = admitted;
  const step = admitted.step as AgentStep;
  const { runId } = data;
  const stepId = data.stepId!;
  const attempt = data.attempt!;
  const turn = data.turn!;
  // 2. Guard, and 3. execute.
  const limit = await attemptLimit(host, runId, step, attempt);
  const depOutputs = await outputsOf(core, runId, env, step.dependsOn);
  const unit = withRecords(
    startUnit(
      host,
      state,
      runId,
      stepId,
      turn,
      admitted.noted,
      agentUnit(host, meta, step, state, turn),
    ),
    a.records,
  );
  const outcome = await guardUnit(host, { runId, stepId, attempt }, jobSignal, limit, (signal) =>
    executeTurn(
      { ...executionDepsFor(host, meta), recorder: unit.recorder },
      {
        step,
        state,
        runId,
        tenantId: meta.tenantId,
        runInput: meta.input,
        depOutputs,
        turn,
        journaled,
        signal,
        receiptsWithCommit: true,
        // Only a job that may go on with the next turn prepares its reservation.
        prepareNext: mayGoOn(chain),
        ...inboxOf(host, step, env),
        ...interruptOf(host, step, data),
        ...replayOf(host, runId, meta, step),
      },
    ),
  );
  // Release: a reservation sent ahead for this turn and not taken by its model call (the turn
  // failed before it, or took its reply from the journal) goes before anything is committed.
  if (held !== undefined) await core.meter.release(runId, stepId, turn);
  // 4. Commit.
  const early = await endsEarly(host, env, outcome, data);
  if (early !== null || outcome.kind === 'budget') return early ?? 'budget';
  // The turn commits nothing of itself: once the call is decided, it is taken again from its
  // journaled reply (the calls before the held one return their receipts).
  if (outcome.kind === 'paused') return pauseUnit(host, env, unit, data, outcome.call, chain);
  const c = { data, env, unit, chain, admitted };
  if (outcome.kind === 'failed') return commitFailedTurn(host, c, outcome.error);
  return commitTurn(host, c, outcome.turn);
}

/** Where a step with an inbox reads it: the run's inbox, from the run's cursors. */
function inboxOf(
  host: UnitHost,
  step: AgentStep,
  env: SnapshotEnvelope<RunSnapshot>,
): { inbox?: TurnArgs['inbox'] } {
  if (step.inbox === undefined) return {};
  const taken = env.snapshot.context.taken;
  return {
    inbox: {
      reader: host.core.stores.inbox,
      from: taken?.[step.inbox] ?? 0,
      endFrom: taken?.[END] ?? 0,
    },
  };
}

/**
 * A step with `onBusy: 'interrupt'`: its model call listens for the abort-channel message that a
 * signal of its inbox was sent (see `interruptMessage`), while it is in flight.
 */
function interruptOf(
  host: UnitHost,
  step: AgentStep,
  data: JobData,
): { interrupt?: TurnArgs['interrupt'] } {
  if (step.inbox === undefined || step.onBusy !== 'interrupt') return {};
  const key = interruptMessage(data.runId, step.id, data.attempt!, step.inbox);
  return {
    interrupt: {
      listen() {
        const controller = new AbortController();
        host.aborts.set(key, controller);
        return {
          signal: controller.signal,
          stop: () => {
            if (host.aborts.get(key) === controller) host.aborts.delete(key);
          },
        };
      },
    },
  };
}

/**
 * The turn's own guard, after admission: the turn must be the one the snapshot says comes next.
 * Null when it is; else what the unit came to, with what is due enqueued.
 */
async function checkTurnOrder(
  host: UnitHost,
  admitted: Admitted,
  data: JobData,
  chain: Chain,
): Promise<UnitOutcome | null> {
  const { core } = host;
  const { runId, stepId, attempt } = data;
  const turn = data.turn!;
  const stored = admitted.state.agent?.turns ?? 0;
  if (stored === turn) return null;
  // stored > turn: the turn is committed (a worker died after its commit): nothing runs and
  // nothing is reserved; the next unit is enqueued. stored < turn: a gap, which is never
  // appended over; the work resumes from the committed turn.
  if (stored < turn) {
    core.log.warn(
      { runId, stepId, attempt, turn, committedTurns: stored, error: 'resume_error' },
      'turn job ahead of the committed turns: resuming from the committed turn',
    );
  }
  await core.stores.acknowledgeRead(runId);
  await core.queues.enqueueDue(runId, admitted.env, chain.self);
  return stored > turn ? 'turn-committed' : 'turn-gap';
}

/** What a turn's commit works from: the unit, as admitted and started. */
interface TurnCommit {
  data: JobData;
  env: SnapshotEnvelope<RunSnapshot>;
  unit: Unit;
  chain: Chain;
  admitted: Admitted;
}

/** A failed turn commits nothing of itself: the step fails (or is retried) where it stood. */
async function commitFailedTurn(
  host: UnitHost,
  c: TurnCommit,
  error: Extract<TurnOutcome, { kind: 'failed' }>['error'],
): Promise<UnitOutcome> {
  const { core } = host;
  const { data, env, unit, chain } = c;
  const { runId } = data;
  const failure = failed(host, data.stepId!, data.attempt!, error);
  const applied = await core.host.apply(
    runId,
    [...unit.started, failure],
    env,
    await recording(unit),
  );
  notifyFailures(host, runId, [failure], applied, data.turn);
  await core.queues.enqueueDue(runId, applied.envelope, chain.self);
  return 'failed';
}

/**
 * The events a turn commits: its `turn.committed`, then `step.succeeded` for a final answer, or,
 * when it was the last turn `maxTurns` allows and the loop may not go on, `step.failed`.
 */
function turnEvents(
  host: UnitHost,
  step: AgentStep,
  data: JobData,
  state: StepState,
  result: TurnResult,
): RunEvent[] {
  const stepId = data.stepId!;
  const attempt = data.attempt!;
  const turn = data.turn!;
  const { messages, fingerprint, final } = result;
  const cursor = state.agent?.cursor ?? 0;
  const at = host.core.clock();
  // The inbox's signals the turn took (and an `end` signal), each moving the run's cursor of its
  // name in this commit: a signal is taken once, by the turn that committed it.
  const taken = [...result.taken, ...(result.end === undefined ? [] : [result.end])];
  const events: RunEvent[] = taken.map((signal) => ({
    type: 'signal.taken',
    stepId,
    attempt,
    turn,
    name: signal.name,
    index: signal.index,
    seq: signal.seq,
    ...(signal.id === null ? {} : { id: signal.id }),
    at,
  }));
  // A conversation woken with nothing to take commits no turn.
  if (messages.length > 0) {
    events.push({
      type: 'turn.committed',
      stepId,
      attempt,
      turn,
      cursor: cursor + messages.length,
      fingerprint,
      at,
    });
  }
  if (final !== null) {
    events.push({
      type: 'step.succeeded',
      stepId,
      attempt,
      output: final as unknown as JsonValue,
      at,
    });
  } else if (result.waits === true) {
    events.push({ type: 'wait.started', stepId, attempt, signal: step.inbox!, at });
  } else if (turn + 1 >= step.maxTurns) {
    const error = new MaxTurnsExceededError(stepId, step.maxTurns).toJSON();
    events.push(failed(host, stepId, attempt, error));
  }
  return events;
}

/**
 * Commits a turn (its messages appended to the history, its events, the last read-only call's
 * receipt) and goes on: with the next turn in this job when the commit made it the one unit to
 * do, its reservation sent beside the commit, else leaving what is due to the queue.
 */
async function commitTurn(host: UnitHost, c: TurnCommit, result: TurnResult): Promise<UnitOutcome> {
  const { core } = host;
  const { data, env, unit, chain } = c;
  const { state } = c.admitted;
  const step = c.admitted.step as AgentStep;
  const { runId } = data;
  const stepId = data.stepId!;
  const turn = data.turn!;
  const { messages, final, receipts, ahead } = result;
  const cursor = state.agent?.cursor ?? 0;
  const events = turnEvents(host, step, data, state, result);
  // Send: the next turn's reservation, sent beside this commit when this job takes the next
  // turn: right after it in the same write (the commit is sent once its options are taken), so
  // the commit's own answer does not wait on the reservation.
  const onNext =
    ahead === undefined || final !== null
      ? undefined
      : (next: JobSpec) => {
          if (next.data.stepId === stepId && next.data.turn === turn + 1) {
            queueMicrotask(() => ahead.reserve());
          }
        };
  let handedOn = false;
  try {
    const { applied, next } = await commitUnit(host, {
      data,
      env,
      unit,
      events,
      chain,
      base: {
        appends: [core.stores.history.appendOp(runId, stepId, cursor, messages)],
        // The last read-only call's receipt, written with the turn: one write fewer per turn.
        ...(receipts.length === 0 ? {} : { ledgerRecords: receipts }),
      },
      ...(onNext === undefined ? {} : { onNext }),
    });
    if (applied.committed && messages.length > 0) {
      host.histories.committed(runId, stepId, cursor, messages);
    }
    notifyFailures(host, runId, events, applied, turn);
    debugPoint(DebugPoint.afterCommit, `${stepId}:${turn}`);
    // 5. Next.
    const ended = final !== null ? 'succeeded' : result.waits === true ? 'waiting' : 'turn';
    if (result.waits === true && applied.committed) {
      // A message sent while this turn committed (its sender saw the step RUNNING and woke
      // nothing) is found by reading the inbox again after the commit.
      const wakes = await core.queues.signalWakes(runId, applied.envelope.snapshot);
      if (wakes.length > 0) await core.queues.add(wakes);
    }
    if (next !== null) {
      const going = await nextUnit(host, next, applied, chain, ended);
      handedOn = typeof going !== 'string';
      return going;
    }
    await core.queues.enqueueDue(runId, applied.envelope, chain.self);
    return ended;
  } finally {
    // Release: whatever this unit does not hand on to the next turn, its reservation.
    if (!handedOn && onNext !== undefined) await core.meter.release(runId, stepId, turn + 1);
  }
}

/** Where turn `turn` of a granular step executes, as its unit was admitted. */
export interface TurnExecution {
  step: AgentStep;
  state: StepState;
  runId: string;
  tenantId: string;
  runInput: JsonValue;
  /** Outputs of the steps this one depends on, by step id. */
  depOutputs: Record<string, JsonValue>;
  turn: number;
  signal: AbortSignal;
  journaled?: Promise<ModelReply | null>;
  /** In a run that replays another: the original's receipts. */
  replay?: ReplayedCalls;
  /** Leave the last read-only receipt for the turn's commit (see `TurnArgs`). */
  receiptsWithCommit?: boolean;
  /** Prepare the next turn's reservation (see `TurnArgs`). */
  prepareNext?: boolean;
  /** A step with an inbox: where it is read, and the run's cursors (see `TurnArgs`). */
  inbox?: TurnArgs['inbox'];
  /** A step with `onBusy: 'interrupt'` (see `TurnArgs`). */
  interrupt?: TurnArgs['interrupt'];
}

/**
 * Executes turn `turn` of a granular agent step (see {@link takeTurn}) with the same choke point
 * as a step: whatever it throws becomes a failure with its retryability, a budget hit is returned
 * apart.
 */
export function executeTurn(deps: StepExecutionDeps, args: TurnExecution): Promise<TurnOutcome> {
  const { runId, step, state, turn } = args;
  const ids = { runId, stepId: step.id, attempt: state.attempt, turn };
  return traceAttempt(deps.trace ?? null, ids, step.kind, () => takeOneTurn(deps, args));
}

async function takeOneTurn(deps: StepExecutionDeps, args: TurnExecution): Promise<TurnOutcome> {
  const { step, state, runId, tenantId, signal } = args;
  const gate = callGate(state);
  try {
    const resolved = resolveAgent(deps, step);
    const agent = step.conversation === true ? conversationAgent(resolved) : resolved;
    // The worker builds the agents' tokenizers when it starts: the turn counts with them.
    await tokenizerReady(agent.model);
    // Tagged policies: before every turn, a turn being the unit a granular step runs at a time.
    await enforceTaggedPolicies(deps.policies, step, {
      input: step.input === undefined ? args.runInput : step.input,
      runInput: args.runInput,
      deps: args.depOutputs,
      runId,
      tenantId,
      signal,
    });
    const turn = await takeTurn(
      {
        ...loopDeps(deps, { runId, step, attempt: state.attempt }, gate, args.replay),
        journal: deps.journal,
        fingerprints: deps.fingerprints,
        histories: deps.histories,
        policyVersion: deps.policyVersion,
        ...(deps.results === undefined ? {} : { results: deps.results }),
      },
      {
        agent,
        step,
        input: agentInput(step, args.runInput, args.depOutputs),
        runId,
        tenantId,
        attempt: state.attempt,
        pause: state.pauses ?? 0,
        signal,
        turn: args.turn,
        cursor: state.agent?.cursor ?? 0,
        fingerprint: state.agent?.fingerprint ?? null,
        ...(deps.budget === undefined ? {} : { budget: deps.budget }),
        ...(args.journaled === undefined ? {} : { journaled: args.journaled }),
        ...(args.receiptsWithCommit === true ? { receiptsWithCommit: true } : {}),
        ...(args.prepareNext === true ? { prepareNext: true } : {}),
        ...(args.inbox === undefined ? {} : { inbox: args.inbox }),
        ...(args.interrupt === undefined ? {} : { interrupt: args.interrupt }),
      },
    );
    return { kind: 'turn', turn };
  } catch (thrown) {
    return failureOf(thrown, gate);
  }
}

/** What a granular turn needs beyond an agent loop's needs. */
export interface TurnDeps extends AgentLoopDeps {
  journal: ModelJournal;
  fingerprints: FingerprintStore;
  /** The step's committed history. */
  histories: HistoryReader;
  /** The runtime's `policyVersion`, part of the fingerprint. */
  policyVersion?: string | undefined;
}

/** Where a granular turn runs: the step, and what its committed turns left behind. */
export interface TurnArgs extends AgentStepArgs {
  /** The turn to take (0-based): the number of turns committed so far. */
  turn: number;
  /** Messages the committed history holds. */
  cursor: number;
  /** The fingerprint hash the first turn stored, or null before the first commit. */
  fingerprint: string | null;
  /** The turn's journaled reply, when the caller already asked for it. @defaultValue read here */
  journaled?: Promise<ModelReply | null>;
  /**
   * The receipt of the turn's last tool call, when it is a read-only call that ran, is left for
   * the caller's commit to write (see {@link TurnResult.receipts}). @defaultValue written here
   */
  receiptsWithCommit?: boolean;
  /**
   * The caller may take the next turn itself, with its reservation sent beside this turn's commit
   * (see {@link TurnResult.ahead}). @defaultValue false: nothing is prepared
   */
  prepareNext?: boolean;
  /**
   * A step with an inbox: where its signals are read, and the run's cursors of the inbox's name
   * (`from`) and of `end` (`endFrom`).
   */
  inbox?: { reader: InboxReader; from: number; endFrom: number };
  /**
   * A step with `onBusy: 'interrupt'`: `listen()` while its model call is in flight; the signal
   * it returns aborts when a message of the inbox is sent.
   */
  interrupt?: { listen(): { signal: AbortSignal; stop(): void } };
}

/** What a granular turn came to; the caller commits it. */
export interface TurnResult {
  /** The messages this turn adds to the history, in order. */
  messages: ChatMessage[];
  /** The fingerprint hash the turn ran under. */
  fingerprint: string;
  /** The step's result when the reply was a final answer; null when the loop goes on. */
  final: AgentResult | null;
  /** The inbox signals the turn took as user messages (before its model call), in send order. */
  taken: StoredSignal[];
  /** A conversation's `end` signal, taken: the step ends with `final`. */
  end?: StoredSignal;
  /** A conversation waits for its next message (no other is in its inbox yet). */
  waits?: boolean;
  /** Ledger receipts the turn's commit must write (with `receiptsWithCommit`); else empty. */
  receipts: LedgerRecordOp[];
  /**
   * The usage reservation of the next turn's model call, prepared and not sent (see
   * `UsageMeter.prepare`): the caller sends it beside the turn's commit when the same process
   * takes the next turn. Absent for a final answer, a last allowed turn, an unmetered step, or
   * without `prepareNext`.
   */
  ahead?: { reserve(): void };
}

/**
 * One turn of a granular agent step: checks the fingerprint (a mismatch is an irrecoverable
 * `ResumeError` and nothing runs), takes the model's reply from the journal or asks the model and
 * journals the reply before any tool runs, then runs the reply's tool calls through the ledger
 * keyed by `sha256(runId:stepId:turn:toolCallId)`. Nothing here commits: a failure leaves the
 * committed history and turn as they were.
 */
export async function takeTurn(deps: TurnDeps, args: TurnArgs): Promise<TurnResult> {
  const { step, runId, turn, cursor } = args;
  const current = await checkFingerprint(deps, args);
  const history = cursor === 0 ? [] : await deps.histories.read(runId, step.id, cursor);
  // The inbox: the signals the turn takes, the same ones a journaled reply answered.
  const journaled = await (args.journaled ?? deps.journal.get(runId, step.id, turn));
  let taken = await takenSignals(args, journaled);
  if (step.conversation === true && taken.length === 0 && waitedBefore(history)) {
    return wokenEmpty(deps, args, history, current.hash);
  }
  const added: ChatMessage[] = turn === 0 ? [userMessage(args.input)] : [];
  const asked = { ...args, journaled: Promise.resolve(journaled) };
  let replied: Awaited<ReturnType<typeof replyOf>> | undefined;
  for (let tries = 0; replied === undefined; tries++) {
    // onBusy 'interrupt': a message sent while the model call is in flight aborts it (never a
    // tool call: they run on the turn's own signal), and the turn asks again with the message.
    const listening =
      journaled === null && tries < MAX_INTERRUPTS ? args.interrupt?.listen() : undefined;
    const on =
      listening === undefined
        ? asked
        : { ...asked, signal: AbortSignal.any([args.signal, listening.signal]) };
    try {
      const sent = [...history, ...added, ...taken.map(signalMessage)];
      replied = await replyOf(deps, on, sent, taken.length);
    } catch (error) {
      if (listening?.signal.aborted !== true || args.signal.aborted) throw error;
      taken = await takenSignals(args, null);
    } finally {
      listening?.stop();
    }
  }
  const { reply, known } = replied;
  if (args.inbox !== undefined && (reply.inboxTaken ?? 0) !== taken.length) {
    // Another worker's reply to the same turn was journaled first: the signals it answered.
    taken = await pendingSignals(
      args.inbox.reader,
      runId,
      step.inbox!,
      args.inbox.from,
      reply.inboxTaken ?? 0,
    );
  }
  added.push(...taken.map(signalMessage), reply.message);
  const calls = toolCallsOf(reply.message);
  const base = { fingerprint: current.hash, receipts: [] as LedgerRecordOp[], taken };
  if (calls.length === 0) {
    const conversation = [...history, ...added];
    const final = () => finalResult(deps, args, conversation, turn + 1);
    if (step.conversation !== true || turn + 1 >= step.maxTurns) {
      return { ...base, messages: added, final: await final() };
    }
    return { ...base, messages: added, ...(await afterReply(args, taken.length, final)) };
  }
  // Tools: each call through the ledger, the last read-only receipt left for the commit.
  const receipts: LedgerRecordOp[] = [];
  const context = toolContext(args, turn, 'granular');
  const deferred = args.receiptsWithCommit === true ? receipts : undefined;
  const results = await runToolCalls(deps, context, calls, known, deferred);
  debugPoint(DebugPoint.afterTools, `${step.id}:${turn}`);
  added.push(...results);
  const out: TurnResult = { ...base, messages: added, final: null, receipts };
  if (step.conversation === true && calls.some((c) => c.name === END)) {
    // The model ended the conversation: its last reply is the step's output.
    out.final = await finalResult(deps, args, [...history, ...added], turn + 1);
    return out;
  }
  const ahead = await prepareNext(deps, args, [...history, ...added]);
  if (ahead !== undefined) out.ahead = ahead;
  return out;
}

/**
 * The inbox signals a turn takes as user messages, from the run's cursor of the inbox's name: as
 * many as a journaled reply of the turn answered, else every one sent so far.
 */
function takenSignals(args: TurnArgs, journaled: ModelReply | null): Promise<StoredSignal[]> {
  const { inbox, step, runId } = args;
  if (inbox === undefined || step.inbox === undefined) return Promise.resolve([]);
  const count = journaled === null ? undefined : (journaled.inboxTaken ?? 0);
  return pendingSignals(inbox.reader, runId, step.inbox, inbox.from, count);
}

/** The history ends with a reply without tool calls: a conversation that waited for a message. */
function waitedBefore(history: readonly ChatMessage[]): boolean {
  const last = history[history.length - 1];
  return last?.role === 'assistant' && toolCallsOf(last).length === 0;
}

/**
 * A conversation woken with no message to take: an `end` signal ends it (its last reply is the
 * output; no model call), else it waits again.
 */
async function wokenEmpty(
  deps: TurnDeps,
  args: TurnArgs,
  history: ChatMessage[],
  fingerprint: string,
): Promise<TurnResult> {
  const base = { messages: [], fingerprint, receipts: [], taken: [] };
  const end = await endSignal(args);
  if (end === null) return { ...base, final: null, waits: true };
  return { ...base, final: await finalResult(deps, args, history, args.turn), end };
}

/** The `end` signal the conversation may take now, or null. */
async function endSignal(args: TurnArgs): Promise<StoredSignal | null> {
  const { inbox, runId } = args;
  return inbox === undefined ? null : inbox.reader.read(runId, END, inbox.endFrom);
}

/**
 * A conversation's reply without tool calls: an `end` signal ends the step, a message sent while
 * the model answered is taken by the next turn at once, else the step waits for its next message.
 */
async function afterReply(
  args: TurnArgs,
  taken: number,
  final: () => Promise<AgentResult>,
): Promise<Pick<TurnResult, 'final' | 'end' | 'waits'>> {
  const { inbox, runId, step } = args;
  const end = await endSignal(args);
  if (end !== null) return { final: await final(), end };
  const next = await inbox!.reader.read(runId, step.inbox!, inbox!.from + taken);
  return { final: null, waits: next === null };
}

/** The step's result: its last reply's text, with its turns, tool calls and usage. */
async function finalResult(
  deps: TurnDeps,
  args: TurnArgs,
  conversation: readonly ChatMessage[],
  turns: number,
): Promise<AgentResult> {
  const replies = await deps.journal.replies(args.runId, args.step.id, turns);
  let answer: string | null = null;
  for (let i = conversation.length - 1; i >= 0 && answer === null; i--) {
    const m = conversation[i]!;
    if (m.role === 'assistant' && typeof m.content === 'string' && m.content !== '') {
      answer = m.content;
    }
  }
  return {
    answer,
    turns,
    toolCalls: conversation.filter((m) => m.role === 'tool').length,
    usage: totalUsage(replies),
  };
}

/**
 * The fingerprint the turn runs under. A turn after the first must run under the one the first
 * stored (else an irrecoverable `ResumeError` naming what changed). Before the turn persists
 * anything (its reservation, its journaled reply, a held call): the first turn of the step claims
 * it, or finds the one an execution of it that did not commit claimed (a crash, a pause for an
 * approval), which it must match like later turns.
 */
async function checkFingerprint(deps: TurnDeps, args: TurnArgs): Promise<AgentFingerprint> {
  const { agent, step, runId } = args;
  const current = stepFingerprint(agent, step, args.input, {
    price: deps.meter?.priceOf(agent.model) ?? null,
    policyVersion: deps.policyVersion,
  });
  if (args.fingerprint !== null && args.fingerprint !== current.hash) {
    const stored = await deps.fingerprints.get(runId, step.id);
    const changed = stored === null ? null : compareFingerprints(stored, current);
    throw changed === null
      ? new ResumeError(
          `Cannot resume step "${step.id}" of run "${runId}": its fingerprint changed since the run started (what changed is not on record); start a new run, or restore the agent and step as they were.`,
          { recoverable: false, runId, stepId: step.id },
        )
      : ResumeError.fingerprintMismatch(changed.field, { runId, stepId: step.id });
  }
  if (args.fingerprint === null) await claimFingerprint(deps.fingerprints, runId, step.id, current);
  return current;
}

/**
 * The journal: the turn's reply as journaled, or, when none is, the model's reply to
 * `conversation`, journaled before any of its tools runs (the first reply recorded for the turn
 * wins, so a worker racing this one uses the same reply). With a fresh reply comes what the
 * ledger holds for its read-only calls, read beside the journal write.
 */
async function replyOf(
  deps: TurnDeps,
  args: TurnArgs,
  conversation: ChatMessage[],
  inboxTaken: number,
): Promise<{ reply: ModelReply; known?: ReadonlyMap<string, Promise<LedgerEntry | null>> }> {
  const { agent, step, runId, tenantId, turn } = args;
  const journaled = await (args.journaled ?? deps.journal.get(runId, step.id, turn));
  if (journaled !== null) {
    if (deps.meter !== undefined) {
      // The reply of a worker that stopped after journaling it: settle what that worker left open.
      await deps.meter.settle({ tenantId, runId, stepId: step.id, agent }, (r) =>
        r.turn === turn ? Promise.resolve(journaled) : deps.journal.get(runId, step.id, r.turn),
      );
    }
    return { reply: journaled };
  }
  const sent: {
    recording?: Promise<RecordedReply>;
    entries?: Map<string, Promise<LedgerEntry | null>>;
  } = {};
  const journal = (fresh: ModelReply): Promise<RecordedReply> => {
    debugPoint(DebugPoint.afterModelReply, `${step.id}:${turn}`);
    const reply = args.inbox === undefined ? fresh : { ...fresh, inboxTaken };
    const recording = deps.journal.record(runId, step.id, turn, reply);
    recording.catch(() => {}); // met below
    // Sent with the journal write: what the ledger holds for the reply's read-only calls.
    const where = { agent, runId, stepId: step.id, tenantId, turn };
    sent.entries = readOnlyEntries(deps.ledger, where, toolCallsOf(fresh.message));
    return (sent.recording = recording);
  };
  // A metered call journals its reply beside its reconcile, in the same round trip.
  const messages = await shaped(deps, args, conversation);
  const fresh = await askModel(deps, args, turn, messages, (r) => {
    void journal(r); // met below, through `sent`
  });
  const recorded = await (sent.recording ?? journal(fresh));
  debugPoint(DebugPoint.afterJournal, `${step.id}:${turn}`);
  return recorded.recorded
    ? { reply: recorded.reply, ...(sent.entries === undefined ? {} : { known: sent.entries }) }
    : { reply: recorded.reply };
}

/**
 * The next turn's reservation, prepared and not sent (see `UsageMeter.prepare`), when the caller
 * may take the next turn itself, the step is metered and `maxTurns` allows a next turn.
 * `conversation` is what the next turn will send: this turn's history and messages, shaped as
 * for the model.
 */
async function prepareNext(
  deps: TurnDeps,
  args: TurnArgs,
  conversation: ChatMessage[],
): Promise<{ reserve(): void } | undefined> {
  const { agent, step, runId, tenantId, turn } = args;
  if (args.prepareNext !== true || deps.meter === undefined || turn + 1 >= step.maxTurns) {
    return undefined;
  }
  const messages =
    deps.context === undefined
      ? conversation
      : await deps.context.prepare({ agent, step, runId, messages: conversation });
  return deps.meter.prepare({
    agent,
    tenantId,
    runId,
    stepId: step.id,
    turn: turn + 1,
    attempt: args.attempt,
    pause: args.pause ?? 0,
    messages,
    budget: args.budget,
    stepBudget: step.budgets,
  });
}
