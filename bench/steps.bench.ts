/**
 * Cost of one durable step: no-op operator steps in 10-step runs, driven by the BullMQ worker,
 * beside two floors measured in the same run on the same server:
 *   - a raw BullMQ job-per-step chain (each job adds the next one: the queueing floor),
 *   - a bare WATCH/HGET/MULTI/HSET/XADD/EXEC commit of a same-size snapshot (the CAS floor).
 * For AOF `everysec` and `always`: ms per step at concurrency 1, steps/s at concurrency 32. The
 * worker runs as configured by default (a job goes on with the next step of its run: chained
 * units, see `chainMs`); each figure is also given for one job per step (`chainMs: 0`), so the
 * cost of a step's own queue hop stays visible.
 *
 *   npm run bench:steps
 *   BENCH_REPS=5 BENCH_RUNS=200 npm run bench:steps
 */
import { randomUUID } from 'node:crypto';
import { Queue, Worker, type Job } from 'bullmq';
import { Redis } from 'ioredis';
import { createRuntime, type PlanInput } from '../src/index.js';
import { startRedisServer } from '../test/helpers/redis-server.js';

const STEPS = 10;
const REPS = Number(process.env['BENCH_REPS'] ?? 3);
const SEQ_RUNS = Number(process.env['BENCH_SEQ_RUNS'] ?? 30);
const PAR_RUNS = Number(process.env['BENCH_RUNS'] ?? 200);
const CONCURRENCY = 32;

const plan: PlanInput = {
  name: 'bench-line',
  steps: Array.from({ length: STEPS }, (_, i) => ({
    id: `s${i}`,
    kind: 'operator' as const,
    operator: 'noop',
    dependsOn: i === 0 ? [] : [`s${i - 1}`],
  })),
};

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const spread = (xs: number[]) => `${Math.min(...xs).toFixed(2)}–${Math.max(...xs).toFixed(2)}`;

/** The queueing floor: chains of STEPS jobs, each job adding the next. Returns elapsed ms. */
async function bullmqChains(url: string, chains: number, concurrency: number): Promise<number> {
  const name = `floor-${randomUUID().slice(0, 6)}`;
  const conn = new Redis(url, { maxRetriesPerRequest: null });
  const queue = new Queue(name, { connection: conn, prefix: '{bench}' });
  let remaining = chains;
  let done!: () => void;
  const finished = new Promise<void>((ok) => (done = ok));
  const workerConn = new Redis(url, { maxRetriesPerRequest: null });
  const worker = new Worker(
    name,
    async (job: Job<{ chain: number; k: number }>) => {
      const { chain, k } = job.data;
      if (k + 1 < STEPS) {
        await queue.add(
          's',
          { chain, k: k + 1 },
          { jobId: `${chain}|${k + 1}`, removeOnComplete: true },
        );
      } else if (--remaining === 0) {
        done();
      }
    },
    { connection: workerConn, prefix: '{bench}', concurrency },
  );
  await worker.waitUntilReady();
  const t0 = performance.now();
  await queue.addBulk(
    Array.from({ length: chains }, (_, chain) => ({
      name: 's',
      data: { chain, k: 0 },
      opts: { jobId: `${chain}|0`, removeOnComplete: true },
    })),
  );
  await finished;
  const ms = performance.now() - t0;
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  // BullMQ leaves connections it was given open.
  conn.disconnect();
  workerConn.disconnect();
  return ms;
}

/** The CAS floor: µs per bare WATCH/HGET/MULTI/HSET/XADD/EXEC of a ~5 KB snapshot. */
async function bareCas(url: string, n: number): Promise<number> {
  const r = new Redis(url);
  const key = `{bench-cas}:snap`;
  const payload = JSON.stringify({ pad: 'x'.repeat(5000) });
  await r.hset(key, 'v', '0', 's', payload);
  const t0 = performance.now();
  for (let v = 0; v < n; v++) {
    await Promise.all([r.watch(key), r.hget(key, 'v')]);
    await r
      .multi()
      .hset(key, 'v', String(v + 1), 's', payload)
      .xadd(`{bench-cas}:events`, '*', 't', 'step.succeeded', 'd', '{}')
      .exec();
  }
  const us = ((performance.now() - t0) * 1000) / n;
  await r.del(key, `{bench-cas}:events`);
  r.disconnect();
  return us;
}

/**
 * flujo: `runs` 10-step runs, a worker of `concurrency`. With concurrency 1 the runs go one after
 * the other, and each is timed by its own events (created → finished). Otherwise, like the BullMQ
 * floor (its worker is ready, then every chain head is queued at once), every run is started on a
 * paused queue, the worker is started and ready, and the time runs from resuming the queue to the
 * last run's finish. Completion is detected with one SCARD of the active-runs set, so waiting
 * costs the worker nothing. Returns elapsed ms.
 */
