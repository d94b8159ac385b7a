/** `flujo status`, `events`, `ledger` and `usage`: reading a run (no job module needed). */
import { checkRunId, connect, runModule, type Connection } from '../connect.js';
import { repeatFlags, type Ctx } from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';
import {
  attemptsOf,
  eventLine,
  exitCodeOf,
  ledgerLines,
  nextCommands,
  statusLines,
  usageLines,
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

/** `flujo status <runId> [--json]`: exits with the run's code (0 succeeded or running, 1 failed, …). */
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
      for (const line of statusLines(report, attempts, next)) console.log(line);
    }
    return exitCodeOf(report);
  });
}

/** `flujo events <runId> [--follow] [--json]`: one line per event; `--follow` ends with the run. */
export async function cmdEvents(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], 'flujo events <runId>');
  noMoreArgs(ctx, 1);
  return withRun(ctx, runId, async (conn) => {
    const stop = new AbortController();
    const onSignal = () => stop.abort();
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    try {
      const options = { follow: ctx.values.follow === true, signal: stop.signal };
      for await (const e of conn.runtime().events(runId, options)) {
        console.log(ctx.values.json === true ? JSON.stringify(e) : eventLine(e));
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
