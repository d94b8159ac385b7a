/**
 * What `durability: { replicas: 1 }` costs per step: 10-step runs of no-op operator steps on a
 * master with one replica (both AOF `always`, on this machine's loopback), driven through
 * `start()` + `settled()`, with and without waiting for the replica, in the same run and
 * alternating which goes first:
 *   - ms per step one run at a time (what a caller waits for),
 *   - steps/s with 200 runs started at once on a worker of concurrency 32,
 *   - how many WAITs the master served per step.
 *
 *   npm run bench:durability
 *   BENCH_REPS=5 npm run bench:durability
 */
import { Redis } from 'ioredis';
import { createRuntime, type PlanInput } from '../src/index.js';
import { startRedisServer } from '../test/helpers/redis-server.js';
import { median, spread } from './stats.js';

const STEPS = 10;
const REPS = Number(process.env['BENCH_REPS'] ?? 3);
const SEQ_RUNS = Number(process.env['BENCH_SEQ_RUNS'] ?? 30);
const PAR_RUNS = Number(process.env['BENCH_RUNS'] ?? 200);
const CONCURRENCY = 32;

const plan: PlanInput = {
  name: 'bench-durability',
  steps: Array.from({ length: STEPS }, (_, i) => ({
    id: `s${i}`,
    kind: 'operator' as const,
    operator: 'noop',
    dependsOn: i === 0 ? [] : [`s${i - 1}`],
  })),
};

async function waits(admin: Redis): Promise<number> {
  const match = /cmdstat_wait:calls=(\d+)/.exec(await admin.info('commandstats'));
  return match === null ? 0 : Number(match[1]);
}

/** One measurement: ms per step one run at a time, steps/s at concurrency 32, WAITs per step. */
async function measure(url: string, admin: Redis, replicas: number, rep: number) {
  const runtime = createRuntime({
    redis: url,
    prefix: `bd${rep}r${replicas}`,
    ...(replicas === 0 ? {} : { durability: { replicas } }),
  }).operator('noop', () => null);
  const worker = runtime.createWorker({ concurrency: CONCURRENCY });
  await worker.ready();
  try {
    const waitsBefore = await waits(admin);
    let started = performance.now();
    for (let i = 0; i < SEQ_RUNS; i++) {
      const report = await (await runtime.start(plan, null)).settled({ timeoutMs: 60_000 });
      if (report.status !== 'succeeded') throw new Error(`run ${report.status}`);
    }
    const msPerStep = (performance.now() - started) / (SEQ_RUNS * STEPS);
    const waitsPerStep = ((await waits(admin)) - waitsBefore) / (SEQ_RUNS * STEPS);
    started = performance.now();
    const handles = await Promise.all(
      Array.from({ length: PAR_RUNS }, () => runtime.start(plan, null)),
    );
    const reports = await Promise.all(handles.map((h) => h.settled({ timeoutMs: 120_000 })));
    if (reports.some((r) => r.status !== 'succeeded')) throw new Error('a run did not succeed');
    const stepsPerSecond = (PAR_RUNS * STEPS) / ((performance.now() - started) / 1000);
    return { msPerStep, stepsPerSecond, waitsPerStep };
  } finally {
    await worker.close();
    await runtime.close();
  }
}

async function main(): Promise<void> {
  const aof = ['--appendonly', 'yes', '--appendfsync', 'always'];
  const master = await startRedisServer(aof);
  const replica = await startRedisServer([...aof, '--replicaof', '127.0.0.1', String(master.port)]);
  const admin = new Redis(master.url);
  try {
    for (;;) {
      if (/state=online/.test(await admin.info('replication'))) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const results: Record<
      0 | 1,
      { msPerStep: number[]; stepsPerSecond: number[]; waits: number[] }
    > = {
      0: { msPerStep: [], stepsPerSecond: [], waits: [] },
      1: { msPerStep: [], stepsPerSecond: [], waits: [] },
    };
    for (let rep = 0; rep < REPS; rep++) {
      const order: (0 | 1)[] = rep % 2 === 0 ? [0, 1] : [1, 0];
      for (const replicas of order) {
        const m = await measure(master.url, admin, replicas, rep);
        results[replicas].msPerStep.push(m.msPerStep);
        results[replicas].stepsPerSecond.push(m.stepsPerSecond);
        results[replicas].waits.push(m.waitsPerStep);
        console.log(
          `rep ${rep + 1} replicas ${replicas}: ${m.msPerStep.toFixed(3)} ms/step one at a time, ${m.stepsPerSecond.toFixed(0)} steps/s at concurrency ${CONCURRENCY}, ${m.waitsPerStep.toFixed(2)} WAITs/step`,
        );
      }
    }
    console.log(
      `\n${STEPS}-step runs, master + 1 replica, AOF always, median of ${REPS} (spread):`,
    );
    for (const r of [0, 1] as const) {
      const x = results[r];
      console.log(
        `  replicas ${r}: ${median(x.msPerStep).toFixed(3)} ms/step (${spread(x.msPerStep, 3)}), ${median(x.stepsPerSecond).toFixed(0)} steps/s (${spread(x.stepsPerSecond, 0)}), ${median(x.waits).toFixed(2)} WAITs/step`,
      );
    }
    const latency = results[1].msPerStep.map((v, i) => v / results[0].msPerStep[i]!);
    const throughput = results[1].stepsPerSecond.map((v, i) => v / results[0].stepsPerSecond[i]!);
    console.log(
      `replicas 1 cost per step: +${(median(results[1].msPerStep) - median(results[0].msPerStep)).toFixed(3)} ms one at a time`,
    );
    console.log(
      `replicas 1 vs 0 steps/s ratio at concurrency ${CONCURRENCY}: ${median(throughput).toFixed(2)}`,
    );
    console.log(`replicas 1 vs 0 per-step latency ratio: ${median(latency).toFixed(2)}`);
  } finally {
    admin.disconnect();
    await replica.stop();
    await master.stop();
  }
}

await main();
