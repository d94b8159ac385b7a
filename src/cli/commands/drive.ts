/**
 * Drives a run from the CLI: an in-process worker executes its units while the run's event stream
 * prints one line per step state change, until the run ends or waits for a person.
 */
import type { Runtime, RunReport } from '../../runtime.js';
import type { Connection } from '../connect.js';
import { ExitCode } from '../exit-codes.js';
import { exitCodeOf, progressLine, summaryLines } from '../render.js';

/** How to drive. */
export interface DriveOptions {
  /** Follow the stream after this id (an existing run); from its start when undefined. */
  after: string | undefined;
  json: boolean;
  concurrency: number;
  /** The resume command, for the summary and for an interruption. */
  resume: string;
}

/** The id of the run's newest event, or undefined when its stream is empty. */
export async function lastEventId(conn: Connection, runId: string): Promise<string | undefined> {
  const last = await conn.redis.xrevrange(conn.keys.events(runId), '+', '-', 'COUNT', 1);
  return last[0]?.[0];
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
  const worker = runtime.createWorker({ concurrency: options.concurrency });
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    await worker.ready();
    const follow = {
      follow: true,
      signal: stop.signal,
      ...(options.after === undefined ? {} : { after: options.after }),
    };
    for await (const e of runtime.events(runId, follow)) {
      if (options.json) {
        if (e.type === 'step.changed' || e.type === 'turn.committed') {
          console.log(JSON.stringify(e.data));
        }
      } else {
        const line = progressLine(e);
        if (line !== null) console.log(line);
      }
      if (e.type === 'run.status' && (e.data as { to?: unknown }).to === 'waiting') break;
    }
  } finally {
    // A second Ctrl-C while running units finish ends the process at once.
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await worker.close();
  }
  if (stop.signal.aborted) {
    console.error(`flujo: interrupted; the run goes on with: ${options.resume}`);
    return ExitCode.interrupted;
  }
  return finish(await runtime.status(runId), options.json, options.resume);
}
