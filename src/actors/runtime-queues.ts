import { Job, Queue } from 'bullmq';
import { InputValidationError } from '../errors.js';
import type { Redis } from 'ioredis';
import type { AppliedEvent } from './run-host.js';
import type { StreamedText } from '../execution/ports.js';
import type { JsonValue } from '../internal/json.js';
import { runSteps, type RunSnapshot, type StepChange } from '../machines/kernel.js';
import { createInboxStore, type InboxStore } from '../persistence/inbox.js';
import { createMapStore, type MapStore } from '../persistence/map-store.js';
import type { PlannedAction } from '../machines/types.js';
import { END } from '../execution/conversation.js';
import type { Plan } from '../plan/schema.js';
import type { Keys } from '../persistence/keys.js';
import { createStreamWatcher, type StreamWatcher } from '../persistence/stream-watcher.js';
import { createRunChannels, type RunChannels } from '../persistence/run-channels.js';
import { readRunStatus } from '../persistence/run-lookups.js';
import type { RuntimeMeta } from './runtime-meta.js';
import { runSlotOf, stepSlotOf, type ConcurrencySlot } from '../plan/concurrency.js';
import {
  createConcurrencySlots,
  type ConcurrencySlots,
  type SlotLease,
} from '../persistence/concurrency-store.js';
import { RUN_LEASE, STEP_LEASE, stepHolder } from './concurrency.js';
import {
  bullPriority,
  dueJobs,
  JobName,
  parseCarrierNote,
  deadlineJobId,
  isUnitJobOf,
  plannedJobs,
  unitJobsGlob,
  signalWakeJob,
  childWakeJob,
  timerJobId,
  itemJob,
  mapEndJob,
  type JobData,
  type JobSpec,
} from './jobs.js';

/** The abort-channel message naming one running attempt. */
export function abortMessage(runId: string, stepId: string, attempt: number): string {
  return `${runId}\n${stepId}\n${attempt}`;
}

/**
 * The abort-channel message that a signal `name` was sent while attempt `attempt` of a granular
 * step may be in a model call: a step whose inbox is `name`, with `onBusy: 'interrupt'`, aborts
 * that call and takes its turn again with the message.
 */
export function interruptMessage(
  runId: string,
  stepId: string,
  attempt: number,
  name: string,
): string {
  return `${abortMessage(runId, stepId, attempt)}\ninbox\n${name}`;
}

const JOB_DEFAULTS = {
  // Completed ids are kept a while so that a re-add of the same unit is a no-op (a re-add after
  // that is harmless too: the job's guard finds the unit done); at most a day, at most 20 000.
  removeOnComplete: { age: 24 * 3600, count: 20_000 },
  removeOnFail: { age: 7 * 24 * 3600, count: 20_000 },
  // Our processor throws only for infrastructure trouble (step failures are events): retry it.
  attempts: 25,
  backoff: { type: 'exponential', delay: 100 },
};

/** What a runtime's queues are built with. */
export interface RuntimeQueuesOptions {
  /** The runtime's connection: channels publish on it; the watcher duplicates it. */
  redis: Redis;
  /** The connection the BullMQ queue uses (the caller's to close). */
  queueConnection: Redis;
  /** Opens the subscriber connection, on the first subscription (closed by {@link RuntimeQueues.close}). */
  openSubscriber: () => Redis;
  /** The names of the runtime's keys. */
  keys: Keys;
  /** The BullMQ queue name: the queue of the runs this runtime starts, and of its schedules. */
  queueName: string;
  /** The runtime's clock, epoch ms. */
  clock: () => number;
  /** The runs' metadata: a run that ended gets its expiry from it. */
  meta: RuntimeMeta;
  /**
   * How long finished runs are kept (`retention.finishedRunsMs`): a finished job is kept no longer
   * (its run is gone then, and a job added again under its id finds nothing to do). @defaultValue
   * a day
   */
  finishedRunsMs?: number;
}

