/**
 * The durable-job demo in one command: crawl → report → render → upload → email, on Redis, with a
 * BullMQ worker; the report is drafted by an agent, and the upload and e-mail go to a local HTTP
 * service that counts every request and honours idempotency keys. Then the same job again, with
 * its worker process killed by SIGKILL right after the upload's effect, and resumed: the service
 * still saw one upload and one e-mail.
 *
 *   npm run demo                      embedded redis-server (AOF) with its data in .flujo/redis
 *   REDIS_URL=redis://… npm run demo  another Redis
 *   OPENAI_BASE_URL=… OPENAI_API_KEY=… [OPENAI_MODEL=…] npm run demo   the report by a real model
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRuntime, type AgentResult, type JsonValue } from 'flujo';
import { startEmbeddedRedis } from 'flujo/testing';
import { agents, input, modelEndpoint, operators, plan, serviceUrl, setup, tools } from './job.ts';
import { fetchStats, type ServiceStats } from './service.ts';

const started = performance.now();
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const CHILD = fileURLToPath(new URL('./worker-child.ts', import.meta.url));
// The CLI keeps job data in .flujo/data too, so `flujo run` and this demo share one service.
const DATA_DIR = resolve('.flujo', 'data');
// Its own key prefix: the demo's workers never pick up runs of `flujo run`, nor the other way.
const PREFIX = 'durable-job-demo';
const WORKER = { concurrency: 4, toolLeaseMs: 500, recoveryMs: 1000 };
const KILL_AT = 'after-tool-effect:upload_report';

const show = (p: string) => (relative(process.cwd(), p).startsWith('..') ? p : relative('.', p));
const newRunId = () => `docs-${Date.now().toString(36)}-${randomUUID().slice(0, 4)}`;
const problems: string[] = [];
const expect = (ok: boolean, what: string) => {
  if (!ok) problems.push(what);
};

const embedded = process.env['REDIS_URL'] ? undefined : await startEmbeddedRedis();
const redisUrl = process.env['REDIS_URL'] ?? embedded!.url;
const teardown = await setup({ dataDir: DATA_DIR });
const model = modelEndpoint();
// After setup: the report agent's model is only known once setup has started it.
const runtime = createRuntime({
  redis: redisUrl,
  prefix: PREFIX,
  operators,
  tools,
  agents: agents(),
});

console.log('durable-job demo: crawl → report → render → upload → email\n');
console.log(
  `redis    ${embedded ? `embedded redis-server, AOF in ${show(embedded.dataDir)}` : 'REDIS_URL'} (${redisUrl})`,
);
console.log(
  `model    ${model.scripted ? `scripted model server of flujo/testing (${model.baseURL})` : `${model.model} at ${model.baseURL}`} (the report agent)`,
);
console.log(
  `service  ${serviceUrl()} (upload + email; every request recorded in ${show(join(DATA_DIR, 'requests.jsonl'))})`,
);

/** One line about what a step produced. */
function brief(stepId: string, output: JsonValue): string {
  const o = (output ?? {}) as Record<string, unknown>;
  switch (stepId) {
    case 'crawl':
      return `${(o['pages'] as unknown[]).length} pages read`;
    case 'report': {
      const r = output as unknown as AgentResult;
      const first = (r.answer ?? '').split('\n')[0] ?? '';
      return `drafted by the agent (${r.turns} model turns, ${r.toolCalls} tool call): ${first}`;
    }
    case 'render':
      return show(String(o['path']));
    case 'upload':
      return String(o['url']);
    case 'email':
      return `sent ${String(o['messageId'])} to ${String(o['to'])}`;
    default:
      return JSON.stringify(output).slice(0, 60);
  }
}

