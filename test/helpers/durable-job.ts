/**
 * The durable-job example (examples/durable-job) for a test file: its e-mail and upload service
 * and its setup (which starts the scripted model server) in this process, a runtime of the job on
 * a fresh prefix for each test, and worker children (examples/durable-job/worker-child.ts) that a
 * debug point kills.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach } from 'vitest';
import { createRuntime, type FlujoWorker, type Runtime } from 'flujo';
import { agents, operators, setup, tools } from '../../examples/durable-job/job.ts';
import { startService, type Service } from '../../examples/durable-job/service.ts';
import { root, spawnChild } from './cli.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from './redis.js';

const CHILD = join(root, 'examples', 'durable-job', 'worker-child.ts');

/** The workers' options: a short tool lease, so that an in-doubt upload is re-run soon after a crash. */
export const WORKER = { concurrency: 2, toolLeaseMs: 500, recoveryMs: 1000 };

/** What a test of the example uses; each field is set by the hooks before a test runs. */
export interface DurableJobExample {
  /** The example's data directory: the service and the model server are found through it. */
  dataDir: string;
  service: Service;
  /** This test's key prefix. */
  prefix: string;
  /** A runtime of the job on `prefix`, closed after the test. */
  runtime: Runtime;
  /** A worker the test started, if any: closed after the test. */
  worker: FlujoWorker | undefined;
}

/**
 * Registers the hooks of a file that tests the example: the service and the job's setup once (in
 * a new temporary directory named after `tmpName`), a runtime on a fresh prefix for each test,
 * and the clean-up of both.
 */
export function useDurableJob(tmpName: string): DurableJobExample {
  const example = { worker: undefined } as DurableJobExample;
  let teardown: () => Promise<void>;
  beforeAll(async () => {
    // The scripted model, never a real endpoint from the environment (the children inherit this).
    for (const name of ['OPENAI_BASE_URL', 'OPENAI_API_KEY', 'OPENAI_MODEL'])
      delete process.env[name];
    example.dataDir = await mkdtemp(join(tmpdir(), tmpName));
    // In this process: it lives as long as the tests, and the worker children find it through
    // <dataDir>/service.json, as the job module's setup does.
    example.service = await startService({ dataDir: example.dataDir });
    teardown = await setup({ dataDir: example.dataDir });
  });
  afterAll(async () => {
    await teardown();
    await example.service.close();
    await rm(example.dataDir, { recursive: true, force: true });
  });
  beforeEach(() => {
    example.prefix = testPrefix();
    example.runtime = createRuntime({
      redis: redisUrl(),
      prefix: example.prefix,
      operators,
      tools,
      agents: agents(),
    });
  });
  afterEach(async () => {
    await example.worker?.close();
    example.worker = undefined;
    await example.runtime.close();
    await deleteRuntimeKeys(example.prefix);
  });
  return example;
}

/** How a worker child ended, with its stdout and then its stderr. */
export interface ChildExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

/**
 * Works `runId` in worker-child.ts until the debug point `killAt` kills it. Started with the tsx
 * loader (`node --import tsx`), not the tsx CLI, which would turn the SIGKILL into exit code 137.
 */
export async function runWorkerChild(
  example: DurableJobExample,
  runId: string,
  killAt: string,
): Promise<ChildExit> {
  const args = ['--import', 'tsx', CHILD, redisUrl(), example.prefix, runId, example.dataDir];
  const env = {
    ...process.env,
    FLUJO_KILL_AT: killAt,
    TOOL_LEASE_MS: String(WORKER.toolLeaseMs),
    RECOVERY_MS: String(WORKER.recoveryMs),
  };
  const { code, signal, out, err } = await spawnChild(process.execPath, args, { env }).done;
  return { code, signal, output: out + err };
}
