/**
 * The web view (`flujo ui`): a local HTTP server (node:http, no framework) over a runtime. The run
 * list with filters, kept up to date by polling `/list.json`; a page per run that follows the run
 * live (server-sent events); and forms that act on a run through the runtime's own functions
 * (see `actions.ts`), posted only from this view's own pages.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { isFlujoError } from '../errors.js';
import { renderTraceHtml } from '../observability/trace-html.js';
import { isRunId } from '../persistence/keys.js';
import { readRunModule } from '../persistence/run-lookups.js';
import type { RunStatus } from '../machines/types.js';
import type { ChatMessage } from '../schemas/messages.js';
import { IDLE_WORK_MS, runtimeCore, type RunReport, type Runtime } from '../runtime.js';
import type { RunListFilter } from '../worker/run-list.js';
import {
  againOf,
  DONE,
  refusalOf,
  RUN_ACTIONS,
  runAction,
  STEP_ACTIONS,
  stepAction,
  type ActionResult,
  type RunAction,
  type StepAction,
} from './actions.js';
import { promptOf, type ModelCallView } from './detail-html.js';
import {
  listTableHtml,
  partHash,
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
import { renderSchedulesPage } from './schedules-html.js';
import { renderWorkersPage } from './workers-html.js';

/** Options of {@link startUi}. */
export interface UiOptions {
  /** The port to listen on; 0 picks a free one. @defaultValue 7400 */
  port?: number;
  /** The address to listen on. @defaultValue '127.0.0.1' (this machine only) */
  host?: string;
  /** How many runs the list shows at most (1 to 1000). @defaultValue 100 */
  listLimit?: number;
  /**
   * Called before a signal from a run's page is sent, e.g. to declare the signals of the run's
   * job module (`runtime.signals`), so that its payload is checked against them (`flujo ui`
   * does). @defaultValue none: the signals the runtime was given
   */
  declareSignals?: (runId: string) => Promise<void>;
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
/** The longest a run page's stream waits before it looks again for idle work. */
const MAX_IDLE_CHECK_MS = 60_000;

/** One server-sent event. `data` is one line of JSON (JSON.stringify never writes a newline). */
const sse = (event: string, data: string, id?: string): string =>
  `${id === undefined ? '' : `id: ${id}\n`}event: ${event}\ndata: ${data}\n\n`;

/**
 * How long to wait before looking again whether the run's due work waits for a worker: until the
 * soonest due step would count as idle, else `IDLE_WORK_MS`; null when the run is not
 * running (nothing is due until an event says otherwise).
 */
function nextIdleCheck(report: RunReport, now: number): number | null {
  if (report.status !== 'running') return null;
  if (report.idle !== null) return IDLE_WORK_MS;
  let soonest = Infinity;
  for (const s of report.steps) {
    const due =
      s.status === 'READY'
        ? s.updatedAt
        : s.status === 'FAILED_RETRYABLE' && s.retryAt !== null
          ? s.retryAt
          : null;
    if (due !== null) soonest = Math.min(soonest, due + IDLE_WORK_MS - now);
  }
  if (soonest === Infinity) return IDLE_WORK_MS;
  return Math.min(MAX_IDLE_CHECK_MS, Math.max(250, soonest + 50));
}

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
    const core = runtimeCore(runtime);
    const [trace, ledger, usage, module, meta, events, models, again] = await Promise.all([
      runtime.trace(runId),
      runtime.ledger(runId),
      runtime.usage(runId),
      // Named in the notice of due work that waits for a worker, only then read.
      report.idle === null ? null : readRunModule(core.redis, core.stores.keys, runId),
      core.meta.read(runId),
      core.stores.store.readEvents(runId),
      modelCalls(runId),
      againOf(runtime, runId),
    ]);
    return {
      report,
      trace,
      ledger,
      usage,
      module,
      input: meta.input,
      events,
      models,
      again,
    };
  }

  /**
   * The run's model calls as its model journal holds them, each with the conversation it
   * answered as the step's history holds it: for turn t of a granular step, the messages before
   * the step's (t+1)-th assistant message (all of them while the turn is not committed).
   */
  async function modelCalls(runId: string): Promise<ModelCallView[]> {
    const core = runtimeCore(runtime);
    const journaled = await core.stores.journal.list(runId);
    const steps = [...new Set(journaled.filter((j) => j.turn !== null).map((j) => j.stepId))];
    const histories = new Map<string, ChatMessage[]>(
      await Promise.all(
        steps.map(async (id) => [id, await core.stores.history.read(runId, id)] as const),
      ),
    );
    const calls: ModelCallView[] = [];
    for (const j of journaled) {
      if (j.turn === null) {
        j.replies.forEach((reply, index) =>
          calls.push({
            stepId: j.stepId,
            turn: null,
            attempt: j.attempt,
            // A call recorded one by one names its index; a paused attempt's list, the order.
            index: j.call ?? index,
            reply,
            prompt: null,
          }),
        );
        continue;
      }
      const reply = j.replies[0];
      if (reply === undefined) continue;
      calls.push({
        stepId: j.stepId,
        turn: j.turn,
        attempt: null,
        index: 0,
        reply,
        prompt: promptOf(histories.get(j.stepId) ?? [], j.turn),
      });
    }
    return calls;
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

  async function listData(url: URL, res: ServerResponse): Promise<void> {
    const filter: RunListFilter = { limit: listLimit };
    const status = url.searchParams.get('status')?.trim() ?? '';
    const plan = url.searchParams.get('plan')?.trim() ?? '';
    const tenant = url.searchParams.get('tenant')?.trim() ?? '';
    if (status !== '') filter.status = status as RunStatus;
    if (plan !== '') filter.plan = plan;
    if (tenant !== '') filter.tenantId = tenant;
    const html = listTableHtml(await runtime.list(filter));
    send(
      res,
      200,
      JSON.stringify({ hash: partHash(html), html }),
      'application/json; charset=utf-8',
    );
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

  /**
   * Server-sent events of a run page: one `run` event per event of the run, from its start or
   * `Last-Event-ID`; a `progress` event per `ctx.progress` report (first the latest of each step,
   * then each one as it is published; never in the run's history, so without an id); and an
   * `idle` event when due work waits for a worker (see `RunReport.idle`) or stopped waiting.
   */
  async function runEvents(runId: string, req: IncomingMessage, res: ServerResponse) {
    const core = runtimeCore(runtime);
    // Late writers (a progress report, an idle check) may outlive the stream: never after its end.
    const put = (text: string) => {
      if (!res.writableEnded && !res.destroyed) res.write(text);
    };
    // Subscribed before the latest progress is read, so that no report falls between the two;
    // reports that come before the stream opens wait in `early`.
    let early: string[] | null = [];
    const unsubscribe = await core.queues.subscribeProgress(runId, (message) => {
      if (early === null) put(sse('progress', message));
      else early.push(message);
    });
    let report: RunReport;
    try {
      // Refused before the stream opens: an unknown run gets its 404 page.
      report = await runtime.status(runId);
    } catch (error) {
      unsubscribe();
      throw error;
    }
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
    for (const [stepId, p] of Object.entries(report.progress)) {
      put(sse('progress', JSON.stringify({ runId, stepId, ...p })));
    }
    for (const message of early) put(sse('progress', message));
    early = null;
    // Keeps proxies and idle timeouts from closing a quiet stream.
    const beat = setInterval(() => put(': still here\n\n'), 15_000);
    // Idle work: one status read when due work could have waited IDLE_WORK_MS for a worker, and
    // none while events come (each re-arms the check). `idle` goes out while work waits, and once
    // more when it stopped waiting without an event (a worker took it), so the page redraws.
    let idleTimer: NodeJS.Timeout | undefined;
    let toldIdle = report.idle !== null;
    const arm = (ms: number | null) => {
      clearTimeout(idleTimer);
      if (ms === null || stop.signal.aborted) return;
      idleTimer = setTimeout(() => {
        runtime.status(runId).then(
          (now) => {
            if (stop.signal.aborted) return;
            if (now.idle !== null || toldIdle) {
              put(sse('idle', JSON.stringify({ runId, idle: now.idle })));
            }
            toldIdle = now.idle !== null;
            arm(nextIdleCheck(now, core.clock()));
          },
          () => arm(IDLE_WORK_MS),
        );
      }, ms);
    };
    arm(nextIdleCheck(report, core.clock()));
    try {
      // A run's stream ends with its run.finished event; a resumed run goes on, so read on.
      while (!stop.signal.aborted) {
        let read = 0;
        for await (const e of runtime.events(runId, {
          follow: true,
          signal: stop.signal,
          ...(after === undefined ? {} : { after }),
        })) {
          put(sse('run', JSON.stringify({ type: e.type }), e.id));
          after = e.id;
          read++;
          arm(IDLE_WORK_MS + 50);
        }
        if (read === 0 && !stop.signal.aborted) await new Promise((r) => setTimeout(r, 250));
      }
    } catch (error) {
      if (!stop.signal.aborted) {
        const message =
          isFlujoError(error) && error.code === 'run_not_found'
            ? 'the run is gone'
            : 'lost the run’s events; reload the page';
        put(sse('gone', JSON.stringify({ message })));
      }
    } finally {
      stop.abort();
      clearInterval(beat);
      clearTimeout(idleTimer);
      unsubscribe();
      streams.delete(stop);
      res.end();
    }
  }

  /**
   * A form of a run page: refused unless it comes from this view's own pages; then the action,
   * and a redirect to the page it leads to. A refusal shows on the run's page, whole.
   */
  async function act(
    runId: string,
    req: IncomingMessage,
    res: ServerResponse,
    perform: (form: URLSearchParams) => Promise<ActionResult>,
  ): Promise<void> {
    // A page of another site may post a form here: only this view's own pages may act.
    const origin = req.headers.origin;
    const site = req.headers['sec-fetch-site'];
    if (
      (origin !== undefined && origin !== `http://${req.headers.host ?? ''}`) ||
      (site !== undefined && site !== 'same-origin' && site !== 'none')
    ) {
      throw new HttpError(
        403,
        'Refused',
        `A form sent from another site (${origin ?? String(site)}) is refused: act from this view's own run page.`,
      );
    }
    const form = await readForm(req);
    let result: ActionResult;
    try {
      result = await perform(form);
    } catch (error) {
      const refusal = refusalOf(error);
      if (refusal === null) throw error;
      return runPage(runId, res, { kind: 'error', text: refusal.message }, refusal.status);
    }
    res.writeHead(303, { location: `${urlPath('runs', result.runId)}?done=${result.done}` });
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
    if (url.pathname === '/list.json' && get) return listData(url, res);
    if (url.pathname === '/schedules' && get) {
      return send(res, 200, renderSchedulesPage(await runtime.schedules()));
    }
    if (url.pathname === '/workers' && get) {
      return send(res, 200, renderWorkersPage(await runtime.workers()));
    }
    if (parts[0] !== 'runs' || parts[1] === undefined || parts[1] === '') throw notFound();
    const runId = runIdOf(parts[1]);
    const rest = parts.slice(2);
    if (get && rest.length === 0) {
      const done = url.searchParams.get('done') ?? '';
      const text = Object.hasOwn(DONE, done) ? DONE[done as keyof typeof DONE] : undefined;
      return runPage(runId, res, text === undefined ? undefined : { kind: 'ok', text });
    }
    if (get && rest.length === 1 && rest[0] === 'data') return runData(runId, res);
    if (get && rest.length === 1 && rest[0] === 'events') return runEvents(runId, req, res);
    if (get && rest.length === 1 && rest[0] === 'trace') {
      return send(res, 200, renderTraceHtml(await runtime.trace(runId)));
    }
    if (method === 'POST' && rest.length === 1 && RUN_ACTIONS.includes(rest[0] as RunAction)) {
      return act(runId, req, res, (form) =>
        runAction(runtime, runId, rest[0] as RunAction, form, options.declareSignals),
      );
    }
    if (
      method === 'POST' &&
      rest.length === 3 &&
      rest[0] === 'steps' &&
      STEP_ACTIONS.includes(rest[2] as StepAction)
    ) {
      const stepId = rest[1]!;
      return act(runId, req, res, (form) =>
        stepAction(runtime, runId, stepId, rest[2] as StepAction, form),
      );
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
