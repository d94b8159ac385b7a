/**
 * The web view (`flujo ui`): a local HTTP server (node:http, no framework) over a runtime. The run
 * list with filters, a page per run that follows the run live (server-sent events), and
 * approve/reject forms that go through `runtime.approve` / `runtime.reject`.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { isFlujoError } from '../errors.js';
import { renderTraceHtml } from '../observability/trace-html.js';
import { isRunId } from '../persistence/keys.js';
import type { RunStatus } from '../machines/types.js';
import type { DecisionInput, Runtime } from '../runtime.js';
import type { RunListFilter } from '../worker/run-list.js';
import {
  renderListPage,
  renderMessagePage,
  renderRunPage,
  runParts,
  runTitle,
  urlPath,
  type ListFilterForm,
  type Notice,
  type RunView,
} from './html.js';

/** Options of {@link startUi}. */
export interface UiOptions {
  /** The port to listen on; 0 picks a free one. @defaultValue 7400 */
  port?: number;
  /** The address to listen on. @defaultValue '127.0.0.1' (this machine only) */
  host?: string;
  /** How many runs the list shows at most (1 to 1000). @defaultValue 100 */
  listLimit?: number;
}

/** A running web view. */
export interface UiServer {
  /** Where it answers, e.g. `http://127.0.0.1:7400/`. */
  url: string;
  /** Stops it: open pages lose their live updates, the runtime stays open. */
  close(): Promise<void>;
}

const MAX_FORM_BYTES = 64 * 1024;
const LOOPBACK = new Set(['127.0.0.1', 'localhost', '::1', '[::1]']);
const STREAM_ID = /^\d+-\d+$/;

/** An answer to a request that is not what the view serves. */
class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly title: string,
    message: string,
  ) {
    super(message);
  }
}

const notFound = (what = 'This page does not exist.') => new HttpError(404, 'Not found', what);

function send(
  res: ServerResponse,
  status: number,
  body: string,
  type = 'text/html; charset=utf-8',
): void {
  res.writeHead(status, {
    'content-type': type,
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'same-origin',
  });
  res.end(body);
}

/** The hostname of a `Host` header (`[::1]:80` → `[::1]`). */
function hostnameOf(host: string | undefined): string {
  if (host === undefined) return '';
  if (host.startsWith('[')) return host.slice(0, host.indexOf(']') + 1);
  const colon = host.lastIndexOf(':');
  return colon === -1 ? host : host.slice(0, colon);
}

/** Reads a form body (urlencoded), at most {@link MAX_FORM_BYTES}. */
async function readForm(req: IncomingMessage): Promise<URLSearchParams> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_FORM_BYTES) {
      throw new HttpError(413, 'Too large', `A form may hold at most ${MAX_FORM_BYTES} bytes.`);
    }
    chunks.push(chunk);
  }
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

/** The raw path split into decoded segments; a malformed escape is a path that does not exist. */
function segmentsOf(pathname: string): string[] {
  try {
    return pathname.split('/').slice(1).map(decodeURIComponent);
  } catch {
    throw notFound();
  }
}

