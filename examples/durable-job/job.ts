/**
 * The durable-job demo as a job module for the `flujo` CLI: crawl a folder of docs pages, have an
 * agent draft a report on them, render it to HTML, upload it, and e-mail a link to it. Upload and
 * e-mail are real HTTP calls to the demo service (service.ts), made through the tool-call ledger
 * with the ledger's idempotency key, so a worker killed at any point never uploads or sends twice.
 * The agent's model is the scripted model server of `flujo/testing` (model.ts), or the
 * OpenAI-compatible endpoint of OPENAI_BASE_URL with OPENAI_API_KEY (and OPENAI_MODEL).
 *
 *   npx flujo run examples/durable-job/job.ts
 *   npx flujo resume <runId> examples/durable-job/job.ts
 */
import { createHash } from 'node:crypto';
import { mkdir, readFile, readdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import type { RecordedRequest, ScriptedReply } from 'flujo/testing';
import {
  defineAgent,
  defineTool,
  Step,
  type AgentDefinition,
  type AgentResult,
  type JsonValue,
  type Operator,
  type PlanInput,
} from 'flujo';
import { startModel, textOf, type ModelEndpoint } from './model.ts';
import { ensureService, type ServiceHandle } from './service.ts';

/** Where the fixture pages are. */
export const PAGES_DIR = fileURLToPath(new URL('./pages', import.meta.url));

/** The run input when none is given. */
export const input = { to: 'docs-team@tidewater.example' };

const retry = { maxAttempts: 4, initialDelayMs: 250, backoffCoefficient: 2, maxDelayMs: 5000 };

/**
 * What the report step asks its agent. The agent is also given the crawl step's output (an agent
 * step gets `{ input, results }` from the steps it depends on): the pages' titles and sizes; it
 * reads the pages' text with its read_pages tool.
 */
export const REPORT_TASK =
  'Draft a short report on the Tidewater docs for the docs team: read the pages with read_pages, then write one opening sentence with the number of pages, and one line per page ("- <title>: <what the page says, in one sentence>"). Plain text, no markdown headings.';

/** crawl → report → render → upload → email, no gates. */
export const plan = {
  name: 'docs-report',
  description: 'Crawl the Tidewater docs, report on them, render, upload and e-mail the report.',
  // Generous: a person may take a while between killing a run and resuming it.
  budgets: { maxSteps: 20, maxToolCalls: 10, maxWallClockMs: 15 * 60_000 },
  defaults: { retry: { ...retry, jitter: 0.2 } },
  steps: [
    { id: 'crawl', kind: 'operator', operator: 'crawl', effects: ['read_only'] },
    // An ATOMIC agent step: drafting is a short exchange (read the pages, write the text) whose
    // only tool is read-only, so there is nothing in it to protect turn by turn. A worker that
    // dies mid-draft costs a fresh draft, one or two model calls, and nothing downstream has
    // happened yet: render, upload and e-mail wait for the committed report, and use that one
    // text whatever happens after. Granular mode would add a unit of work, a commit and a history
    // in Redis per turn for no gain here; it pays when turns have effects or are costly to redo
    // (see examples/research-agent).
    Step.agent('report', 'reporter', REPORT_TASK, {
      mode: 'atomic',
      maxTurns: 4,
      dependsOn: ['crawl'],
      effects: ['read_only'],
    }),
    {
      id: 'render',
      kind: 'operator',
      operator: 'render',
      // crawl for the figures, report for the text.
      dependsOn: ['crawl', 'report'],
      effects: ['local'],
    },
    {
      id: 'upload',
      kind: 'operator',
      operator: 'upload',
      dependsOn: ['render'],
      effects: ['external'],
      riskLevel: 'medium',
    },
    {
      id: 'email',
      kind: 'operator',
      operator: 'email',
      dependsOn: ['upload'],
      effects: ['external'],
      // `high` or `critical` would make the step wait for a person, as `gatedPlan` below does.
      riskLevel: 'medium',
    },
  ],
} satisfies PlanInput;

/** The same job, with the e-mail waiting for a person's approval (`flujo approve <runId> email`). */
export const gatedPlan = {
  ...plan,
  name: 'docs-report-gated',
  steps: plan.steps.map((s): PlanInput['steps'][number] =>
    s.id === 'email'
      ? { ...s, gate: { approvers: ['ops'], reason: 'sends an e-mail outside the company' } }
      : s,
  ),
} satisfies PlanInput;

// Set by setup(): where reports are rendered, which service the tools call, where the model is.
let dataDir: string | undefined;
let service: ServiceHandle | undefined;
let model: ModelEndpoint | undefined;

function needSetup(): string {
  if (dataDir === undefined) {
    throw Object.assign(
      new Error('the durable-job module was not set up: call setup({ dataDir })'),
      {
        retryable: false,
      },
    );
  }
  return dataDir;
}

/**
 * Called once before a run, resume or worker: finds the demo service of `dataDir` or starts one
 * (detached, see ensureService), and starts the scripted model server (or checks OPENAI_BASE_URL
 * and OPENAI_API_KEY, see model.ts). The returned function stops what this process started.
 */
export async function setup(ctx: { dataDir: string }): Promise<() => Promise<void>> {
  dataDir = resolve(ctx.dataDir);
  const endpoint = await startModel({
    dataDir,
    name: 'durable-job',
    scriptedModel: 'scripted-reporter',
    reply: reporterReply,
  });
  model = endpoint;
  const found = await ensureService(dataDir);
  service = found;
  return async () => {
    await endpoint.close();
    if (found.started) await found.stop();
  };
}

/** The model the report agent talks to (after setup). */
export function modelEndpoint(): ModelEndpoint {
  needSetup();
  return model!;
}

/** The URL of the service the tools call (after setup). */
export function serviceUrl(): string {
  needSetup();
  return service!.url;
}

interface CallContext {
  idempotencyKey: string;
  runId: string;
  signal: AbortSignal;
}

/** POSTs to the service with the ledger's idempotency key. 4xx is final; anything else retryable. */
async function post(path: string, body: unknown, ctx: CallContext): Promise<unknown> {
  const dir = needSetup();
  const send = (url: string) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'idempotency-key': ctx.idempotencyKey,
        'x-flujo-run': ctx.runId,
      },
      body: JSON.stringify(body),
      signal: ctx.signal,
    });
  let res: Response;
  try {
    res = await send(service!.url);
  } catch (err) {
    // Nothing listens (the service was stopped, or idled out): the request never arrived, so
    // starting the service again and resending cannot double an effect.
    if ((err as { cause?: { code?: string } }).cause?.code !== 'ECONNREFUSED') throw err;
    service = await ensureService(dir);
    res = await send(service.url);
  }
  const value: unknown = await res.json();
  if (!res.ok) {
    const message = `POST ${path} answered ${res.status}: ${JSON.stringify(value)}`;
    throw Object.assign(new Error(message), { retryable: res.status >= 500 || res.status === 429 });
  }
  return value;
}

