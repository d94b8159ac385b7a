/**
 * A worker process for one run of the durable job, for crash demos and tests: it works the queue
 * until the run settles, then prints the run's status as one JSON line and exits (0 if the run
 * succeeded). With `FLUJO_KILL_AT` set (e.g. `after-tool-effect:upload_report`), a debug point
 * kills it with SIGKILL on the way.
 *
 *   node --import tsx examples/durable-job/worker-child.ts <redisUrl> <prefix> <runId> [dataDir]
 *
 * Run it with `node --import tsx`, not the tsx command: that one runs the script in a grandchild
 * and reports its SIGKILL as exit code 137, so the parent could not see the signal.
 * Env: TOOL_LEASE_MS (default 500), RECOVERY_MS (default 1000).
 */
import { createRuntime } from 'flujo';
import { agents, operators, setup, tools } from './job.ts';

const [redisUrl, prefix, runId, dataDir = '.flujo/durable-job'] = process.argv.slice(2);
if (redisUrl === undefined || prefix === undefined || runId === undefined) {
  console.error('usage: worker-child.ts <redisUrl> <prefix> <runId> [dataDir]');
  process.exit(2);
}
const number = (name: string, fallback: number) => {
  const value = Number(process.env[name] ?? fallback);
  return Number.isFinite(value) && value > 0 ? value : fallback;
};

const cleanup = await setup({ dataDir });
// After setup, which found the parent's scripted model server (see model.ts).
const runtime = createRuntime({ redis: redisUrl, prefix, operators, tools, agents: agents() });
const worker = runtime.createWorker({
  concurrency: 1,
  toolLeaseMs: number('TOOL_LEASE_MS', 500),
  recoveryMs: number('RECOVERY_MS', 1000),
});
let exitCode: number;
try {
  await worker.ready();
  const run = await runtime.attach(runId);
  const report = await run.settled({ timeoutMs: 60_000 });
  console.log(JSON.stringify({ runId, status: report.status, summary: report.summary }));
  exitCode = report.status === 'succeeded' ? 0 : 1;
} finally {
  await worker.close();
  await runtime.close();
  await cleanup();
}
process.exit(exitCode);
