/**
 * Drives a run from the CLI: an in-process worker executes its units while the run's event stream
 * prints one line per step state change, until the run ends or waits for a person.
 */
import { RedisUnavailableError } from '../../errors.js';
import { isConnectionError } from '../../persistence/redis-errors.js';
import { lastEventId as readLastEventId } from '../../persistence/run-lookups.js';
import { IDLE_WORK_MS, type Runtime, type RunReport, runtimeCore } from '../../runtime.js';
import type { Connection } from '../connect.js';
import { CliError, ExitCode } from '../exit-codes.js';
import { watchRedis } from '../outage.js';
import { createLiveState, type LiveStore } from '../live-state.js';
import { exitCodeOf, idleLine, progressLine, summaryLines, type NextCommands } from '../render.js';

/** How to drive. */
export interface DriveOptions {
  /** Follow the stream after this id (an existing run); from its start when undefined. */
  after: string | undefined;
  json: boolean;
  concurrency: number;
  /** The resume command, for the summary and for an interruption. */
  resume: string;
  /** The worker and resume commands, for the notice of due work that no worker takes. */
  next: NextCommands;
  /** Hide streamed agent text. @defaultValue false */
  quiet?: boolean;
  /** The connection, watched for outages. */
  conn: Pick<Connection, 'url' | 'target' | 'timeoutMs'>;
  /** How long an outage may last before the command ends with exit 6. */
  outageLimitMs: number;
}

/**
 * What is shown live beside the progress lines: operators' `ctx.progress` reports, agents' reply
 * text as it streams (unless quiet), and a notice when due work waits for a worker. Returns a
 * function that stops it, and `touch`, called on every event (the idle check waits for silence).
 */
async function liveView(
  runtime: Runtime,
  runId: string,
  options: DriveOptions,
  state: LiveStore,
): Promise<{ stop: () => void; touch: () => void; line: (text: string) => void }> {
  const open = () => state.getSnapshot().context.streaming !== null;
  const line = (text: string) => {
    if (open()) process.stdout.write('\n');
    state.trigger.lineWritten();
    console.log(text);
  };
  const unsubscribe: (() => void)[] = [];
  unsubscribe.push(
    await runtimeCore(runtime).queues.subscribeProgress(runId, (message) => {
      if (options.json) return line(JSON.stringify({ type: 'progress', ...JSON.parse(message) }));
      const p = JSON.parse(message) as { stepId: string; at: number; info: unknown };
      line(`  ${progressClock(p.at)}  ${p.stepId}: progress ${JSON.stringify(p.info)}`);
    }),
  );
  if (options.quiet !== true) {
    unsubscribe.push(
      await runtimeCore(runtime).queues.subscribeChunks(runId, (message) => {
        const c = JSON.parse(message) as { stepId: string; turn: number; text: string; at: number };
        if (options.json) return line(JSON.stringify({ type: 'chunk', ...c }));
        const who = `${c.stepId}:${c.turn}`;
        if (state.getSnapshot().context.streaming !== who) {
          line(`  ${progressClock(c.at)}  ${c.stepId}: turn ${c.turn + 1} says:`);
          process.stdout.write('    ');
        }
        state.trigger.streamed({ who });
        process.stdout.write(c.text.replaceAll('\n', '\n    '));
      }),
    );
  }
  // One status read after each silence of IDLE_WORK_MS: nothing is read while events come.
  let timer: NodeJS.Timeout | undefined;
  const arm = () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      runtime.status(runId).then(
        (report) => {
          const idle = report.idle;
          if (idle !== null && !state.getSnapshot().context.toldIdle.includes(idle.stepId)) {
            state.trigger.idleTold({ stepId: idle.stepId });
            if (options.json) {
              const { worker, resume, note } = options.next;
              const said = note === '' ? {} : { note: note.trim().slice(1, -1) };
              line(
                JSON.stringify({ type: 'idle', ...idle, commands: { worker, resume }, ...said }),
              );
            } else line(idleLine(idle, options.next));
          }
          arm();
        },
        () => arm(),
      );
    }, IDLE_WORK_MS);
    timer.unref();
  };
  arm();
  return {
    stop: () => {
      clearTimeout(timer);
      for (const u of unsubscribe) u();
      if (open()) process.stdout.write('\n');
    },
    touch: arm,
    line,
  };
}