/** Starts the web view over `runtime`; resolves once it listens. */
export async function startUi(runtime: Runtime, options: UiOptions = {}): Promise<UiServer> {
  const host = options.host ?? '127.0.0.1';
  const listLimit = options.listLimit ?? 100;
  const streams = new Set<AbortController>();

  async function view(runId: string): Promise<RunView> {
    // The status first: an unknown run is refused as such before anything else is read.
    const report = await runtime.status(runId);
    const [trace, ledger, usage] = await Promise.all([
      runtime.trace(runId),
      runtime.ledger(runId),
      runtime.usage(runId),
    ]);
    return { report, trace, ledger, usage };
  }

  function runIdOf(raw: string): string {
    if (!isRunId(raw)) throw notFound('That is not a run id.');
    return raw;
  }

  async function listPage(url: URL, res: ServerResponse): Promise<void> {
    const form: ListFilterForm = {
      status: url.searchParams.get('status')?.trim() ?? '',
      plan: url.searchParams.get('plan')?.trim() ?? '',
      tenant: url.searchParams.get('tenant')?.trim() ?? '',
    };
    const filter: RunListFilter = {
      limit: listLimit,
      ...(form.status === '' ? {} : { status: form.status as RunStatus }),
      ...(form.plan === '' ? {} : { plan: form.plan }),
      ...(form.tenant === '' ? {} : { tenantId: form.tenant }),
    };
    try {
      send(res, 200, renderListPage(await runtime.list(filter), form));
    } catch (error) {
      if (!isFlujoError(error) || error.code !== 'input_invalid') throw error;
      send(res, 400, renderListPage([], form, error.message));
    }
  }

  async function runPage(runId: string, res: ServerResponse, notice?: Notice, status = 200) {
    send(res, status, renderRunPage(await view(runId), notice));
  }

  async function runData(runId: string, res: ServerResponse): Promise<void> {
    const v = await view(runId);
    const body = JSON.stringify({
      title: `${runTitle(v.report)} · flujo`,
      status: v.report.status,
      parts: runParts(v),
      trace: v.trace,
    });
    send(res, 200, body, 'application/json; charset=utf-8');
  }

  /** Server-sent events: one `run` event per event of the run, from its start or `Last-Event-ID`. */
  async function runEvents(runId: string, req: IncomingMessage, res: ServerResponse) {
    // Refused before the stream opens: an unknown run gets its 404 page.
    await runtime.status(runId);
    const last = req.headers['last-event-id'];
    let after = typeof last === 'string' && STREAM_ID.test(last) ? last : undefined;
    const stop = new AbortController();
    streams.add(stop);
    res.on('close', () => stop.abort());
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-store',
      connection: 'keep-alive',
    });
    res.write('retry: 1000\n\n');
    // Keeps proxies and idle timeouts from closing a quiet stream.
    const beat = setInterval(() => res.write(': still here\n\n'), 15_000);
    try {
      // A run's stream ends with its run.finished event; a resumed run goes on, so read on.
      while (!stop.signal.aborted) {
        let read = 0;
        for await (const e of runtime.events(runId, {
          follow: true,
          signal: stop.signal,
          ...(after === undefined ? {} : { after }),
        })) {
          res.write(`id: ${e.id}\nevent: run\ndata: ${JSON.stringify({ type: e.type })}\n\n`);
          after = e.id;
          read++;
        }
        if (read === 0 && !stop.signal.aborted) await new Promise((r) => setTimeout(r, 250));
      }
    } catch (error) {
      if (!stop.signal.aborted) {
        const message =
          isFlujoError(error) && error.code === 'run_not_found'
            ? 'the run is gone'
            : 'lost the run’s events; reload the page';
        res.write(`event: gone\ndata: ${JSON.stringify({ message })}\n\n`);
      }
    } finally {
      clearInterval(beat);
      streams.delete(stop);
      res.end();
    }
  }

  async function decide(
    runId: string,
    stepId: string,
    decision: 'approve' | 'reject',
    req: IncomingMessage,
    res: ServerResponse,
  ): Promise<void> {
    // A page of another site may post a form here: only this view's own pages may decide.
    const origin = req.headers.origin;
    const site = req.headers['sec-fetch-site'];
    if (
      (origin !== undefined && origin !== `http://${req.headers.host ?? ''}`) ||
      (site !== undefined && site !== 'same-origin' && site !== 'none')
    ) {
      throw new HttpError(
        403,
        'Refused',
        `A decision sent from another site (${origin ?? String(site)}) is refused: approve or reject from this view's own run page.`,
      );
    }
    const form = await readForm(req);
    const by = form.get('by')?.trim() ?? '';
    const comment = form.get('comment')?.trim() ?? '';
    const callId = form.get('callId') ?? '';
    if (by === '') {
      return runPage(
        runId,
        res,
        { kind: 'error', text: 'Say who decides: fill in "by" (your name), then decide again.' },
        400,
      );
    }
    const input: DecisionInput = {
      by,
      ...(comment === '' ? {} : { comment }),
      ...(callId === '' ? {} : { callId }),
    };
    try {
      if (decision === 'approve') await runtime.approve(runId, stepId, input);
      else await runtime.reject(runId, stepId, input);
    } catch (error) {
      const status = !isFlujoError(error)
        ? undefined
        : (
            {
              approval_not_allowed: 403,
              step_not_waiting: 409,
              input_invalid: 400,
            } as Record<string, number>
          )[error.code];
      if (status === undefined) throw error;
      return runPage(runId, res, { kind: 'error', text: (error as Error).message }, status);
    }
    res.writeHead(303, { location: urlPath('runs', runId) });
    res.end();
  }

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (LOOPBACK.has(host) && !LOOPBACK.has(hostnameOf(req.headers.host))) {
      // A name that resolves to this machine but is not its own: a page of another site.
      throw new HttpError(421, 'Wrong host', 'Open this view at 127.0.0.1 or localhost.');
    }
    const url = new URL(req.url ?? '/', 'http://localhost');
    const parts = segmentsOf(url.pathname);
    const method = req.method ?? 'GET';
    const get = method === 'GET' || method === 'HEAD';
    if (url.pathname === '/' && get) return listPage(url, res);
    if (parts[0] !== 'runs' || parts[1] === undefined || parts[1] === '') throw notFound();
    const runId = runIdOf(parts[1]);
    const rest = parts.slice(2);
    if (get && rest.length === 0) return runPage(runId, res);
    if (get && rest.length === 1 && rest[0] === 'data') return runData(runId, res);
    if (get && rest.length === 1 && rest[0] === 'events') return runEvents(runId, req, res);
    if (get && rest.length === 1 && rest[0] === 'trace') {
      return send(res, 200, renderTraceHtml(await runtime.trace(runId)));
    }
    if (
      method === 'POST' &&
      rest.length === 3 &&
      rest[0] === 'steps' &&
      (rest[2] === 'approve' || rest[2] === 'reject')
    ) {
      return decide(runId, rest[1]!, rest[2], req, res);
    }
    throw notFound();
  }

  const server = createServer((req, res) => {
    route(req, res).catch((error: unknown) => {
      if (res.headersSent) {
        res.end();
        return;
      }
      if (error instanceof HttpError) {
        send(res, error.status, renderMessagePage(error.title, error.message));
      } else if (isFlujoError(error) && error.code === 'run_not_found') {
        send(res, 404, renderMessagePage('Run not found', error.message));
      } else {
        const message = error instanceof Error ? error.message : String(error);
        const status = isFlujoError(error) && error.code === 'redis_unavailable' ? 503 : 500;
        send(res, status, renderMessagePage('Something went wrong', message));
      }
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 7400, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  const shown = host.includes(':') ? `[${host}]` : host;
  return {
    url: `http://${shown}:${port}/`,
    async close() {
      for (const s of streams) s.abort();
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      await closed;
    },
  };
}
