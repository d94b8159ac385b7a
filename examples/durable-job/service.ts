/**
 * The demo's stand-in for two external APIs: a report host (`POST /upload`) and a mail service
 * (`POST /email`). It records every request in an append-only JSON-lines file and honours the
 * `Idempotency-Key` header the way payment and mail APIs do: a key it has seen gets the first
 * response back, marked `Idempotent-Replayed: true`, and the effect does not happen again. Both the
 * counts and the keys are rebuilt from the file on start, so they survive restarts of the service.
 *
 *   GET /stats[?runId=ID]     { requests, effects, duplicates } by kind (upload, email)
 *   GET /requests[?runId=ID]  the recorded requests
 *   GET /files/<name>         an uploaded report
 *
 * Run it on its own with `node examples/durable-job/service.ts --data-dir DIR [--port N]`; the job
 * module starts it through {@link ensureService}. Only node: imports, so Node runs this file as is.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import {
  appendFileSync,
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { basename, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

/** The two effects the service performs. */
export type EffectKind = 'upload' | 'email';

/** Per-kind counts. */
export type Counts = Record<EffectKind, number>;

/** What `GET /stats` answers. */
export interface ServiceStats {
  /** Every POST to /upload or /email, accepted or not. */
  requests: Counts;
  /** Requests that really did their effect (stored a file, sent an e-mail). */
  effects: Counts;
  /** Requests whose Idempotency-Key was seen before: answered from the record, no effect. */
  duplicates: Counts;
}

/** One line of `requests.jsonl`. */
export interface RequestRecord {
  seq: number;
  at: number;
  kind: EffectKind;
  /** The `Idempotency-Key` header, if any. */
  key: string | null;
  /** The `X-Flujo-Run` header: which run sent it (for per-run counts). */
  runId: string | null;
  outcome: 'effect' | 'duplicate' | 'rejected';
  status: number;
  response: unknown;
}

/** Options of {@link startService}. */
export interface ServiceOptions {
  /** Where the request log, the uploads and `service.json` live. */
  dataDir: string;
  /** @defaultValue 0 (a free port) */
  port?: number;
  /** Exit after this long without a request (a detached service must not live forever). @defaultValue never */
  idleExitMs?: number;
}

/** A running service. */
export interface Service {
  url: string;
  /** Counts, over all requests or those of one run. */
  stats(runId?: string): ServiceStats;
  /** The recorded requests, over all or those of one run. */
  requests(runId?: string): RequestRecord[];
  close(): Promise<void>;
}

/** What `<dataDir>/service.json` holds: where the live service of a data directory listens. */
export interface ServiceInfo {
  url: string;
  pid: number;
  startedAt: number;
}

const counts = (): Counts => ({ upload: 0, email: 0 });

/** Counts of a list of records. */
export function statsOf(records: readonly RequestRecord[]): ServiceStats {
  const stats: ServiceStats = { requests: counts(), effects: counts(), duplicates: counts() };
  for (const r of records) {
    stats.requests[r.kind] += 1;
    if (r.outcome === 'effect') stats.effects[r.kind] += 1;
    if (r.outcome === 'duplicate') stats.duplicates[r.kind] += 1;
  }
  return stats;
}

function readRecords(file: string): RequestRecord[] {
  if (!existsSync(file)) return [];
  const out: RequestRecord[] = [];
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (line === '') continue;
    try {
      out.push(JSON.parse(line) as RequestRecord);
    } catch {
      // A line torn by a crash mid-write: its response never left, so it never happened.
    }
  }
  return out;
}

/** True when process `pid` runs (and is not a zombie waiting to be reaped). */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  try {
    // An exited child that its parent has not reaped yet (a zombie) is not running.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat[stat.lastIndexOf(')') + 2] !== 'Z';
  } catch {
    return true; // no procfs: trust kill(pid, 0)
  }
}

/**
 * One service per data directory, or two of them would each keep their own idempotency keys over
 * one log. The lock file holds the owner's pid; a lock whose owner is dead is taken over.
 */