async function flujoRuns(
  url: string,
  runs: number,
  concurrency: number,
  chainMs?: number,
): Promise<number> {
  const runtime = createRuntime({ redis: url, prefix: `b${randomUUID().slice(0, 6)}` });
  runtime.operator('noop', () => null);
  const { redis, keys } = runtime.core;
  const idle = async () => {
    while ((await redis.scard(keys.activeRuns())) > 0) await new Promise((r) => setTimeout(r, 2));
  };
  const ids: string[] = [];
  let workerStart = 0;
  let worker;
  if (concurrency === 1) {
    worker = runtime.createWorker({
      concurrency,
      recoverOnStart: false,
      ...(chainMs === undefined ? {} : { chainMs }),
    });
    await worker.ready();
    for (let i = 0; i < runs; i++) {
      ids.push((await runtime.start(plan, null)).runId);
      await idle();
    }
  } else {
    await runtime.core.queue.pause();
    for (let i = 0; i < runs; i++) ids.push((await runtime.start(plan, null)).runId);
    worker = runtime.createWorker({
      concurrency,
      recoverOnStart: false,
      ...(chainMs === undefined ? {} : { chainMs }),
    });
    await worker.ready();
    workerStart = Date.now();
    await runtime.core.queue.resume();
    await idle();
  }
  let last = 0;
  let summed = 0;
  for (const runId of ids) {
    const events = await runtime.core.store.readEvents(runId);
    const created = Number(events[0]?.data['at']);
    const finished = events.find((e) => e.type === 'run.finished');
    if (finished?.data['status'] !== 'succeeded') throw new Error(`run ${runId} did not succeed`);
    const end = Number(finished.data['at']);
    last = Math.max(last, end);
    summed += end - created;
  }
  await worker.close();
  await runtime.close();
  return concurrency === 1 ? summed : last - workerStart;
}

async function measure(appendfsync: 'everysec' | 'always'): Promise<number> {
  const server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', appendfsync]);
  try {
    const rows: Record<string, number[]> = {
      chain1: [], // ms per step, BullMQ chain, concurrency 1
      cas: [], // ms per bare CAS commit
      flujo1: [], // ms per step, flujo, concurrency 1
      chain32: [], // steps/s, BullMQ chains, concurrency 32
      flujo32: [], // steps/s, flujo, concurrency 32
      single1: [], // ms per step, flujo with one job per step, concurrency 1
      single32: [], // steps/s, flujo with one job per step, concurrency 32
    };
    // Warm-up of both paths, at both concurrencies, so every figure below is of warm code.
    await bullmqChains(server.url, 20, 1);
    await flujoRuns(server.url, 5, 1);
    await bullmqChains(server.url, PAR_RUNS, CONCURRENCY);
    await flujoRuns(server.url, PAR_RUNS, CONCURRENCY);
    await flujoRuns(server.url, 5, 1, 0);
    await flujoRuns(server.url, PAR_RUNS, CONCURRENCY, 0);
    for (let rep = 0; rep < REPS; rep++) {
      rows.chain1!.push((await bullmqChains(server.url, SEQ_RUNS, 1)) / (SEQ_RUNS * STEPS));
      rows.cas!.push((await bareCas(server.url, 2000)) / 1000);
      rows.flujo1!.push((await flujoRuns(server.url, SEQ_RUNS, 1)) / (SEQ_RUNS * STEPS));
      rows.chain32!.push(
        (PAR_RUNS * STEPS) / ((await bullmqChains(server.url, PAR_RUNS, CONCURRENCY)) / 1000),
      );
      rows.flujo32!.push(
        (PAR_RUNS * STEPS) / ((await flujoRuns(server.url, PAR_RUNS, CONCURRENCY)) / 1000),
      );
      rows.single1!.push((await flujoRuns(server.url, SEQ_RUNS, 1, 0)) / (SEQ_RUNS * STEPS));
      rows.single32!.push(
        (PAR_RUNS * STEPS) / ((await flujoRuns(server.url, PAR_RUNS, CONCURRENCY, 0)) / 1000),
      );
    }
    const floor = median(rows.chain1!) + median(rows.cas!);
    console.log(`\nAOF appendfsync ${appendfsync} (${REPS} repetitions; median, min–max)`);
    console.log(
      `  BullMQ chain, concurrency 1     ${median(rows.chain1!).toFixed(3)} ms/step  (${spread(rows.chain1!)})`,
    );
    console.log(
      `  bare WATCH/MULTI/EXEC commit    ${median(rows.cas!).toFixed(3)} ms       (${spread(rows.cas!)})`,
    );
    console.log(
      `  flujo, concurrency 1            ${median(rows.flujo1!).toFixed(3)} ms/step  (${spread(rows.flujo1!)})`,
    );
    console.log(
      `  flujo / (chain + CAS) floor     ${(median(rows.flujo1!) / floor).toFixed(2)}  (target ≤ 2)`,
    );
    console.log(
      `  one job per step, conc. 1       ${median(rows.single1!).toFixed(3)} ms/step  (${spread(rows.single1!)}); / floor ${(median(rows.single1!) / floor).toFixed(2)}`,
    );
    console.log(`  BullMQ chains, concurrency 32   ${median(rows.chain32!).toFixed(0)} steps/s`);
    console.log(
      `  flujo, concurrency 32           ${median(rows.flujo32!).toFixed(0)} steps/s  (${spread(rows.flujo32!)})`,
    );
    console.log(
      `  one job per step, conc. 32      ${median(rows.single32!).toFixed(0)} steps/s  (${spread(rows.single32!)})`,
    );
    return median(rows.flujo32!);
  } finally {
    await server.stop();
  }
}

console.log(
  `${STEPS}-step runs of no-op operators; ${SEQ_RUNS} runs one at a time, ${PAR_RUNS} at once`,
);
await measure('always');
const everysec = await measure('everysec');
console.log(`\nsteps/s at concurrency 32: ${everysec.toFixed(0)}`);
