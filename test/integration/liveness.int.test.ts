/**
 * Liveness and waiting: `settled()` learns that a run ended from its event stream (the Redis
 * commands its client sends stay the same however long the run takes), operators' progress reaches
 * subscribers and status without entering the history, and due work no worker takes is reported.
 */
import { randomUUID } from 'node:crypto';
import { createConnection, type Socket } from 'node:net';
import { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import {
  createRuntime,
  type FlujoWorker,
  type OperatorContext,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';

let prefix: string;
let rt: Runtime;
let worker: FlujoWorker | undefined;
let skew = 0;

const sleepy: PlanInput = {
  name: 'sleepy',
  steps: [{ id: 's', kind: 'operator', operator: 'sleep' }],
};

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  skew = 0;
  rt = createRuntime({
    redis: redisUrl(),
    prefix,
    clock: () => Date.now() + skew,
    operators: {
      sleep: async ({ input }: OperatorContext) => {
        await new Promise((resolve) => setTimeout(resolve, (input as { ms: number }).ms));
        return { slept: true };
      },
    },
  });
});
afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await rt.close();
  await deleteRuntimeKeys(prefix);
});

/**
 * MONITOR on a plain socket: calls `onCommand` with each command's client address, name and first
 * argument.
 */
async function rawMonitor(
  onCommand: (source: string, command: string, arg: string | undefined) => void,
): Promise<Socket> {
  const url = new URL(redisUrl());
  const socket = createConnection({ host: url.hostname, port: Number(url.port) });
  let buffered = '';
  await new Promise<void>((resolve, reject) => {
    socket.once('error', reject);
    socket.on('data', (data: Buffer) => {
      buffered += data.toString();
      const lines = buffered.split('\r\n');
      buffered = lines.pop() ?? '';
      for (const line of lines) {
        if (line === '+OK') resolve();
        const m = /^\+[\d.]+ \[\d+ (\S+)\] "([^"]+)"(?: "([^"]*)")?/.exec(line);
        if (m !== null) onCommand(m[1]!, m[2]!.toLowerCase(), m[3]);
      }
    });
    socket.write('MONITOR\r\n');
  });
  return socket;
}

/**
 * Runs a step of `ms` and counts the commands the waiting runtime's connections send from the
 * moment `start()` returned until `settled()` resolved (MONITOR, attributed by connection name).
 */
async function commandsWhileSettling(ms: number): Promise<{ count: number; waited: number }> {
  worker ??= rt.createWorker({ concurrency: 1 });
  await worker.ready();
  const name = `waiter-${randomUUID().slice(0, 6)}`;
  const client = new Redis(redisUrl(), { connectionName: name });
  const waiter = createRuntime({ redis: client, prefix });
  const seen: string[] = [];
  const marks = new Map<string, number>();
  const monitor = await rawMonitor((source, command, arg) => {
    if (command === 'echo' && arg?.startsWith('mark-') === true) marks.set(arg, seen.length);
    else seen.push(`${source} ${command}`);
  });
  // MONITOR lines arrive after the replies: the window is bounded by two ECHO marks (sent from
  // another connection once the awaited calls returned), not by what has arrived so far.
  const marker = new Redis(redisUrl());
  const mark = async (label: string): Promise<number> => {
    const tag = `mark-${label}-${randomUUID().slice(0, 6)}`;
    await marker.echo(tag);
    await vi.waitFor(() => expect(marks.has(tag)).toBe(true), { timeout: 5000, interval: 5 });
    return marks.get(tag)!;
  };
  try {
    const run = await waiter.start(sleepy, { ms });
    const t0 = performance.now();
    const from = await mark('from');
    expect((await run.settled()).status).toBe('succeeded');
    const waited = performance.now() - t0;
    const to = await mark('to');
    // The waiter's connections (the watcher's is created on first use): all named `name`.
    const list = (await client.client('LIST')) as string;
    const mine = new Set(
      list
        .split('\n')
        .filter((l) => l.includes(` name=${name} `))
        .map((l) => /addr=(\S+)/.exec(l)?.[1]),
    );
    const count = seen.slice(from, to).filter((l) => mine.has(l.split(' ')[0])).length;
    return { count, waited };
  } finally {
    monitor.destroy();
    marker.disconnect();
    await waiter.close();
    client.disconnect();
  }
}

