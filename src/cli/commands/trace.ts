/** `flujo trace`: a run's trace as JSON, or as a self-contained HTML timeline. */
import { statSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { renderTraceHtml } from '../../observability/trace-html.js';
import { checkRunId } from '../connect.js';
import type { Ctx } from '../context.js';
import { badInput, ExitCode } from '../exit-codes.js';
import { withRun } from './read.js';

/** The file `--out` names, checked before anything is read: its folder must exist. */
function outFile(ctx: Ctx): string | undefined {
  const out = ctx.values.out;
  if (out === undefined) return undefined;
  if (out.trim() === '') badInput('--out is empty; pass a file, e.g. --out trace.html');
  const file = resolve(ctx.cwd, out);
  const folder = dirname(file);
  let isFolder = false;
  try {
    isFolder = statSync(folder).isDirectory();
  } catch {
    badInput(`--out ${out}: the folder ${folder} does not exist; create it or pick another file`);
  }
  if (!isFolder) badInput(`--out ${out}: ${folder} is not a folder; pick another file`);
  try {
    if (statSync(file).isDirectory()) {
      badInput(`--out ${out} is a folder; name a file in it, e.g. --out ${out}/trace.html`);
    }
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
  }
  return file;
}

/** `flujo trace <runId> [--out file] [--html]`. */
export async function cmdTrace(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], 'flujo trace <runId> [--out file] [--html]');
  if (ctx.args.length > 1) badInput(`unexpected argument "${ctx.args[1]}"; see \`flujo --help\``);
  const file = outFile(ctx);
  return withRun(ctx, runId, async (conn) => {
    const trace = await conn.runtime().trace(runId);
    const text =
      ctx.values.html === true ? renderTraceHtml(trace) : `${JSON.stringify(trace, null, 2)}\n`;
    if (file === undefined) {
      process.stdout.write(text);
      return ExitCode.ok;
    }
    writeFileSync(file, text);
    const what = ctx.values.html === true ? 'timeline' : 'trace';
    console.log(`wrote the ${what} of run ${runId} to ${file} (${Buffer.byteLength(text)} bytes)`);
    return ExitCode.ok;
  });
}
