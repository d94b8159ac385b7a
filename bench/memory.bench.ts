/**
 * Memory over many runs: runs of two no-op operator steps started at a constant rate
 * (`BENCH_RATE` a second, 100 by default) with retention on and short (`retention.finishedRunsMs`
 * of 1 s, `retention.tombstoneMs` of 2 s, `endedRunsCheckMs` of 1.5 s, a worker sweeping every
 * second),
 * on a worker of concurrency 8 in this process and a private redis-server (no persistence). The
 * runs are started by a second runtime in this process, as a caller would. At two checkpoints,
 * after 1,000 runs and after `BENCH_RUNS` (20,000 by default), the starts pause until every run
 * has ended and its retention has passed; then it prints:
 *   - the process's RSS and live heap (after a full GC, with `--expose-gc`), its RSS again once
 *     V8 has handed back the free pages it keeps mapped (after V8's most thorough collection),
 *     and since the last checkpoint the highest RSS and the most runs in flight (sampled every
 *     second: a machine that falls behind the rate holds more runs at once, and a process's RSS
 *     keeps its peak);
 *   - the bytes Redis holds (`MEMORY USAGE` of every key), and the keys by kind (run ids, job ids
 *     and numbers replaced by `*`).
 * Then, as the lines to compare:
 *   - `worker RSS 20000 vs 1000 runs ratio: <x>` (1.00: flat), the RSS once V8 handed back its
 *     free pages: after a full GC alone, V8 keeps mapped about as many pages as the busiest
 *     moment of the phase needed (measured: 330–350 MiB of RSS against 165–190 once handed
 *     back), so that figure follows the phase's peak rather than the runs it went through; it is
 *     printed too, as `worker RSS after a full GC only 20000 vs 1000 runs ratio: <x>`;
 *   - `Redis bytes per finished run after retention: <n>`: the bytes held at the second checkpoint
 *     less those at the first, over the runs in between (what each finished run leaves behind;
 *     what is held at both, as the last second's finished jobs that BullMQ removes as later jobs
 *     finish, cancels out). BullMQ's own event stream (capped by BullMQ at about 10,000 entries)
 *     is left out and shown apart.
 *
 *   npm run bench:memory
 *   BENCH_RUNS=5000 BENCH_RATE=200 npm run bench:memory
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { createRuntime, type PlanInput } from '../src/index.js';
import { startRedisServer } from '../test/helpers/redis-server.js';
import { runtimeCore } from '../src/runtime.js';

const RUNS = Number(process.env['BENCH_RUNS'] ?? 20_000);
const FIRST = Math.min(1000, RUNS);
const RATE = Number(process.env['BENCH_RATE'] ?? 100);
const RETENTION_MS = 1000;

const plan: PlanInput = {
  name: 'bench-memory',
  steps: [
    { id: 'a', kind: 'operator', operator: 'noop' },
    { id: 'b', kind: 'operator', operator: 'noop', dependsOn: ['a'] },
  ],
};

const mib = (n: number) => `${(n / 1024 / 1024).toFixed(1)} MiB`;
const sleep = (ms: number) => new Promise((ok) => setTimeout(ok, ms));

/** Every key of the server with its MEMORY USAGE, by kind (ids and numbers as `*`). */
async function redisBytes(
  redis: Redis,
): Promise<{ total: number; events: number; kinds: Map<string, { keys: number; bytes: number }> }> {
  const kinds = new Map<string, { keys: number; bytes: number }>();
  let total = 0;
  let events = 0;
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'COUNT', 1000);
    cursor = next;
    for (const key of keys) {
      const bytes = Number((await redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0')) ?? 0);
      const kind = key
        .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, '*')
        .replace(/\d+/g, '*');
      if (/\{[^}]*:q\}:[^:]+:events$/.test(key)) {
        events += bytes;
        continue;
      }
      total += bytes;
      const k = kinds.get(kind) ?? { keys: 0, bytes: 0 };
      k.keys++;
      k.bytes += bytes;
      kinds.set(kind, k);
    }
  } while (cursor !== '0');
  return { total, events, kinds };
}

