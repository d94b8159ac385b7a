/**
 * CAS commit latency: `store.commit` against the bare floor (the same WATCH/HGET + MULTI/HSET/XADD/EXEC
 * round trips, hand-written, with an already serialized payload), interleaved in one process.
 *
 *   npm run bench:cas                 # starts a private redis-server (AOF on, fsync every second)
 *   REDIS_URL=redis://… npm run bench:cas
 */
import { Redis } from 'ioredis';
import { createKeys } from '../src/persistence/keys.js';
import { createSnapshotStore, type RunEventRecord } from '../src/persistence/snapshot-store.js';
import { startRedisServer, type TestRedisServer } from '../test/helpers/redis-server.js';

const REPETITIONS = 7;
const COMMITS_PER_REPETITION = 2000;
const WARMUP_COMMITS = 2000;

/** A run snapshot as the run machine would persist it: 10 steps with state, attempt and output. */
function buildSnapshot(): unknown {
  const states = ['succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded'];
  states.push('running', 'pending', 'pending', 'pending');
  const steps = states.map((state, i) => ({
    stepId: `step-${String(i).padStart(2, '0')}-${i % 3 === 0 ? 'research' : 'transform'}`,
    kind: i % 3 === 0 ? 'agent' : 'operator',
    state,
    attempt: state === 'pending' ? 0 : 1 + (i % 2),
    startedAt: state === 'pending' ? null : 1_700_000_000_000 + i * 1500,
    finishedAt: state === 'succeeded' ? 1_700_000_000_900 + i * 1500 : null,
    turns: i % 3 === 0 ? 3 : 0,
    output:
      state === 'succeeded'
        ? {
            summary: `Step ${i} looked up the customer record, checked the open invoices and drafted a reply.`,
            items: [
              { id: `inv-${1000 + i}`, amount: 120.5 + i, currency: 'EUR', status: 'open' },
              { id: `inv-${2000 + i}`, amount: 99 + i, currency: 'EUR', status: 'paid' },
            ],
            usage: { inputTokens: 1200 + i * 10, outputTokens: 300 + i, costMicros: 4200 + i },
          }
        : null,
  }));
  return {
    runId: 'run-01HZX3Q9V6Y8K2M4N7P0R5T1W3',
    planId: 'support-triage@3',
    status: 'running',
    fingerprint: 'c0ffee'.repeat(10) + 'beef',
    requestKey: 'support-triage:T-48213:2024-05-01T10:00:00Z',
    tenant: 'tenant-eu-west-17',
    input: { ticketId: 'T-48213', customer: 'acme-corp', priority: 'high', locale: 'de-DE' },
    steps,
    budgets: { maxSteps: 40, maxTurns: 60, maxTokens: 200_000, maxCostMicros: 5_000_000 },
    usage: { steps: 7, turns: 9, inputTokens: 9120, outputTokens: 2140, costMicros: 31_870 },
    historyCursor: { stream: 'run-01HZX3Q9V6Y8K2M4N7P0R5T1W3:history', lastId: '1700000009000-3' },
  };
}

function buildEvents(): RunEventRecord[] {
  const detail =
    'checked 2 open invoices, drafted a reply in de-DE; no side effects pending, ledger clean';
  return [
    {
      type: 'step.succeeded',
      stepId: 'step-06-transform',
      attempt: 1,
      at: 1_700_000_009_000,
      detail,
    },
    {
      type: 'step.started',
      stepId: 'step-07-transform',
      attempt: 1,
      at: 1_700_000_009_001,
      detail,
    },
  ];
}

function quantile(sorted: Float64Array, q: number): number {
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i] as number;
}

interface Series {
  samples: number[];
  repMedians: number[];
  elapsedNs: bigint;
}

