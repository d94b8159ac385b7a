/**
 * What a commit writes: the steps that moved, the new events and a new output, never the whole
 * run. A 200-step line whose steps each return 20 KB runs through the runtime while every commit
 * script call is measured on its way to Redis; the last commits must be no larger than the first,
 * and every reader (dependents, outcomes, events, status) must still see each full output.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, type FlujoWorker, type PlanInput, type Runtime } from '../../src/index.js';
import { connect, deleteRuntimeKeys } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';

const STEPS = 200;
const OUTPUT_BYTES = 20_000;

interface Commit {
  /** Bytes of every argument of the script call. */
  total: number;
  /** Bytes of its largest argument (a step's output, when the commit carries one). */
  largest: number;
}

describe('commit cost independent of run size', () => {
  let redis: Redis;
  let rt: Runtime;
  let worker: FlujoWorker;
  const prefix = `t-${randomUUID().slice(0, 8)}`;
  const commits: Commit[] = [];
  let depsSeen = 0;

  beforeAll(async () => {
    redis = connect();
    // Observes each script call the store sends (ioredis sends a defined command as EVALSHA).
    const send = redis.sendCommand.bind(redis);
    redis.sendCommand = (command: { name: string; args: unknown[] }, ...rest: unknown[]) => {
      if (command.name === 'evalsha') {
        const args = command.args.map((a) =>
          Buffer.isBuffer(a) ? a.length : Buffer.byteLength(String(a)),
        );
        const keys = command.args.slice(2, 2 + Number(command.args[1])).map(String);
        // The commit script: snap, events, outputs, then lists.
        if (keys[0]?.startsWith(prefix) && keys[2]?.endsWith(':outputs')) {
          commits.push({ total: args.reduce((n, b) => n + b, 0), largest: Math.max(...args) });
        }
      }
      return (send as (...a: unknown[]) => unknown)(command, ...rest);
    };
    rt = createRuntime({ redis, prefix, queueName: 'sizes' });
    rt.operator('produce', ({ deps, stepId }) => {
      const i = Number(stepId.slice(1));
      if (i > 0) {
        const dep = deps[`s${i - 1}`] as { i: number; text: string } | undefined;
        if (dep?.i === i - 1 && dep.text.length === OUTPUT_BYTES) depsSeen++;
      }
      return { i, text: String(i % 10).repeat(OUTPUT_BYTES) };
    });
    worker = rt.createWorker({ concurrency: 1 });
    await worker.ready();
  });
  afterAll(async () => {
    await worker.close();
    await rt.close();
    redis.disconnect();
    await deleteRuntimeKeys(prefix);
  });

  it('a 200-step run of 20 KB outputs: every commit is small, and every reader sees each output', async () => {
    const plan: PlanInput = {
      name: 'line',
      steps: Array.from({ length: STEPS }, (_, i) => ({
        id: `s${i}`,
        kind: 'operator' as const,
        operator: 'produce',
        dependsOn: i === 0 ? [] : [`s${i - 1}`],
      })),
    };
    const run = await rt.start(plan);
    const done = await run.settled({ timeoutMs: 120_000 });
    expect(done.status).toBe('succeeded');
    // Every dependent was handed its dependency's full output.
    expect(depsSeen).toBe(STEPS - 1);

    // One commit per step (its start and its result are committed together).
    expect(commits.length).toBeGreaterThanOrEqual(STEPS);
    // Without the output it carries, a commit is under 4 KB, however far the run has come; with
    // it, the output is its only large part, written once.
    for (const c of commits) {
      const rest = c.largest > OUTPUT_BYTES ? c.total - c.largest : c.total;
      expect(rest).toBeLessThan(4096);
      expect(c.total).toBeLessThan(OUTPUT_BYTES + 4096);
    }
    const carrying = commits.filter((c) => c.largest > OUTPUT_BYTES);
    expect(carrying.length).toBe(STEPS);
    const avg = (xs: Commit[]) => xs.reduce((n, c) => n + c.total, 0) / xs.length;
    expect(avg(commits.slice(-20))).toBeLessThan(avg(commits.slice(0, 20)) * 1.1);

    // The snapshot is many small fields (but the step order, written once when the run was
    // created); the outputs are stored once, beside it.
    const snapKey = runtimeCore(rt).stores.keys.snap(run.runId);
    const { plan: order, ...fields } = await redis.hgetall(snapKey);
    expect(order).toContain('"s199"');
    expect(Object.keys(fields).length).toBeGreaterThan(STEPS);
    for (const value of Object.values(fields)) expect(value.length).toBeLessThan(1024);
    expect(await redis.hlen(runtimeCore(rt).stores.keys.outputs(run.runId))).toBe(STEPS);
    // The event stream names large outputs instead of copying them.
    const entries = await redis.xrange(runtimeCore(rt).stores.keys.events(run.runId), '-', '+');
    for (const [, flat] of entries) {
      expect(flat[flat.indexOf('d') + 1]!.length).toBeLessThan(4096);
    }

    // Readers see the full outputs: outcomes, events (the run summary too), status.
    const successes: unknown[] = [];
    for await (const o of run.outcomes()) if (o.type === 'success') successes.push(o.output);
    expect(successes).toHaveLength(STEPS);
    successes.forEach((output, i) =>
      expect(output).toEqual({ i, text: String(i % 10).repeat(OUTPUT_BYTES) }),
    );
    let produced: Record<string, { text: string }> | undefined;
    for await (const e of rt.events(run.runId)) {
      if (e.type === 'run.finished') produced = e.data['produced'] as typeof produced;
    }
    expect(Object.keys(produced ?? {})).toHaveLength(STEPS);
    expect(produced?.['s199']?.text).toHaveLength(OUTPUT_BYTES);
    expect(Object.keys(done.summary.produced)).toHaveLength(STEPS);
    expect(done.steps[150]?.output).toEqual({ i: 150, text: '0'.repeat(OUTPUT_BYTES) });
  }, 180_000);

  it('a run continued by another process: loads skip the outputs, the dependent reads its own', async () => {
    const other = createRuntime({ redis: connect(), prefix, queueName: 'sizes-gate' });
    const seen: unknown[] = [];
    other.operator('produce', ({ stepId }) => ({ stepId, text: 'y'.repeat(OUTPUT_BYTES) }));
    other.operator('use', ({ deps }) => {
      seen.push(deps['a']);
      return { used: true };
    });
    const plan: PlanInput = {
      name: 'gated',
      steps: [
        { id: 'a', kind: 'operator', operator: 'produce' },
        { id: 'b', kind: 'operator', operator: 'use', dependsOn: ['a'], gate: { reason: 'ok?' } },
      ],
    };
    let w = other.createWorker({ concurrency: 1 });
    await w.ready();
    const run = await other.start(plan);
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('waiting');
    await w.close();
    await other.close();
    runtimeCore(other).redis.disconnect();

    // A fresh runtime: nothing of the run in memory.
    const fresh = createRuntime({ redis: connect(), prefix, queueName: 'sizes-gate' });
    fresh.operator('use', ({ deps }) => {
      seen.push(deps['a']);
      return { used: true };
    });
    try {
      const loaded = await runtimeCore(fresh).host.load(run.runId);
      expect(loaded.snapshot.children['a']?.snapshot.context.output).toBeNull();
      // Status still shows what each step produced.
      expect((await fresh.status(run.runId)).steps[0]?.output).toMatchObject({ stepId: 'a' });
      w = fresh.createWorker({ concurrency: 1 });
      await w.ready();
      await fresh.approve(run.runId, 'b', { by: 'ana' });
      expect(
        (await fresh.attach(run.runId).then((h) => h.settled({ timeoutMs: 10_000 }))).status,
      ).toBe('succeeded');
      expect(seen).toEqual([{ stepId: 'a', text: 'y'.repeat(OUTPUT_BYTES) }]);
      let produced: Record<string, unknown> | undefined;
      for await (const e of fresh.events(run.runId)) {
        if (e.type === 'run.finished') produced = e.data['produced'] as typeof produced;
      }
      expect(produced).toEqual({
        a: { stepId: 'a', text: 'y'.repeat(OUTPUT_BYTES) },
        b: { used: true },
      });
    } finally {
      await w.close();
      await fresh.close();
      runtimeCore(fresh).redis.disconnect();
    }
  });
});
