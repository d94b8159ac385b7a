/**
 * The demos' model. By default it is the scripted model server of `flujo/testing`, spoken to by
 * the real `openai` client over HTTP, playing a script that is a function of each request: it
 * answers by what the conversation holds so far, so any number of runs, retries and resumes get
 * replies that fit. With `OPENAI_BASE_URL` and `OPENAI_API_KEY` set, the agents talk to that
 * OpenAI-compatible endpoint instead (`OPENAI_MODEL` names the model; default `gpt-4.1-mini`).
 *
 * The scripted server runs in the process that starts it, on a port kept in
 * `<dataDir>/<name>-model.json`: the next process that needs it uses the same server while its
 * process lives, and otherwise starts one on the same port. A granular agent step fingerprints
 * its provider's base URL, so a run resumed by another process (after a kill) must find its
 * model at the URL it started with.
 */
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import {
  startScriptedModelServer,
  type RecordedRequest,
  type ScriptedModelServer,
  type ScriptedReply,
} from 'flujo/testing';
import { ConfigurationError } from 'flujo';
import { isAlive } from './service.ts';

/** The model name agents use when OPENAI_BASE_URL is set and OPENAI_MODEL is not. */
export const DEFAULT_OPENAI_MODEL = 'gpt-4.1-mini';

/** Where the agents' model is. */
export interface ModelEndpoint {
  /** The provider's base URL. */
  baseURL: string;
  /** The model name to ask for. */
  model: string;
  /** The API key (a function for a real endpoint, so it is read at call time). */
  apiKey: string | (() => string);
  /** True for the scripted model server. */
  scripted: boolean;
  /** The scripted server when it runs in this process (to count its requests). */
  server: ScriptedModelServer | undefined;
  /** Stops the scripted server if this process started it. */
  close(): Promise<void>;
}

/** Options of {@link startModel}. */
export interface ModelOptions {
  /** Where `<name>-model.json` lives: the job's data directory. */
  dataDir: string;
  /** One scripted server per name and data directory, e.g. `research`. */
  name: string;
  /** The model name the agents ask the scripted server for. */
  scriptedModel: string;
  /** The script: the reply to one request, from what the request holds. */
  reply: (request: RecordedRequest) => ScriptedReply;
  /** @defaultValue `process.env` */
  env?: NodeJS.ProcessEnv;
}

interface ModelInfo {
  url: string;
  port: number;
  pid: number;
}

function readInfo(file: string): ModelInfo | undefined {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as ModelInfo;
  } catch {
    return undefined;
  }
}

/** True when a scripted model server answers at `url` (it names itself in its 404s). */
async function answers(url: string): Promise<boolean> {
  try {
    const res = await fetch(`${url}/models`, { signal: AbortSignal.timeout(1000) });
    const body = (await res.json()) as { error?: { message?: unknown } };
    return res.status === 404 && String(body.error?.message).startsWith('scripted model server');
  } catch {
    return false;
  }
}

/** The scripted server of the recorded info, when its process lives and it answers. */
async function live(info: ModelInfo | undefined): Promise<ModelInfo | undefined> {
  if (info === undefined || !isAlive(info.pid)) return undefined;
  return (await answers(info.url)) ? info : undefined;
}

const started = new Map<string, ScriptedModelServer>();

/** A scripted server on `port`, or undefined when something else listens there. */
async function listenOn(port: number): Promise<ScriptedModelServer | undefined> {
  try {
    return await startScriptedModelServer({ port });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE') return undefined;
    throw err;
  }
}

/**
 * Where the agents' model is: the endpoint of `OPENAI_BASE_URL`, else the scripted model server
 * of `name` in `dataDir`, found (in this or another live process) or started. Throws a
 * `ConfigurationError` naming the fix when OPENAI_BASE_URL is set without OPENAI_API_KEY.
 */
export async function startModel(options: ModelOptions): Promise<ModelEndpoint> {
  const env = options.env ?? process.env;
  const baseURL = env['OPENAI_BASE_URL'];
  if (baseURL !== undefined && baseURL !== '') {
    if ((env['OPENAI_API_KEY'] ?? '') === '') {
      throw new ConfigurationError(
        'OPENAI_BASE_URL is set but OPENAI_API_KEY is not: set both to use that endpoint, or unset OPENAI_BASE_URL to use the scripted model',
      );
    }
    return {
      baseURL,
      model: env['OPENAI_MODEL'] || DEFAULT_OPENAI_MODEL,
      apiKey: () => env['OPENAI_API_KEY'] ?? '',
      scripted: false,
      server: undefined,
      close: async () => {},
    };
  }
  const dir = resolve(options.dataDir);
  const file = join(dir, `${options.name}-model.json`);
  const endpoint = (url: string, server: ScriptedModelServer | undefined): ModelEndpoint => ({
    baseURL: url,
    model: options.scriptedModel,
    apiKey: 'scripted',
    scripted: true,
    server,
    close: async () => {
      if (server === undefined) return;
      started.delete(file);
      await server.close();
    },
  });

  const mine = started.get(file);
  if (mine !== undefined) return endpoint(mine.url, undefined);
  const before = readInfo(file);
  const found = await live(before);
  if (found !== undefined) return endpoint(found.url, undefined);

  let server = before === undefined ? undefined : await listenOn(before.port);
  if (server === undefined && before !== undefined) {
    // Another process may have started it meanwhile: use that one; else any free port.
    const now = await live(readInfo(file));
    if (now !== undefined) return endpoint(now.url, undefined);
  }
  if (server === undefined) {
    server = await startScriptedModelServer();
    if (before !== undefined) {
      console.error(
        `${options.name} model: port ${before.port} is taken, so the scripted model now listens on ${server.url}; granular runs started against the old URL cannot resume (their fingerprint names the provider's URL)`,
      );
    }
  }
  // Endless: each reply function puts itself back before it answers.
  const s: ScriptedModelServer = server;
  const play = (request: RecordedRequest): ScriptedReply => {
    s.enqueue(play);
    return options.reply(request);
  };
  s.enqueue(play);
  started.set(file, s);
  mkdirSync(dir, { recursive: true });
  const info: ModelInfo = { url: s.url, port: s.port, pid: process.pid };
  writeFileSync(`${file}.${process.pid}.tmp`, JSON.stringify(info));
  renameSync(`${file}.${process.pid}.tmp`, file);
  return endpoint(s.url, s);
}

/** The text of a request message's content. */
export function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((p: unknown) => (typeof p === 'object' && p !== null && 'text' in p ? String(p.text) : ''))
    .join('');
}