describe('waiting for a run', () => {
  it('settled() sends a bounded number of commands, the same for a 1 s and a 2 s run (no polling)', async () => {
    const short = await commandsWhileSettling(1000);
    const long = await commandsWhileSettling(2000);
    expect(short.waited).toBeGreaterThanOrEqual(950);
    expect(long.waited).toBeGreaterThanOrEqual(1950);
    // The reads of two reports (snapshot, outputs, meta, started, progress, replays), the
    // watcher's connection set-up, one read per wake: about 18. The worker's commits may wake
    // the read once or one by one (up to 2 more reads). Polling from 10 ms up to 200 ms sends
    // 3 commands per poll: 25 more for 1 s, 40 for 2 s.
    expect(short.count).toBeLessThanOrEqual(22);
    expect(long.count).toBeLessThanOrEqual(22);
    expect(Math.abs(long.count - short.count)).toBeLessThanOrEqual(3);
  }, 30_000);

  it('settled({ timeoutMs }) returns the report as it stands when the run takes longer', async () => {
    const run = await rt.start(sleepy, { ms: 1000 });
    const t0 = performance.now();
    const report = await run.settled({ timeoutMs: 150 });
    expect(report.status).toBe('running');
    expect(performance.now() - t0).toBeGreaterThanOrEqual(140);
    expect(performance.now() - t0).toBeLessThan(1000);
  });

  it('settled() waits longer than redisTimeoutMs for a run that takes longer, and resolves when it ends', async () => {
    // The waiting read blocks on purpose: the runtime's command timeout must not end it.
    const waiter = createRuntime({ redis: redisUrl(), prefix, redisTimeoutMs: 300 });
    try {
      worker = rt.createWorker({ concurrency: 1 });
      await worker.ready();
      const run = await waiter.start(sleepy, { ms: 1500 });
      const t0 = performance.now();
      const report = await run.settled({ timeoutMs: 20_000 });
      expect(report.status).toBe('succeeded');
      expect(performance.now() - t0).toBeLessThan(5000);
    } finally {
      await waiter.close();
    }
  });

  it('settled() rejects, naming the run, when its runtime is closed meanwhile', async () => {
    const other = createRuntime({ redis: redisUrl(), prefix });
    const run = await other.start(sleepy, { ms: 10 });
    const waiting = run.settled().catch((e: unknown) => e);
    await new Promise((resolve) => setTimeout(resolve, 50));
    await other.close();
    const error = await waiting;
    expect(error).toBeInstanceOf(Error);
    expect((error as Error).message).toContain(`while waiting for run "${run.runId}"`);
  });

  it('many settled() at once on one runtime each resolve when their own run ends', async () => {
    worker = rt.createWorker({ concurrency: 8 });
    await worker.ready();
    const runs = await Promise.all([300, 100, 200].map((ms) => rt.start(sleepy, { ms })));
    const order: string[] = [];
    await Promise.all(
      runs.map(async (run) => {
        await run.settled();
        order.push(run.runId);
      }),
    );
    expect(order).toEqual([runs[1]!.runId, runs[2]!.runId, runs[0]!.runId]);
  });
});

describe('progress and idle work', () => {
  it('ctx.progress reaches a subscriber and status (latest only), never the event stream', async () => {
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    rt.operator('count', async ({ progress }) => {
      await released;
      progress({ done: 1, of: 2 });
      progress({ done: 2, of: 2 });
      return 'counted';
    });
    const run = await rt.start({
      name: 'counting',
      steps: [{ id: 'c', kind: 'operator', operator: 'count' }],
    });
    const heard: unknown[] = [];
    const unsubscribe = await runtimeCore(rt).queues.subscribeProgress(run.runId, (m) =>
      heard.push((JSON.parse(m) as { info: unknown }).info),
    );
    worker = rt.createWorker({ concurrency: 1 });
    await worker.ready();
    release();
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await new Promise((resolve) => setTimeout(resolve, 50));
    unsubscribe();
    expect(heard).toEqual([
      { done: 1, of: 2 },
      { done: 2, of: 2 },
    ]);
    const report = await rt.status(run.runId);
    expect(Object.keys(report.progress)).toEqual(['c']);
    expect(report.progress['c']).toMatchObject({ attempt: 1, info: { done: 2, of: 2 } });
    expect(report.progress['c']!.at).toBeGreaterThan(0);
    const types: string[] = [];
    for await (const e of rt.events(run.runId)) types.push(e.type);
    expect(types.filter((t) => t.includes('progress'))).toEqual([]);
  });

  it('progress that is not small plain JSON fails the step with the fix, and records nothing', async () => {
    rt.operator('chatty', ({ progress }) => {
      progress({ log: 'x'.repeat(9000) });
      return null;
    });
    worker = rt.createWorker({ concurrency: 1 });
    await worker.ready();
    const run = await rt.start({
      name: 'chatty',
      steps: [{ id: 'c', kind: 'operator', operator: 'chatty', retry: { maxAttempts: 1 } }],
    });
    const report = await run.settled({ timeoutMs: 10_000 });
    expect(report.status).toBe('failed');
    expect(report.steps[0]!.error?.message).toMatch(/info: is \d+ bytes of JSON, more than 8192/);
    expect(report.progress).toEqual({});
  });

  it('due work that no worker takes for 5 s is reported as idle', async () => {
    const run = await rt.start(sleepy, { ms: 10 });
    expect((await rt.status(run.runId)).idle).toBeNull();
    skew = 4000;
    expect((await rt.status(run.runId)).idle).toBeNull();
    skew = 6000;
    expect((await rt.status(run.runId)).idle).toMatchObject({ stepId: 's' });
    expect((await rt.status(run.runId)).idle!.idleMs).toBeGreaterThanOrEqual(6000);
    // Once a worker takes it, nothing is idle.
    worker = rt.createWorker({ concurrency: 1 });
    await worker.ready();
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.idle).toBeNull();
  });
});
