/**
 * The durable-job example (examples/durable-job) on real Redis: the job runs to success with one
 * upload and one e-mail, and it still does after its worker process is killed with SIGKILL at each
 * point between an effect and its commit (issue 3's acceptance). Its report step is an agent on the
 * scripted model server, which setup starts in this process and the worker children find.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createRuntime, type FlujoWorker, type Runtime } from 'flujo';
import {
  agents,
  gatedPlan,
  input,
  operators,
  plan,
  setup,
  tools,
} from '../../examples/durable-job/job.ts';
import {
  ensureService,
  fetchStats,
  liveService,
  startService,
  type Service,
} from '../../examples/durable-job/service.ts';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const ROOT = join(import.meta.dirname, '..', '..');
const CHILD = join(ROOT, 'examples', 'durable-job', 'worker-child.ts');
// A short tool lease, so that the in-doubt upload can be re-run soon after the crash.
const WORKER = { concurrency: 2, toolLeaseMs: 500, recoveryMs: 1000 };

let redis: Redis;
let dataDir: string;
let service: Service;
let teardown: () => Promise<void>;
let prefix: string;
let runtime: Runtime;
let worker: FlujoWorker | undefined;

beforeAll(async () => {
  // The scripted model, never a real endpoint from the environment (the children inherit this).
  for (const name of ['OPENAI_BASE_URL', 'OPENAI_API_KEY', 'OPENAI_MODEL'])
    delete process.env[name];
  redis = connect();
  dataDir = await mkdtemp(join(tmpdir(), 'flujo-durable-job-'));
  // In this process: it lives as long as the tests, and the worker children find it through
  // <dataDir>/service.json, as the job module's setup does.
  service = await startService({ dataDir });
  teardown = await setup({ dataDir });
});
afterAll(async () => {
  await teardown();
  await service.close();
  await rm(dataDir, { recursive: true, force: true });
  await redis.quit();
});
beforeEach(() => {
  prefix = testPrefix();
  runtime = createRuntime({ redis: redisUrl(), prefix, operators, tools, agents: agents() });
});
afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await runtime.close();
  await deletePrefix(redis, prefix);
});

const newRunId = () => `dj-${randomUUID().slice(0, 8)}`;

async function runToEnd(runId: string) {
  worker = runtime.createWorker(WORKER);
  await worker.ready();
  return (await runtime.attach(runId)).settled({ timeoutMs: 20_000 });
}

/** How many times each step's success was committed, from the run's event stream. */
async function commitsPerStep(runId: string): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for await (const e of runtime.events(runId)) {
    if (e.type === 'step.succeeded') {
      const step = String((e.data as Record<string, unknown>)['stepId']);
      counts[step] = (counts[step] ?? 0) + 1;
    }
  }
  return counts;
}

const ONCE = { crawl: 1, report: 1, render: 1, upload: 1, email: 1 };

interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

/**
 * Works the run in worker-child.ts until the debug point kills it. Started with the tsx loader
 * (`node --import tsx`), not the tsx CLI, which would turn the SIGKILL into exit code 137.
 */
function runChild(runId: string, killAt: string): Promise<Exit> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', CHILD, redisUrl(), prefix, runId, dataDir],
    {
      cwd: ROOT,
      env: {
        ...process.env,
        FLUJO_KILL_AT: killAt,
        TOOL_LEASE_MS: String(WORKER.toolLeaseMs),
        RECOVERY_MS: String(WORKER.recoveryMs),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let output = '';
  child.stdout.on('data', (b: Buffer) => (output += b.toString()));
  child.stderr.on('data', (b: Buffer) => (output += b.toString()));
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code, signal) => resolve({ code, signal, output }));
  });
}

