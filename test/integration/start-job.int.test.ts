/**
 * Runs started by a producer that has only BullMQ: a separate Node process whose script imports
 * `bullmq` and nothing of flujo adds `start` jobs to a runtime's queue; a worker in this process
 * starts and drives the runs. Refused jobs fail once, name the field, and write nothing.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { UnrecoverableError } from 'bullmq';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_JSON_DEPTH, type JsonValue } from '../../src/internal/json.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import { RuntimeCore } from '../../src/actors/core.js';
import { processStartJob, runQueue, startJobRunId } from '../../src/worker/start-job.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { caught } from '../helpers/caught.js';
import { root, spawnChild } from '../helpers/cli.js';
import {
  connect,
  deleteRuntimeKeys,
  readPrefix,
  readQuietPrefix,
  redisUrl,
  testPrefix,
} from '../helpers/redis.js';

const producer = join(root, 'test', 'fixtures', 'start-runs.mjs');

/** One line the producer prints: a job's return value, or why it failed. */
interface Line {
  job: string;
  runId?: string;
  created?: boolean;
  failed?: string;
  attemptsMade?: number;
}

const dir = mkdtempSync(join(tmpdir(), 'flujo-start-job-'));
let files = 0;

/** Runs the plain BullMQ producer on these payloads, with this runtime prefix and queue name. */
function produce(payloads: unknown[], prefix: string, queueName?: string): Promise<Line[]> {
  const file = join(dir, `jobs-${files++}.json`);
  writeFileSync(file, JSON.stringify(payloads));
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    REDIS_URL: redisUrl(),
    FLUJO_PREFIX: prefix,
    ...(queueName === undefined ? {} : { FLUJO_QUEUE: queueName }),
  };
  return spawnChild(process.execPath, [producer, file], { env }).done.then(({ code, out, err }) => {
    if (code !== 0) throw new Error(`producer exited ${code}: ${err}`);
    return out
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Line);
  });
}

/** `{"a": {"a": … 1 …}}` with `levels` objects, built without recursion. */
function nested(levels: number): unknown {
  let value: unknown = 1;
  for (let i = 0; i < levels; i++) value = { a: value };
  return value;
}

const plan: PlanInput = {
  name: 'line',
  steps: [
    { id: 'a', kind: 'operator', operator: 'a' },
    { id: 'b', kind: 'operator', operator: 'b', dependsOn: ['a'] },
  ],
};

/** The run input each run's first step saw, by run id. */
const seen = new Map<string, JsonValue>();

function runtimeOn(prefix: string, queueName?: string): Runtime {
  return createRuntime({
    redis: redisUrl(),
    prefix,
    ...(queueName === undefined ? {} : { queueName }),
  })
    .operator('a', ({ runId, input }) => {
      seen.set(runId, input);
      return { got: input };
    })
    .operator('b', ({ deps }) => ({ after: deps['a'] ?? null }));
}

const prefix = testPrefix();
let redis: Redis;
let runtime: Runtime;
let worker: FlujoWorker;

beforeAll(async () => {
  redis = connect();
  runtime = runtimeOn(prefix);
  worker = runtime.createWorker({ concurrency: 8 });
  await worker.ready();
});
afterAll(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
  redis.disconnect();
  rmSync(dir, { recursive: true, force: true });
});

/** Every key the runtime owns (its runs, request keys, run list), not those of its queue. */
const runtimeKeys = async (p: string) => ({
  ...(await readPrefix(redis, `${p}:`)),
  ...(await readPrefix(redis, `{${p}:runs}`)),
});

/** {@link runtimeKeys} once a worker's work after a run's last commit (its expiry) is done. */
const quietKeys = async (p: string) => ({
  ...(await readQuietPrefix(redis, `${p}:`)),
  ...(await readQuietPrefix(redis, `{${p}:runs}`)),
});