/** Uploads the rendered report. External; the service dedupes by the idempotency key. */
export const uploadReport = defineTool({
  name: 'upload_report',
  description: 'Uploads an HTML report to the report host and returns its URL.',
  input: z.object({ name: z.string().regex(/^[\w.-]+$/), html: z.string().min(1) }),
  output: z.object({ id: z.string(), url: z.string(), bytes: z.number() }),
  class: 'external',
  requiresIdempotencyKey: true,
  riskLevel: 'medium',
  run: (args, ctx) => post('/upload', args, ctx),
});

/** Sends the e-mail with the report's link. External; deduped by the idempotency key. */
export const sendEmail = defineTool({
  name: 'send_email',
  description: 'Sends an e-mail with a link to an attachment.',
  input: z.object({
    to: z.email(),
    subject: z.string().min(1),
    body: z.string().min(1),
    attachmentUrl: z.url(),
  }),
  output: z.object({ messageId: z.string(), to: z.string(), queued: z.boolean() }),
  class: 'external',
  requiresIdempotencyKey: true,
  // `high` or `critical` would hold every call for a person's approval.
  riskLevel: 'medium',
  run: (args, ctx) => post('/email', args, ctx),
});

/** The tools the operators call. */
export const tools = [uploadReport, sendEmail];