const server = await startRedisServer(['--save', '', '--appendonly', 'no']);
try {
  const prefix = `m${randomUUID().slice(0, 6)}`;
  const options = {
    redis: server.url,
    prefix,
    // A shared machine under load can hold a reply for seconds: no deadline makes a start fail.
    redisTimeoutMs: 120_000,
    // The notes of ended runs are checked for less time than a run's tombstone lives.
    retention: { finishedRunsMs: RETENTION_MS, tombstoneMs: 2 * RETENTION_MS },
    endedRunsCheckMs: 1.5 * RETENTION_MS,
  };
  const runtime = createRuntime(options).operator('noop', () => ({ ok: true }));
  const worker = runtime.createWorker({ concurrency: 8, sweepEveryMs: 1000 });
  const caller = createRuntime(options);
  await worker.ready();
  const redis = new Redis(server.url);
  const { keys } = runtimeCore(runtime).stores;
  let started = 0;
  let failed = 0;
  const failures = new Set<string>();

  // Sampled every second: the highest RSS and the most runs in flight since the last checkpoint
  // (a machine that falls behind the rate holds more runs at once, and RSS keeps its peak).
  let peak = { rss: 0, inFlight: 0 };
  const sampling = setInterval(() => {
    peak.rss = Math.max(peak.rss, process.memoryUsage.rss());
    void redis.scard(keys.activeRuns()).then((n) => {
      peak.inFlight = Math.max(peak.inFlight, n);
    });
  }, 1000);

  /** Starts runs at RATE a second until `until` have been started. */
  const startUntil = async (until: number): Promise<void> => {
    const t0 = performance.now();
    const from = started;
    const pending: Promise<unknown>[] = [];
    while (started < until) {
      const due = from + Math.floor(((performance.now() - t0) / 1000) * RATE);
      while (started < Math.min(due, until)) {
        started++;
        pending.push(
          caller.start(plan, { n: started }).catch((error: unknown) => {
            failed++;
            if (failures.size < 3) failures.add(String(error));
          }),
        );
      }
      if (pending.length > 1000) await Promise.all(pending.splice(0));
      await sleep(5);
    }
    await Promise.all(pending);
  };

  /** Waits until no run is active and retention (and the notes of ended runs) has passed. */
  const settle = async (): Promise<void> => {
    while ((await redis.scard(keys.activeRuns())) > 0) await sleep(50);
    await sleep(3 * RETENTION_MS + 2500);
  };

  const checkpoint = async () => {
    await settle();
    global.gc?.();
    await sleep(100);
    global.gc?.();
    const memory = process.memoryUsage();
    // Then V8's most thorough collection (what it runs itself before giving up on memory): it
    // also hands back the pages a full GC keeps mapped for later allocations, so what is left is
    // what the process holds, whatever its busiest moment since the last checkpoint was.
    global.gc?.({ type: 'major', execution: 'sync', flavor: 'last-resort' });
    const reduced = process.memoryUsage.rss();
    const phase = peak;
    peak = { rss: 0, inFlight: 0 };
    return {
      peak: phase,
      rss: memory.rss,
      reduced,
      heap: memory.heapUsed,
      heapTotal: memory.heapTotal,
      external: memory.external,
      redis: await redisBytes(redis),
    };
  };

  console.log(
    `runs of 2 no-op steps at ${RATE}/s, retention ${RETENTION_MS} ms; checkpoints at ${FIRST} and ${RUNS} runs`,
  );
  await startUntil(FIRST);
  const first = await checkpoint();
  await startUntil(RUNS);
  const last = await checkpoint();
  const show = (label: string, c: typeof first) => {
    console.log(
      `\nafter ${label} runs: RSS ${mib(c.rss)} (${mib(c.reduced)} once V8 hands back its free pages; at most ${mib(c.peak.rss)} while running, with up to ${c.peak.inFlight} runs in flight), live heap ${mib(c.heap)} of ${mib(c.heapTotal)}, external ${mib(c.external)}${global.gc === undefined ? ' (without --expose-gc: rough)' : ''}; Redis ${c.redis.total} bytes (+ BullMQ's event stream ${c.redis.events})`,
    );
    const rows = [...c.redis.kinds].sort((a, b) => b[1].bytes - a[1].bytes).slice(0, 12);
    for (const [kind, k] of rows)
      console.log(
        `  ${String(k.bytes).padStart(9)} B  ${String(k.keys).padStart(6)} keys  ${kind}`,
      );
  };
  show(String(FIRST), first);
  show(String(RUNS), last);
  if (failed > 0) console.log(`\n${failed} starts failed: ${[...failures].join('; ')}`);
  console.log(
    `\nworker live heap ${RUNS} vs ${FIRST} runs ratio: ${(last.heap / first.heap).toFixed(2)}`,
  );
  console.log(
    `worker RSS after a full GC only ${RUNS} vs ${FIRST} runs ratio: ${(last.rss / first.rss).toFixed(2)}`,
  );
  console.log(
    `worker RSS ${RUNS} vs ${FIRST} runs ratio: ${(last.reduced / first.reduced).toFixed(2)}`,
  );
  console.log(
    `Redis bytes per finished run after retention: ${((last.redis.total - first.redis.total) / Math.max(1, RUNS - FIRST)).toFixed(1)}`,
  );
  clearInterval(sampling);
  redis.disconnect();
  await worker.close();
  await caller.close();
  await runtime.close();
} finally {
  await server.stop();
}