async function main(): Promise<void> {
  const external = process.env['REDIS_URL'];
  let server: TestRedisServer | undefined;
  let url: string;
  if (external !== undefined && external !== '') {
    url = external;
    console.log('redis: REDIS_URL (an external server; its persistence settings apply)');
  } else {
    server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', 'everysec']);
    url = server.url;
    console.log(
      `redis: private redis-server on 127.0.0.1:${server.port} with --appendonly yes --appendfsync everysec`,
    );
  }

  const redis = new Redis(url);
  const bare = redis.duplicate();
  const prefix = `bench-${process.pid}`;
  const keys = createKeys(prefix);
  const store = createSnapshotStore({ redis, prefix });

  try {
    const snapshot = buildSnapshot();
    const events = buildEvents();
    const sJson = JSON.stringify(snapshot);
    const eJson = events.map((e) => JSON.stringify(e));
    const eType = events.map((e) => e.type);
    console.log(
      `payload: snapshot ${sJson.length} B JSON, ${events.length} events of ${eJson.map((e) => e.length).join(' + ')} B`,
    );

    const storeRun = 'bench-store';
    const bareRun = 'bench-bare';
    const snapKey = keys.snap(bareRun);
    const eventsKey = keys.events(bareRun);
    await store.create(storeRun, snapshot);
    await bare.hset(snapKey, 'v', '0', 'sv', '1', 's', sJson, 'u', String(Date.now()));
    let storeVersion = 0;
    let bareVersion = 0;

    const storeCommit = async (): Promise<void> => {
      const env = await store.commit(storeRun, storeVersion, snapshot, events);
      storeVersion = env.version;
    };
    const bareCommit = async (): Promise<void> => {
      const expected = String(bareVersion);
      const [, v] = await Promise.all([bare.watch(snapKey), bare.hget(snapKey, 'v')]);
      if (v !== expected) {
        await bare.unwatch();
        throw new Error(`bare floor: expected version ${expected}, found ${v}`);
      }
      const vs = String(bareVersion + 1);
      const replies = await bare
        .multi()
        .hset(snapKey, 'v', vs, 'sv', '1', 's', sJson, 'u', String(Date.now()))
        .xadd(eventsKey, '*', 'v', vs, 't', eType[0] as string, 'd', eJson[0] as string)
        .xadd(eventsKey, '*', 'v', vs, 't', eType[1] as string, 'd', eJson[1] as string)
        .exec();
      if (replies === null) throw new Error('bare floor: EXEC aborted');
      for (const [err] of replies) if (err !== null) throw err;
      bareVersion += 1;
    };

    const run = async (commit: () => Promise<void>, n: number, into?: Series): Promise<void> => {
      const latencies = new Float64Array(n);
      const start = process.hrtime.bigint();
      let t0 = start;
      for (let i = 0; i < n; i++) {
        await commit();
        const t1 = process.hrtime.bigint();
        latencies[i] = Number(t1 - t0) / 1000;
        t0 = t1;
      }
      if (into === undefined) return;
      into.elapsedNs += t0 - start;
      for (const l of latencies) into.samples.push(l);
      latencies.sort();
      into.repMedians.push(quantile(latencies, 0.5));
    };

    await run(storeCommit, WARMUP_COMMITS);
    await run(bareCommit, WARMUP_COMMITS);

    const storeSeries: Series = { samples: [], repMedians: [], elapsedNs: 0n };
    const bareSeries: Series = { samples: [], repMedians: [], elapsedNs: 0n };
    for (let rep = 0; rep < REPETITIONS; rep++) {
      // Alternate the order so drift (AOF rewrite, GC, CPU frequency) hits both sides alike.
      if (rep % 2 === 0) {
        await run(storeCommit, COMMITS_PER_REPETITION, storeSeries);
        await run(bareCommit, COMMITS_PER_REPETITION, bareSeries);
      } else {
        await run(bareCommit, COMMITS_PER_REPETITION, bareSeries);
        await run(storeCommit, COMMITS_PER_REPETITION, storeSeries);
      }
    }

    const summarize = (s: Series) => {
      const sorted = Float64Array.from(s.samples).sort();
      return {
        median: quantile(sorted, 0.5),
        p99: quantile(sorted, 0.99),
        spreadMin: Math.min(...s.repMedians),
        spreadMax: Math.max(...s.repMedians),
        perSecond: s.samples.length / (Number(s.elapsedNs) / 1e9),
      };
    };
    const a = summarize(storeSeries);
    const b = summarize(bareSeries);
    const fmt = (x: number) => x.toFixed(1).padStart(8);
    console.log(
      `${REPETITIONS} repetitions × ${COMMITS_PER_REPETITION} sequential commits each, interleaved, after ${WARMUP_COMMITS} warm-up commits per side`,
    );
    console.log('');
    console.log(
      `${'variant'.padEnd(24)}${'median µs'.padStart(10)}${'p99 µs'.padStart(10)}  ${'rep medians µs (min–max)'.padEnd(26)}${'commits/s'.padStart(10)}`,
    );
    for (const [name, s] of [
      ['store.commit', a],
      ['bare floor', b],
    ] as const) {
      console.log(
        `${name.padEnd(24)}${fmt(s.median)}  ${fmt(s.p99)}  ${`${s.spreadMin.toFixed(1)}–${s.spreadMax.toFixed(1)}`.padEnd(26)}${s.perSecond.toFixed(0).padStart(10)}`,
      );
    }
    console.log('');
    const final = await store.load(storeRun);
    if (final.version !== storeVersion || bareVersion !== storeVersion) {
      throw new Error(
        `version mismatch: store ${final.version}/${storeVersion}, bare ${bareVersion}`,
      );
    }
    console.log(`cas commit vs bare floor ratio: ${(a.median / b.median).toFixed(2)}`);
  } finally {
    await store.close();
    let cursor = '0';
    do {
      const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 100);
      cursor = next;
      if (found.length > 0) await redis.del(...found);
    } while (cursor !== '0');
    await bare.quit();
    await redis.quit();
    await server?.stop();
  }
}

await main();