/** Prints the run's step changes as they are committed; resolves when the run ends. */
async function follow(runId: string, who: () => string): Promise<string> {
  const outputs = new Map<string, JsonValue>();
  const errors = new Map<string, string>();
  let status = 'unknown';
  for await (const e of runtime.events(runId, { follow: true })) {
    const d = e.data as Record<string, unknown>;
    if (e.type === 'step.succeeded') outputs.set(String(d['stepId']), d['output'] as JsonValue);
    if (e.type === 'step.failed') {
      const error = d['error'] as { code?: string; message?: string } | undefined;
      errors.set(String(d['stepId']), `${error?.code ?? 'error'}: ${error?.message ?? ''}`);
    }
    if (e.type === 'step.changed' && d['to'] !== 'READY' && d['from'] !== 'READY') {
      const step = String(d['stepId']);
      const change = `${String(d['from'])} → ${String(d['to'])}`;
      const attempt = Number(d['attempt']) > 1 ? ` (attempt ${String(d['attempt'])})` : '';
      const what =
        d['to'] === 'SUCCEEDED'
          ? `  ${brief(step, outputs.get(step) ?? null)}`
          : String(d['to']).startsWith('FAILED')
            ? `  ${errors.get(step) ?? ''}`
            : '';
      console.log(`  [${who()}] ${step.padEnd(6)} ${change.padEnd(22)}${attempt}${what}`.trimEnd());
    }
    if (e.type === 'run.finished') status = String(d['status']);
  }
  return status;
}