/** A fixture page, read. */
interface PageText {
  file: string;
  title: string;
  /** The visible text, without the title. */
  text: string;
  /** The text of the page's paragraphs only. */
  paragraphs: string;
}

const plain = (html: string) =>
  html
    .replace(/<[^>]+>/g, ' ')
    .replace(/&amp;/g, '&')
    .replace(/\s+/g, ' ')
    .trim();

/** Reads the fixture pages, sorted by file name. */
async function readPages(): Promise<PageText[]> {
  const files = (await readdir(PAGES_DIR)).filter((f) => f.endsWith('.html')).sort();
  const pages: PageText[] = [];
  for (const file of files) {
    const html = await readFile(join(PAGES_DIR, file), 'utf8');
    const title = /<title>([^<]*)<\/title>/i.exec(html)?.[1]?.trim() ?? file;
    const text = plain(html.replace(/<title>[^<]*<\/title>/i, ' '));
    const paragraphs = [...html.matchAll(/<p>([\s\S]*?)<\/p>/gi)].map((m) => plain(m[1]!));
    pages.push({ file, title, text, paragraphs: paragraphs.join(' ') });
  }
  return pages;
}

/** The report agent's one tool: the pages the crawl read. Read-only. */
export const readPagesTool = defineTool({
  name: 'read_pages',
  description:
    'Returns every page of the Tidewater docs: file, title, word count and paragraph text.',
  input: z.object({}),
  class: 'read_only',
  run: async () => ({
    pages: (await readPages()).map((p) => ({
      file: p.file,
      title: p.title,
      words: p.text.split(' ').length,
      text: p.paragraphs,
    })),
  }),
});

interface ReadPage {
  file: string;
  title: string;
  words: number;
  text: string;
}

/**
 * What the scripted model plays for the report agent, from the request alone: without the pages
 * in the conversation it asks for them; with them it drafts the report (deterministic: the same
 * pages give the same text).
 */
export function reporterReply(request: RecordedRequest): ScriptedReply {
  const tool = request.messages.find((m) => m.role === 'tool');
  if (tool === undefined) {
    return { toolCalls: [{ id: 'pages_1', name: 'read_pages', arguments: {} }] };
  }
  let pages: ReadPage[];
  try {
    pages = (JSON.parse(textOf(tool.content)) as { pages: ReadPage[] }).pages;
  } catch {
    return { text: 'The pages could not be read, so there is no report.' };
  }
  const words = pages.reduce((n, p) => n + p.words, 0);
  const first = (text: string) => /^.*?[.!?](?=\s|$)/.exec(text)?.[0] ?? text;
  return {
    text: [
      `The Tidewater docs have ${pages.length} pages, ${words} words in all.`,
      ...pages.map((p) => `- ${p.title}: ${first(p.text)}`),
    ].join('\n'),
  };
}

/** What the report agent is told; a real model follows it, the scripted one plays it. */
export const REPORTER_PROMPT =
  'You write short, factual reports on documentation for the team that maintains it. Use only what the pages say.';

/** The report agent on the model setup() found; called after setup (the CLI does it). */
export function agents(): AgentDefinition[] {
  const m = modelEndpoint();
  return [
    defineAgent({
      name: 'reporter',
      model: m.model,
      provider: { baseURL: m.baseURL, apiKey: m.apiKey },
      systemPrompt: REPORTER_PROMPT,
      tools: [readPagesTool],
      settings: { temperature: 0 },
      timeoutMs: m.scripted ? 10_000 : 60_000,
    }),
  ];
}

