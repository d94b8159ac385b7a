/**
 * A follower of a run (`outcomes({ follow: true })`) reads what is new, not the stream again: the
 * stored events once, then each batch the watcher's read hands over; and it reads each step's
 * output stored apart once, not the outputs the run's summary names at its end. Counted on the
 * follower's runtime's connection (the watcher's reads are on a connection of their own).
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createRuntime, type PlanInput, type Runtime } from '../../src/index.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';

const STEPS = 20;
const OUTPUT_BYTES = 20_000;

/** The commands `redis` sends, each with its arguments. */
function record(redis: Redis): { name: string; args: unknown[] }[] {
  const sent: { name: string; args: unknown[] }[] = [];
  const send = redis.sendCommand.bind(redis);
  redis.sendCommand = (command: { name: string; args: unknown[] }, ...rest: unknown[]) => {
    sent.push({ name: command.name, args: command.args });
    return (send as (...args: unknown[]) => unknown)(command, ...rest);
  };
  return sent;
}

let prefix: string;
let runner: Runtime;
let follower: Runtime;

beforeEach(() => {
  prefix = testPrefix();
});

afterEach(async () => {
  await runner.close();
  await follower.close();
  await deleteRuntimeKeys(prefix);
});

describe('a follower of a run', () => {
  it('reads the stream once, then only what is new, and each stored output once', async () => {
    runner = createRuntime({ redis: redisUrl(), prefix }).operator('big', ({ stepId }) => ({
      text: stepId.padEnd(OUTPUT_BYTES, '.'),
    }));
    follower = createRuntime({ redis: redisUrl(), prefix });
    const plan: PlanInput = {
      name: `line-${randomUUID().slice(0, 6)}`,
      steps: Array.from({ length: STEPS }, (_, i) => ({
        id: `s${i}`,
        kind: 'operator' as const,
        operator: 'big',
        dependsOn: i === 0 ? [] : [`s${i - 1}`],
      })),
    };
    const worker = runner.createWorker({ concurrency: 1 });
    try {
      await worker.ready();
      const sent = record(runtimeCore(follower).redis);
      const run = await follower.start(plan, null);
      const outputs: string[] = [];
      for await (const o of run.outcomes({ follow: true })) {
        if (o.type === 'success') outputs.push((o.output as { text: string }).text);
      }
      expect(outputs).toEqual(plan.steps.map((s) => s.id.padEnd(OUTPUT_BYTES, '.')));
      const keys = runtimeCore(follower).stores.keys;
      const ranges = sent.filter((c) => c.name === 'xrange');
      expect(ranges).toHaveLength(1);
      const outputReads = sent.filter(
        (c) => c.name === 'hmget' && c.args[0] === keys.outputs(run.runId),
      );
      // Each step's output once (a batch's outputs in one read), none for the run's summary.
      expect(outputReads.reduce((n, c) => n + c.args.length - 1, 0)).toBe(STEPS);
    } finally {
      await worker.close();
    }
  }, 60_000);
});
