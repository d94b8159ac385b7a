/**
 * The research-agent demo in one command: a GRANULAR agent step (one durable unit of work, and one
 * commit, per model turn) searches a local corpus, writes notes into the data directory, e-mails a
 * summary through the demo service and answers. Then the same job again, with its worker process
 * killed by SIGKILL at a named point inside a turn, resumed by a fresh worker: each tool effect
 * once, one e-mail, and the same answer as the run that was not killed.
 *
 *   npm run demo:agent                                   embedded redis-server (AOF) in .flujo/redis
 *   REDIS_URL=redis://… npm run demo:agent               another Redis
 *   KILL_AT=after-journal:research:2 npm run demo:agent  another kill point (FLUJO_KILL_AT syntax)
 *   OPENAI_BASE_URL=… OPENAI_API_KEY=… [OPENAI_MODEL=…] npm run demo:agent   a real model
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRuntime, type AgentResult, type LedgerEntry } from 'flujo';
import { startEmbeddedRedis } from 'flujo/testing';
import { fetchStats, type ServiceStats } from '../durable-job/service.ts';
import {
  agents,
  input,
  modelEndpoint,
  notesRecords,
  plan,
  serviceUrl,
  setup,
  type NotesRecord,
} from './job.ts';

const started = performance.now();
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const CHILD = fileURLToPath(new URL('./worker-child.ts', import.meta.url));
// The CLI keeps job data in .flujo/data too: `flujo run` and this demo share the service and model.
const DATA_DIR = resolve('.flujo', 'data');
// Its own key prefix: the demo's workers never pick up runs of `flujo run`, nor the other way.
const PREFIX = 'research-agent-demo';
const WORKER = { concurrency: 2, toolLeaseMs: 500, recoveryMs: 1000 };
// Every tool of turn 1 (write_notes) has run and has its receipt; the turn is not committed.
const KILL_AT = process.env['KILL_AT'] || 'after-tools:research:1';
const STEP = 'research';

const show = (p: string) => (relative(process.cwd(), p).startsWith('..') ? p : relative('.', p));
const newRunId = () => `research-${Date.now().toString(36)}-${randomUUID().slice(0, 4)}`;
const problems: string[] = [];
const expect = (ok: boolean, what: string) => {
  if (!ok) problems.push(what);
};

const embedded = process.env['REDIS_URL'] ? undefined : await startEmbeddedRedis();
const redisUrl = process.env['REDIS_URL'] ?? embedded!.url;
const teardown = await setup({ dataDir: DATA_DIR });
const model = modelEndpoint();
const runtime = createRuntime({ redis: redisUrl, prefix: PREFIX, agents: agents() });
// Chat completions only: the server also records the probes of processes looking for it.
const modelCalls = () =>
  (model.server?.requests ?? []).filter((r) => r.path.endsWith('/chat/completions')).length;

console.log('research-agent demo: a granular agent step: search → notes → e-mail → answer\n');
console.log(
  `redis    ${embedded ? `embedded redis-server, AOF in ${show(embedded.dataDir)}` : 'REDIS_URL'} (${redisUrl})`,
);
console.log(
  `model    ${model.scripted ? `scripted model server of flujo/testing (${model.baseURL})` : `${model.model} at ${model.baseURL}`}`,
);
console.log(
  `service  ${serviceUrl()} (e-mail; every request recorded in .flujo/data/requests.jsonl)`,
);
console.log(`question ${input.question} (answer to ${input.to})`);

/** One line about a tool call of the ledger. */
function callLine(e: LedgerEntry): string {
  const a = (e.args ?? {}) as Record<string, unknown>;
  const tool = e.tool.replace(/@.*$/, '');
  switch (tool) {
    case 'search_corpus':
      return `search_corpus "${String(a['query'])}"`;
    case 'write_notes':
      return `write_notes "${String(a['title'])}"`;
    case 'send_email':
      return `send_email to ${String(a['to'])}`;
    default:
      return tool;
  }
}

/**
 * Prints the run's step changes and turn commits as they are committed, each turn with the tool
 * calls it made (from the ledger); resolves with the run's status when it ends.
 */