describe('a plain BullMQ producer starts runs', () => {
  it('50 start jobs: every run is created and succeeds, a request key used twice makes one run, and each job returns its run id', async () => {
    const payloads = Array.from({ length: 50 }, (_, i) => ({
      plan,
      input: { n: i },
      // Jobs 0-9 carry request keys; job 10 repeats job 3's (same tenant): one run for both.
      ...(i < 10 ? { requestKey: `order-${i}` } : i === 10 ? { requestKey: 'order-3' } : {}),
      // Two name their run; one runs for another tenant.
      ...(i === 20
        ? { runId: 'named-20' }
        : i === 21
          ? { runId: 'named-21', tenantId: 'acme' }
          : {}),
    }));
    payloads[10]!.input = { n: 3 };
    const lines = await produce(payloads, prefix);

    expect(lines).toHaveLength(50);
    expect(lines.filter((l) => l.failed !== undefined)).toEqual([]);
    const ids = lines.map((l) => l.runId!);
    expect(new Set(ids).size).toBe(49);
    // The duplicated key: the same run, created by exactly one of the two jobs.
    expect(ids[10]).toBe(ids[3]);
    expect([lines[3]!.created, lines[10]!.created].sort()).toEqual([false, true]);
    expect(lines.filter((l) => l.created === true)).toHaveLength(49);
    expect(ids[20]).toBe('named-20');
    expect(ids[21]).toBe('named-21');
    // A job that names no run id gets a UUID.
    expect(ids[30]).toMatch(
      /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
    );

    const reports = await Promise.all(
      [...new Set(ids)].map(async (id) =>
        (await runtime.attach(id)).settled({ timeoutMs: 20_000 }),
      ),
    );
    expect(reports.map((r) => r.status)).toEqual(Array(49).fill('succeeded'));
    const listed = await runtime.list({ status: 'succeeded', limit: 1000 });
    expect(listed).toHaveLength(49);
    expect(new Set(listed.map((r) => r.runId))).toEqual(new Set(ids));
    expect(listed.find((r) => r.runId === 'named-21')?.tenantId).toBe('acme');
    expect(listed.filter((r) => r.tenantId === 'default')).toHaveLength(48);
    // Each run got the input of its job.
    lines.forEach((l, i) => expect(seen.get(l.runId!)).toEqual({ n: i === 10 ? 3 : i }));
    const report = await runtime.status(ids[0]!);
    expect(report.steps.map((s) => [s.stepId, s.status])).toEqual([
      ['a', 'SUCCEEDED'],
      ['b', 'SUCCEEDED'],
    ]);
  });

  it('malformed start jobs fail once, naming the field, and write nothing', async () => {
    // Something in Redis already, so "as before" is not just "empty".
    await runtime.start(plan, { n: 0 }, { runId: 'existing', requestKey: 'taken' });
    await (await runtime.attach('existing')).settled({ timeoutMs: 10_000 });
    const before = await quietKeys(prefix);

    const refused: [data: unknown, field: string, says: string][] = [
      ['text', '(root)', 'the job data must be an object { plan, input?, runId?'],
      [[plan], '(root)', 'got an array'],
      [{ input: { n: 1 } }, 'plan', 'missing: add the plan to run'],
      [{ plan: 7 }, 'plan', 'got a number'],
      [{ plan: { name: 'p', steps: [{ id: 'a', kind: 'operator' }] } }, 'steps[0].operator', ''],
      [{ plan: '{"name": "p", "steps": [' }, 'Invalid plan', ''],
      [{ plan, inptu: { n: 1 } }, 'inptu', 'unknown field; did you mean "input"?'],
      [{ plan, runId: 42 }, 'runId', 'must be a string, e.g. runId: "order-42", got a number'],
      [{ plan, runId: 'a{b}' }, 'runId', 'must not contain "{" or "}"'],
      [{ plan, runId: 'existing' }, 'Run "existing" already exists', ''],
      [{ plan, requestKey: '' }, 'requestKey', 'must be a string of 1 to 512 characters'],
      [{ plan, tenantId: 'x}' }, 'tenantId', 'must not contain "{" or "}"'],
      [{ plan, input: nested(MAX_JSON_DEPTH + 1) }, 'input.a.a.a.a.a.a', 'nested deeper than'],
      [{ plan, input: { n: 1, x: 'a' }, requestKey: 'k', runId: 5, extra: 1 }, 'extra', ''],
    ];
    const lines = await produce(
      refused.map(([data]) => data),
      prefix,
    );
    expect(lines).toHaveLength(refused.length);
    lines.forEach((line, i) => {
      const [, field, says] = refused[i]!;
      expect(line.runId, `job ${i}`).toBeUndefined();
      expect(line.failed, `job ${i}`).toContain(field);
      expect(line.failed, `job ${i}`).toContain(says);
      // Attempted once: the producer allows 3 attempts, a refusal takes none of the others.
      expect(line.attemptsMade, `job ${i}`).toBe(1);
    });
    // The last job's every problem is named at once.
    expect(lines.at(-1)!.failed).toMatch(/Invalid start job \(2 problems\)/);
    expect(lines.at(-1)!.failed).toContain('runId: must be a string');
    expect(await runtimeKeys(prefix)).toEqual(before);
  });

  it('a runtime with its own key prefix and queue name takes start jobs on that queue', async () => {
    const own = testPrefix();
    expect(runQueue({ prefix: own, queueName: 'intake' })).toEqual({
      name: 'intake',
      prefix: `{${own}:q}`,
    });
    const rt = runtimeOn(own, 'intake');
    const w = rt.createWorker();
    try {
      await w.ready();
      const lines = await produce(
        [
          { plan, input: { n: 7 }, requestKey: 'own' },
          { plan, input: { n: 7 }, requestKey: 'own' },
        ],
        own,
        'intake',
      );
      expect(lines.map((l) => l.failed)).toEqual([undefined, undefined]);
      expect(lines[1]!.runId).toBe(lines[0]!.runId);
      const report = await (await rt.attach(lines[0]!.runId!)).settled({ timeoutMs: 10_000 });
      expect(report.status).toBe('succeeded');
      expect(seen.get(lines[0]!.runId!)).toEqual({ n: 7 });
      expect((await rt.list()).map((r) => r.runId)).toEqual([lines[0]!.runId]);
      // Nothing reached the default queue of that prefix, nor the other runtime.
      expect(await readPrefix(redis, `{${own}:q}:runs:`)).toEqual({});
      expect(await runtime.list({ limit: 1000 })).not.toContainEqual(
        expect.objectContaining({ runId: lines[0]!.runId }),
      );
    } finally {
      await w.close();
      await rt.close();
      await deleteRuntimeKeys(own);
    }
  });

  it('the deploying guide shows the producer the tests run', () => {
    const guide = readFileSync(join(root, 'docs/guides/deploying.md'), 'utf8');
    const section = guide.split('\n## Starting runs from a plain BullMQ producer\n')[1];
    expect(section).toBeDefined();
    const block = /```js\n([\s\S]*?)```/.exec(section!)?.[1];
    expect(block).toBe(readFileSync(producer, 'utf8'));
  });
});

