/**
 * The research agent as a job module for the `flujo` CLI: one GRANULAR agent step that searches a
 * small local corpus, writes notes into the job's data directory and e-mails a summary through the
 * demo service (examples/durable-job/service.ts), one durable unit of work per model turn. The
 * model is the scripted model server of `flujo/testing` (see script.ts), or the OpenAI-compatible
 * endpoint of OPENAI_BASE_URL with OPENAI_API_KEY (and OPENAI_MODEL).
 *
 *   npx flujo run examples/research-agent/job.ts
 *   npx flujo resume <runId> examples/research-agent/job.ts
 *
 * The agents are exported as a function: the CLI calls it after `setup`, which is where the
 * scripted model server starts and its URL becomes known.
 */
import {
  appendFileSync,
  existsSync,
  linkSync,
  mkdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { z } from 'zod';
import { defineAgent, defineTool, plan as planOf, Step, type AgentDefinition } from 'flujo';
import { startModel, type ModelEndpoint } from '../durable-job/model.ts';
import { ensureService, type ServiceHandle } from '../durable-job/service.ts';
import { search } from './corpus.ts';
import { DEFAULT_TO, researchReply } from './script.ts';

/** The run input when none is given: `--input '{"question":"…","to":"…"}'` overrides it. */
export const input = {
  question: 'How does a honeybee colony survive the winter?',
  to: DEFAULT_TO,
};

/** One granular agent step: a durable unit, and a commit, per model turn. */
export const plan = planOf(
  'research-agent',
  [
    Step.granular('research', 'researcher', undefined, {
      description: 'Search the corpus, write notes, e-mail a summary, answer.',
      maxTurns: 8,
      effects: ['local', 'external'],
      retry: { maxAttempts: 4, initialDelayMs: 250, backoffCoefficient: 2, maxDelayMs: 5000 },
    }),
  ],
  // Generous: a person may take a while between killing a run and resuming it.
  { budgets: { maxSteps: 10, maxToolCalls: 20, maxWallClockMs: 15 * 60_000 } },
);

// Set by setup(): where notes go, which service sends e-mail, where the model is.
let dataDir: string | undefined;
let service: ServiceHandle | undefined;
let model: ModelEndpoint | undefined;

function needSetup(): string {
  if (dataDir === undefined) {
    throw Object.assign(
      new Error('the research-agent module was not set up: call setup({ dataDir })'),
      { retryable: false },
    );
  }
  return dataDir;
}

/**
 * Called once before a run, resume or worker: finds the demo service of `dataDir` or starts one
 * (detached), and starts the scripted model server (or checks OPENAI_BASE_URL / OPENAI_API_KEY).
 * The returned function stops what this process started.
 */
export async function setup(ctx: { dataDir: string }): Promise<() => Promise<void>> {
  dataDir = resolve(ctx.dataDir);
  const endpoint = await startModel({
    dataDir,
    name: 'research',
    scriptedModel: 'scripted-researcher',
    reply: researchReply,
  });
  model = endpoint;
  const found = await ensureService(dataDir);
  service = found;
  return async () => {
    await endpoint.close();
    if (found.started) await found.stop();
  };
}

/** The model the agent talks to (after setup). */
export function modelEndpoint(): ModelEndpoint {
  needSetup();
  return model!;
}

/** The URL of the e-mail service (after setup). */
export function serviceUrl(): string {
  needSetup();
  return service!.url;
}

/** Searches the corpus. Read-only: a re-run has no effect, and the ledger keeps its result. */
export const searchCorpus = defineTool({
  name: 'search_corpus',
  description:
    'Searches the library of notes on honeybees in winter; returns the best files with a matching sentence.',
  input: z.object({
    query: z.string().min(1).describe('keywords'),
    limit: z.number().int().min(1).max(5).optional().describe('how many files, 3 if not given'),
  }),
  class: 'read_only',
  run: ({ query, limit }) => ({ hits: search(query, limit) }),
});

/** Where the notes of a run go, and the log of every write (to count effects). */
export const notesDir = (dir: string, runId: string) =>
  join(dir, 'research-agent', 'notes', runId.replace(/[^\w.-]/g, '_'));
export const notesLog = (dir: string) => join(dir, 'research-agent', 'notes.jsonl');

/** One line of `notes.jsonl`. */
export interface NotesRecord {
  at: number;
  runId: string;
  key: string;
  file: string;
  outcome: 'effect' | 'duplicate';
}

/** The notes writes of a run, from the log. */
export function notesRecords(dir: string, runId: string): NotesRecord[] {
  const file = notesLog(dir);
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as NotesRecord)
    .filter((r) => r.runId === runId);
}

const slug = (s: string) =>
  s
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-|-$/g, '')
    .slice(0, 60) || 'notes';

