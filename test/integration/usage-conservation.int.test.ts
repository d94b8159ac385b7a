/**
 * Usage conservation under crashes: 50 granular runs, driven by worker children that
 * are killed with SIGKILL again and again at points drawn from a seeded generator: at each named
 * point of a turn, or while a model request is in flight. At the end no reservation is open, and
 * the tokens spent equal, to the token, the usage the scripted server reported for the replies it
 * sent plus the baseline input estimate of each request it never answered.
 *
 * Each doomed child works with concurrency 1, so when it dies exactly one unit of work is in
 * flight, stopped at the chosen point; every other run sits between units, committed.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/logging.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime, runtimeCore } from '../../src/runtime.js';
import {
  startScriptedModelServer,
  type RecordedRequest,
  type ScriptedModelServer,
  type ScriptedReply,
} from '../../src/testing/index.js';
import { spawnAgentChild, type AgentChild } from '../helpers/agent-child.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const RUNS = 50;
const KILLS = 14;

const plan: PlanInput = {
  name: 'conservation',
  steps: [
    {
      id: 'research',
      kind: 'agent',
      agent: 'researcher',
      mode: 'granular',
      retry: { maxAttempts: 10, initialDelayMs: 20, maxDelayMs: 100, jitter: 0 },
    },
  ],
};

const turnOf = (r: RecordedRequest): number =>
  r.messages.filter((m) => m.role === 'assistant').length;

/** Turn 0 asks for two tools at once, turn 1 for one, turn 2 answers; fixed usage per turn. */
function replyFor(turn: number): ScriptedReply {
  const usage = { prompt_tokens: 100 + 50 * turn, completion_tokens: 10 + turn };
  if (turn === 0) {
    return {
      toolCalls: [
        { id: 'a', name: 'search', arguments: { q: 'alpha' } },
        { id: 'b', name: 'search', arguments: { q: 'beta' } },
      ],
      usage,
    };
  }
  if (turn === 1) {
    return { toolCalls: [{ id: 'n', name: 'save_note', arguments: { text: 'noted' } }], usage };
  }
  return { text: 'Both found, noted.', usage };
}