function takeLock(file: string): void {
  for (let tries = 0; tries < 3; tries++) {
    try {
      const fd = openSync(file, 'wx');
      writeSync(fd, String(process.pid));
      closeSync(fd);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      const owner = Number(readFileSync(file, 'utf8'));
      if (owner > 0 && owner !== process.pid && isAlive(owner)) {
        throw Object.assign(
          new Error(
            `another service (pid ${owner}) already serves ${file.replace(/service\.lock$/, '')}; use it (see service.json) or stop it`,
          ),
          { code: 'SERVICE_RUNNING' },
        );
      }
      rmSync(file, { force: true });
    }
  }
  throw new Error(`could not take ${file}`);
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((ok, fail) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (chunk: string) => (body += chunk));
    req.on('end', () => ok(body));
    req.on('error', fail);
  });
}

const isString = (v: unknown, max = 10_000): v is string =>
  typeof v === 'string' && v.length > 0 && v.length <= max;

/** Checks a request body; returns what is wrong with it, or undefined. */
function problemOf(kind: EffectKind, body: Record<string, unknown>): string | undefined {
  if (kind === 'upload') {
    if (!isString(body['name'], 200) || !/^[\w.-]+$/.test(body['name'])) {
      return 'name: a file name of letters, digits, "_", "." or "-"';
    }
    if (!isString(body['html'], 1_000_000)) return 'html: the document, a non-empty string';
    return undefined;
  }
  for (const field of ['to', 'subject', 'body', 'attachmentUrl']) {
    if (!isString(body[field])) return `${field}: a non-empty string`;
  }
  return undefined;
}