const progressClock = (at: number): string => new Date(at).toISOString().slice(11, 23);

const lostRedis = (error: unknown): boolean =>
  error instanceof RedisUnavailableError || isConnectionError(error);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The id of the run's newest event, or undefined when its stream is empty. */
export async function lastEventId(conn: Connection, runId: string): Promise<string | undefined> {
  return readLastEventId(conn.redis, conn.keys, runId);
}

/** Prints what a run came to and returns its exit code. */
export function finish(report: RunReport, json: boolean, resume: string): ExitCode {
  const exitCode = exitCodeOf(report);
  if (json) console.log(JSON.stringify({ type: 'result', exitCode, ...report }));
  else for (const line of summaryLines(report, resume)) console.log(line);
  return exitCode;
}

/** Runs a worker and prints progress until the run ends or waits; returns the exit code. */
export async function drive(
  runtime: Runtime,
  runId: string,
  options: DriveOptions,
): Promise<number> {
  const state = createLiveState(options.after);
  // Subscribed before the worker starts, so nothing it reports is missed.
  const live = await liveView(runtime, runId, options, state);
  // The run's queue (where its units are), and the runtime's (where its schedules fire).
  const queues = runtimeCore(runtime).queues;
  const worker = runtime.createWorker({
    concurrency: options.concurrency,
    queues: [await queues.runQueueName(runId), queues.queueName],
  });
  const stop = new AbortController();
  const lost = new AbortController();
  const onSignal = () => stop.abort();
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const { conn } = options;
  const watch = watchRedis({
    url: conn.url,
    target: conn.target,
    timeoutMs: conn.timeoutMs,
    limitMs: options.outageLimitMs,
    onLimit: () => lost.abort(),
  });
  const signal = AbortSignal.any([stop.signal, lost.signal]);
  try {
    await worker.ready();
    // Through an outage the worker retries its units and the stream is read again from the
    // last event printed, until Redis is back or the outage passes its limit.
    for (;;) {
      try {
        const { after } = state.getSnapshot().context;
        const follow = { follow: true, signal, ...(after === undefined ? {} : { after }) };
        for await (const e of runtime.events(runId, follow)) {
          state.trigger.event({ id: e.id, eventType: e.type, data: e.data });
          live.touch();
          if (options.json) {
            if (e.type === 'step.changed' || e.type === 'turn.committed') {
              live.line(JSON.stringify(e.data));
            }
          } else {
            const line = progressLine(e);
            if (line !== null) live.line(line);
          }
          if (e.type === 'run.status' && (e.data as { to?: unknown }).to === 'waiting') break;
        }
        break;
      } catch (error) {
        if (signal.aborted) break;
        if (!lostRedis(error)) throw error;
        await sleep(250);
      }
    }
  } finally {
    // A progress report or a chunk published just before the run's last commit still reaches the
    // screen: its message went out on the subscriber connection before the events that ended
    // the run, on another connection (bounded, should Redis be away).
    if (!lost.signal.aborted) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        queues.drainSubscriptions().catch(() => {}),
        new Promise((r) => (timer = setTimeout(r, 1000))),
      ]);
      clearTimeout(timer);
    }
    live.stop();
    // A second Ctrl-C while running units finish ends the process at once.
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    watch.stop();
    // Units in flight finish first, unless Redis is gone: then they are redelivered on resume.
    const closed = worker.close();
    if (lost.signal.aborted) await Promise.race([closed.catch(() => {}), sleep(conn.timeoutMs)]);
    else await closed;
  }
  if (lost.signal.aborted) {
    throw new CliError(
      `Redis at ${conn.target} has not answered for ${Math.round(options.outageLimitMs / 1000)} s (--redis-outage-limit); the run is kept: when Redis is back, go on with: ${options.resume}`,
      ExitCode.redisUnavailable,
    );
  }
  if (stop.signal.aborted) {
    console.error(`flujo: interrupted; the run goes on with: ${options.resume}`);
    return ExitCode.interrupted;
  }
  return finish(await runtime.status(runId), options.json, options.resume);
}
