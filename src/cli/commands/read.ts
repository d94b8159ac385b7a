/** `flujo status`, `events`, `ledger` and `usage`: reading a run (no job module needed). */
import type { StoredRunEvent } from '../../persistence/snapshot-store.js';
import { checkRunId, connect, runModule, type Connection } from '../connect.js';
import { repeatFlags, type Ctx } from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';
import {
  attemptsOf,
  eventLine,
  exitCodeOf,
  inTimeOrder,
  ledgerLines,
  nextCommands,
  statusLines,
  usageLines,
  type RenderOptions,
} from '../render.js';

/** Connects for a command about the existing run `runId` (nothing is written if it does not exist). */
export async function withRun(
  ctx: Ctx,
  runId: string,
  body: (conn: Connection) => Promise<number>,
): Promise<number> {
  const conn = await connect({ ...ctx.values, cwd: ctx.cwd, env: ctx.env, existingRun: runId });
  try {
    await conn.requireRun(runId);
    return await body(conn);
  } finally {
    await conn.close();
  }
}

function noMoreArgs(ctx: Ctx, count: number): void {
  if (ctx.args.length > count) {
    badInput(`unexpected argument "${ctx.args[count]}"; see \`flujo --help\``);
  }
}

/** `--full` and `--verbose`. */
const renderOptions = (ctx: Ctx): RenderOptions => ({
  full: ctx.values.full === true,
  verbose: ctx.values.verbose === true,
});

/** `flujo status <runId> [--full] [--verbose] [--json]`: exits with the run's code (0 succeeded or running, 1 failed, …). */
export async function cmdStatus(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], 'flujo status <runId>');
  noMoreArgs(ctx, 1);
  return withRun(ctx, runId, async (conn) => {
    const runtime = conn.runtime();
    const report = await runtime.status(runId);
    const events = [];
    for await (const e of runtime.events(runId)) events.push(e);
    const attempts = attemptsOf(events);
    if (ctx.values.json === true) console.log(JSON.stringify({ ...report, attempts }));
    else {
      // Due work no worker takes: the commands to take it up name the job module the run
      // records (`flujo run` records it).
      const next =
        report.idle === null
          ? undefined
          : nextCommands(runId, await runModule(conn, runId), repeatFlags(ctx.values));
      for (const line of statusLines(report, attempts, next, renderOptions(ctx))) console.log(line);
    }
    return exitCodeOf(report);
  });
}

/**
 * `flujo events <runId> [--follow] [--full] [--verbose] [--json]`: one line per event;
 * `--follow` ends with the run. The JSON lines come in stream (commit) order; the text lines in
 * the order the events happened (their `at`): what is stored, then, with `--follow`, each commit's
 * events as it lands.
 */
export async function cmdEvents(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], 'flujo events <runId>');
  noMoreArgs(ctx, 1);
  const json = ctx.values.json === true;
  const render = renderOptions(ctx);
  const print = (batch: readonly StoredRunEvent[]) => {
    for (const e of json ? batch : inTimeOrder(batch)) {
      console.log(json ? JSON.stringify(e) : eventLine(e, render));
    }
  };
  return withRun(ctx, runId, async (conn) => {
    const stop = new AbortController();
    const onSignal = () => stop.abort();
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    try {
      const runtime = conn.runtime();
      // Loaded here, as connect() loads the runtime: only once Redis answered.
      const core = (await import('../../runtime.js')).runtimeCore(runtime);
      // Read in batches (what is stored, then what each wake-up brings), each printed in order.
      for (let after: string | undefined; ;) {
        const batch: StoredRunEvent[] = [];
        for await (const e of runtime.events(runId, after === undefined ? {} : { after })) {
          batch.push(e);
        }
        print(batch);
        after = batch.at(-1)?.id ?? after;
        const finished = batch.some((e) => e.type === 'run.finished');
        if (ctx.values.follow !== true || finished || stop.signal.aborted) break;
        await core.queues
          .watcher()
          .next(core.stores.keys.events(runId), after ?? '0-0', stop.signal);
      }
    } finally {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
    }
    return ExitCode.ok;
  });
}

/** `flujo ledger <runId> [--json]`: the run's tool calls. */
export async function cmdLedgerList(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], 'flujo ledger <runId>');
  noMoreArgs(ctx, 1);
  if (ctx.values.succeeded !== undefined || ctx.values.retry === true) {
    badInput(`--succeeded and --retry go with \`flujo ledger resolve ${runId} <callId>\``);
  }
  return withRun(ctx, runId, async (conn) => {
    const entries = await conn.runtime().ledger(runId);
    if (ctx.values.json === true) console.log(JSON.stringify(entries));
    else for (const line of ledgerLines(entries)) console.log(line);
    return ExitCode.ok;
  });
}

/** `flujo usage <runId> [--json]`: the run's model usage, reservation by reservation. */
export async function cmdUsage(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], 'flujo usage <runId>');
  noMoreArgs(ctx, 1);
  return withRun(ctx, runId, async (conn) => {
    const usage = await conn.runtime().usage(runId);
    if (ctx.values.json === true) console.log(JSON.stringify(usage));
    else for (const line of usageLines(usage)) console.log(line);
    return ExitCode.ok;
  });
}
