/**
 * Cost of the pure kernel per event: `advanceRun` (restore the run's actors from the persisted
 * snapshot, feed one event, read the snapshot back) on runs of 10 and 50 steps in a line, against
 * a JSON round trip of the same snapshot measured in the same run (the floor of any stateless
 * restore). Several repetitions; median and spread.
 *
 *   npm run bench:kernel
 */
import { advanceRun, parsePlan, startRun, type RunEvent, type RunSnapshot } from '../src/index.js';

const REPS = 7;
const RUNS_PER_REP = 60;

function linePlan(steps: number) {
  return parsePlan({
    name: `line-${steps}`,
    steps: Array.from({ length: steps }, (_, i) => ({
      id: `s${i}`,
      kind: 'operator',
      operator: 'noop',
      dependsOn: i === 0 ? [] : [`s${i - 1}`],
    })),
  });
}

const ok = (stepId: string, at: number): RunEvent => ({
  type: 'step.succeeded',
  stepId,
  attempt: 1,
  output: { ok: true },
  at,
});

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

function measure(steps: number): void {
  const plan = linePlan(steps);
  const kernelReps: number[] = [];
  const floorReps: number[] = [];
  let bytes = 0;
  for (let rep = 0; rep < REPS + 1; rep++) {
    let kernelNs = 0n;
    let floorNs = 0n;
    let events = 0;
    for (let r = 0; r < RUNS_PER_REP; r++) {
      let snap: RunSnapshot = startRun(plan, { runId: `r${r}`, at: 1 }).snapshot;
      for (let i = 0; i < steps; i++) {
        const t0 = process.hrtime.bigint();
        const copy = JSON.parse(JSON.stringify(snap)) as RunSnapshot;
        const t1 = process.hrtime.bigint();
        snap = advanceRun(copy, ok(`s${i}`, 2 + i)).snapshot;
        const t2 = process.hrtime.bigint();
        floorNs += t1 - t0;
        kernelNs += t2 - t1;
        events++;
      }
      bytes = JSON.stringify(snap).length;
    }
    if (rep === 0) continue; // warm-up
    kernelReps.push(Number(kernelNs) / 1000 / events);
    floorReps.push(Number(floorNs) / 1000 / events);
  }
  const k = median(kernelReps);
  const f = median(floorReps);
  console.log(
    `${String(steps).padStart(3)} steps  snapshot ${String(bytes).padStart(6)} B  ` +
      `advanceRun ${k.toFixed(1)} µs/event (${Math.min(...kernelReps).toFixed(1)}–${Math.max(...kernelReps).toFixed(1)})  ` +
      `JSON round trip ${f.toFixed(1)} µs (${Math.min(...floorReps).toFixed(1)}–${Math.max(...floorReps).toFixed(1)})  ` +
      `ratio ${(k / f).toFixed(2)}`,
  );
}

console.log(
  `${REPS} repetitions × ${RUNS_PER_REP} runs after a warm-up repetition; per event, medians (min–max)`,
);
measure(10);
measure(50);