/** A small seeded generator (mulberry32), so the kill points are the same on every run. */
function prng(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const POINTS = [
  'after-model-reply',
  'after-journal',
  'between-tools',
  'after-tools',
  'after-commit',
  'in-flight',
] as const;

let model: ScriptedModelServer;
let rt: Runtime;
let prefix: string;
let dir: string;
// When set, the next request the model sees is held (a slow reply), so it can be cut in flight.
let holdNext = false;

function spawnChild(env: Record<string, string>): Promise<AgentChild> {
  return spawnAgentChild({
    REDIS_URL: redisUrl(),
    FLUJO_PREFIX: prefix,
    MODEL_URL: model.url,
    EFFECT_FILE: join(dir, 'effects.log'),
    RECOVERY_MS: '600',
    ...env,
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function allSettled(ids: string[], timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const reports = await Promise.all(ids.map((id) => rt.status(id)));
    if (reports.every((r) => r.status !== 'running')) return true;
    await sleep(100);
  }
  return false;
}

beforeAll(async () => {
  model = await startScriptedModelServer();
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-conservation-'));
  rt = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
});
afterAll(async () => {
  await rt.close();
  await deleteRuntimeKeys(prefix);
  await model.close();
  await rm(dir, { recursive: true, force: true });
});

describe('usage conservation across SIGKILLs', () => {
  it(`${RUNS} granular runs, ${KILLS} kills at seeded points: nothing left open, every token accounted for`, async () => {
    model.enqueue(
      ...Array.from({ length: 2000 }, () => (r: RecordedRequest): ScriptedReply => {
        const reply = replyFor(turnOf(r));
        if (!holdNext) return reply;
        holdNext = false;
        return { fault: 'delay', ms: 5000, then: reply };
      }),
    );
    const ids: string[] = [];
    for (let i = 0; i < RUNS; i++) {
      ids.push((await rt.start(plan, `question ${i}`, { runId: `cons-${i}` })).runId);
    }
    // Every point twice, then more up to KILLS, in a seeded order with a seeded pass count each.
    const random = prng(20261123);
    const order: (typeof POINTS)[number][] = [...POINTS, ...POINTS];
    while (order.length < KILLS) order.push(POINTS[Math.floor(random() * POINTS.length)]!);
    for (let i = order.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [order[i], order[j]] = [order[j]!, order[i]!];
    }
    const kills: string[] = [];
    for (const point of order) {
      const nth = 1 + Math.floor(random() * 6);
      if (point === 'in-flight') {
        const child = await spawnChild({ CONCURRENCY: '1' });
        const seen = model.requestCount;
        holdNext = true;
        // Wait until the held request has reached the server, then cut it off.
        for (let i = 0; i < 300 && model.requestCount === seen; i++) await sleep(10);
        await sleep(20);
        child.proc.kill('SIGKILL');
        await child.exited;
        kills.push(`in-flight #${model.requestCount}`);
        continue;
      }
      const child = await spawnChild({ CONCURRENCY: '1', FLUJO_KILL_AT: `${point}@${nth}` });
      const died = await Promise.race([
        child.exited.then(() => true),
        sleep(15_000).then(() => false),
      ]);
      if (!died) {
        // Every run got past the point before it was reached n times: stop the child.
        child.proc.kill('SIGKILL');
        await child.exited;
      }
      kills.push(`${point}@${nth}${died ? '' : ' (not reached)'}`);
    }
    // A last child with no kill point finishes every run.
    const finisher = await spawnChild({ CONCURRENCY: '8' });
    const done = await allSettled(ids, 60_000);
    finisher.proc.kill('SIGTERM');
    await finisher.exited;
    expect(done, `not every run settled; kills: ${kills.join(', ')}`).toBe(true);
    expect(kills.filter((k) => !k.includes('not reached')).length).toBeGreaterThanOrEqual(
      KILLS - 3,
    );

    const reports = await Promise.all(ids.map((id) => rt.status(id)));
    expect(reports.map((r) => r.status)).toEqual(ids.map(() => 'succeeded'));

    // No reservation left open, in any run.
    const usages = await Promise.all(ids.map((id) => rt.usage(id)));
    const all = usages.flatMap((u) => u.reservations);
    expect(all.filter((r) => r.state !== 'reconciled')).toEqual([]);
    for (const u of usages)
      expect(u.totals).toMatchObject({ reservedTokens: 0, reservedMicroUsd: 0 });

    // What the server reported for what it answered, plus the baseline of what it never answered.
    const chat = model.requests.filter((r) => r.path.endsWith('/chat/completions'));
    const answered = chat.filter((r) => r.answered);
    const unanswered = chat.filter((r) => !r.answered);
    const reported = answered.reduce(
      (n, r) => n + (r.usage?.prompt_tokens ?? 0) + (r.usage?.completion_tokens ?? 0),
      0,
    );
    const baselines = all.filter((r) => r.outcome === 'baseline');
    expect(unanswered.length).toBeGreaterThanOrEqual(2);
    expect(baselines).toHaveLength(unanswered.length);
    const baseline = baselines.reduce((n, r) => n + r.estimate.inputTokens, 0);
    const spent = usages.reduce((n, u) => n + u.totals.spentTokens, 0);
    expect(spent).toBe(reported + baseline);
    // Each reservation charged either a reply's usage exactly, the baseline, or nothing.
    expect(all.filter((r) => r.outcome === 'usage').length).toBe(answered.length);
    expect(all.every((r) => r.charged !== null)).toBe(true);
    const tenant = await runtimeCore(rt).stores.quota.usage('default');
    expect(tenant).toMatchObject({ reservedTokens: 0, spentTokens: spent });
  }, 180_000);
});
