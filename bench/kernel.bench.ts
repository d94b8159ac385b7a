/**
 * Cost of the pure kernel per event: `advanceRun` (restore the run's actors from the persisted
 * snapshot, feed one event, read the snapshot back) on runs of 10 and 50 steps in a line, against
 * a JSON round trip of the same snapshot measured in the same run (the floor of any stateless
 * restore). Beside it, the same event fed to the run restored whole (`openRun(snapshot).send`,
 * every step actor restored), which `advanceRun` avoids by restoring only the steps the event
 * reaches. Several repetitions; median and spread.
 *
 * Then a long run held open with big outputs (100 steps of 20 KB each): per event, feeding it
 * (`OpenRun.send`) and working out what its commit writes (`runSnapshotDelta`, which compares
 * unchanged steps by reference before serializing anything). Last, 10-step lines held open, each
 * step fed as a worker's chained unit feeds it (`sendStartedWith`: its start with its result) and
 * its commit's delta: the kernel's share of a step's CPU, to set beside a whole step's CPU in
 * `bench:steps`.
 *
 *   npm run bench:kernel
 */
import { openRun, startOpenRun } from '../src/machines/kernel.js';
import { runSnapshotDelta } from '../src/machines/stored-snapshot.js';
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

const ok = (stepId: string, at: number, output: unknown = { ok: true }): RunEvent => ({
  type: 'step.succeeded',
  stepId,
  attempt: 1,
  output: output as never,
  at,
});

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

const copy = (snap: RunSnapshot) => JSON.parse(JSON.stringify(snap)) as RunSnapshot;
const us = (ns: bigint, n: number) => Number(ns) / 1000 / n;
const spread = (xs: number[]) =>
  `${median(xs).toFixed(1)} µs (${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)})`;

function measure(steps: number): void {
  const plan = linePlan(steps);
  const kernelReps: number[] = [];
  const wholeReps: number[] = [];
  const floorReps: number[] = [];
  let bytes = 0;
  for (let rep = 0; rep < REPS + 1; rep++) {
    let kernelNs = 0n;
    let wholeNs = 0n;
    let floorNs = 0n;
    let events = 0;
    for (let r = 0; r < RUNS_PER_REP; r++) {
      let snap: RunSnapshot = startRun(plan, { runId: `r${r}`, at: 1 }).snapshot;
      for (let i = 0; i < steps; i++) {
        const event = ok(`s${i}`, 2 + i);
        const t0 = process.hrtime.bigint();
        const parsed = copy(snap);
        const t1 = process.hrtime.bigint();
        const next = advanceRun(parsed, event).snapshot;
        const t2 = process.hrtime.bigint();
        const again = copy(snap);
        const t3 = process.hrtime.bigint();
        openRun(again).send(event);
        const t4 = process.hrtime.bigint();
        floorNs += t1 - t0;
        kernelNs += t2 - t1;
        wholeNs += t4 - t3;
        snap = next;
        events++;
      }
      bytes = JSON.stringify(snap).length;
    }
    if (rep === 0) continue; // warm-up
    kernelReps.push(us(kernelNs, events));
    wholeReps.push(us(wholeNs, events));
    floorReps.push(us(floorNs, events));
  }
  const k = median(kernelReps);
  const w = median(wholeReps);
  const f = median(floorReps);
  console.log(
    `${String(steps).padStart(3)} steps  snapshot ${String(bytes).padStart(6)} B  ` +
      `advanceRun ${spread(kernelReps)}  JSON round trip ${spread(floorReps)}  ` +
      `ratio ${(k / f).toFixed(2)}  |  restored whole ${spread(wholeReps)}  ratio ${(w / f).toFixed(2)}`,
  );
}

/** A run of `steps` steps held open, each producing `outputBytes` of output: send + delta. */
function measureHeld(steps: number, outputBytes: number): void {
  const plan = linePlan(steps);
  const output = { text: 'x'.repeat(outputBytes) };
  const sendReps: number[] = [];
  const deltaReps: number[] = [];
  for (let rep = 0; rep < REPS + 1; rep++) {
    let sendNs = 0n;
    let deltaNs = 0n;
    const run = openRun(startRun(plan, { runId: 'held', at: 1 }).snapshot);
    let previous = run.snapshot;
    for (let i = 0; i < steps; i++) {
      const t0 = process.hrtime.bigint();
      const next = run.send(ok(`s${i}`, 2 + i, output)).snapshot;
      const t1 = process.hrtime.bigint();
      runSnapshotDelta(previous, next);
      const t2 = process.hrtime.bigint();
      sendNs += t1 - t0;
      deltaNs += t2 - t1;
      previous = next;
    }
    if (rep === 0) continue; // warm-up
    sendReps.push(us(sendNs, steps));
    deltaReps.push(us(deltaNs, steps));
  }
  console.log(
    `${steps} steps × ${outputBytes / 1000} KB outputs, held open: ` +
      `send ${spread(sendReps)}  commit delta ${spread(deltaReps)}`,
  );
}

/**
 * Lines of `steps` steps held open, each step fed as a worker's chained unit feeds it (its
 * `step.started` with its result, `sendStartedWith`) and its commit's delta worked out: the kernel's
 * whole share of a step's CPU, xstate's two actors included.
 */
function measureLines(steps: number, runs: number): void {
  const plan = linePlan(steps);
  const feedReps: number[] = [];
  const deltaReps: number[] = [];
  for (let rep = 0; rep < REPS + 1; rep++) {
    let feedNs = 0n;
    let deltaNs = 0n;
    for (let r = 0; r < runs; r++) {
      const { run, transition } = startOpenRun(plan, { runId: `line${r}`, at: 1 });
      let previous = transition.snapshot;
      for (let i = 0; i < steps; i++) {
        const started: RunEvent = { type: 'step.started', stepId: `s${i}`, attempt: 1, at: 2 + i };
        const t0 = process.hrtime.bigint();
        const fed = run.sendStartedWith(started, ok(`s${i}`, 2 + i, null));
        const t1 = process.hrtime.bigint();
        if (fed === null) throw new Error(`step s${i} was not fed`);
        runSnapshotDelta(previous, fed[1].snapshot);
        const t2 = process.hrtime.bigint();
        feedNs += t1 - t0;
        deltaNs += t2 - t1;
        previous = fed[1].snapshot;
      }
    }
    if (rep === 0) continue; // warm-up
    feedReps.push(us(feedNs, steps * runs));
    deltaReps.push(us(deltaNs, steps * runs));
  }
  console.log(
    `${steps}-step lines held open, per step as a chained unit feeds it (step.started with its result): ` +
      `feed ${spread(feedReps)}  commit delta ${spread(deltaReps)}`,
  );
}

console.log(
  `${REPS} repetitions × ${RUNS_PER_REP} runs after a warm-up repetition; per event, medians (min–max)`,
);
measure(10);
measure(50);
measureHeld(100, 20_000);
measureLines(10, 500);
