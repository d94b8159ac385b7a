/**
 * What a run's event stream records besides step and run changes: each tool call (executed, or its
 * receipt replayed after a worker died between the effect and the commit), each model call, the
 * worker that ran each unit, and a unit taken over after its worker was killed. Worker children
 * (test/fixtures/driver-child.ts) are killed with SIGKILL at a debug point.
 */
import type { ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createRuntime, defineAgent, defineTool, type Runtime } from '../../src/index.js';
import type { StoredRunEvent } from '../../src/persistence/snapshot-store.js';
import { startScriptedModelServer } from '../../src/testing/index.js';
import { killChildren, spawnReadyChild } from '../helpers/ready-child.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

const QUEUE = 'ev';

let prefix: string;
let dir: string;
let rt: Runtime;
const children = new Set<ChildProcess>();

beforeEach(async () => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  dir = await mkdtemp(join(tmpdir(), 'flujo-events-'));
  rt = createRuntime({ redis: redisUrl(), prefix, queueName: QUEUE });
});
afterEach(async () => {
  killChildren(children);
  children.clear();
  await rt.close();
  await deleteRuntimeKeys(prefix);
  await rm(dir, { recursive: true, force: true });
});

/** A worker child; resolves with its pid once it is ready, and its exit. */
const spawnWorker = (killAt = '') =>
  spawnReadyChild(
    'driver-child.ts',
    {
      REDIS_URL: redisUrl(),
      FLUJO_PREFIX: prefix,
      QUEUE_NAME: QUEUE,
      EFFECT_FILE: join(dir, 'effects'),
      RECOVERY_MS: '800',
      FLUJO_KILL_AT: killAt,
    },
    children,
  );

const of = (events: readonly StoredRunEvent[], type: string) =>
  events.filter((e) => e.type === type).map((e) => e.data as Record<string, unknown>);

async function eventsOf(runId: string): Promise<StoredRunEvent[]> {
  const out: StoredRunEvent[] = [];
  for await (const e of rt.events(runId)) out.push(e);
  return out;
}

const notingPlan = {
  name: 'noting',
  steps: [{ id: 'n', kind: 'operator' as const, operator: 'noting' }],
};

describe('the event stream records what each unit did', () => {
  it('one tool.called per call, executed, between the attempt start and its result; the worker that ran it', async () => {
    const worker = await spawnWorker();
    const run = await rt.start(notingPlan);
    expect((await run.settled({ timeoutMs: 15_000 })).status).toBe('succeeded');
    const events = await eventsOf(run.runId);
    const calls = of(events, 'tool.called');
    expect(calls.map((c) => [c['tool'], c['class'], c['replayed'], c['outcome']])).toEqual([
      ['note@1', 'external', false, 'succeeded'],
      ['note@1', 'external', false, 'succeeded'],
    ]);
    expect(new Set(calls.map((c) => c['callId'])).size).toBe(2);
    expect(calls.every((c) => typeof c['durationMs'] === 'number' && c['durationMs'] >= 0)).toBe(
      true,
    );
    const types = events.map((e) => e.type);
    const started = types.indexOf('step.started');
    const succeeded = types.indexOf('step.succeeded');
    expect(types.indexOf('tool.called')).toBeGreaterThan(started);
    expect(types.lastIndexOf('tool.called')).toBeLessThan(succeeded);
    const ran = of(events, 'step.ran');
    expect(ran).toHaveLength(1);
    expect(ran[0]!['worker']).toMatchObject({ pid: worker.pid });
    expect(of(events, 'step.takenOver')).toHaveLength(0);
  });

  it('a worker killed between the effect and the commit: the next one replays both receipts, and the take-over is an event', async () => {
    // Killed right after the second call's receipt is recorded, before the step's commit.
    const victim = await spawnWorker('after-receipt:note@2');
    const run = await rt.start(notingPlan);
    await victim.exited;
    const survivor = await spawnWorker();
    expect((await run.settled({ timeoutMs: 20_000 })).status).toBe('succeeded');
    const events = await eventsOf(run.runId);
    // Each effect happened once, in the victim.
    const notes = readFileSync(join(dir, 'effects.note'), 'utf8').trim().split('\n');
    expect(notes.map((l) => l.split(' ').slice(1, 4).join(' '))).toEqual([
      `note a ${victim.pid}`,
      `note b ${victim.pid}`,
    ]);
    // Only the committed execution's calls are recorded: both replayed from their receipts.
    expect(of(events, 'tool.called').map((c) => [c['replayed'], c['outcome']])).toEqual([
      [true, 'succeeded'],
      [true, 'succeeded'],
    ]);
    const taken = of(events, 'step.takenOver');
    expect(taken).toHaveLength(1);
    expect(taken[0]).toMatchObject({
      stepId: 'n',
      attempt: 1,
      previousWorker: { pid: victim.pid },
      worker: { pid: survivor.pid },
    });
    // The re-run is attempt 1 still, and its run is recorded with the survivor.
    expect(of(events, 'step.ran').map((r) => (r['worker'] as { pid: number }).pid)).toEqual([
      survivor.pid,
    ]);
    expect(existsSync(join(dir, 'effects'))).toBe(true);
  }, 40_000);

  it('one model.called per model call, with its reservation, tokens, cost and duration', async () => {
    const model = await startScriptedModelServer();
    const search = defineTool({
      name: 'search',
      input: z.object({ q: z.string() }),
      class: 'read_only',
      run: ({ q }) => ({ q, hits: 3 }),
    });
    const agent = defineAgent({
      name: 'asker',
      model: 'gpt-4o-mini',
      provider: { baseURL: model.url, apiKey: 'test-key' },
      systemPrompt: 'Answer.',
      tools: [search],
      settings: { maxTokens: 100 },
    });
    const local = createRuntime({
      redis: redisUrl(),
      prefix,
      pricing: { models: { 'gpt-4o-mini': { inputPerMillion: 1, outputPerMillion: 2 } } },
    }).agent(agent);
    const worker = local.createWorker({ concurrency: 1 });
    try {
      await worker.ready();
      model.enqueue(
        {
          toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'x' } }],
          usage: { prompt_tokens: 100, completion_tokens: 10 },
        },
        { text: 'Done.', usage: { prompt_tokens: 150, completion_tokens: 5 } },
      );
      const run = await local.start(
        { name: 'ask', steps: [{ id: 'a', kind: 'agent', agent: 'asker' }] },
        'Go.',
      );
      expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
      const events: StoredRunEvent[] = [];
      for await (const e of local.events(run.runId)) events.push(e);
      const calls = of(events, 'model.called');
      expect(model.requestCount).toBe(2);
      expect(
        calls.map((c) => [c['turn'], c['inputTokens'], c['outputTokens'], c['charged']]),
      ).toEqual([
        [0, 100, 10, 'usage'],
        [1, 150, 5, 'usage'],
      ]);
      expect(calls[0]!['costUsd']).toBeCloseTo((100 * 1 + 10 * 2) / 1e6, 9);
      const reservations = (await local.usage(run.runId)).reservations.map((r) => r.id);
      expect(calls.map((c) => c['reservationId'])).toEqual(reservations);
      expect(of(events, 'tool.called').map((c) => [c['tool'], c['turn'], c['replayed']])).toEqual([
        ['search@1', 0, false],
      ]);
    } finally {
      await worker.close();
      await local.close();
      await model.close();
    }
  });
});
