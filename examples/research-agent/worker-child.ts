/**
 * A worker process for one run of the research agent, for the crash demo: it works the queue
 * until the run settles, then prints the run's status as one JSON line and exits (0 if the run
 * succeeded). With `FLUJO_KILL_AT` set (e.g. `after-tools:research:1`), a debug point kills it with
 * SIGKILL on the way.
 *
 *   node --import tsx examples/research-agent/worker-child.ts <redisUrl> <prefix> <runId> <dataDir>
 *
 * Its setup finds the scripted model server of `<dataDir>` that the parent started, so both talk
 * to the model at one URL (the granular step's fingerprint includes it).
 * Env: TOOL_LEASE_MS (default 500), RECOVERY_MS (default 1000).
 */
import { createRuntime } from 'flujo';
import { agents, setup } from './job.ts';

const [redisUrl, prefix, runId, dataDir] = process.argv.slice(2);
if (redisUrl === undefined || prefix === undefined || runId === undefined || !dataDir) {
  console.error('usage: worker-child.ts <redisUrl> <prefix> <runId> <dataDir>');
  process.exit(2);
}
const number = (name: string, fallback: number) => {
  const value = Number(process.env[name] ?? fallback);
  return Number.isFinite(value) && value > 0 ? value : fallback;
};

const cleanup = await setup({ dataDir });
const runtime = createRuntime({ redis: redisUrl, prefix, agents: agents() });
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
