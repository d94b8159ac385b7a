/**
 * The `flujo` binary (bin/flujo.js → dist, rebuilt when src/ changes) with signals: a run that
 * waits says what for (run, status, list), `flujo signal` checks the job module's declared signals
 * and refuses bad input with exit 2 writing nothing, a send again with its id is a no-op, a worker
 * takes the signal up, and `flujo run --request-key --signal` starts or signals.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime } from '../../src/runtime.js';
import { runFlujo, startFlujo } from '../helpers/cli.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const JOB = 'test/fixtures/jobs/signals.ts';

let redis: Redis;
let prefix: string;
const flujo = (args: string[]) => runFlujo(args, { prefix, user: 'tester' });

/** Every key of the prefix with its content (streams included). */
async function dump(): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 500);
    cursor = next;
    for (const key of keys) {
      const type = await redis.type(key);
      if (type === 'hash') out[key] = await redis.hgetall(key);
      else if (type === 'stream') out[key] = await redis.xrange(key, '-', '+');
      else if (type === 'set') out[key] = (await redis.smembers(key)).sort();
      else if (type === 'list') out[key] = await redis.lrange(key, 0, -1);
      else out[key] = await redis.get(key);
    }
  } while (cursor !== '0');
  return out;
}

beforeAll(() => {
  redis = connect();
  prefix = testPrefix();
});
afterAll(async () => {
  await deletePrefix(redis, `${prefix}:`);
  await deletePrefix(redis, `{${prefix}:q}`);
  await deletePrefix(redis, `{${prefix}:runs}`);
  redis.disconnect();
});

describe('flujo signal', { timeout: 90_000 }, () => {
  it('a waiting run says what it waits for; bad signals are refused with exit 2, writing nothing', async () => {
    const run = await flujo(['run', JOB]);
    expect(run.code, run.err).toBe(3);
    const runId = /^run (\S+) /.exec(run.out)![1]!;
    const hint = `waiting for signal "approve-order": approval (0 queued; send one with npx flujo signal ${runId} approve-order --data JSON)`;
    expect(run.out).toContain(hint);
    const status = await flujo(['status', runId]);
    expect(status.code).toBe(3);
    expect(status.out).toContain(hint);
    const list = await flujo(['list', '--status', 'waiting']);
    expect(list.out).toContain('approval (waits for signal "approve-order")');

    const before = await dump();
    const refusals: [string[], string][] = [
      [
        ['signal', runId, 'approve-ordr', '--data', '{"by":"ana"}'],
        'declares no signal "approve-ordr"; it takes: approve-order',
      ],
      [['signal', runId, 'approve-order', '--data', '{"by":1}'], 'payload.by'],
      [['signal', runId, 'approve-order', '--data', 'nope'], '--data is not JSON'],
      [['signal', runId, 'approve order'], 'name'],
      [['signal', 'no-such-run', 'approve-order'], 'Run "no-such-run" not found'],
    ];
    for (const [args, message] of refusals) {
      const r = await flujo(args);
      expect(r.code, `${args.join(' ')}: ${r.err}`).toBe(2);
      expect(r.err).toContain(message);
    }
    expect(await dump()).toEqual(before);

    const sent = await flujo([
      'signal',
      runId,
      'approve-order',
      '--data',
      '{"by":"ana"}',
      '--id',
      'a1',
      '--json',
    ]);
    expect(sent.code, sent.err).toBe(0);
    expect(JSON.parse(sent.out)).toEqual({
      runId,
      name: 'approve-order',
      index: 0,
      seq: 1,
      id: 'a1',
      duplicate: false,
    });
    const again = await flujo([
      'signal',
      runId,
      'approve-order',
      '--data',
      '{"by":"ana"}',
      '--id',
      'a1',
    ]);
    expect(again.code).toBe(0);
    expect(again.out).toContain('(sent before with this id: nothing more delivered)');
    const other = await flujo([
      'signal',
      runId,
      'approve-order',
      '--data',
      '{"by":"bo"}',
      '--id',
      'a1',
    ]);
    expect(other.code).toBe(2);
    expect(other.err).toContain('Signal id "a1" was already sent');

    // A worker takes the signal up.
    const worker = startFlujo(['worker', JOB], { prefix });
    const rt = createRuntime({ redis: redisUrl(), prefix });
    try {
      for (let i = 0; i < 300; i++) {
        if ((await rt.status(runId)).status === 'succeeded') break;
        await new Promise((r) => setTimeout(r, 100));
      }
      const report = await rt.status(runId);
      expect(report.status).toBe('succeeded');
      expect(report.steps.find((s) => s.stepId === 'ship')!.output).toEqual({
        shipped: true,
        approval: { by: 'ana' },
      });
    } finally {
      worker.child.kill('SIGTERM');
      await worker.done;
      await rt.close();
    }
    const events = await flujo(['events', runId]);
    expect(events.out).toMatch(/wait\.started +approval attempt 1: signal "approve-order"/);
    expect(events.out).toMatch(
      /signal\.received +"approve-order" #1 \(seq 1, id a1\): \{"by":"ana"\}/,
    );
    expect(events.out).toMatch(/signal\.taken +approval attempt 1: "approve-order" #1 \(seq 1\)/);
    const ended = await flujo(['signal', runId, 'approve-order', '--data', '{"by":"ana"}']);
    expect(ended.code).toBe(2);
    expect(ended.err).toContain('is succeeded: it takes no more signals');
  });

  it('flujo resume of a waiting run: only reported with no signal queued, driven on with one', async () => {
    const run = await flujo(['run', JOB]);
    expect(run.code, run.err).toBe(3);
    const runId = /^run (\S+) /.exec(run.out)![1]!;
    const idle = await flujo(['resume', runId, JOB]);
    expect(idle.code, idle.err).toBe(3);
    expect(idle.out).toContain('waiting for signal "approve-order": approval (0 queued;');
    const sent = await flujo(['signal', runId, 'approve-order', '--data', '{"by":"cy"}']);
    expect(sent.code, sent.err).toBe(0);
    // No worker runs: the resume takes the queued signal and ends the run.
    const resumed = await flujo(['resume', runId, JOB]);
    expect(resumed.code, resumed.err).toBe(0);
    expect(resumed.out).toContain(`run ${runId} succeeded`);
    const rt = createRuntime({ redis: redisUrl(), prefix });
    try {
      const report = await rt.status(runId);
      expect(report.steps.find((s) => s.stepId === 'ship')!.output).toEqual({
        shipped: true,
        approval: { by: 'cy' },
      });
    } finally {
      await rt.close();
    }
  });

  it('flujo run --request-key --signal: starts the run, which takes the signal', async () => {
    const args = [
      'run',
      JOB,
      '--request-key',
      'order-7',
      '--signal',
      'approve-order',
      '--data',
      '{"by":"ana"}',
    ];
    const first = await flujo(args);
    expect(first.code, first.err).toBe(0);
    expect(first.out).toContain('signal "approve-order" #1 of its name sent to it');
    const refused = await flujo(['run', JOB, '--signal', 'approve-order']);
    expect(refused.code).toBe(2);
    expect(refused.err).toContain('--signal needs --request-key');
  });

  it('a job module whose wait step waits for a signal it does not declare is refused', async () => {
    const r = await flujo(['validate', 'test/fixtures/jobs/signals-undeclared.ts']);
    expect(r.code).toBe(2);
    expect(r.err).toContain(
      'step "approval" waits for signal "aprove-order", which signals does not declare (it declares: approve-order)',
    );
  });
});
