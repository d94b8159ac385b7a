/** `flujo signal`: send a signal to a run (no job module needed; the run's own is read if recorded). */
import { existsSync } from 'node:fs';
import { checkRunId, runModule, type Connection } from '../connect.js';
import { parseJsonOption, repeatFlags, type Ctx } from '../context.js';
import { nextCommands } from '../render.js';
import { ExitCode, badInput } from '../exit-codes.js';
import { loadJobModule } from '../job-module.js';
import { withRun } from './read.js';

/**
 * Declares the signals of the job module the run records, when it records one that still
 * exists: the payload is then checked as a worker of that module would check it. Says on stderr
 * when the recorded module is gone (the payload is then checked as JSON only).
 */
export async function declareRunSignals(
  conn: Connection,
  runId: string,
  cwd: string,
): Promise<void> {
  const file = await runModule(conn, runId);
  if (file === null) return;
  if (!existsSync(file)) {
    console.error(
      `flujo signal: the run's job module ${file} is gone: its declared signals are not checked`,
    );
    return;
  }
  const job = await loadJobModule(file, cwd);
  conn.runtime().signals(job.plan.name, job.signals);
}

/** `flujo signal <runId> <name> [--data JSON] [--id ID] [--json]` */
export async function cmdSignal(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], 'flujo signal <runId> <name>');
  const name = ctx.args[1];
  if (name === undefined || name === '') {
    badInput(`name the signal: \`flujo signal ${runId} <name> [--data JSON]\``);
  }
  if (ctx.args.length > 2) badInput(`unexpected argument "${ctx.args[2]}"; see \`flujo --help\``);
  const data = ctx.values.data;
  const payload = data === undefined ? null : parseJsonOption(data, '--data', '{"ok":true}');
  const id = ctx.values.id;
  if (id !== undefined && id === '') badInput('--id is empty; pass an id, e.g. --id order-17');
  return withRun(ctx, runId, async (conn) => {
    await declareRunSignals(conn, runId, ctx.cwd);
    const receipt = await conn
      .runtime()
      .signal(runId, name, payload, id === undefined ? {} : { id });
    if (ctx.values.json === true) {
      console.log(JSON.stringify(receipt));
      return ExitCode.ok;
    }
    const again = receipt.duplicate ? ' (sent before with this id: nothing more delivered)' : '';
    console.log(`signal "${name}" #${receipt.index + 1} of its name sent to run ${runId}${again}`);
    const next = nextCommands(runId, await runModule(conn, runId), repeatFlags(ctx.values));
    console.log(`a running worker takes it up (\`${next.worker}\`)${next.note}`);
    return ExitCode.ok;
  });
}