interface Page {
  file: string;
  title: string;
  words: number;
  chars: number;
}
interface Rendered {
  path: string;
  name: string;
  bytes: number;
  /** The report's headline, passed down the line for the e-mail's subject. */
  title: string;
}
interface Receipt {
  id: string;
  url: string;
  bytes: number;
}
type Uploaded = Receipt & { title: string };

const escape = (s: string) =>
  s.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]!);

/** The operators, by the names the plan uses. */
export const operators: Record<string, Operator> = {
  /** Reads the fixture pages: title and text size of each. */
  async crawl(): Promise<{ pages: Page[] }> {
    const pages = (await readPages()).map(({ file, title, text }) => ({
      file,
      title,
      words: text.split(' ').length,
      chars: text.length,
    }));
    return { pages };
  },

  // report: the agent step (see the plan and `agents`).

  /**
   * Writes the report as HTML into the data directory: the crawl's figures and the agent's draft.
   * Deterministic (no clock), and it reads only committed outputs: a re-run writes the same
   * bytes, so the upload's arguments, and with them its ledger call, stay the same. The file is
   * named by its content, not by the run: a replay of the run (`flujo replay`) whose agent
   * drafts the same report uploads the same arguments and gets the original's receipt.
   */
  async render({ deps }): Promise<Rendered> {
    const { pages } = deps['crawl'] as unknown as { pages: Page[] };
    const draft = (deps['report'] as unknown as AgentResult).answer ?? '';
    const words = pages.reduce((n, p) => n + p.words, 0);
    const longest = pages.reduce((a, b) => (b.words > a.words ? b : a));
    const dir = join(needSetup(), 'reports');
    await mkdir(dir, { recursive: true });
    const title = `Tidewater docs: ${pages.length} pages, ${words} words`;
    const bullets = draft.split('\n').filter((l) => l.startsWith('- '));
    const prose = draft.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('- '));
    const html = [
      '<!doctype html>',
      `<html lang="en"><head><meta charset="utf-8"><title>Docs report: ${escape(title)}</title></head><body>`,
      `<h1>${escape(title)}</h1>`,
      ...prose.map((l) => `<p>${escape(l)}</p>`),
      ...(bullets.length === 0
        ? []
        : ['<ul>', ...bullets.map((l) => `<li>${escape(l.slice(2))}</li>`), '</ul>']),
      '<h2>Pages</h2>',
      '<ul>',
      ...pages.map((p) => `<li>${escape(`${p.title} (${p.file}): ${p.words} words`)}</li>`),
      '</ul>',
      `<p>Longest page: ${escape(longest.title)} (${longest.words} words).</p>`,
      '</body></html>',
      '',
    ].join('\n');
    const name = `tidewater-docs-${createHash('sha256').update(html).digest('hex').slice(0, 16)}.html`;
    const path = join(dir, name);
    await writeFile(path, html);
    return { path, name, bytes: Buffer.byteLength(html), title };
  },

  /** Uploads the rendered file through the ledger. */
  async upload({ deps, tools }): Promise<Uploaded> {
    const rendered = deps['render'] as unknown as Rendered;
    const html = await readFile(rendered.path, 'utf8');
    const receipt = await tools.call<Receipt>('upload_report', { name: rendered.name, html });
    return { ...receipt, title: rendered.title };
  },

  /** E-mails the link to the uploaded report through the ledger (deps: only the step before). */
  async email({ deps, runInput, tools }): Promise<JsonValue> {
    const uploaded = deps['upload'] as unknown as Uploaded;
    const to = (runInput as { to?: string } | null)?.to ?? input.to;
    return tools.call<JsonValue>('send_email', {
      to,
      subject: uploaded.title,
      body: `Hello,\n\nthe docs report is ready: ${uploaded.url}\n`,
      attachmentUrl: uploaded.url,
    });
  },
};
