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
 * At concurrency 32 also as a user of the API sees it: the runs started at once with `start()`
 * while the worker runs, timed from the first start to the last `settled()`.
 *
 * Then growth with run size: lines of 10 and 100 steps that each return 20 KB, one run at a time
 * and 8 at a time: ms per step (a run timed by its own events, created → finished), the ratio of
 * the 100-step to the 10-step per-step cost (1.0: a step costs the same however long the run),
 * and the Redis bytes a finished run occupies (MEMORY USAGE over its keys).
 *
 *   npm run bench:steps
 *   BENCH_REPS=5 BENCH_RUNS=200 npm run bench:steps
 *   BENCH_ONLY=growth BENCH_GROWTH_RUNS=3 npm run bench:steps
 *   BENCH_ONLY=width npm run bench:steps
 *   BENCH_ONLY=latency npm run bench:steps
 *   BENCH_ONLY=floors npm run bench:steps
 *   BENCH_ONLY=follow npm run bench:steps
 *
 * Then followers: 8 runs of 100 steps returning 20 KB at once, waited for by `settled()` or
 * followed by `outcomes({ follow: true })`, as `follow vs settled ratio (8 × 100 × 20 KB): <x>`.
 *
 * With the floors, the worker process's CPU per step at concurrency 8 and 32 against a BullMQ
 * chain's, as `client CPU per step vs BullMQ chain ratio: <x> at concurrency <c>`, and throughput
 * at concurrency 32 as `steps/s vs BullMQ chains ratio at concurrency 32: <x>`.
 *
 * Then latency: lines of 10 and 100 steps returning 200 B or 20 KB, one run at a time through
 * `start()` and `settled()`, against a bare Lua compare-and-set of the same payload, AOF always, as
 * `steps vs bare CAS latency ratio (<steps> × <size>): <x>`; and what `start()` alone costs its
 * caller (ms and CPU per start of a 10-step line, one at a time, no worker in the process).
 *
 * Then width: fan-out runs (a root, independent leaves, a join) of 100 and 1,000 steps, one at a
 * time, as `fan-out 1000 vs 100 per-step cost ratio: <x>` (1.0: a step costs the same however many
 * of its run's steps are ready at once).
 *
 * First, the latency a caller of `settled()` sees on 10-step runs at concurrency 1, beside the
 * engine's own time for the same runs, as `settled vs engine latency ratio: <x>`.
 */
import { randomUUID } from 'node:crypto';
import { Queue, Worker, type Job } from 'bullmq';
import { Redis } from 'ioredis';
import { createRuntime, type PlanInput } from '../src/index.js';
import { startRedisServer } from '../test/helpers/redis-server.js';
import { runtimeCore } from '../src/runtime.js';
import { median, spread } from './stats.js';

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
  const cpu0 = process.cpuUsage();
  await queue.addBulk(
    Array.from({ length: chains }, (_, chain) => ({
      name: 's',
      data: { chain, k: 0 },
      opts: { jobId: `${chain}|0`, removeOnComplete: true },
    })),
  );
  await finished;
  const ms = performance.now() - t0;
  lastCpuMs = cpuMs(process.cpuUsage(cpu0));
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  // BullMQ leaves connections it was given open.
  conn.disconnect();
  workerConn.disconnect();
  return ms;
}