async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, fail) => {
    timer = setTimeout(() => fail(new Error(`${what} took more than ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

const fmtStats = (s: ServiceStats) =>
  `upload ${s.effects.upload} effect${s.effects.upload === 1 ? '' : 's'} (${s.duplicates.upload} duplicate${s.duplicates.upload === 1 ? '' : 's'} answered from its record), ` +
  `email ${s.effects.email} effect${s.effects.email === 1 ? '' : 's'} (${s.duplicates.email} duplicate${s.duplicates.email === 1 ? '' : 's'})`;

async function printLedger(runId: string): Promise<Awaited<ReturnType<typeof runtime.ledger>>> {
  const entries = await runtime.ledger(runId);
  for (const e of entries) {
    const lease =
      e.state === 'RUNNING' && e.leaseUntil !== null
        ? `, lease ${e.leaseUntil > Date.now() ? `ends in ${e.leaseUntil - Date.now()} ms` : 'lapsed'}, no receipt`
        : '';
    console.log(
      `  ${e.tool.padEnd(16)} ${e.state.padEnd(9)} run ${e.runs}x  key ${e.callId.slice(0, 12)}…${lease}`,
    );
  }
  return entries;
}

// 1. The job from start to end, with a worker in this process.
let worker = runtime.createWorker(WORKER);
await worker.ready();
const first = newRunId();
console.log(`\n1) run ${first}: the whole job, worker in this process`);
await runtime.start(plan, input, { runId: first });
const firstStatus = await withTimeout(
  follow(first, () => 'worker'),
  20_000,
  'the first run',
);
const firstStats = await fetchStats(serviceUrl(), first);
console.log(`run ${firstStatus}`);
console.log(`service saw for this run: ${fmtStats(firstStats)}`);
console.log("ledger (each tool call once; read_pages is the report agent's):");
const firstLedger = await printLedger(first);
expect(firstStatus === 'succeeded', `run ${first} ended ${firstStatus}, not succeeded`);
expect(
  firstStats.effects.upload === 1 && firstStats.effects.email === 1,
  `run ${first}: expected 1 upload and 1 email effect`,
);
expect(
  firstLedger.length === 3 && firstLedger.every((e) => e.state === 'SUCCEEDED'),
  `run ${first}: expected 3 SUCCEEDED ledger entries`,
);

console.log(`
Kill and resume by hand (the CLI keeps Redis in .flujo/redis and job data in .flujo/data):
  npx flujo run examples/durable-job/job.ts               # prints the run id; kill -9 it mid-run
  npx flujo resume <runId> examples/durable-job/job.ts    # goes on where it stopped
  npx flujo ledger <runId>                                # each tool call once
  curl -s "$(jq -r .url .flujo/data/service.json)/stats?runId=<runId>"   # what the service saw
  FLUJO_KILL_AT=${KILL_AT} npx flujo run examples/durable-job/job.ts
                                                          # dies right after the upload's effect
  npx flujo redis stop                                    # when done
This demo's own runs are under another key prefix: npx flujo status ${first} --prefix ${PREFIX}`);

// 2. The same job in a child worker that is SIGKILLed after the upload's effect, then resumed here.
await worker.close();
const second = newRunId();
console.log(`\n2) run ${second}: a worker process killed after the upload, before its receipt`);
await runtime.start(plan, input, { runId: second });
let who = 'child';
const secondDone = follow(second, () => who);
const nodeBin = join(ROOT, 'node_modules', '.bin', 'node');
const child = spawn(
  existsSync(nodeBin) ? nodeBin : process.execPath,
  ['--import', 'tsx', CHILD, redisUrl, PREFIX, second, DATA_DIR],
  {
    cwd: ROOT,
    env: {
      ...process.env,
      FLUJO_KILL_AT: KILL_AT,
      TOOL_LEASE_MS: String(WORKER.toolLeaseMs),
      RECOVERY_MS: String(WORKER.recoveryMs),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  },
);
let childOut = '';
child.stdout.on('data', (b: Buffer) => (childOut += b.toString()));
child.stderr.on('data', (b: Buffer) => (childOut += b.toString()));
console.log(`  worker process ${child.pid} started with FLUJO_KILL_AT=${KILL_AT}`);
const exit = await withTimeout(
  new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((ok, fail) => {
    child.once('error', fail);
    child.once('close', (code, signal) => ok({ code, signal }));
  }),
  20_000,
  'the worker process',
);
console.log(
  `  worker process ${child.pid} ${exit.signal === null ? `exited with code ${exit.code}` : `killed by ${exit.signal}`}`,
);
expect(exit.signal === 'SIGKILL', `the child was not killed by SIGKILL (${JSON.stringify(exit)})`);
if (exit.signal !== 'SIGKILL' && childOut !== '') console.log(childOut.trimEnd());
const atCrash = await fetchStats(serviceUrl(), second);
console.log(`at the crash, service saw: ${fmtStats(atCrash)}`);
console.log('at the crash, ledger:');
await printLedger(second);

console.log('resuming with a fresh worker in this process…');
who = 'resume';
worker = runtime.createWorker(WORKER);
await worker.ready();
const secondStatus = await withTimeout(secondDone, 20_000, 'the resumed run');
const secondStats = await fetchStats(serviceUrl(), second);
console.log(`run ${secondStatus}`);
console.log(`service saw for this run: ${fmtStats(secondStats)}`);
console.log('ledger (each tool call once):');
const secondLedger = await printLedger(second);
expect(secondStatus === 'succeeded', `run ${second} ended ${secondStatus}, not succeeded`);
expect(
  secondStats.effects.upload === 1 && secondStats.effects.email === 1,
  `run ${second}: expected 1 upload and 1 email effect`,
);
expect(
  secondLedger.length === 3 && secondLedger.every((e) => e.state === 'SUCCEEDED'),
  `run ${second}: expected 3 SUCCEEDED ledger entries`,
);

console.log(`
What happened: the worker process uploaded the report (the service stored it and answered) and was
killed before the ledger recorded the receipt. The upload step was still RUNNING in Redis, so the
job that was running it went back to the queue once the dead worker's lock lapsed, and the fresh
worker ran the step again. The ledger found the call started but unfinished, its lease lapsed: in doubt. upload_report
sends the ledger's idempotency key, so it was re-run with the SAME key and the service answered
from its record instead of storing a second copy (${secondStats.duplicates.upload} duplicate, still ${secondStats.effects.upload} effect). Then the e-mail went
out once. A tool without a key would have stopped the step (tool_outcome_unknown) for a person to
resolve with \`flujo ledger resolve\`: never a blind re-run.`);

const seconds = ((performance.now() - started) / 1000).toFixed(1);
if (problems.length > 0) console.log(`\nFAILED (${seconds} s):\n  ${problems.join('\n  ')}`);
else console.log(`\nok: both runs succeeded with 1 upload and 1 e-mail each (${seconds} s)`);

await worker.close();
await runtime.close();
await teardown();
await embedded?.stop();
// runtime.close() does not close the connection that events(…, { follow: true }) blocks on, which
// would keep this process alive: end it here.
process.exit(problems.length > 0 ? 1 : 0);