async function follow(runId: string, who: () => string): Promise<string> {
  let status = 'unknown';
  let seen = 0;
  for await (const e of runtime.events(runId, { follow: true })) {
    const d = e.data as Record<string, unknown>;
    if (e.type === 'turn.committed') {
      const fresh = (await runtime.ledger(runId)).filter((l) => l.seq > seen);
      seen = Math.max(seen, ...fresh.map((l) => l.seq));
      const did = fresh.length === 0 ? 'final answer' : fresh.map(callLine).join(', ');
      console.log(`  [${who()}] turn ${String(d['turn'])} committed: ${did}`);
    }
    if (e.type === 'step.changed' && d['to'] !== 'READY' && d['from'] !== 'READY') {
      const attempt = Number(d['attempt']) > 1 ? ` (attempt ${String(d['attempt'])})` : '';
      console.log(
        `  [${who()}] ${String(d['stepId'])} ${String(d['from'])} → ${String(d['to'])}${attempt}`,
      );
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

/** Lines of at most `width` characters (paragraphs kept apart by an empty line). */
function wrap(text: string, width: number): string[] {
  const lines: string[] = [];
  for (const paragraph of text.split(/\n+/)) {
    if (lines.length > 0) lines.push('');
    let line = '';
    for (const word of paragraph.split(' ')) {
      if (line !== '' && line.length + word.length + 1 > width) {
        lines.push(line);
        line = word;
      } else line = line === '' ? word : `${line} ${word}`;
    }
    lines.push(line);
  }
  return lines;
}

const cut = (s: string, n: number) => (s.length > n ? `${s.slice(0, n - 1)}…` : s);
const count = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`;
const effects = (records: NotesRecord[]) => records.filter((r) => r.outcome === 'effect').length;
const fmtNotes = (records: NotesRecord[]) =>
  `notes ${count(effects(records), 'file')} written (${count(records.length - effects(records), 'duplicate')})`;
const fmtMail = (s: ServiceStats) =>
  `e-mail ${count(s.effects.email, 'effect')} (${count(s.duplicates.email, 'duplicate')} answered from its record)`;

async function printLedger(runId: string): Promise<LedgerEntry[]> {
  const entries = await runtime.ledger(runId);
  for (const e of entries) {
    console.log(
      `  ${cut(callLine(e), 58).padEnd(58)} ${e.state.padEnd(9)} run ${e.runs}x  key ${e.callId.slice(0, 12)}…`,
    );
  }
  return entries;
}

/** What the run produced and what the outside world saw; checks one effect per tool. */
async function report(runId: string, status: string, calls: number) {
  const done = await runtime.status(runId);
  const result = done.summary.produced[STEP] as unknown as AgentResult | undefined;
  const notes = notesRecords(DATA_DIR, runId);
  const mail = await fetchStats(serviceUrl(), runId);
  console.log(`run ${status}`);
  if (result !== undefined) {
    console.log(`answer (${result.turns} turns, ${result.toolCalls} tool calls):`);
    for (const line of wrap(result.answer ?? '(none)', 96)) console.log(line && `  ${line}`);
  }
  if (model.scripted) console.log(`model calls: ${calls}`);
  for (const r of notes.filter((n) => n.outcome === 'effect'))
    console.log(`notes: ${show(r.file)}`);
  console.log(`effects for this run: ${fmtNotes(notes)}, ${fmtMail(mail)}`);
  console.log('ledger (each tool call once):');
  const ledger = await printLedger(runId);
  expect(status === 'succeeded', `run ${runId} ended ${status}, not succeeded`);
  expect(effects(notes) === 1, `run ${runId}: expected 1 notes file, found ${effects(notes)}`);
  expect(mail.effects.email === 1, `run ${runId}: expected 1 e-mail, found ${mail.effects.email}`);
  expect(
    ledger.length > 0 && ledger.every((e) => e.state === 'SUCCEEDED'),
    `run ${runId}: expected every ledger entry SUCCEEDED`,
  );
  return { answer: result?.answer ?? null, ledger, mail };
}

// 1. The job from start to end, with a worker in this process.
let worker = runtime.createWorker(WORKER);
await worker.ready();
const first = newRunId();
console.log(`\n1) run ${first}: the whole job, worker in this process`);
let calls = modelCalls();
await runtime.start(plan, input, { runId: first });
const firstStatus = await withTimeout(
  follow(first, () => 'worker'),
  30_000,
  'the first run',
);
const firstCalls = modelCalls() - calls;
const one = await report(first, firstStatus, firstCalls);
expect(
  one.ledger.every((e) => e.runs === 1),
  `run ${first}: expected every tool call to run once`,
);

console.log(`
Kill and resume by hand (the CLI keeps Redis in .flujo/redis and job data in .flujo/data):
  FLUJO_KILL_AT=${KILL_AT} npx flujo run examples/research-agent/job.ts
                                                              # dies inside turn 1
  npx flujo resume <runId> examples/research-agent/job.ts     # goes on from the committed turns
  npx flujo ledger <runId>                                    # each tool call once
  npx flujo redis stop                                        # when done
This demo's own runs are under another key prefix: npx flujo status ${first} --prefix ${PREFIX}`);

// 2. The same job in a child worker that is SIGKILLed inside a turn, then resumed here.
await worker.close();
const second = newRunId();
console.log(`\n2) run ${second}: a worker process killed at ${KILL_AT}`);
calls = modelCalls();
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
  30_000,
  'the worker process',
);
console.log(
  `  worker process ${child.pid} ${exit.signal === null ? `exited with code ${exit.code}` : `killed by ${exit.signal}`}`,
);
expect(exit.signal === 'SIGKILL', `the child was not killed by SIGKILL (${JSON.stringify(exit)})`);
if (exit.signal !== 'SIGKILL' && childOut !== '') console.log(childOut.trimEnd());
const atCrash = (await runtime.status(second)).steps.find((s) => s.stepId === STEP);
console.log(
  `at the crash: ${count(atCrash?.agent?.turns ?? 0, 'turn')} committed, ${fmtNotes(notesRecords(DATA_DIR, second))}, ${fmtMail(await fetchStats(serviceUrl(), second))}`,
);
console.log('at the crash, ledger:');
await printLedger(second);

console.log('resuming with a fresh worker in this process…');
who = 'resume';
worker = runtime.createWorker(WORKER);
await worker.ready();
const secondStatus = await withTimeout(secondDone, 30_000, 'the resumed run');
const secondCalls = modelCalls() - calls;
const two = await report(second, secondStatus, secondCalls);
// The scripted model answers alike whenever the conversation is alike; a real one need not.
if (model.scripted) {
  expect(
    two.answer === one.answer,
    `run ${second}: its answer differs from the answer of run ${first}`,
  );
  expect(
    two.ledger.length === one.ledger.length,
    `run ${second}: ${two.ledger.length} tool calls, run ${first} made ${one.ledger.length}`,
  );
}
// A kill before the reply is journaled asks the model again; any later point must not.
if (model.scripted && !KILL_AT.startsWith('after-model-reply')) {
  expect(
    secondCalls === firstCalls,
    `run ${second}: the model was called ${secondCalls} times, ${firstCalls} without the kill`,
  );
}
console.log(
  `answer ${two.answer === one.answer ? 'equal to' : 'DIFFERENT from'} run 1's; ${model.scripted ? `model calls ${secondCalls} (run 1: ${firstCalls})` : ''}`,
);

/** What the resumed worker found, for the kill point it was killed at. */
function whatHappened(point: string): string {
  const resumed =
    "The fresh worker took the turn's job once the dead worker's lock lapsed and checked the fingerprint (prompt, model, endpoint, tools, settings, input: unchanged).";
  switch (point.split(':')[0]!.split('@')[0]) {
    case 'after-model-reply':
      return `The model had replied, but the reply was not journaled yet, so nothing of the turn had run. ${resumed} It asked the model again: the one repeat a crash can cause, and it has no effect outside.`;
    case 'after-journal':
      return `The turn's model reply was in the journal; none of its tools had run. ${resumed} It took the reply from the journal instead of asking the model again (same tool calls, same ids, so the same ledger keys), ran the tools once, and committed the turn.`;
    case 'between-tools':
    case 'after-tools':
    case 'after-receipt':
      return `The turn was not committed, but its reply was in the journal and each tool call it had finished had its receipt in the ledger. ${resumed} It took the reply from the journal, got the recorded receipts instead of running those tools again, ran only what had not run, and committed the turn.`;
    case 'after-tool-effect':
      return `A tool had done its effect, but its receipt was not in the ledger: the call was in doubt once its lease lapsed. write_notes and send_email take the idempotency key, so the fresh worker ran the call again with the SAME key, and the notes file and the mail service answered from their record (the duplicate above) instead of acting twice. A tool without a key would stop the step for a person to resolve (flujo ledger resolve): never a blind re-run.`;
    case 'after-commit':
      return `The turn was committed, the next one not enqueued. The redelivered job found the turn already committed (the turn guard): it ran nothing, asked no model, and enqueued the next turn.`;
    default:
      return 'See src/internal/debug-points.ts for what this point stands for.';
  }
}
console.log(`\nWhat happened (${KILL_AT}):`);
for (const line of wrap(whatHappened(KILL_AT), 100)) console.log(line);

const seconds = ((performance.now() - started) / 1000).toFixed(1);
if (problems.length > 0) console.log(`\nFAILED (${seconds} s):\n  ${problems.join('\n  ')}`);
else
  console.log(
    `\nok: both runs succeeded with 1 notes file and 1 e-mail each${model.scripted ? ', and the same answer' : ''} (${seconds} s)`,
  );

await worker.close();
await runtime.close();
await teardown();
await embedded?.stop();
// runtime.close() does not close the connection that events(…, { follow: true }) blocks on, which
// would keep this process alive: end it here.
process.exit(problems.length > 0 ? 1 : 0);
