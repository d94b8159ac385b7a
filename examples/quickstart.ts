import { Redis } from 'ioredis';
import {
  advanceRun,
  createSnapshotStore,
  parsePlan,
  startRun,
  type RunSnapshot,
} from '../src/index.js';
import { ensureEmbeddedRedis } from '../src/testing/index.js';

const plan = parsePlan({
  name: 'newsletter',
  steps: [
    { id: 'draft', kind: 'operator', operator: 'draft' },
    { id: 'review', kind: 'human_gate', dependsOn: ['draft'] },
    {
      id: 'send',
      kind: 'operator',
      operator: 'send',
      dependsOn: ['review'],
      effects: ['external'],
    },
  ],
});

// The Redis of the `flujo` command: REDIS_URL, else the embedded server of .flujo/redis.
const url = process.env.REDIS_URL ?? (await ensureEmbeddedRedis()).url;
// A Redis that does not answer fails within 2 s instead of being retried forever.
const redis = new Redis(url, {
  connectTimeout: 2000,
  commandTimeout: 2000,
  maxRetriesPerRequest: 1,
  retryStrategy: () => null,
});
const store = createSnapshotStore<RunSnapshot>({ redis });
const runId = `newsletter-${Date.now()}`;

// Create the run: the machines plan what must happen outside.
const first = startRun(plan, { runId, at: Date.now() });
const env = await store.create(runId, first.snapshot);
console.log(first.planned); // [{ type: 'step.execute', stepId: 'draft', attempt: 1 }]

// A worker ran attempt 1 of "draft": feed the fact, commit only if nobody else did meanwhile.
const event = {
  type: 'step.succeeded',
  stepId: 'draft',
  attempt: 1,
  output: 'Hi!',
  at: Date.now(),
} as const;
const next = advanceRun(env.snapshot, event);
const committed = await store.commit(runId, env.version, next.snapshot, [event]);
console.log(committed.version, next.status, next.planned);
// 1 waiting [{ type: 'step.requestApproval', stepId: 'review' }]

await store.close();
redis.disconnect();