/**
 * Writes a notes file into the data directory: a local side effect, keyed by the turn's
 * idempotency key, which the runtime fills in (`idempotency_key`, hidden from the model). The file
 * name holds the key, and the file is published with an exclusive link: a re-run of the same call
 * (same key, same title) finds it and writes nothing, so the notes are written once however often
 * the turn runs.
 */
export const writeNotes = defineTool({
  name: 'write_notes',
  description:
    'Saves research notes as a markdown file; returns its path and a file URL to attach.',
  input: z.object({
    title: z.string().min(1).max(200),
    text: z.string().min(1).max(20_000),
    idempotency_key: z.string(),
  }),
  output: z.object({ path: z.string(), url: z.string(), bytes: z.number(), title: z.string() }),
  class: 'local',
  requiresIdempotencyKey: true,
  run: ({ title, text, idempotency_key: key }, ctx) => {
    const dir = notesDir(needSetup(), ctx.runId);
    mkdirSync(dir, { recursive: true });
    const path = join(dir, `${slug(title)}-${key.slice(0, 12)}.md`);
    const content = `# ${title}\n\n${text}\n`;
    const tmp = `${path}.${process.pid}.tmp`;
    writeFileSync(tmp, content);
    let outcome: NotesRecord['outcome'] = 'effect';
    try {
      linkSync(tmp, path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      outcome = 'duplicate';
    } finally {
      rmSync(tmp, { force: true });
    }
    const record: NotesRecord = { at: Date.now(), runId: ctx.runId, key, file: path, outcome };
    appendFileSync(notesLog(needSetup()), `${JSON.stringify(record)}\n`);
    const bytes = Buffer.byteLength(readFileSync(path));
    return { path, url: pathToFileURL(path).href, bytes, title };
  },
});

/**
 * Sends an e-mail through the demo service. External: the service honours the Idempotency-Key
 * header, which carries the call's own ledger key (`ctx.idempotencyKey`, derived from the turn's
 * key and the model's tool call id, so two e-mails of one turn stay apart). The tool declares
 * `idempotency_key` too: a keyed tool of a granular step must take the turn's key, and the
 * runtime checks it is there before the call can have any effect.
 */
export const sendEmail = defineTool({
  name: 'send_email',
  description: 'Sends an e-mail with a link to an attachment (e.g. the notes file URL).',
  input: z.object({
    to: z.email(),
    subject: z.string().min(1).max(200),
    body: z.string().min(1).max(10_000),
    attachmentUrl: z.url(),
    idempotency_key: z.string(),
  }),
  output: z.object({ messageId: z.string(), to: z.string(), queued: z.boolean() }),
  class: 'external',
  requiresIdempotencyKey: true,
  // `high` or `critical` would hold every call for a person's approval.
  riskLevel: 'medium',
  run: async ({ to, subject, body, attachmentUrl }, ctx) => {
    const dir = needSetup();
    const send = (url: string) =>
      fetch(`${url}/email`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'idempotency-key': ctx.idempotencyKey,
          'x-flujo-run': ctx.runId,
        },
        body: JSON.stringify({ to, subject, body, attachmentUrl }),
        signal: ctx.signal,
      });
    let res: Response;
    try {
      res = await send(service!.url);
    } catch (err) {
      // Nothing listens (the service idled out): the request never arrived, so starting the
      // service again and resending cannot double an effect.
      if ((err as { cause?: { code?: string } }).cause?.code !== 'ECONNREFUSED') throw err;
      service = await ensureService(dir);
      res = await send(service.url);
    }
    const value: unknown = await res.json();
    if (!res.ok) {
      const message = `POST /email answered ${res.status}: ${JSON.stringify(value)}`;
      throw Object.assign(new Error(message), {
        retryable: res.status >= 500 || res.status === 429,
      });
    }
    return value;
  },
});

/** What the agent is told; a real model follows it, the scripted one plays it (script.ts). */
export const SYSTEM_PROMPT = [
  'You are a careful research assistant. The user message is JSON: { question, to }.',
  '1. Search the corpus with search_corpus (one or two queries) until you can answer.',
  '2. Save your notes once with write_notes: the question as title, and the sources you used with one key sentence each.',
  '3. E-mail a short summary to the address "to" with send_email, attaching the notes (attachmentUrl: the url write_notes returned).',
  '4. Then answer the question in one paragraph, without tool calls.',
].join('\n');

/** The research agent on the model setup() found; called by the CLI after setup. */
export function agents(): AgentDefinition[] {
  const m = modelEndpoint();
  return [
    defineAgent({
      name: 'researcher',
      model: m.model,
      provider: { baseURL: m.baseURL, apiKey: m.apiKey },
      systemPrompt: SYSTEM_PROMPT,
      tools: [searchCorpus, writeNotes, sendEmail],
      settings: { temperature: 0 },
      timeoutMs: m.scripted ? 10_000 : 60_000,
    }),
  ];
}
