/**
 * The durable-job example (examples/durable-job) on real Redis: the job runs to success with one
 * upload and one e-mail, and it still does after its worker process is killed with SIGKILL at each
 * point between an effect and its commit. Its report step is an agent on the
 * scripted model server, which setup starts in this process and the worker children find.
 */
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { gatedPlan, input, plan } from '../../examples/durable-job/job.ts';
import { ensureService, fetchStats, liveService } from '../../examples/durable-job/service.ts';
import { runWorkerChild, useDurableJob, WORKER } from '../helpers/durable-job.js';

const example = useDurableJob('flujo-durable-job-');

const newRunId = () => `dj-${randomUUID().slice(0, 8)}`;

async function runToEnd(runId: string) {
  example.worker = example.runtime.createWorker(WORKER);
  await example.worker.ready();
  return (await example.runtime.attach(runId)).settled({ timeoutMs: 20_000 });
}

/** How many times each step's success was committed, from the run's event stream. */
async function commitsPerStep(runId: string): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for await (const e of example.runtime.events(runId)) {
    if (e.type === 'step.succeeded') {
      const step = String((e.data as Record<string, unknown>)['stepId']);
      counts[step] = (counts[step] ?? 0) + 1;
    }
  }
  return counts;
}

const ONCE = { crawl: 1, report: 1, render: 1, upload: 1, email: 1 };

describe('examples/durable-job', () => {
  it('runs crawl → report → render → upload → email with one upload and one e-mail', async () => {
    const runId = newRunId();
    await example.runtime.start(plan, input, { runId });
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

    expect(example.service.stats(runId)).toEqual({
      requests: { upload: 1, email: 1 },
      effects: { upload: 1, email: 1 },
      duplicates: { upload: 0, email: 0 },
    });
    // The tools sent the ledger's call ids as idempotency keys.
    const ledger = await example.runtime.ledger(runId);
    expect(ledger.map((e) => [e.tool, e.state, e.runs])).toEqual([
      ['read_pages@1', 'SUCCEEDED', 1],
      ['upload_report@1', 'SUCCEEDED', 1],
      ['send_email@1', 'SUCCEEDED', 1],
    ]);
    expect(example.service.requests(runId).map((r) => r.key)).toEqual(
      ledger.slice(1).map((e) => e.callId),
    );
    expect(await commitsPerStep(runId)).toEqual(ONCE);
  });

  it('gatedPlan holds the e-mail for approval, and sends it once approved', async () => {
    const runId = newRunId();
    await example.runtime.start(gatedPlan, input, { runId });
    const waiting = await runToEnd(runId);
    expect(waiting.status).toBe('waiting');
    expect(waiting.steps.find((s) => s.stepId === 'email')?.status).toBe('WAITING_APPROVAL');
    expect(example.service.stats(runId).effects).toEqual({ upload: 1, email: 0 });

    await example.runtime.approve(runId, 'email', { by: 'ops', comment: 'looks right' });
    const done = await (await example.runtime.attach(runId)).settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('succeeded');
    expect(example.service.stats(runId).effects).toEqual({ upload: 1, email: 1 });
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
      await example.runtime.start(plan, input, { runId });
      const exit = await runWorkerChild(example, runId, c.killAt);
      expect(exit.signal, exit.output).toBe('SIGKILL');

      // Where the child died.
      expect(example.service.stats(runId).effects).toEqual({ upload: 1, email: 0 });
      expect((await example.runtime.ledger(runId)).map((e) => e.state)).toEqual(c.ledgerAtCrash);
      const atCrash = await example.runtime.status(runId);
      expect(atCrash.status).toBe('running');
      expect(atCrash.steps.find((s) => s.stepId === 'upload')?.status).toBe(c.uploadStepAtCrash);

      // A fresh worker picks the run up.
      const report = await runToEnd(runId);
      expect(report.status).toBe('succeeded');
      expect(example.service.stats(runId)).toEqual({
        requests: { upload: 1 + c.uploadDuplicates, email: 1 },
        effects: { upload: 1, email: 1 },
        duplicates: { upload: c.uploadDuplicates, email: 0 },
      });
      const ledger = await example.runtime.ledger(runId);
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