describe('a start job that runs again', () => {
  it('finds the run an earlier execution of the same job created, and refuses anyone else', async () => {
    // A prefix of its own, with no worker until the end: nothing moves the run meanwhile.
    const own = testPrefix();
    const core = new RuntimeCore({ redis: redisUrl(), prefix: own });
    const rt = runtimeOn(own);
    try {
      const job = { id: '9001', timestamp: 1_700_000_000_000, attemptsStarted: 1, data: { plan } };
      const runId = startJobRunId(core, job);
      expect(startJobRunId(core, { ...job, attemptsStarted: 2 })).toBe(runId);
      expect(startJobRunId(core, { ...job, id: '9002' })).not.toBe(runId);
      expect(await processStartJob(core, job)).toEqual({ runId, created: true });
      const after = await runtimeKeys(own);
      // Its worker died after the run was created: the job runs again and goes on with it.
      expect(await processStartJob(core, { ...job, attemptsStarted: 2 })).toEqual({
        runId,
        created: true,
      });
      // A first execution that finds the run, or a second one asking for something else: refused.
      for (const other of [job, { ...job, attemptsStarted: 2, data: { plan, input: 1 } }]) {
        const error = await caught(processStartJob(core, other));
        expect(error).toBeInstanceOf(UnrecoverableError);
        expect((error as Error).message).toContain(`Run "${runId}" already exists`);
      }
      expect(await runtimeKeys(own)).toEqual(after);
      // One run, with one job for its first step (a second enqueue of it was a no-op).
      expect(await rt.list()).toHaveLength(1);
      // Every unit job has its run's priority: it waits in BullMQ's prioritized set.
      expect(await redis.zcard(`${runQueue({ prefix: own }).prefix}:runs:prioritized`)).toBe(1);
      const w = rt.createWorker();
      const report = await (await rt.attach(runId)).settled({ timeoutMs: 10_000 });
      await w.close();
      expect(report.status).toBe('succeeded');
    } finally {
      await core.close();
      await rt.close();
      await deleteRuntimeKeys(own);
    }
  });
});