/** The CPU time of the last `bullmqChains` or parallel `flujoRuns`, ms (this process: the worker's). */
let lastCpuMs = 0;
const cpuMs = (u: NodeJS.CpuUsage): number => (u.user + u.system) / 1000;

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
  const { redis } = runtimeCore(runtime);
  const { keys } = runtimeCore(runtime).stores;
  // Polled every 10 ms: a poll is a few µs of this process's CPU, which the figures count.
  const idle = async () => {
    while ((await redis.scard(keys.activeRuns())) > 0) await new Promise((r) => setTimeout(r, 10));
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
    await runtimeCore(runtime).queues.queue.pause();
    for (let i = 0; i < runs; i++) ids.push((await runtime.start(plan, null)).runId);
    worker = runtime.createWorker({
      concurrency,
      recoverOnStart: false,
      ...(chainMs === undefined ? {} : { chainMs }),
    });
    await worker.ready();
    workerStart = Date.now();
    const cpu0 = process.cpuUsage();
    await runtimeCore(runtime).queues.queue.resume();
    await idle();
    lastCpuMs = cpuMs(process.cpuUsage(cpu0));
  }
  let last = 0;
  let summed = 0;
  for (const runId of ids) {
    const events = await runtimeCore(runtime).stores.store.readEvents(runId);
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

/**
 * Steps/s as a user of the API sees them: `runs` runs started at once with `start()` while a
 * worker of concurrency `concurrency` in the same process runs them, timed from the first start
 * to the last `settled()` resolving. Returns elapsed ms.
 */
async function apiRuns(url: string, runs: number, concurrency: number): Promise<number> {
  const runtime = createRuntime({ redis: url, prefix: `b${randomUUID().slice(0, 6)}` });
  runtime.operator('noop', () => null);
  const worker = runtime.createWorker({ concurrency, recoverOnStart: false });
  await worker.ready();
  const t0 = performance.now();
  const reports = await Promise.all(
    Array.from({ length: runs }, async () => (await runtime.start(plan, null)).settled()),
  );
  const elapsed = performance.now() - t0;
  if (reports.some((r) => r.status !== 'succeeded')) throw new Error('a run did not succeed');
  await worker.close();
  await runtime.close();
  return elapsed;
}

/**
 * What a caller of `settled()` waits beside what the engine takes: `runs` 10-step runs with 200 B
 * results at concurrency 1, each timed from `start()` returning to `settled()` resolving, and by
 * its own events (created → finished). Returns both sums in ms.
 */
async function settledLatency(
  url: string,
  runs: number,
): Promise<{ user: number; engine: number }> {
  const runtime = createRuntime({ redis: url, prefix: `b${randomUUID().slice(0, 6)}` });
  const result = 'x'.repeat(200);
  runtime.operator('noop', () => result);
  const worker = runtime.createWorker({ concurrency: 1, recoverOnStart: false });
  await worker.ready();
  let user = 0;
  let engine = 0;
  for (let i = 0; i < runs; i++) {
    const handle = await runtime.start(plan, null);
    const t0 = performance.now();
    const report = await handle.settled();
    user += performance.now() - t0;
    if (report.status !== 'succeeded') throw new Error(`run ${handle.runId} did not succeed`);
    const events = await runtimeCore(runtime).stores.store.readEvents(handle.runId);
    const finished = events.find((e) => e.type === 'run.finished');
    engine += Number(finished?.data['at']) - Number(events[0]?.data['at']);
  }
  await worker.close();
  await runtime.close();
  return { user, engine };
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
      api32: [], // steps/s, flujo through start() and settled(), concurrency 32
      cpuChain8: [], // client CPU ms per step, BullMQ chains, concurrency 8
      cpuFlujo8: [], // client CPU ms per step, flujo, concurrency 8
      cpuChain32: [], // client CPU ms per step, BullMQ chains, concurrency 32
      cpuFlujo32: [], // client CPU ms per step, flujo, concurrency 32
    };
    const steps = PAR_RUNS * STEPS;
    // Warm-up of both paths, at both concurrencies, so every figure below is of warm code.
    await bullmqChains(server.url, 20, 1);
    await flujoRuns(server.url, 5, 1);
    await bullmqChains(server.url, PAR_RUNS, CONCURRENCY);
    await flujoRuns(server.url, PAR_RUNS, CONCURRENCY);
    await flujoRuns(server.url, 5, 1, 0);
    await flujoRuns(server.url, PAR_RUNS, CONCURRENCY, 0);
    await apiRuns(server.url, PAR_RUNS, CONCURRENCY);
    for (let rep = 0; rep < REPS; rep++) {
      rows.chain1!.push((await bullmqChains(server.url, SEQ_RUNS, 1)) / (SEQ_RUNS * STEPS));
      rows.cas!.push((await bareCas(server.url, 2000)) / 1000);
      rows.flujo1!.push((await flujoRuns(server.url, SEQ_RUNS, 1)) / (SEQ_RUNS * STEPS));
      rows.chain32!.push(
        (PAR_RUNS * STEPS) / ((await bullmqChains(server.url, PAR_RUNS, CONCURRENCY)) / 1000),
      );
      rows.cpuChain32!.push(lastCpuMs / steps);
      rows.flujo32!.push(
        (PAR_RUNS * STEPS) / ((await flujoRuns(server.url, PAR_RUNS, CONCURRENCY)) / 1000),
      );
      rows.cpuFlujo32!.push(lastCpuMs / steps);
      await bullmqChains(server.url, PAR_RUNS, 8);
      rows.cpuChain8!.push(lastCpuMs / steps);
      await flujoRuns(server.url, PAR_RUNS, 8);
      rows.cpuFlujo8!.push(lastCpuMs / steps);
      rows.single1!.push((await flujoRuns(server.url, SEQ_RUNS, 1, 0)) / (SEQ_RUNS * STEPS));
      rows.single32!.push(
        (PAR_RUNS * STEPS) / ((await flujoRuns(server.url, PAR_RUNS, CONCURRENCY, 0)) / 1000),
      );
      rows.api32!.push(
        (PAR_RUNS * STEPS) / ((await apiRuns(server.url, PAR_RUNS, CONCURRENCY)) / 1000),
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
    console.log(
      `  start() → settled(), conc. 32   ${median(rows.api32!).toFixed(0)} steps/s  (${spread(rows.api32!)}); / flujo, conc. 32 ${(median(rows.api32!) / median(rows.flujo32!)).toFixed(2)}`,
    );
    console.log(
      `  client CPU per step, conc. 8    flujo ${median(rows.cpuFlujo8!).toFixed(3)} ms (${spread(rows.cpuFlujo8!)}), BullMQ chain ${median(rows.cpuChain8!).toFixed(3)} ms (${spread(rows.cpuChain8!)})`,
    );
    console.log(
      `  client CPU per step, conc. 32   flujo ${median(rows.cpuFlujo32!).toFixed(3)} ms (${spread(rows.cpuFlujo32!)}), BullMQ chain ${median(rows.cpuChain32!).toFixed(3)} ms (${spread(rows.cpuChain32!)})`,
    );
    const aof = `(AOF ${appendfsync})`;
    for (const c of [8, 32]) {
      const ratio = median(rows[`cpuFlujo${c}`]!) / median(rows[`cpuChain${c}`]!);
      console.log(
        `client CPU per step vs BullMQ chain ratio: ${ratio.toFixed(2)} at concurrency ${c} ${aof}`,
      );
    }
    console.log(
      `steps/s vs BullMQ chains ratio at concurrency 32: ${(median(rows.flujo32!) / median(rows.chain32!)).toFixed(2)} ${aof}`,
    );
    return median(rows.flujo32!);
  } finally {
    await server.stop();
  }
}

const OUTPUT_BYTES = 20_000;
const GROWTH_RUNS = Number(process.env['BENCH_GROWTH_RUNS'] ?? 3);

const bigLine = (steps: number): PlanInput => ({
  name: `big-line-${steps}`,
  steps: Array.from({ length: steps }, (_, i) => ({
    id: `s${i}`,
    kind: 'operator' as const,
    operator: 'big',
    dependsOn: i === 0 ? [] : [`s${i - 1}`],
  })),
});

/** Bytes Redis holds for one run: MEMORY USAGE of each of its keys. */
async function runBytes(redis: Redis, prefix: string, runId: string): Promise<number> {
  let bytes = 0;
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:{${runId}}:*`, 'COUNT', 500);
    cursor = next;
    for (const key of keys)
      bytes += Number(await redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0'));
  } while (cursor !== '0');
  return bytes;
}

/**
 * `runs` runs of `steps` steps returning 20 KB each, `parallel` at a time (a worker of that
 * concurrency). Returns ms per step: one at a time, each run timed by its events; in parallel,
 * from the first start to the last finish over all steps. And the bytes of the last run.
 */
async function bigRuns(
  url: string,
  steps: number,
  runs: number,
  parallel: number,
): Promise<{ msPerStep: number; bytes: number }> {
  const prefix = `g${randomUUID().slice(0, 6)}`;
  const runtime = createRuntime({ redis: url, prefix });
  runtime.operator('big', ({ stepId }) => ({ stepId, text: stepId.padEnd(OUTPUT_BYTES, '.') }));
  const worker = runtime.createWorker({ concurrency: parallel, recoverOnStart: false });
  await worker.ready();
  const { redis } = runtimeCore(runtime);
  const { keys } = runtimeCore(runtime).stores;
  const idle = async () => {
    while ((await redis.scard(keys.activeRuns())) > 0) await new Promise((r) => setTimeout(r, 2));
  };
  const plan = bigLine(steps);
  const ids: string[] = [];
  const t0 = Date.now();
  if (parallel === 1) {
    for (let i = 0; i < runs; i++) {
      ids.push((await runtime.start(plan, null)).runId);
      await idle();
    }
  } else {
    for (let i = 0; i < runs; i++) ids.push((await runtime.start(plan, null)).runId);
    await idle();
  }
  let summed = 0;
  let last = 0;
  for (const runId of ids) {
    const events = await runtimeCore(runtime).stores.store.readEvents(runId);
    const created = Number(events[0]?.data['at']);
    const finished = events.find((e) => e.type === 'run.finished');
    if (finished?.data['status'] !== 'succeeded') throw new Error(`run ${runId} did not succeed`);
    summed += Number(finished.data['at']) - created;
    last = Math.max(last, Number(finished.data['at']));
  }
  const bytes = await runBytes(redis, prefix, ids[ids.length - 1]!);
  await worker.close();
  await runtime.close();
  const elapsed = parallel === 1 ? summed : last - t0;
  return { msPerStep: elapsed / (runs * steps), bytes };
}

async function growth(): Promise<void> {
  const server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', 'everysec']);
  try {
    await bigRuns(server.url, 10, 3, 1); // warm-up
    await bigRuns(server.url, 100, 1, 1);
    const rows: Record<string, number[]> = { s10: [], s100: [], p10: [], p100: [] };
    let bytes10 = 0;
    let bytes100 = 0;
    // Interleaved, in batches of the same number of steps (ten 10-step runs, one 100-step run), so
    // that both sizes see the same load of the shared machine; the median batch is quoted.
    for (let rep = 0; rep < REPS; rep++) {
      for (let k = 0; k < GROWTH_RUNS; k++) {
        const ten = await bigRuns(server.url, 10, 10, 1);
        const hundred = await bigRuns(server.url, 100, 1, 1);
        rows.s10!.push(ten.msPerStep);
        rows.s100!.push(hundred.msPerStep);
        bytes10 = ten.bytes;
        bytes100 = hundred.bytes;
      }
      rows.p10!.push((await bigRuns(server.url, 10, 80, 8)).msPerStep);
      rows.p100!.push((await bigRuns(server.url, 100, 8, 8)).msPerStep);
    }
    const kb = (n: number) => `${(n / 1024).toFixed(0)} KB`;
    console.log(
      `\nGrowth: steps returning 20 KB, AOF everysec (${REPS} × ${GROWTH_RUNS} batches of 100 steps one at a time, ${REPS} of 800 steps 8 at a time; median, min–max)`,
    );
    console.log(
      `  10-step runs, one at a time     ${median(rows.s10!).toFixed(3)} ms/step  (${spread(rows.s10!)})`,
    );
    console.log(
      `  100-step runs, one at a time    ${median(rows.s100!).toFixed(3)} ms/step  (${spread(rows.s100!)})`,
    );
    console.log(
      `  10-step runs, 8 at a time       ${median(rows.p10!).toFixed(3)} ms/step  (${spread(rows.p10!)})`,
    );
    console.log(
      `  100-step runs, 8 at a time      ${median(rows.p100!).toFixed(3)} ms/step  (${spread(rows.p100!)})`,
    );
    console.log(
      `  Redis bytes per finished run    ${kb(bytes10)} (10 steps), ${kb(bytes100)} (100 steps; outputs ${kb(100 * OUTPUT_BYTES)})`,
    );
    console.log(
      `100-step vs 10-step per-step cost ratio (20 KB): ${(median(rows.s100!) / median(rows.s10!)).toFixed(2)}`,
    );
  } finally {
    await server.stop();
  }
}

/**
 * 8 runs of 100 steps returning 20 KB each, started at once (a worker of concurrency 8), each
 * waited for by `settled()` or followed to its end by `outcomes({ follow: true })` from another
 * runtime in the same process (as a caller that is not the worker would). Returns ms from the
 * first start to the last end.
 */
async function waitedRuns(url: string, how: 'settled' | 'follow'): Promise<number> {
  const prefix = `f${randomUUID().slice(0, 6)}`;
  // A shared machine under load can hold a reply for seconds: no deadline makes a figure fail.
  const runtime = createRuntime({ redis: url, prefix, redisTimeoutMs: 120_000 });
  runtime.operator('big', ({ stepId }) => ({ stepId, text: stepId.padEnd(OUTPUT_BYTES, '.') }));
  const worker = runtime.createWorker({ concurrency: 8, recoverOnStart: false });
  const caller = createRuntime({ redis: url, prefix, redisTimeoutMs: 120_000 });
  await worker.ready();
  const plan = bigLine(100);
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      const run = await caller.start(plan, null);
      if (how === 'settled') {
        if ((await run.settled()).status !== 'succeeded') throw new Error('run did not succeed');
        return;
      }
      let succeeded = 0;
      for await (const o of run.outcomes({ follow: true })) if (o.type === 'success') succeeded++;
      if (succeeded !== 100) throw new Error(`followed ${succeeded} successes, not 100`);
    }),
  );
  const ms = performance.now() - t0;
  await worker.close();
  await caller.close();
  await runtime.close();
  return ms;
}

/** `follow vs settled ratio (8 × 100 × 20 KB):`, the two interleaved, the medians compared. */
async function followers(): Promise<void> {
  const server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', 'everysec']);
  try {
    await waitedRuns(server.url, 'settled'); // warm-up
    await waitedRuns(server.url, 'follow');
    const settled: number[] = [];
    const follow: number[] = [];
    for (let rep = 0; rep < Math.max(REPS, 3); rep++) {
      settled.push(await waitedRuns(server.url, 'settled'));
      follow.push(await waitedRuns(server.url, 'follow'));
    }
    console.log(`\nFollowers: 8 runs of 100 steps returning 20 KB at once, AOF everysec`);
    console.log(
      `  settled()                       ${median(settled).toFixed(0)} ms  (${spread(settled)})`,
    );
    console.log(
      `  outcomes({ follow: true })      ${median(follow).toFixed(0)} ms  (${spread(follow)})`,
    );
    console.log(
      `follow vs settled ratio (8 × 100 × 20 KB): ${(median(follow) / median(settled)).toFixed(2)}`,
    );
  } finally {
    await server.stop();
  }
}

// A compare-and-set at its floor: the version checked, the snapshot and its version written, an
// event appended, in one script (one round trip), as a commit of one step would be at the least.
const CAS_LUA = `if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 's', ARGV[3])
redis.call('XADD', KEYS[2], '*', 't', 'step.succeeded', 'd', '{}')
return 1`;

/** ms per bare Lua compare-and-set commit of a `bytes`-byte payload, `n` one after the other. */
async function bareLuaCas(url: string, n: number, bytes: number): Promise<number> {
  const r = new Redis(url);
  const cas = (...args: string[]) =>
    r.eval(CAS_LUA, 2, '{bench-lua}:snap', '{bench-lua}:events', ...args);
  const payload = 'x'.repeat(bytes);
  await r.hset('{bench-lua}:snap', 'v', '0');
  await cas('0', '0', payload); // loads the script (EVAL keeps it cached)
  const t0 = performance.now();
  for (let v = 0; v < n; v++) {
    if ((await cas(String(v), String(v + 1), payload)) !== 1) throw new Error('CAS refused');
  }
  const ms = (performance.now() - t0) / n;
  await r.del('{bench-lua}:snap', '{bench-lua}:events');
  r.disconnect();
  return ms;
}

/**
 * ms per step of `runs` line runs of `steps` steps that each return `bytes` bytes, one at a time,
 * each timed as its caller waits: from calling `start()` to `settled()` resolving.
 */
async function settledShape(
  url: string,
  steps: number,
  bytes: number,
  runs: number,
): Promise<number> {
  const runtime = createRuntime({ redis: url, prefix: `l${randomUUID().slice(0, 6)}` });
  const output = 'x'.repeat(bytes);
  runtime.operator('out', () => output);
  const worker = runtime.createWorker({ concurrency: 1, recoverOnStart: false });
  await worker.ready();
  const line: PlanInput = {
    name: `latency-${steps}`,
    steps: Array.from({ length: steps }, (_, i) => ({
      id: `s${i}`,
      kind: 'operator' as const,
      operator: 'out',
      dependsOn: i === 0 ? [] : [`s${i - 1}`],
    })),
  };
  let ms = 0;
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    const report = await (await runtime.start(line, null)).settled();
    ms += performance.now() - t0;
    if (report.status !== 'succeeded') throw new Error(`latency run ${report.status}`);
  }
  await worker.close();
  await runtime.close();
  return ms / (runs * steps);
}

/**
 * What a caller waits on in `start()` of a 10-step line, one start at a time, with no worker in
 * the process (the queue paused): ms per start, and this process's CPU per start, over `n` starts
 * after a warm-up.
 */
async function startCost(url: string, n: number): Promise<{ ms: number; cpuMs: number }> {
  const runtime = createRuntime({ redis: url, prefix: `s${randomUUID().slice(0, 6)}` });
  await runtimeCore(runtime).queues.queue.pause();
  for (let i = 0; i < 50; i++) await runtime.start(plan, null);
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  for (let i = 0; i < n; i++) await runtime.start(plan, null);
  const ms = (performance.now() - t0) / n;
  const cpu = cpuMs(process.cpuUsage(cpu0)) / n;
  await runtime.close();
  return { ms, cpuMs: cpu };
}

/**
 * Latency against the commit floor: one run at a time, ms per step through `start()` and
 * `settled()`, beside a bare Lua compare-and-set of the same payload, both with AOF `always`, for
 * lines of 10 and 100 steps returning 200 B or 20 KB, as `steps vs bare CAS latency ratio
 * (<shape>): <x>`.
 */
async function latency(): Promise<void> {
  const server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', 'always']);
  try {
    const shapes = [
      [10, 200],
      [10, 20_000],
      [100, 200],
      [100, 20_000],
    ] as const;
    await settledShape(server.url, 10, 200, 5); // warm-up
    await bareLuaCas(server.url, 100, 200);
    const flujo = shapes.map((): number[] => []);
    const cas = shapes.map((): number[] => []);
    for (let rep = 0; rep < REPS; rep++) {
      for (const [i, [steps, bytes]] of shapes.entries()) {
        flujo[i]!.push(await settledShape(server.url, steps, bytes, steps === 10 ? 10 : 2));
        cas[i]!.push(await bareLuaCas(server.url, 500, bytes));
      }
    }
    console.log(
      `\nLatency: line runs one at a time through start() and settled(), beside a bare Lua CAS commit of the same payload, AOF always (median of ${REPS}, min–max)`,
    );
    const label = (steps: number, bytes: number) =>
      `${steps} × ${bytes >= 1000 ? `${bytes / 1000} KB` : `${bytes} B`}`;
    for (const [i, [steps, bytes]] of shapes.entries()) {
      console.log(
        `  ${label(steps, bytes).padEnd(12)} flujo ${median(flujo[i]!).toFixed(3)} ms/step (${spread(flujo[i]!)}), bare CAS ${median(cas[i]!).toFixed(3)} ms (${spread(cas[i]!)})`,
      );
    }
    for (const [i, [steps, bytes]] of shapes.entries()) {
      console.log(
        `steps vs bare CAS latency ratio (${label(steps, bytes)}): ${(median(flujo[i]!) / median(cas[i]!)).toFixed(2)}`,
      );
    }
    const starts = [];
    for (let rep = 0; rep < REPS; rep++) starts.push(await startCost(server.url, 300));
    const startMs = starts.map((c) => c.ms);
    const startCpu = starts.map((c) => c.cpuMs);
    console.log(
      `start() of a 10-step line, one at a time, no worker in the process, AOF always: ${median(startMs).toFixed(3)} ms (${spread(startMs)}), client CPU ${median(startCpu).toFixed(3)} ms (${spread(startCpu)})`,
    );
  } finally {
    await server.stop();
  }
}

/** A fan-out plan: a root, `leaves` independent steps after it, and a join after them all. */
function fanOut(leaves: number): PlanInput {
  return {
    name: `bench-fan-${leaves}`,
    steps: [
      { id: 'root', kind: 'operator', operator: 'noop' },
      ...Array.from({ length: leaves }, (_, i) => ({
        id: `l${i}`,
        kind: 'operator' as const,
        operator: 'noop',
        dependsOn: ['root'],
      })),
      {
        id: 'join',
        kind: 'operator',
        operator: 'noop',
        dependsOn: Array.from({ length: leaves }, (_, i) => `l${i}`),
      },
    ],
  };
}

/** ms per step of one fan-out run of `steps` steps through start() and settled(), worker concurrency 8. */
async function fanOutRun(url: string, steps: number): Promise<number> {
  const runtime = createRuntime({ redis: url, prefix: `bw${randomUUID().slice(0, 6)}` }).operator(
    'noop',
    () => null,
  );
  const worker = runtime.createWorker({ concurrency: 8 });
  await worker.ready();
  try {
    const started = performance.now();
    const report = await (
      await runtime.start(fanOut(steps - 2), null)
    ).settled({
      timeoutMs: 600_000,
    });
    if (report.status !== 'succeeded') throw new Error(`fan-out run ${report.status}`);
    return (performance.now() - started) / steps;
  } finally {
    await worker.close();
    await runtime.close();
  }
}

/** Width: a fan-out of 1,000 steps against one of 100, per step, one run at a time. */
async function width(): Promise<void> {
  const server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', 'everysec']);
  try {
    await fanOutRun(server.url, 100); // warm-up
    const rows: Record<'w100' | 'w1000', number[]> = { w100: [], w1000: [] };
    for (let rep = 0; rep < REPS; rep++) {
      rows.w100.push(await fanOutRun(server.url, 100));
      rows.w1000.push(await fanOutRun(server.url, 1000));
    }
    console.log(
      `\nWidth: fan-out runs (root, leaves, join) of no-op steps, one at a time, worker concurrency 8, AOF everysec (median of ${REPS}, min–max)`,
    );
    console.log(`  100 steps     ${median(rows.w100).toFixed(3)} ms/step  (${spread(rows.w100)})`);
    console.log(
      `  1,000 steps   ${median(rows.w1000).toFixed(3)} ms/step  (${spread(rows.w1000)})`,
    );
    console.log(
      `fan-out 1000 vs 100 per-step cost ratio: ${(median(rows.w1000) / median(rows.w100)).toFixed(2)}`,
    );
  } finally {
    await server.stop();
  }
}

console.log(
  `${STEPS}-step runs of no-op operators; ${SEQ_RUNS} runs one at a time, ${PAR_RUNS} at once`,
);
{
  const server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', 'everysec']);
  try {
    await settledLatency(server.url, 10);
    const { user, engine } = await settledLatency(server.url, SEQ_RUNS * 2);
    const n = SEQ_RUNS * 2;
    console.log(
      `\nsettled() after start(), ${n} runs one at a time: ${(user / n).toFixed(2)} ms per run; engine (first event → run.finished) ${(engine / n).toFixed(2)} ms`,
    );
    console.log(`settled vs engine latency ratio: ${(user / engine).toFixed(2)}`);
  } finally {
    await server.stop();
  }
}

// BENCH_ONLY=growth (or width, follow, latency, floors: the everysec floors) runs those figures alone; BENCH_SETTLED_ONLY=1 only the
// settled() latency above.
if (process.env['BENCH_ONLY'] === 'growth') {
  await growth();
} else if (process.env['BENCH_ONLY'] === 'follow') {
  await followers();
} else if (process.env['BENCH_ONLY'] === 'width') {
  await width();
} else if (process.env['BENCH_ONLY'] === 'latency') {
  await latency();
} else if (process.env['BENCH_ONLY'] === 'floors') {
  await measure('everysec');
} else if (process.env['BENCH_SETTLED_ONLY'] !== '1') {
  await measure('always');
  const everysec = await measure('everysec');
  await latency();
  await growth();
  await followers();
  await width();
  console.log(`\nsteps/s at concurrency 32: ${everysec.toFixed(0)}`);
}
