/**
 * The durable-job demo as a job module for the `flujo` CLI: crawl a folder of docs pages, write a
 * report, render it to HTML, upload it, and e-mail a link to it. Upload and e-mail are real HTTP
 * calls to the demo service (service.ts), made through the tool-call ledger with the ledger's
 * idempotency key, so a worker killed at any point never uploads or sends twice.
 *
 *   npx flujo run examples/durable-job/job.ts
 *   npx flujo resume <runId> examples/durable-job/job.ts
 */
import { mkdir, readFile, readdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { defineTool, type JsonValue, type Operator, type PlanInput } from 'flujo';
import { ensureService, type ServiceHandle } from './service.ts';

/** Where the fixture pages are. */
export const PAGES_DIR = fileURLToPath(new URL('./pages/', import.meta.url));

/** The run input when none is given. */
export const input = { to: 'docs-team@tidewater.example' };

const retry = { maxAttempts: 4, initialDelayMs: 250, backoffCoefficient: 2, maxDelayMs: 5000 };

/** crawl → report → render → upload → email, no gates. */
export const plan = {
  name: 'docs-report',
  description: 'Crawl the Tidewater docs, report on them, render, upload and e-mail the report.',
  // Generous: a person may take a while between killing a run and resuming it.
  budgets: { maxSteps: 20, maxToolCalls: 10, maxWallClockMs: 15 * 60_000 },
  defaults: { retry: { ...retry, jitter: 0.2 } },
  steps: [
    { id: 'crawl', kind: 'operator', operator: 'crawl', effects: ['read_only'] },
    { id: 'report', kind: 'operator', operator: 'report', dependsOn: ['crawl'] },
    {
      id: 'render',
      kind: 'operator',
      operator: 'render',
      dependsOn: ['report'],
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
      riskLevel: 'high',
    },
  ],
} satisfies PlanInput;

/** The same job, with the e-mail waiting for a person's approval (`flujo approve <runId> email`). */
export const gatedPlan = {
  ...plan,
  name: 'docs-report-gated',
  steps: plan.steps.map((s) =>
    s.id === 'email'
      ? { ...s, gate: { approvers: ['ops'], reason: 'sends an e-mail outside the company' } }
      : s,
  ),
} satisfies PlanInput;

// Set by setup(): where reports are rendered and which service the tools call.
let dataDir: string | undefined;
let service: ServiceHandle | undefined;

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
 * (detached, see ensureService). The returned function stops it if this process started it.
 */
export async function setup(ctx: { dataDir: string }): Promise<() => Promise<void>> {
  dataDir = resolve(ctx.dataDir);
  const found = await ensureService(dataDir);
  service = found;
  return async () => {
    if (found.started) await found.stop();
  };
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
  riskLevel: 'high',
  run: (args, ctx) => post('/email', args, ctx),
});

/** The tools the operators call. */
export const tools = [uploadReport, sendEmail];

interface Page {
  file: string;
  title: string;
  words: number;
  chars: number;
}
interface Report {
  pages: number;
  words: number;
  longest: { title: string; words: number };
  lines: string[];
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
    const files = (await readdir(PAGES_DIR)).filter((f) => f.endsWith('.html')).sort();
    const pages: Page[] = [];
    for (const file of files) {
      const html = await readFile(join(PAGES_DIR, file), 'utf8');
      const title = /<title>([^<]*)<\/title>/i.exec(html)?.[1]?.trim() ?? file;
      const text = html
        .replace(/<title>[^<]*<\/title>/i, ' ')
        .replace(/<[^>]+>/g, ' ')
        .replace(/\s+/g, ' ')
        .trim();
      pages.push({ file, title, words: text.split(' ').length, chars: text.length });
    }
    return { pages };
  },

  /** A summary of what the crawl found. */
  report({ deps }): Report {
    const { pages } = deps['crawl'] as unknown as { pages: Page[] };
    const longest = pages.reduce((a, b) => (b.words > a.words ? b : a));
    return {
      pages: pages.length,
      words: pages.reduce((n, p) => n + p.words, 0),
      longest: { title: longest.title, words: longest.words },
      lines: pages.map((p) => `${p.title} (${p.file}): ${p.words} words`),
    };
  },

  /**
   * Writes the report as HTML into the data directory. Deterministic (no clock): a re-run writes
   * the same bytes, so the upload's arguments, and with them its ledger call, stay the same.
   */
  async render({ deps, runId }): Promise<Rendered> {
    const report = deps['report'] as unknown as Report;
    const dir = join(needSetup(), 'reports');
    await mkdir(dir, { recursive: true });
    const name = `tidewater-docs-${runId.replace(/[^\w.-]/g, '_')}.html`;
    const title = `Tidewater docs: ${report.pages} pages, ${report.words} words`;
    const html = [
      '<!doctype html>',
      `<html lang="en"><head><meta charset="utf-8"><title>Docs report ${escape(runId)}</title></head><body>`,
      `<h1>${escape(title)}</h1>`,
      '<ul>',
      ...report.lines.map((l) => `<li>${escape(l)}</li>`),
      '</ul>',
      `<p>Longest page: ${escape(report.longest.title)} (${report.longest.words} words).</p>`,
      '</body></html>',
      '',
    ].join('\n');
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