describe('examples/durable-job', () => {
  it('runs crawl → report → render → upload → email with one upload and one e-mail', async () => {
    const runId = newRunId();
    await runtime.start(plan, input, { runId });
    const report = await runToEnd(runId);

    expect(report.status).toBe('succeeded');
    expect(report.steps.map((s) => `${s.stepId}:${s.status}`)).toEqual([
      'crawl:SUCCEEDED',
      'report:SUCCEEDED',
      'render:SUCCEEDED',
      'upload:SUCCEEDED',
      'email:SUCCEEDED',
    ]);
    // The agent read the pages once (its one tool call) and drafted from them.
    expect(report.summary.produced['report']).toMatchObject({ turns: 2, toolCalls: 1 });
    expect((report.summary.produced['report'] as { answer: string }).answer).toContain(
      'The Tidewater docs have 5 pages',
    );
    const rendered = report.summary.produced['render'] as { path: string };
    expect(existsSync(rendered.path)).toBe(true);
    expect(report.summary.produced['email']).toMatchObject({ to: input.to, queued: true });

    expect(service.stats(runId)).toEqual({
      requests: { upload: 1, email: 1 },
      effects: { upload: 1, email: 1 },
      duplicates: { upload: 0, email: 0 },
    });
    // The tools sent the ledger's call ids as idempotency keys.
    const ledger = await runtime.ledger(runId);
    expect(ledger.map((e) => [e.tool, e.state, e.runs])).toEqual([
      ['read_pages@1', 'SUCCEEDED', 1],
      ['upload_report@1', 'SUCCEEDED', 1],
      ['send_email@1', 'SUCCEEDED', 1],
    ]);
    expect(service.requests(runId).map((r) => r.key)).toEqual(ledger.slice(1).map((e) => e.callId));
    expect(await commitsPerStep(runId)).toEqual(ONCE);
  });

  it('gatedPlan holds the e-mail for approval, and sends it once approved', async () => {
    const runId = newRunId();
    await runtime.start(gatedPlan, input, { runId });
    const waiting = await runToEnd(runId);
    expect(waiting.status).toBe('waiting');
    expect(waiting.steps.find((s) => s.stepId === 'email')?.status).toBe('WAITING_APPROVAL');
    expect(service.stats(runId).effects).toEqual({ upload: 1, email: 0 });

    await runtime.approve(runId, 'email', { by: 'ops', comment: 'looks right' });
    const done = await (await runtime.attach(runId)).settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('succeeded');
    expect(service.stats(runId).effects).toEqual({ upload: 1, email: 1 });
  });

  const crashes = [
    {
      killAt: 'after-tool-effect:upload_report',
      when: 'after the upload effect, before its receipt',
      // The upload happened, the ledger has no receipt: the call is in doubt once its lease
      // lapses, and upload_report takes a key, so it runs again with the same key.
      ledgerAtCrash: ['SUCCEEDED', 'RUNNING'],
      uploadStepAtCrash: 'RUNNING',
      uploadRuns: 2,
      uploadDuplicates: 1,
    },
    {
      killAt: 'after-receipt:upload_report',
      when: 'after the upload receipt, before the step commit',
      ledgerAtCrash: ['SUCCEEDED', 'SUCCEEDED'],
      uploadStepAtCrash: 'RUNNING',
      uploadRuns: 1,
      uploadDuplicates: 0,
    },
    {
      killAt: 'after-commit:upload',
      when: 'after the upload step commit, before the next enqueue',
      ledgerAtCrash: ['SUCCEEDED', 'SUCCEEDED'],
      uploadStepAtCrash: 'SUCCEEDED',
      uploadRuns: 1,
      uploadDuplicates: 0,
    },
  ];

  it.each(crashes)(
    'killed $when ($killAt): resumed, one upload and one e-mail',
    async (c) => {
      const runId = newRunId();
      await runtime.start(plan, input, { runId });
      const exit = await runChild(runId, c.killAt);
      expect(exit.signal, exit.output).toBe('SIGKILL');

      // Where the child died.
      expect(service.stats(runId).effects).toEqual({ upload: 1, email: 0 });
      expect((await runtime.ledger(runId)).map((e) => e.state)).toEqual(c.ledgerAtCrash);
      const atCrash = await runtime.status(runId);
      expect(atCrash.status).toBe('running');
      expect(atCrash.steps.find((s) => s.stepId === 'upload')?.status).toBe(c.uploadStepAtCrash);

      // A fresh worker picks the run up.
      const report = await runToEnd(runId);
      expect(report.status).toBe('succeeded');
      expect(service.stats(runId)).toEqual({
        requests: { upload: 1 + c.uploadDuplicates, email: 1 },
        effects: { upload: 1, email: 1 },
        duplicates: { upload: c.uploadDuplicates, email: 0 },
      });
      const ledger = await runtime.ledger(runId);
      expect(ledger.map((e) => [e.tool, e.state, e.runs])).toEqual([
        ['read_pages@1', 'SUCCEEDED', 1],
        ['upload_report@1', 'SUCCEEDED', c.uploadRuns],
        ['send_email@1', 'SUCCEEDED', 1],
      ]);
      expect(await commitsPerStep(runId)).toEqual(ONCE);
    },
    30_000,
  );

  it('starts the service detached, reuses it, and keeps counts and keys across its restarts', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'flujo-durable-service-'));
    const email = (url: string) =>
      fetch(`${url}/email`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'key-1' },
        body: JSON.stringify({
          to: 'ana@example.com',
          subject: 'hi',
          body: 'hello',
          attachmentUrl: 'http://127.0.0.1/files/r.html',
        }),
      });
    try {
      const first = await ensureService(dir, { idleExitMs: 60_000 });
      expect(first.started).toBe(true);
      expect(first.pid).not.toBe(process.pid);
      expect(await ensureService(dir)).toMatchObject({
        started: false,
        pid: first.pid,
        url: first.url,
      });
      const sent = await (await email(first.url)).json();
      await first.stop();
      expect(await liveService(dir)).toBeUndefined();

      const second = await ensureService(dir, { idleExitMs: 60_000 });
      expect(second).toMatchObject({ started: true });
      expect(second.pid).not.toBe(first.pid);
      const replay = await email(second.url);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(await replay.json()).toEqual(sent);
      expect(await fetchStats(second.url)).toEqual({
        requests: { upload: 0, email: 2 },
        effects: { upload: 0, email: 1 },
        duplicates: { upload: 0, email: 1 },
      });
      await second.stop();
    } finally {
      const left = await liveService(dir);
      if (left !== undefined) process.kill(left.pid, 'SIGTERM');
      await rm(dir, { recursive: true, force: true });
    }
  });
});
