/**
 * A granular agent step with a ledgered tool, on a Redis Cluster: each turn commits, each tool
 * effect happens once, and every key of the run (journal, history, ledger, blobs…) is in its slot.
 */
import { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createRuntime, defineTool, type Runtime } from '../../src/index.js';
import type { Logger } from '../../src/logging.js';
import { startRedisCluster, type TestRedisCluster } from '../helpers/redis-cluster.js';
import { testPrefix } from '../helpers/redis.js';
import { granularPlan, scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';

let cluster: TestRedisCluster;
let client: Cluster;

beforeAll(async () => {
  cluster = await startRedisCluster();
  client = new Cluster(cluster.seeds);
}, 60_000);

afterAll(async () => {
  client?.disconnect();
  await cluster?.stop();
});

describe('a granular agent step on a Redis Cluster', () => {
  const model = useScriptedModel();
  const warnings: string[] = [];
  const logger: Logger = {
    debug: () => {},
    info: () => {},
    warn: (fields, message) => warnings.push(`${message} ${JSON.stringify(fields)}`),
    error: (fields, message) => warnings.push(`${message} ${JSON.stringify(fields)}`),
  };

  it(
    'completes with each tool effect once, its keys in one slot',
    { timeout: 60_000 },
    async () => {
      const effects: { tool: string; runId: string; key: string }[] = [];
      const search = defineTool({
        name: 'search',
        input: z.object({ q: z.string() }),
        class: 'read_only',
        run: ({ q }, ctx) => {
          effects.push({ tool: 'search', runId: ctx.runId, key: ctx.idempotencyKey });
          return { hits: [`${q} 1`, `${q} 2`] };
        },
      });
      const transfer = defineTool({
        name: 'transfer',
        input: z.object({ cents: z.number().int(), idempotency_key: z.string() }),
        class: 'external',
        requiresIdempotencyKey: true,
        run: ({ cents }, ctx) => {
          effects.push({ tool: 'transfer', runId: ctx.runId, key: ctx.idempotencyKey });
          return { moved: cents };
        },
      });
      const prefix = testPrefix();
      const runtime: Runtime = createRuntime({ redis: cluster.url, prefix, logger }).agent(
        scriptedAgent(model, {
          name: 'researcher',
          systemPrompt: 'Research, pay, answer.',
          tools: [search, transfer],
        }),
      );
      const worker = runtime.createWorker({ concurrency: 2 });
      await worker.ready();
      const runIds: string[] = [];
      try {
        for (let i = 0; i < 3; i++) {
          model.enqueue(
            { toolCalls: [{ id: `s${i}`, name: 'search', arguments: { q: `topic ${i}` } }] },
            { toolCalls: [{ id: `t${i}`, name: 'transfer', arguments: { cents: 100 + i } }] },
            { text: `done ${i}`, usage: { prompt_tokens: 30, completion_tokens: 7 } },
          );
          const run = await runtime.start(granularPlan('cluster-agent'), `question ${i}`);
          runIds.push(run.runId);
          const done = await run.settled({ timeoutMs: 20_000 });
          expect(done.status, JSON.stringify(done.steps)).toBe('succeeded');
          expect(done.summary.produced['research']).toMatchObject({
            answer: `done ${i}`,
            turns: 3,
            toolCalls: 2,
          });
          const ledger = await runtime.ledger(run.runId);
          expect(ledger.map((e) => [e.tool, e.state])).toEqual([
            ['search@1', 'SUCCEEDED'],
            ['transfer@1', 'SUCCEEDED'],
          ]);
        }
        expect(model.requestCount).toBe(9);
        // Each effect once per run.
        for (const runId of runIds) {
          expect(effects.filter((e) => e.runId === runId).map((e) => e.tool)).toEqual([
            'search',
            'transfer',
          ]);
        }
        // Every key of each run, on whatever master holds it, in the slot of its hash tag.
        for (const runId of runIds) {
          const slots = new Set<number>();
          let count = 0;
          for (const node of client.nodes('master')) {
            const keys = await node.keys(`${prefix}:{${runId}}:*`);
            count += keys.length;
            for (const key of keys) slots.add(Number(await client.cluster('KEYSLOT', key)));
          }
          expect(count).toBeGreaterThan(5);
          expect(slots.size).toBe(1);
        }
        expect(warnings.filter((w) => /CROSSSLOT|same slot|slots allocation/i.test(w))).toEqual([]);
      } finally {
        await worker.close();
        await runtime.close();
      }
    },
  );
});