/** Starts the service in this process; writes `<dataDir>/service.json` so others can find it. */
export async function startService(options: ServiceOptions): Promise<Service> {
  const dataDir = resolve(options.dataDir);
  const uploads = join(dataDir, 'uploads');
  mkdirSync(uploads, { recursive: true });
  const lockFile = join(dataDir, 'service.lock');
  takeLock(lockFile);
  const logFile = join(dataDir, 'requests.jsonl');
  const infoFile = join(dataDir, 'service.json');

  const records = readRecords(logFile);
  const firstResponse = new Map<string, RequestRecord>();
  for (const r of records) {
    if (r.outcome === 'effect' && r.key !== null) firstResponse.set(`${r.kind}\n${r.key}`, r);
  }
  let base = '';
  let idleTimer: NodeJS.Timeout | undefined;
  const touch = () => {
    if (options.idleExitMs === undefined) return;
    clearTimeout(idleTimer);
    idleTimer = setTimeout(() => void close().then(() => process.exit(0)), options.idleExitMs);
    idleTimer.unref();
  };

  function record(r: Omit<RequestRecord, 'seq' | 'at'>): RequestRecord {
    const full: RequestRecord = { seq: records.length + 1, at: Date.now(), ...r };
    // Synchronous, before the response: an effect that was answered is always on record.
    appendFileSync(logFile, `${JSON.stringify(full)}\n`);
    records.push(full);
    return full;
  }

  function effect(kind: EffectKind, body: Record<string, unknown>): unknown {
    const id = randomUUID().slice(0, 8);
    if (kind === 'upload') {
      const file = `${id}-${String(body['name'])}`;
      writeFileSync(join(uploads, file), String(body['html']));
      return { id, url: `${base}/files/${file}`, bytes: Buffer.byteLength(String(body['html'])) };
    }
    return { messageId: `<${id}@mail.tidewater.example>`, to: body['to'], queued: true };
  }

  function send(res: ServerResponse, status: number, value: unknown, replayed = false): void {
    res.writeHead(status, {
      'content-type': 'application/json',
      ...(replayed ? { 'idempotent-replayed': 'true' } : {}),
    });
    res.end(JSON.stringify(value));
  }

  async function post(kind: EffectKind, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const header = (name: string) => {
      const v = req.headers[name];
      return typeof v === 'string' && v !== '' ? v : null;
    };
    const key = header('idempotency-key');
    const runId = header('x-flujo-run');
    const text = await readBody(req);
    // From here on no await: check, effect and record happen in one turn of the event loop, so
    // two requests with one key can never both do the effect.
    const seen = key === null ? undefined : firstResponse.get(`${kind}\n${key}`);
    if (seen !== undefined) {
      record({
        kind,
        key,
        runId,
        outcome: 'duplicate',
        status: seen.status,
        response: seen.response,
      });
      send(res, seen.status, seen.response, true);
      return;
    }
    let body: Record<string, unknown>;
    try {
      const parsed: unknown = JSON.parse(text);
      if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new Error();
      body = parsed as Record<string, unknown>;
    } catch {
      body = {};
    }
    const problem = problemOf(kind, body);
    if (problem !== undefined) {
      const response = { error: `bad ${kind} request: ${problem}` };
      record({ kind, key, runId, outcome: 'rejected', status: 400, response });
      send(res, 400, response);
      return;
    }
    const done = record({
      kind,
      key,
      runId,
      outcome: 'effect',
      status: 200,
      response: effect(kind, body),
    });
    if (key !== null) firstResponse.set(`${kind}\n${key}`, done);
    send(res, 200, done.response);
  }

  const server = createServer((req, res) => {
    touch();
    const url = new URL(req.url ?? '/', 'http://localhost');
    const runId = url.searchParams.get('runId') ?? undefined;
    const path = url.pathname;
    if (req.method === 'POST' && (path === '/upload' || path === '/email')) {
      post(path === '/upload' ? 'upload' : 'email', req, res).catch((err: unknown) =>
        send(res, 500, { error: String(err) }),
      );
    } else if (req.method === 'GET' && path === '/stats') {
      send(res, 200, service.stats(runId));
    } else if (req.method === 'GET' && path === '/requests') {
      send(res, 200, service.requests(runId));
    } else if (req.method === 'GET' && path.startsWith('/files/')) {
      const file = join(uploads, basename(decodeURIComponent(path.slice('/files/'.length))));
      if (!existsSync(file)) {
        send(res, 404, { error: 'no such file' });
      } else {
        res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
        res.end(readFileSync(file));
      }
    } else {
      send(res, 404, { error: `no route ${req.method ?? ''} ${path}` });
    }
  });

  try {
    await new Promise<void>((ok, fail) => {
      server.once('error', fail);
      server.listen(options.port ?? 0, '127.0.0.1', () => ok());
    });
  } catch (err) {
    rmSync(lockFile, { force: true });
    throw err;
  }
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const info: ServiceInfo = { url: base, pid: process.pid, startedAt: Date.now() };
  writeFileSync(`${infoFile}.tmp`, JSON.stringify(info));
  renameSync(`${infoFile}.tmp`, infoFile);
  touch();

  let closing: Promise<void> | undefined;
  function close(): Promise<void> {
    closing ??= (async () => {
      clearTimeout(idleTimer);
      server.closeAllConnections();
      await new Promise<void>((ok) => server.close(() => ok()));
      if (readInfo(dataDir)?.pid === process.pid) rmSync(infoFile, { force: true });
      rmSync(lockFile, { force: true });
    })();
    return closing;
  }

  const service: Service = {
    url: base,
    stats: (id) => statsOf(id === undefined ? records : records.filter((r) => r.runId === id)),
    requests: (id) => (id === undefined ? [...records] : records.filter((r) => r.runId === id)),
    close,
  };
  return service;
}

/** What `<dataDir>/service.json` says, if anything. */
export function readInfo(dataDir: string): ServiceInfo | undefined {
  try {
    return JSON.parse(readFileSync(join(resolve(dataDir), 'service.json'), 'utf8')) as ServiceInfo;
  } catch {
    return undefined;
  }
}

/** `GET /stats` of the service at `url`. */
export async function fetchStats(url: string, runId?: string): Promise<ServiceStats> {
  const query = runId === undefined ? '' : `?runId=${encodeURIComponent(runId)}`;
  const res = await fetch(`${url}/stats${query}`, { signal: AbortSignal.timeout(2000) });
  if (!res.ok) throw new Error(`GET ${url}/stats answered ${res.status}`);
  return (await res.json()) as ServiceStats;
}

/** The service that `<dataDir>/service.json` names, if it answers. */
export async function liveService(dataDir: string): Promise<ServiceInfo | undefined> {
  const info = readInfo(dataDir);
  if (info === undefined || !isAlive(info.pid)) return undefined;
  try {
    await fetchStats(info.url);
    return info;
  } catch {
    return undefined;
  }
}