/**
 * How work and news leave a runtime: the BullMQ queue and the jobs added to it (due units,
 * planned units, deadlines), the pub/sub channels (aborts, streamed text, progress) with one
 * subscriber connection for every listener, and the watcher of runs' event streams.
 */
export class RuntimeQueues {
  /** The BullMQ queue name. */
  readonly queueName: string;
  /** Aborts, streamed text and progress, published live. */
  readonly channels: RunChannels;
  readonly #queues = new Map<string, Queue>();
  #watcher: StreamWatcher | undefined;
  #subscriber: Redis | undefined;
  readonly #listeners = new Map<string, Set<(message: string) => void>>();
  readonly #redis: Redis;
  readonly #queueConnection: Redis;
  readonly #openSubscriber: () => Redis;
  readonly #keys: Keys;
  readonly #clock: () => number;
  readonly #meta: RuntimeMeta;
  readonly #inbox: InboxStore;
  readonly #slots: ConcurrencySlots;
  readonly #maps: MapStore;
  readonly #jobDefaults: typeof JOB_DEFAULTS;
  readonly #finishedRunsMs: number | undefined;

  /**
   * Called each time a run is found ended, before it leaves the active runs (so that a crash in it
   * is met again by the run's next sweep): a child run wakes its parent, a cancelled parent cancels
   * its children (`child.ts`: `runEnded`, set by the runtime core).
   */
  onEnded: ((runId: string, snapshot: RunSnapshot) => Promise<void>) | undefined;

  /** Opens nothing: the queue, the subscriber and the watcher are made on first use. */
  constructor(options: RuntimeQueuesOptions) {
    this.#redis = options.redis;
    this.#queueConnection = options.queueConnection;
    this.#openSubscriber = options.openSubscriber;
    this.#keys = options.keys;
    this.queueName = options.queueName;
    this.#clock = options.clock;
    this.#meta = options.meta;
    this.channels = createRunChannels(options.redis, options.keys);
    this.#inbox = createInboxStore(options.redis, options.keys);
    this.#slots = createConcurrencySlots(options.redis, options.keys);
    this.#maps = createMapStore(options.redis, options.keys);
    this.#finishedRunsMs = options.finishedRunsMs;
    const keptS = Math.ceil((options.finishedRunsMs ?? Infinity) / 1000);
    this.#jobDefaults =
      keptS >= JOB_DEFAULTS.removeOnComplete.age
        ? JOB_DEFAULTS
        : {
            ...JOB_DEFAULTS,
            removeOnComplete: { ...JOB_DEFAULTS.removeOnComplete, age: keptS },
          };
  }

  /**
   * The runtime's queue, made on first use: BullMQ writes the queue's meta when it makes one, so a
   * runtime that only reads (status, reproduce) writes nothing.
   */
  get queue(): Queue {
    return this.queueNamed(this.queueName);
  }

  /** The queue named `name` (made on first use, then kept), under the runtime's queue prefix. */
  queueNamed(name: string): Queue {
    let queue = this.#queues.get(name);
    if (queue === undefined) {
      queue = new Queue(name, {
        connection: this.#queueConnection,
        prefix: this.#keys.queuePrefix(),
        defaultJobOptions: this.#jobDefaults,
      });
      queue.on('error', () => {});
      this.#queues.set(name, queue);
    }
    return queue;
  }

  /**
   * The name of the queue the run's units go to: the one its meta records (the queue of the runtime
   * that started it, or the start's `queue`), or this runtime's for a run that records none (one
   * started before runs recorded their queue).
   */
  async runQueueName(runId: string): Promise<string> {
    return (await this.#route(runId)).queue;
  }

  /**
   * Where the run's unit jobs go and with which BullMQ priority (see `bullPriority`): from its
   * meta, or this runtime's queue and the default priority for a run whose meta is gone (removed
   * meanwhile: its job, if any, finds no run and ends).
   */
  async #route(runId: string): Promise<{ queue: string; priority: number }> {
    try {
      const meta = await this.#meta.read(runId);
      return { queue: meta.queue ?? this.queueName, priority: bullPriority(meta.priority) };
    } catch (error) {
      if (error instanceof InputValidationError) {
        return { queue: this.queueName, priority: bullPriority(0) };
      }
      throw error;
    }
  }

