/**
 * A tour of the durable kernel: a plan parsed and validated, a run created in Redis, and every
 * event decided by the pure run machine and committed with compare-and-set, its events appended to
 * the run's stream in the same transaction. A small in-process loop plays the worker.
 *
 *   npm run demo                      embedded redis-server (AOF) with its data in .flujo/redis
 *   REDIS_URL=redis://… npm run demo  another Redis
 */
import { randomInt } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { Redis } from 'ioredis';
import {
  advanceRun,
  createSnapshotStore,
  isFlujoError,
  parsePlan,
  runSteps,
  startRun,
  type JsonValue,
  type PlannedAction,
  type RunEvent,
  type RunSnapshot,
  type RunTransition,
} from '../../src/index.js';
import { startEmbeddedRedis } from '../../src/testing/index.js';

const plan = parsePlan(readFileSync(new URL('./plan.json', import.meta.url), 'utf8'));

// The operators: plain async functions, referenced from the plan by name.
const operators: Record<string, (attempt: number) => JsonValue | Promise<JsonValue>> = {
  fetch: () => ({ pages: ['intro.html', 'pricing.html', 'faq.html'] }),
  summarize: (attempt) => {
    // The first attempt times out, to show a retry with backoff.
    if (attempt === 1) throw Object.assign(new Error('model timed out'), { retryable: true });
    return { summary: 'Three pages: what it is, what it costs, what people ask.' };
  },
  translate: () => ({ es: 'Tres páginas.' }),
  publish: () => ({ url: 'https://example.invalid/post/1' }),
};

const embedded = process.env['REDIS_URL'] ? undefined : await startEmbeddedRedis();
const redis = new Redis(process.env['REDIS_URL'] ?? embedded!.url);
const store = createSnapshotStore<RunSnapshot>({ redis });
const runId = `tour-${Date.now()}`;

function show(label: string, t: RunTransition, version: number): void {
  const changes = t.changes.map((c) => `${c.stepId} ${c.from}→${c.to}`).join(', ');
  console.log(
    `v${String(version).padStart(2)}  ${label.padEnd(26)} run ${t.status.padEnd(9)} ${changes}`,
  );
}

const first = startRun(plan, { runId, at: Date.now() });
let envelope = await store.create(runId, first.snapshot, [
  { type: 'run.created', plan: plan.name },
]);
console.log(
  `run ${runId} created in Redis (${embedded ? `embedded, AOF in ${embedded.dataDir}` : 'REDIS_URL'})\n`,
);
show('start', first, envelope.version);

const queue: PlannedAction[] = [...first.planned];

async function commit(event: RunEvent): Promise<void> {
  const t = advanceRun(envelope.snapshot, event);
  const facts = t.changes.map((c) => ({ type: 'step.changed', ...c }));
  envelope = await store.commit(runId, envelope.version, t.snapshot, [event, ...facts]);
  const label = `${event.type}${'stepId' in event ? ` ${event.stepId}` : ''}`;
  show(label, t, envelope.version);
  queue.push(...t.planned);
}

while (queue.length > 0) {
  const action = queue.shift()!;
  switch (action.type) {
    case 'step.execute': {
      const step = plan.steps.find((s) => s.id === action.stepId)!;
      // An approved gate step has nothing to run: its output is the approval.
      const run = step.kind === 'operator' ? operators[step.operator] : () => ({ approved: true });
      try {
        const output = await run!(action.attempt);
        await commit({
          type: 'step.succeeded',
          stepId: action.stepId,
          attempt: action.attempt,
          output,
          at: Date.now(),
        });
      } catch (err) {
        const retryable = (err as { retryable?: boolean }).retryable === true;
        await commit({
          type: 'step.failed',
          stepId: action.stepId,
          attempt: action.attempt,
          error: {
            name: 'OperatorError',
            code: 'operator_failed',
            message: (err as Error).message,
            retryable,
          },
          jitterSeed: randomInt(0, 2 ** 32),
          at: Date.now(),
        });
      }
      break;
    }
    case 'step.scheduleRetry':
      console.log(
        `     … retry of ${action.stepId} (attempt ${action.attempt}) in ${action.delayMs} ms`,
      );
      await new Promise((r) => setTimeout(r, action.delayMs));
      await commit({
        type: 'retry.due',
        stepId: action.stepId,
        attempt: action.attempt,
        at: Date.now(),
      });
      break;
    case 'step.requestApproval':
      console.log(`     … ${action.stepId} waits for approval; "editor" approves`);
      await commit({
        type: 'gate.approved',
        stepId: action.stepId,
        by: 'editor',
        comment: 'ship it',
        at: Date.now(),
      });
      break;
    case 'step.abort':
      break;
  }
}

// One writer per version: a second writer holding a stale version is refused, and nothing is written.
try {
  await store.commit(runId, envelope.version - 1, envelope.snapshot, [{ type: 'stale.write' }]);
} catch (err) {
  if (!isFlujoError(err, 'snapshot_conflict')) throw err;
  console.log(`\nstale writer refused: ${err.message}`);
}

const events = await store.readEvents(runId);
const loaded = await store.load(runId);
console.log(
  `\nfinal: ${runSteps(loaded.snapshot)
    .map((s) => `${s.stepId}=${s.status}`)
    .join(' ')}`,
);
console.log(`${events.length} events in the run's stream, snapshot version ${loaded.version}`);

await store.close();
redis.disconnect();
await embedded?.stop();
