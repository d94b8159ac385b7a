/** `flujo ui`: the web view of the runs of a prefix, until SIGINT or SIGTERM. */
import type { Runtime } from '../../runtime.js';
import { startUi, type UiServer } from '../../ui/server.js';
import { connect } from '../connect.js';
import type { Ctx } from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';
import { declareRunSignals } from './signal.js';

/** The port of the web view when `--port` is left out. */
export const DEFAULT_UI_PORT = 7400;

/** `--port P`: a whole number from 0 (any free port) to 65535. */
export function parsePort(text: string | undefined): number {
  if (text === undefined) return DEFAULT_UI_PORT;
  const n = Number(text);
  if (!/^\d+$/.test(text) || n > 65_535) {
    badInput(`--port "${text}" is not a port (0 to 65535); pass e.g. --port ${DEFAULT_UI_PORT}`);
  }
  return n;
}

/** Starts the web view on `host:port`; an address it cannot listen on is bad input naming the fix. */
export async function listenUi(
  runtime: Runtime,
  port: number,
  host: string,
  declareSignals?: (runId: string) => Promise<void>,
): Promise<UiServer> {
  try {
    return await startUi(runtime, {
      port,
      host,
      ...(declareSignals === undefined ? {} : { declareSignals }),
    });
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'EADDRINUSE') {
      badInput(`--port ${port} is in use; pick another, e.g. --port 0 for any free port`);
    }
    if (code === 'EADDRNOTAVAIL' || code === 'ENOTFOUND' || code === 'EAI_AGAIN') {
      badInput(`--host ${host} is not an address of this machine; pass e.g. --host 127.0.0.1`);
    }
    if (code === 'EACCES') {
      badInput(`--port ${port} needs more privileges; pick a port above 1023`);
    }
    throw error;
  }
}

/** `flujo ui [--port P] [--host H]`. */
export async function cmdUi(ctx: Ctx): Promise<number> {
  if (ctx.args.length > 0) badInput(`unexpected argument "${ctx.args[0]}"; see \`flujo --help\``);
  const port = parsePort(ctx.values.port);
  const host = ctx.values.host ?? '127.0.0.1';
  if (host.trim() === '') badInput('--host is empty; pass an address, e.g. --host 127.0.0.1');
  // Long-lived: it keeps reconnecting through a Redis restart.
  const conn = await connect({ ...ctx.values, cwd: ctx.cwd, env: ctx.env, long: true });
  try {
    // A signal sent from a run's page is checked against the signals of the run's job module.
    const ui = await listenUi(conn.runtime(), port, host, (runId) =>
      declareRunSignals(conn, runId, ctx.cwd),
    );
    console.log(`flujo ui: ${ui.url} (Ctrl-C stops it)`);
    await new Promise<void>((resolve) => {
      const stop = () => {
        process.off('SIGINT', stop);
        process.off('SIGTERM', stop);
        resolve();
      };
      process.on('SIGINT', stop);
      process.on('SIGTERM', stop);
    });
    await ui.close();
    return ExitCode.ok;
  } finally {
    await conn.close();
  }
}