/** A service found or started by {@link ensureService}. */
export interface ServiceHandle extends ServiceInfo {
  /** True when this call started it. */
  started: boolean;
  /** Stops it (SIGTERM to its process, then waits for it to go). */
  stop(): Promise<void>;
}

/** How long a detached service waits for requests before it exits on its own. */
export const DETACHED_IDLE_EXIT_MS = 10 * 60_000;

/** Node arguments that let this Node run this .ts file: none where Node strips types itself. */
function loaderArgs(): string[] {
  if (process.features.typescript) return [];
  try {
    return ['--import', import.meta.resolve('tsx')];
  } catch {
    return ['--import', 'tsx'];
  }
}

/**
 * The service of `dataDir`: the one `service.json` points at when it answers, else a new one in
 * a detached process. Detached, not in this process, because the point of the demo is to SIGKILL
 * the process that runs the job: the service must outlive it, so that it can be asked afterwards
 * what it saw, and so that the resumed run talks to the same service. (An in-process service would
 * also count correctly, since its log and keys are on disk, but it would die with the worker.) A
 * detached service exits after {@link DETACHED_IDLE_EXIT_MS} without requests.
 */
export async function ensureService(
  dataDir: string,
  options: { idleExitMs?: number; timeoutMs?: number } = {},
): Promise<ServiceHandle> {
  const dir = resolve(dataDir);
  const handle = (info: ServiceInfo, started: boolean): ServiceHandle => ({
    ...info,
    started,
    async stop() {
      try {
        process.kill(info.pid, 'SIGTERM');
      } catch {
        return; // already gone
      }
      const deadline = Date.now() + 5000;
      while (isAlive(info.pid) && Date.now() < deadline) await sleep(20);
    },
  });
  const live = await liveService(dir);
  if (live !== undefined) return handle(live, false);

  mkdirSync(dir, { recursive: true });
  const log = openSync(join(dir, 'service.log'), 'a');
  const args = [
    ...loaderArgs(),
    fileURLToPath(import.meta.url),
    '--data-dir',
    dir,
    '--idle-exit-ms',
    String(options.idleExitMs ?? DETACHED_IDLE_EXIT_MS),
  ];
  // Its own session (detached): a Ctrl-C or a kill of this process group does not reach it.
  const child = spawn(process.execPath, args, { detached: true, stdio: ['ignore', log, log] });
  closeSync(log);
  let exited: number | null = null;
  child.once('exit', (code) => (exited = code ?? -1));
  child.unref();
  const deadline = Date.now() + (options.timeoutMs ?? 10_000);
  while (Date.now() < deadline) {
    const info = await liveService(dir);
    // Another process may have won the race to start one: use whichever answers.
    if (info !== undefined) return handle(info, info.pid === child.pid);
    if (exited !== null && exited !== 3) break;
    await sleep(25);
  }
  throw new Error(
    `the demo service did not start (exit code ${String(exited)}); see ${join(dir, 'service.log')}`,
  );
}

const sleep = (ms: number) => new Promise((ok) => setTimeout(ok, ms));

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      'data-dir': { type: 'string' },
      port: { type: 'string' },
      'idle-exit-ms': { type: 'string' },
    },
  });
  const dataDir = values['data-dir'];
  if (dataDir === undefined) {
    console.error('usage: node service.ts --data-dir DIR [--port N] [--idle-exit-ms MS]');
    process.exit(2);
  }
  let service: Service;
  try {
    service = await startService({
      dataDir,
      ...(values.port === undefined ? {} : { port: Number(values.port) }),
      ...(values['idle-exit-ms'] === undefined
        ? {}
        : { idleExitMs: Number(values['idle-exit-ms']) }),
    });
  } catch (err) {
    console.error(String(err));
    process.exit((err as { code?: string }).code === 'SERVICE_RUNNING' ? 3 : 1);
  }
  console.log(`demo service ${service.url} (pid ${process.pid}), data in ${resolve(dataDir)}`);
  const stop = () => void service.close().then(() => process.exit(0));
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await main();
}
