/**
 * Signals from the web view: a run's page shows what its wait steps wait for and a form that
 * sends a signal, checked as `flujo signal` checks it (a bad payload or name is refused with the
 * page saying why, nothing written); the step takes the signal and the run goes on.
 */
import { request } from 'node:http';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import { startUi, type UiServer } from '../../src/ui/server.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';

let redis: Redis;
let prefix: string;
let runtime: Runtime;
let worker: FlujoWorker;
let ui: UiServer;
const declared: string[] = [];

const plan: PlanInput = {
  name: 'order',
  steps: [
    { id: 'approval', kind: 'wait', for: { signal: 'approve-order' } },
    { id: 'cool-off', kind: 'wait', for: { durationMs: 600_000 } },
  ],
};

beforeAll(async () => {
  redis = connect();
  prefix = testPrefix();
  runtime = createRuntime({ redis: redisUrl(), prefix });
  worker = runtime.createWorker({ concurrency: 4 });
  await worker.ready();
  ui = await startUi(runtime, {
    port: 0,
    // As `flujo ui` declares the signals of the run's job module.
    declareSignals: (runId) => {
      declared.push(runId);
      runtime.signals('order', { 'approve-order': z.object({ by: z.string() }) });
      return Promise.resolve();
    },
  });
});
afterAll(async () => {
  await ui.close();
  await worker.close();
  await runtime.close();
  await deletePrefix(redis, prefix);
  await deletePrefix(redis, `{${prefix}:q}`);
  await deletePrefix(redis, `{${prefix}:runs}`);
  await redis.quit();
});

function raw(
  path: string,
  options: { method?: string; body?: string } = {},
): Promise<{ status: number; body: string; location: string | undefined }> {
  const url = new URL(path, ui.url);
  const headers =
    options.method === 'POST'
      ? { 'content-type': 'application/x-www-form-urlencoded', origin: ui.url.slice(0, -1) }
      : {};
  return new Promise((resolve, reject) => {
    const req = request(url, { method: options.method ?? 'GET', headers }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, body, location: res.headers.location }),
      );
    });
    req.on('error', reject);
    req.end(options.body);
  });
}

const form = (fields: Record<string, string>) => new URLSearchParams(fields).toString();

describe('signals from the web view', () => {
  it('shows the waits, refuses a bad signal writing nothing, and sends a good one', async () => {
    const run = await runtime.start(plan, null);
    const { runId } = run;
    for (let i = 0; i < 100 && (await runtime.status(runId)).waits.length < 2; i++) {
      await new Promise((r) => setTimeout(r, 50));
    }
    const page = await raw(`/runs/${runId}`);
    expect(page.status).toBe(200);
    expect(page.body).toContain(
      '<b>approval</b> waits for signal <span class="mono">approve-order</span> (0 queued)',
    );
    expect(page.body).toContain(`action="/runs/${runId}/signal"`);
    expect(page.body).toContain('<b>cool-off</b> waits for a timer: it fires at');

    const before = await runtime.status(runId);
    const notJson = await raw(`/runs/${runId}/signal`, {
      method: 'POST',
      body: form({ name: 'approve-order', payload: '{by: ana}' }),
    });
    expect(notJson.status).toBe(400);
    expect(notJson.body).toContain('The payload is not JSON');
    const bad = await raw(`/runs/${runId}/signal`, {
      method: 'POST',
      body: form({ name: 'approve-order', payload: '{"by":1}' }),
    });
    expect(bad.status).toBe(400);
    expect(bad.body).toContain('payload.by');
    const undeclared = await raw(`/runs/${runId}/signal`, {
      method: 'POST',
      body: form({ name: 'nope', payload: '' }),
    });
    expect(undeclared.status).toBe(400);
    expect(undeclared.body).toContain('declares no signal');
    expect(await redis.exists(`${prefix}:{${runId}}:inbox`)).toBe(0);
    expect((await runtime.status(runId)).version).toBe(before.version);

    const sent = await raw(`/runs/${runId}/signal`, {
      method: 'POST',
      body: form({ name: 'approve-order', payload: '{"by":"ana"}', id: 'web-1' }),
    });
    expect(sent.status).toBe(303);
    expect(sent.location).toContain('done=signal');
    expect(declared).toContain(runId);
    for (let i = 0; i < 100; i++) {
      const r = await runtime.status(runId);
      if (r.steps[0]!.status === 'SUCCEEDED') break;
      await new Promise((res) => setTimeout(res, 50));
    }
    const after = await runtime.status(runId);
    expect(after.steps[0]!.output).toEqual({ by: 'ana' });
    expect(after.waits.map((w) => w.stepId)).toEqual(['cool-off']);
    const again = await raw(`/runs/${runId}/signal`, {
      method: 'POST',
      body: form({ name: 'approve-order', payload: '{"by":"ana"}', id: 'web-1' }),
    });
    expect(again.location).toContain('done=signalAgain');
    await runtime.cancel(runId);
  });
});