  /** The queue the run's units go to (see {@link runQueueName}). */
  async runQueue(runId: string): Promise<Queue> {
    return this.queueNamed(await this.runQueueName(runId));
  }

  /**
   * Adds every job the run's snapshot says is due (ids make repeats harmless), but for a unit that
   * a chained job still carries (see the worker): that job runs it, so it gets no job of its own
   * while the carrier is active. `self` is the id of the calling job: a carrier that was
   * redelivered (its worker died mid-chain) hands the unit it carried to a job of its own.
   */
  async enqueueDue(
    runId: string,
    envelope: { snapshot: RunSnapshot; carrier?: string },
    self?: string,
  ): Promise<void> {
    const { snapshot } = envelope;
    const jobs = await this.#dueUncarried(runId, envelope, self);
    if (jobs.length > 0) await this.add(jobs);
    await this.#mapsDue(runId, snapshot);
    if (snapshot.status !== 'active' || snapshot.value === 'failed')
      await this.#ended(runId, snapshot);
  }

  /**
   * The jobs of the run's RUNNING map steps, added again: each item in flight (a dispatch lost by
   * a worker that died between an item's commit and the next item's enqueue), and the finish of a
   * map whose items are over. An item in flight whose job finished without committing it (it
   * gave up) has that job replaced. Ids are deterministic: a job that exists is not added twice.
   * Nothing to read for a run without a running map.
   */
  async #mapsDue(runId: string, snapshot: RunSnapshot): Promise<void> {
    if (snapshot.status !== 'active') return;
    const jobs: JobSpec[] = [];
    for (const s of runSteps(snapshot)) {
      if (s.status !== 'RUNNING' || s.map === undefined || s.map === null) continue;
      const pending = await this.#maps.pending(runId, s.stepId, s.attempt);
      if (pending === null) continue;
      if (pending.end !== null) jobs.push(mapEndJob(runId, s.stepId, s.attempt));
      for (const i of pending.end === null ? pending.inflight : []) {
        jobs.push(itemJob(runId, s.stepId, s.attempt, i.index, i.attempt));
      }
    }
    if (jobs.length === 0) return;
    const finished = await this.finishedJobs(
      runId,
      jobs.map((j) => j.opts.jobId),
    );
    if (finished.length > 0) {
      const queue = await this.runQueue(runId);
      for (const id of finished) await queue.remove(id).catch(() => 0);
    }
    await this.add(jobs);
  }

  /**
   * A run that ended: the end hook, then its end (`RuntimeMeta.ended`), then its concurrency slot
   * given back.
   */
  async #ended(runId: string, snapshot: RunSnapshot): Promise<void> {
    await this.onEnded?.(runId, snapshot);
    await this.#meta.ended(runId, String(snapshot.value));
    // A slot not given back now is freed once its lease lapses and the run is found ended.
    await this.releaseRunSlot(runId).catch(() => {});
  }

  /**
   * The wake jobs of the run's steps that wait for a child run that has ended (one status read per
   * such step, on the child's own key): a child whose end did not reach its parent (a crash
   * between the two) is healed by any guard or sweep of the parent.
   */
  async childWakes(runId: string, snapshot: RunSnapshot): Promise<JobSpec[]> {
    if (snapshot.status !== 'active') return [];
    const jobs: JobSpec[] = [];
    for (const s of runSteps(snapshot)) {
      const child = s.status === 'WAITING' ? s.wait?.child : undefined;
      if (child === undefined) continue;
      const status = await readRunStatus(this.#redis, this.#keys, child);
      if (status === 'succeeded' || status === 'failed' || status === 'cancelled') {
        jobs.push(childWakeJob(runId, s.stepId, s.attempt));
      }
    }
    return jobs;
  }

  /** The jobs the run's snapshot says are due, but a unit an active carrier runs (see above). */
  async #dueUncarried(
    runId: string,
    envelope: { snapshot: RunSnapshot; carrier?: string },
    self?: string,
  ): Promise<JobSpec[]> {
    const jobs = [
      ...dueJobs(runId, envelope.snapshot, this.#clock()),
      // A signal wait whose signal is in the inbox: its sender's wake-up may have been lost.
      ...(await this.signalWakes(runId, envelope.snapshot)),
      // A run step whose child ended: the child's wake-up of it may have been lost.
      ...(await this.childWakes(runId, envelope.snapshot)),
    ];
    const carried = parseCarrierNote(envelope.carrier);
    if (carried !== null && carried.job !== self) {
      const i = jobs.findIndex((j) => j.opts.jobId === carried.unit);
      // Active includes a carrier whose worker died and whose lock has not lapsed yet: the stalled
      // check hands it back to the queue, and its guard (here, as `self`) gives the unit its job.
      const queue = await this.runQueue(runId);
      if (i >= 0 && (await queue.getJobState(carried.job)) === 'active') {
        return jobs.filter((_, k) => k !== i);
      }
    }
    return jobs;
  }

  /**
   * The ids among `jobIds` (jobs of run `runId`) of jobs that have finished (completed or failed):
   * two `ZSCORE`s each on the run's queue, sent at once (no pipeline object: it costs more than the
   * commands).
   */
  async finishedJobs(runId: string, jobIds: readonly string[]): Promise<string[]> {
    if (jobIds.length === 0) return [];
    const { completed, failed } = (await this.runQueue(runId)).keys;
    const redis = this.#queueConnection;
    const scores = await Promise.all(
      jobIds.flatMap((id) => [redis.zscore(completed!, id), redis.zscore(failed!, id)]),
    );
    return jobIds.filter((_, i) => scores[2 * i] !== null || scores[2 * i + 1] !== null);
  }

  /**
   * What a sweep does with an active run: {@link enqueueDue}, unless the job of a unit the snapshot
   * says is due has finished and the run's version is still the one read (`envelope.version`), so
   * no commit followed that job: the commit it made was taken back (a failover to a replica that
   * lagged) or the job gave up. Then the run's finished jobs are replaced ({@link redriveDue}), and
   * the ids of the due units whose jobs had finished are returned (else an empty list).
   */
  async sweepDue(
    runId: string,
    envelope: { snapshot: RunSnapshot; carrier?: string; version: number },
    version: (runId: string) => Promise<number | null>,
  ): Promise<string[]> {
    const { snapshot } = envelope;
    const jobs = await this.#dueUncarried(runId, envelope);
    // Sent together: an add under a finished job's id is a no-op, so the check costs no round trip.
    const [finished] = await Promise.all([
      this.finishedJobs(
        runId,
        jobs.map((j) => j.opts.jobId),
      ),
      jobs.length > 0 ? this.add(jobs) : undefined,
    ]);
    await this.#mapsDue(runId, snapshot);
    if (snapshot.status !== 'active' || snapshot.value === 'failed')
      await this.#ended(runId, snapshot);
    if (finished.length === 0 || (await version(runId)) !== envelope.version) return [];
    await this.redriveDue(runId, envelope);
    return finished;
  }

  /**
   * Removes every finished job (completed or failed) of the run's units, then adds every job the
   * run's snapshot says is due, as {@link enqueueDue} does. For a run whose last commits were taken
   * back (a failover to a replica that lagged): the units it does again (the one due now, and those
   * each commit makes due next) have the ids of jobs that already ran, and BullMQ keeps a finished
   * job's id a while and ignores an add under it. Removing one of a unit that stays committed is
   * harmless: a job added under its id again finds the unit done. Walks the queue's finished sets
   * (`ZSCAN`, up to BullMQ's 20 000 kept of each).
   */
  async redriveDue(runId: string, envelope: { snapshot: RunSnapshot }): Promise<void> {
    const queue = await this.runQueue(runId);
    const redis = this.#queueConnection;
    for (const set of [queue.keys['completed'], queue.keys['failed']]) {
      if (set === undefined) continue;
      let cursor = '0';
      do {
        const [next, flat] = await redis.zscan(
          set,
          cursor,
          'MATCH',
          unitJobsGlob(runId),
          'COUNT',
          1000,
        );
        cursor = next;
        for (let i = 0; i < flat.length; i += 2) {
          const id = flat[i] as string;
          if (isUnitJobOf(id, runId)) await queue.remove(id);
        }
      } while (cursor !== '0');
    }
    await this.enqueueDue(runId, envelope);
  }

  /**
   * The wake jobs of the run's WAITING signal waits that have a signal to take: a signal of their
   * name past the run's cursor of that name. Found in the inbox (one read, only for a run that has
   * such a wait), so a sender that died between its append and its wake-up is healed by any guard
   * or sweep that enqueues the run's due work.
   */
  async signalWakes(runId: string, snapshot: RunSnapshot): Promise<JobSpec[]> {
    if (snapshot.status !== 'active') return [];
    const waits = runSteps(snapshot).filter((s) => s.status === 'WAITING' && s.wait?.signal);
    if (waits.length === 0) return [];
    // A waiting granular agent step is a conversation: an `end` signal wakes it too.
    const talks = waits.some((s) => s.granular);
    const names = [...new Set([...waits.map((s) => s.wait!.signal!), ...(talks ? [END] : [])])];
    const counts = await this.#inbox.counts(runId, names);
    const jobs: JobSpec[] = [];
    const pending = (name: string) => (counts[name] ?? 0) > (snapshot.context.taken?.[name] ?? 0);
    for (const s of waits) {
      const name = s.wait!.signal!;
      const cursor = snapshot.context.taken?.[name] ?? 0;
      if (pending(name)) jobs.push(signalWakeJob(runId, s.stepId, s.attempt, cursor));
      else if (s.granular && pending(END)) {
        const ends = snapshot.context.taken?.[END] ?? 0;
        jobs.push(signalWakeJob(runId, s.stepId, s.attempt, ends, END));
      }
    }
    return jobs;
  }

  /**
   * Removes the delayed timer jobs of the wait steps a transition moved out of WAITING (a signal
   * taken, a cancel, a skip, a budget stop), so that no timer of an ended wait stays queued. A job
   * already running is left to its guard, which finds the step done.
   */
  async removeTimers(runId: string, changes: readonly StepChange[]): Promise<void> {
    for (const c of changes) {
      if (c.from !== 'WAITING') continue;
      const queue = await this.runQueue(runId);
      await queue.remove(timerJobId(runId, c.stepId, c.attempt)).catch(() => 0);
    }
  }

  /**
   * After a commit: adds the units its transition planned (a refused event changed nothing, so
   * then what the snapshot says is due is added, as after any guard).
   */
  async enqueuePlanned(runId: string, applied: AppliedEvent): Promise<void> {
    const { snapshot } = applied.envelope;
    if (!applied.committed) return this.enqueueDue(runId, applied.envelope);
    const jobs = plannedJobs(runId, snapshot, applied.transition.planned, this.#clock());
    if (jobs.length > 0) await this.add(jobs);
    if (snapshot.status !== 'active' || snapshot.value === 'failed')
      await this.#ended(runId, snapshot);
  }

  /**
   * Gives back the concurrency slots of a run that ended: its run's slot (a plan with
   * `concurrency`), and its place among the waiters of its steps' slots (a step with
   * `concurrency`, whose unit will not come now), and wakes the units they are handed to.
   * Harmless when the run holds none; one that is not given back (Redis trouble, a crash before
   * it) is freed when its lease lapses (a run's: once the run is found ended).
   */
  async releaseRunSlot(runId: string): Promise<void> {
    let meta;
    try {
      meta = await this.#meta.read(runId);
    } catch (error) {
      if (error instanceof InputValidationError) return; // no meta: the lease check frees it
      throw error;
    }
    const { plan, input, tenantId } = meta;
    const held: [ConcurrencySlot, string, SlotLease][] = [];
    const runSlot = runSlotOf(plan, input, tenantId);
    if (runSlot !== null) held.push([runSlot, runId, RUN_LEASE]);
    for (const step of plan.steps) {
      const slot = stepSlotOf(plan, step, input, tenantId);
      if (slot !== null) held.push([slot, stepHolder(runId, step.id), STEP_LEASE]);
    }
    for (const [slot, holder, lease] of held) {
      const woken = await this.#slots.release(slot, holder, lease);
      for (const w of woken) await this.wakeParked(w.wake);
    }
  }

  /**
   * Wakes a unit parked for a concurrency slot that was handed to it: `wake` names its run and
   * job (JSON `{ runId, jobId }`). Trouble is left to the unit's own recheck, which comes anyway.
   */
  async wakeParked(wake: string): Promise<void> {
    try {
      const { runId, jobId } = JSON.parse(wake) as { runId: string; jobId: string };
      await this.wakeJob(runId, jobId);
    } catch {
      // its recheck takes the slot it was handed
    }
  }

  /**
   * Runs a parked unit's job now (a delayed job promoted): a slot was handed to it. Nothing when the
   * job is not delayed (it runs, or has not parked yet: it then finds its slot on its own).
   */
  async wakeJob(runId: string, jobId: string): Promise<void> {
    const job = await Job.fromId(await this.runQueue(runId), jobId);
    if (job !== undefined && (await job.isDelayed())) await job.promote();
  }

  /**
   * Adds jobs, each to the queue of its run (see {@link runQueueName}) with its run's priority:
   * every unit job of a run, whoever adds it (a start, a commit, a retry, a deadline, a wake, a
   * sweep), goes to one queue, and goes before the jobs of runs of lower priority waiting there.
   * One round trip per queue.
   */
  async add(jobs: JobSpec[]): Promise<void> {
    const byQueue = new Map<string, JobSpec[]>();
    for (const spec of jobs) {
      const { queue: name, priority } = await this.#route(spec.data.runId);
      const j = { ...spec, opts: { ...spec.opts, priority } };
      const list = byQueue.get(name);
      if (list === undefined) byQueue.set(name, [j]);
      else list.push(j);
    }
    for (const [name, list] of byQueue) {
      const queue = this.queueNamed(name);
      // One job (the common case) needs no pipeline, which costs more than the script call itself.
      if (list.length === 1) {
        const [j] = list as [JobSpec];
        await queue.add(j.name, j.data, j.opts);
      } else {
        await queue.addBulk(list.map((j) => ({ name: j.name, data: j.data, opts: j.opts })));
      }
    }
  }

  /**
   * Removes the completed jobs of queue `name` older than finished runs are kept (at most 1,000),
   * when that is less than a day: BullMQ removes them only as later jobs complete, so the last ones
   * before a quiet spell would stay. Nothing with the default retention.
   */
  async cleanCompleted(name: string): Promise<void> {
    const kept = this.#finishedRunsMs;
    if (kept === undefined || kept >= JOB_DEFAULTS.removeOnComplete.age * 1000) return;
    await this.queueNamed(name).clean(kept, 1000, 'completed');
  }

  /** Schedules the run's wall-clock deadline, if its plan has one. */
  async scheduleDeadline(runId: string, plan: Plan, createdAt: number): Promise<void> {
    const max = plan.budgets?.maxWallClockMs;
    if (max === undefined) return;
    const data: JobData = { runId };
    await this.add([
      {
        name: JobName.deadline,
        data,
        opts: { jobId: deadlineJobId(runId), delay: Math.max(0, createdAt + max - this.#clock()) },
      },
    ]);
  }

  /** Tells workers to abort the attempts a transition planned to abort (cancel, budget stop). */
  async publishAborts(runId: string, planned: readonly PlannedAction[]): Promise<void> {
    for (const p of planned) {
      if (p.type === 'step.abort') {
        await this.channels.publishAbort(abortMessage(runId, p.stepId, p.attempt));
      }
    }
  }

  /**
   * Tells workers that signal `name` was sent to the run, for the granular steps of `snapshot`
   * that may be in a model call (see {@link interruptMessage}).
   */
  async publishInterrupts(runId: string, snapshot: RunSnapshot, name: string): Promise<void> {
    if (snapshot.status !== 'active') return;
    for (const s of runSteps(snapshot)) {
      if (!s.granular || (s.status !== 'RUNNING' && s.status !== 'READY')) continue;
      await this.channels.publishAbort(interruptMessage(runId, s.stepId, s.attempt, name));
    }
  }

  /** Publishes a piece of a streaming reply to the run's chunk channel (live only, not stored). */
  publishChunk(chunk: StreamedText): void {
    const message = JSON.stringify({ ...chunk, at: this.#clock() });
    // Best effort: a lost chunk costs a viewer some live text; the final message is committed.
    this.channels.publishChunk(chunk.runId, message).catch(() => {});
  }

  /**
   * Records the latest progress an operator reported for its step (one hash field, overwritten)
   * and publishes it to the run's progress channel. Best effort, not awaited: progress is for
   * people watching, never part of the run's history.
   */
  publishProgress(runId: string, stepId: string, attempt: number, info: JsonValue): void {
    const message = JSON.stringify({ runId, stepId, attempt, info, at: this.#clock() });
    this.channels.publishProgress(runId, stepId, message).catch(() => {});
  }

  /**
   * Calls `listener` with each chunk message published for the run, until the returned function
   * is called. One subscriber connection serves every listener of the runtime.
   */
  async subscribeChunks(runId: string, listener: (message: string) => void): Promise<() => void> {
    return this.subscribe(this.chunkChannel(runId), listener);
  }

  /** Calls `listener` with each message of a run's progress channel (see `publishProgress`). */
  async subscribeProgress(runId: string, listener: (message: string) => void): Promise<() => void> {
    return this.subscribe(this.channels.progressChannel(runId), listener);
  }

  /**
   * Resolves once the messages Redis sent the subscriber connection before this call have reached
   * their listeners: a PING on that connection is answered after them. A caller that saw a commit
   * made after a publish (on the runtime's connection, so executed after it) gets that message
   * first.
   */
  async drainSubscriptions(): Promise<void> {
    await this.#subscriber?.ping();
  }

  /** Calls `listener` with each message of `channel` until the returned function is called. */
  async subscribe(channel: string, listener: (message: string) => void): Promise<() => void> {
    if (this.#subscriber === undefined) {
      const subscriber = this.#openSubscriber();
      subscriber.on('error', () => {});
      subscriber.on('message', (from: string, message: string) => {
        for (const l of this.#listeners.get(from) ?? []) l(message);
      });
      this.#subscriber = subscriber;
    }
    let listeners = this.#listeners.get(channel);
    if (listeners === undefined) {
      listeners = new Set();
      this.#listeners.set(channel, listeners);
      await this.#subscriber.subscribe(channel);
    }
    listeners.add(listener);
    return () => {
      const set = this.#listeners.get(channel);
      if (set === undefined) return;
      set.delete(listener);
      if (set.size === 0) {
        this.#listeners.delete(channel);
        this.#subscriber?.unsubscribe(channel).catch(() => {});
      }
    };
  }

  /** The pub/sub channel on which a run's streamed reply text is published. */
  chunkChannel(runId: string): string {
    return this.channels.chunkChannel(runId);
  }

  /** The pub/sub channel on which aborts of running attempts are announced. */
  abortChannel(): string {
    return this.channels.abortChannel;
  }

  /** Waits for new events of runs on one dedicated connection, created on first use. */
  watcher(): StreamWatcher {
    this.#watcher ??= createStreamWatcher(this.#redis);
    return this.#watcher;
  }

  /**
   * Closes the watcher, the subscriber and the queue (in that order); the connections it was
   * given stay open.
   */
  async close(): Promise<void> {
    this.#watcher?.close();
    this.#watcher = undefined;
    this.#subscriber?.disconnect();
    this.#subscriber = undefined;
    await Promise.all([...this.#queues.values()].map((q) => q.close()));
  }
}
