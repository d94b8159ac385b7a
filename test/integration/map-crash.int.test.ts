/**
 * A map over 1,000 items driven by `flujo worker` processes (test/fixtures/jobs/map-items.ts), one
 * of them SIGKILLed every second and a new one started: every item is committed once, none is
 * invoked after its commit (each invocation checks its item's output in the map's hash when it
 * starts), the output is in element order, and at most maxConcurrency (8) items run at a time
 * (counted from the invocations' start and end lines, an invocation of a killed worker ending with
 * its kill).
 */
import { appendFileSync, existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createRuntime, type PlanInput, type Runtime } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { plan } from '../fixtures/jobs/map-items.js';
import { startFlujo, type RunningChild } from '../helpers/cli.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const MODULE = 'test/fixtures/jobs/map-items.ts';
const ITEMS = 1000;

let prefix: string;
let dir: string;
let effects: string;
let runtime: Runtime;
const workers: RunningChild[] = [];

function startWorker(killAt = ''): RunningChild {
  const w = startFlujo(['worker', MODULE, '--concurrency', '4'], {
    prefix,
    env: { MAP_EFFECT_FILE: effects, FLUJO_KILL_AT: killAt },
  });
  workers.push(w);
  return w;
}

async function kill(w: RunningChild): Promise<void> {
  if (w.child.exitCode === null && w.child.signalCode === null) w.child.kill('SIGKILL');
  await w.done;
  appendFileSync(effects, `kill ${w.child.pid}\n`);
}

interface Invocation {
  index: number;
  pid: number;
  late: boolean;
}

/** The invocations, and the most that ran at once (a killed worker's end at its kill). */
function invocations(): { all: Invocation[]; most: number } {
  if (!existsSync(effects)) return { all: [], most: 0 };
  const all: Invocation[] = [];
  const open = new Map<number, number>();
  let running = 0;
  let most = 0;
  for (const line of readFileSync(effects, 'utf8').split('\n')) {
    const [what, a, b, c] = line.split(' ');
    if (what === 'start') {
      all.push({ index: Number(a), pid: Number(b), late: c === '1' });
      open.set(Number(b), (open.get(Number(b)) ?? 0) + 1);
      most = Math.max(most, ++running);
    } else if (what === 'end') {
      open.set(Number(b), open.get(Number(b))! - 1);
      running--;
    } else if (what === 'kill') {
      running -= open.get(Number(a)) ?? 0;
      open.delete(Number(a));
    }
  }
  return { all, most };
}

beforeEach(async () => {
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-map-crash-'));
  effects = join(dir, 'effects.log');
  runtime = createRuntime({
    redis: redisUrl(),
    prefix,
    logger: silentLogger,
  });
});
afterEach(async () => {
  await Promise.all(workers.map((w) => kill(w).catch(() => {})));
  workers.length = 0;
  await runtime.close();
  const redis = connect();
  try {
    await deletePrefix(redis, prefix);
  } finally {
    redis.disconnect();
  }
  await rm(dir, { recursive: true, force: true });
});

describe('a map of 1,000 items across workers killed every second', () => {
  it('commits every item once, none invoked after its commit, the output in order', async () => {
    for (let i = 0; i < 3; i++) startWorker();
    const run = await runtime.start(plan as PlanInput, { n: ITEMS });
    const started = Date.now();
    let kills = 0;
    // For up to a minute, a worker dies every second (each lives about 3 s, its start included);
    // the survivors then finish.
    for (;;) {
      await new Promise((resolve) => setTimeout(resolve, 1000));
      const status = (await run.status()).status;
      if (status !== 'running' || Date.now() - started > 60_000) break;
      // The oldest worker dies; a new one starts.
      const victim = workers.shift()!;
      await kill(victim);
      kills++;
      startWorker();
    }
    const report = await run.settled({ timeoutMs: 120_000 });
    expect(report.status).toBe('succeeded');
    expect(kills).toBeGreaterThan(2);
    const each = report.steps.find((s) => s.stepId === 'each')!;
    expect(each.output).toEqual(Array.from({ length: ITEMS }, (_, i) => i * 3));
    expect(report.maps['each']).toEqual({ total: ITEMS, done: ITEMS, failed: 0, running: 0 });
    const { all, most } = invocations();
    // No invocation began after its item's commit.
    expect(all.filter((i) => i.late)).toEqual([]);
    // Every item was invoked, and again only after a worker died with it.
    const byIndex = new Map<number, Invocation[]>();
    for (const i of all) byIndex.set(i.index, [...(byIndex.get(i.index) ?? []), i]);
    expect(byIndex.size).toBe(ITEMS);
    const again = [...byIndex.values()].filter((list) => list.length > 1).length;
    expect(again).toBeLessThanOrEqual(kills * 8);
    expect(most).toBeLessThanOrEqual(8);
    expect(most).toBeGreaterThan(1);
  }, 240_000);
});

describe('a map across a worker killed at each point between an effect and its commit', () => {
  const points = [
    'after-map-start:each',
    'before-item-commit:each@5',
    'after-item-commit:each@5',
    'before-commit:each',
    'after-commit:each',
  ];
  for (const point of points) {
    it(`killed at ${point}: every item committed once, none invoked after its commit`, async () => {
      const victim = startWorker(point);
      const run = await runtime.start(plan as PlanInput, { n: 30 });
      const exit = await victim.done;
      expect(exit.signal).toBe('SIGKILL');
      appendFileSync(effects, `kill ${victim.child.pid}\n`);
      startWorker();
      const report = await run.settled({ timeoutMs: 30_000 });
      expect(report.status).toBe('succeeded');
      const each = report.steps.find((s) => s.stepId === 'each')!;
      expect(each.output).toEqual(Array.from({ length: 30 }, (_, i) => i * 3));
      expect(report.maps['each']).toEqual({ total: 30, done: 30, failed: 0, running: 0 });
      const { all } = invocations();
      expect(all.filter((i) => i.late)).toEqual([]);
      expect(new Set(all.map((i) => i.index)).size).toBe(30);
      // Only the items the killed worker was running ran twice.
      const twice = all.length - 30;
      expect(twice).toBeLessThanOrEqual(4);
    }, 60_000);
  }
});
