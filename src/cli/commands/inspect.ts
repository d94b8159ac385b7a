/**
 * `flujo inspect`: a stored run shown in the Stately inspector. Its stream is read in commit order
 * and turned into xstate inspection events (the run machine as the root actor, each step machine as
 * its child), sent to a WebSocket inspector, e.g. the relay `createInspectorServer()` of
 * `@statelyai/inspect/server`, which opens the inspector page; `--json` prints them instead.
 */
import { createInspector, type StatelyInspectionEvent } from '@statelyai/inspect';
import type { InspectionEvent } from 'xstate';
import { inspectionJson, streamInspector } from '../../observability/inspect.js';
import { runtimeCore } from '../../runtime.js';
import { checkRunId } from '../connect.js';
import type { Ctx } from '../context.js';
import { CliError, ExitCode, badInput } from '../exit-codes.js';
import { withRun } from './read.js';

const USAGE = 'flujo inspect <runId> [--follow] [--url ws://…] [--json]';

/** Where `@statelyai/inspect` sends and its relay server listens unless told otherwise. */
export const DEFAULT_INSPECTOR_URL = 'ws://localhost:8080';

/** The inspector page the relay server opens, as `@statelyai/inspect` documents it. */
export const STATELY_INSPECTOR_PAGE = 'https://stately.ai/inspect';

/** The command that starts the library's relay, which opens the inspector page in a browser. */
export const RELAY_COMMAND = `node -e "import('@statelyai/inspect/server').then((m) => m.createInspectorServer())"`;

/** How long connecting to the inspector may take before the command gives up, in ms. */
const CONNECT_TIMEOUT_MS = 3000;

/** `--url`: a ws: or wss: URL, checked before anything is read. */
function inspectorUrl(ctx: Ctx): string {
  const raw = ctx.values.url;
  if (raw === undefined) return DEFAULT_INSPECTOR_URL;
  let url: URL | undefined;
  try {
    url = new URL(raw);
  } catch {
    url = undefined;
  }
  if (url === undefined || (url.protocol !== 'ws:' && url.protocol !== 'wss:')) {
    badInput(`--url "${raw}" is not a WebSocket URL; pass one like --url ${DEFAULT_INSPECTOR_URL}`);
  }
  return raw;
}

/** Where the inspection events go. */
interface Sink {
  put(event: InspectionEvent): void;
  /** Resolves once everything put has left. */
  close(): Promise<void>;
}

/** JSON lines on stdout. */
function jsonSink(): Sink {
  return {
    put: (e) => {
      process.stdout.write(`${JSON.stringify(inspectionJson(e))}\n`);
    },
    close: () => Promise.resolve(),
  };
}

/**
 * An open WebSocket to the inspector, or a clear error within {@link CONNECT_TIMEOUT_MS}. The
 * library's own WebSocket adapter retries a refused connection forever and keeps at most 200
 * events until it opens, so the command connects itself and gives the library's inspector an
 * adapter over this socket: the messages are the same.
 */
function openSocket(url: string): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url);
    const fail = (why: string) => {
      clearTimeout(timer);
      ws.close();
      reject(
        new CliError(
          `cannot reach the inspector at ${url}: ${why}. Start the relay of @statelyai/inspect ` +
            `(it opens ${STATELY_INSPECTOR_PAGE} in a browser) with ${RELAY_COMMAND}, or pass --url`,
          ExitCode.failed,
        ),
      );
    };
    const timer = setTimeout(
      () => fail(`no answer within ${CONNECT_TIMEOUT_MS} ms`),
      CONNECT_TIMEOUT_MS,
    );
    ws.addEventListener('open', () => {
      clearTimeout(timer);
      resolve(ws);
    });
    ws.addEventListener('error', () => fail('the connection was refused or is not a WebSocket'));
  });
}

/**
 * The events, sent through the library's inspector (its message format) over `ws`. `onLost` is
 * called if the inspector closes the connection before the sink is closed.
 */
function socketSink(ws: WebSocket, onLost: () => void): Sink {
  let put = 0;
  let sent = 0;
  let onSent: (() => void) | undefined;
  let closing = false;
  ws.addEventListener('close', () => {
    if (!closing) onLost();
  });
  const adapter = {
    send(event: StatelyInspectionEvent) {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
      sent += 1;
      if (sent >= put) onSent?.();
    },
  };
  const inspector = createInspector(adapter, { autoStart: false });
  return {
    put(e) {
      put += 1;
      inspector.inspect.next?.(e);
    },
    async close() {
      closing = true;
      // The library converts each event on a later tick: wait for the last one to be sent.
      if (sent < put) await new Promise<void>((resolve) => (onSent = resolve));
      while (ws.readyState === WebSocket.OPEN && ws.bufferedAmount > 0) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      const closed = new Promise<void>((resolve) => {
        if (ws.readyState === WebSocket.CLOSED) resolve();
        ws.addEventListener('close', () => resolve());
        setTimeout(resolve, 1000).unref();
      });
      ws.close();
      await closed;
    },
  };
}

/** `flujo inspect <runId> [--follow] [--url ws://…] [--json]`. */
export async function cmdInspect(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], USAGE);
  if (ctx.args.length > 1) badInput(`unexpected argument "${ctx.args[1]}"; see \`flujo --help\``);
  const json = ctx.values.json === true;
  if (json && ctx.values.url !== undefined) {
    badInput('--json prints the events instead of sending them: leave out --url, or --json');
  }
  const url = json ? undefined : inspectorUrl(ctx);
  return withRun(ctx, runId, async (conn) => {
    const runtime = conn.runtime();
    const { plan } = await runtimeCore(runtime).meta.read(runId);
    const stop = new AbortController();
    let lost = false;
    let sink: Sink;
    if (url === undefined) {
      sink = jsonSink();
    } else {
      sink = socketSink(await openSocket(url), () => {
        lost = true;
        stop.abort();
      });
      console.error(
        `flujo inspect: sending run ${runId} to the inspector at ${url}; watch it in the ` +
          `Stately inspector (${STATELY_INSPECTOR_PAGE}) that the relay opened ` +
          `(${RELAY_COMMAND})${ctx.values.follow === true ? '; following until the run ends (Ctrl-C stops)' : ''}`,
      );
    }
    const onSignal = () => stop.abort();
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    const fold = streamInspector(runId, plan);
    try {
      const options = { follow: ctx.values.follow === true, signal: stop.signal };
      for await (const e of runtime.events(runId, options)) {
        if (lost) break;
        for (const inspected of fold.feed(e)) sink.put(inspected);
      }
    } finally {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      await sink.close();
    }
    if (lost) {
      throw new CliError(
        `the inspector at ${url} closed the connection before the run's events were all sent`,
        ExitCode.failed,
      );
    }
    return ExitCode.ok;
  });
}
