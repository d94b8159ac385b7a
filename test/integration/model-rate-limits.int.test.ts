/**
 * Model rate limits, shared by the worker processes of a prefix (test/fixtures/agent-child.ts with
 * RATE_LIMITS): bad limits refused before anything is written; a 429 with `retry-after` pausing
 * the model for every worker; tokens counted by estimate and corrected by the reply's usage; and
 * 20 agent runs under 30 requests per minute on a scripted server that answers 429 past 30
 * requests in 60 s: it never has to, and never sees more than 30 in any 60 s. Last, in one process
 * with atomic steps: a wait under a provider's host as a span and an event, and a call over its
 * tokens that gives up past `maxWaitMs`.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { trace } from '@opentelemetry/api';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { InputValidationError } from '../../src/errors.js';
import { silentLogger } from '../../src/logging.js';
import type { RecordedRequest, ScriptedReply } from '../../src/testing/index.js';
import { agentChildren, researchPlan, settledReport, turnOf } from '../helpers/agent-child.js';
import {
  connect,
  deleteRuntimeKeys,
  redisMode,
  redisUrl,
  scanKeys,
  testPrefix,
} from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';
import { spansRecorded } from '../../src/observability/tracing.js';

const plan = researchPlan('rate-limits');
const model = useScriptedModel();
let rt: Runtime;
let prefix: string;
let dir: string;
const children = agentChildren(() => ({
  REDIS_URL: redisUrl(),
  FLUJO_PREFIX: prefix,
  MODEL_URL: model.url,
  EFFECT_FILE: join(dir, 'effects.log'),
  // A unit waits up to a minute for capacity, its job's lock renewed meanwhile: a lock long
  // enough that a busy machine does not let it lapse.
  RECOVERY_MS: '10000',
}));

beforeEach(async () => {
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-rate-'));
  rt = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
});

afterEach(async () => {
  await children.killAll();
  await rt.close();
  await deleteRuntimeKeys(prefix);
  await rm(dir, { recursive: true, force: true });
});

/** Turn 0 asks for one search, turn 1 answers. */
const TWO_TURNS: readonly ScriptedReply[] = [
  {
    toolCalls: [{ id: 's1', name: 'search', arguments: { q: 'alpha' } }],
    usage: { prompt_tokens: 100, completion_tokens: 30 },
  },
  { text: 'Alpha, found.', usage: { prompt_tokens: 160, completion_tokens: 9 } },
];
const twoTurns = (r: RecordedRequest): ScriptedReply => TWO_TURNS[turnOf(r)]!;

/** The run's events of type `type`. */
async function eventsOf(runId: string, type: string): Promise<Record<string, unknown>[]> {
  const out: Record<string, unknown>[] = [];
  for await (const e of rt.events(runId)) {
    if (e.type === type) out.push(e.data);
  }
  return out;
}

/** The `model.rate_limited` events of a run. */
const waitsOf = (runId: string) => eventsOf(runId, 'model.rate_limited');

describe('model rate limits', () => {
  it('refuses bad limits, naming the field, and writes nothing', async () => {
    const bad: [unknown, string][] = [
      [{ 'gpt-test': { requestsPerMinute: 0 } }, 'rateLimits.gpt-test.requestsPerMinute'],
      [{ 'gpt-test': { tokensPerMinute: 1.5 } }, 'rateLimits.gpt-test.tokensPerMinute'],
      [{ 'gpt-test': { requestsPerMinute: '30' } }, 'rateLimits.gpt-test.requestsPerMinute'],
      [{ 'gpt-test': {} }, 'rateLimits.gpt-test: sets no limit'],
      [{ 'gpt-test': { requestsPerMinute: 5, burst: 2 } }, 'rateLimits.gpt-test.burst'],
      [{ 'a{b}': { requestsPerMinute: 5 } }, 'rateLimits.a{b}'],
      [[], 'rateLimits: must be an object'],
    ];
    for (const [rateLimits, says] of bad) {
      let thrown: unknown;
      try {
        createRuntime({
          redis: redisUrl(),
          prefix,
          logger: silentLogger,
          rateLimits: rateLimits as never,
        });
      } catch (error) {
        thrown = error;
      }
      expect(thrown, JSON.stringify(rateLimits)).toBeInstanceOf(InputValidationError);
      expect((thrown as Error).message).toContain(says);
    }
    const redis = connect();
    try {
      expect(await scanKeys(redis, `${prefix}*`)).toEqual([]);
      expect(await scanKeys(redis, `{${prefix}:rate:*`)).toEqual([]);
    } finally {
      redis.disconnect();
    }
  });

  it('counts tokens by estimate, then by the usage the reply reports', async () => {
    model.setDefaultReply(twoTurns);
    // Each request is estimated at its input and a 1024-token output buffer (over 1,100 tokens):
    // two of them pass 2,000 tokens, but the first reply reports 130, which is what then counts.
    // A wait would be a minute: past maxWaitMs, the step would fail.
    await children.spawn({
      RATE_LIMITS: JSON.stringify({ 'gpt-test': { tokensPerMinute: 2000, maxWaitMs: 1000 } }),
    });
    const { runId } = await rt.start(plan, 'tokens');
    const report = await settledReport(rt, runId);
    expect(report.status).toBe('succeeded');
    expect(model.requestCount).toBe(2);
    expect(await waitsOf(runId)).toEqual([]);
    // What the window counts now: the two replies' usage (130 and 169), not their estimates.
    const redis = connect();
    try {
      expect(await redis.hget(`{${prefix}:rate:gpt-test}:state`, 'tok')).toBe('299');
      expect(await redis.zcard(`{${prefix}:rate:gpt-test}:log`)).toBe(2);
    } finally {
      redis.disconnect();
    }
  });

  it('a 429 with retry-after pauses the model for every worker', { timeout: 120_000 }, async () => {
    let first = true;
    model.setDefaultReply((r) => {
      if (first) {
        first = false;
        return { fault: 'status', status: 429, retryAfter: 2 };
      }
      return twoTurns(r);
    });
    const env = {
      RATE_LIMITS: JSON.stringify({ 'gpt-test': { requestsPerMinute: 1000 } }),
      CONCURRENCY: '1',
    };
    await children.spawn(env);
    await children.spawn(env);
    const a = await rt.start(plan, 'first');
    // The first worker waits out the block with its one slot: the second run goes to the other.
    while (model.requestCount === 0) await new Promise((r) => setTimeout(r, 10));
    const b = await rt.start(plan, 'second');
    const [ra, rb] = [await settledReport(rt, a.runId), await settledReport(rt, b.runId)];
    expect([ra.status, rb.status]).toEqual(['succeeded', 'succeeded']);
    const [refused, ...rest] = model.requests;
    expect(refused!.answered).toBe(false);
    expect(rest).toHaveLength(4);
    for (const r of rest) expect(r.at - refused!.at).toBeGreaterThanOrEqual(2000);
    // Both runs recorded their wait for the block, and nothing else failed.
    for (const runId of [a.runId, b.runId]) {
      const waits = await waitsOf(runId);
      expect(waits).toHaveLength(1);
      expect(waits[0]).toMatchObject({
        model: 'gpt-test',
        limits: ['gpt-test'],
        reason: 'blocked',
        outcome: 'sent',
        turn: 0,
      });
      expect(waits[0]!['waitedMs']).toBeGreaterThan(1000);
    }
    expect(await eventsOf(a.runId, 'step.failed')).toEqual([]);
  });

  // The longest test here (over a minute): on one server only; the shorter ones check the
  // limits' keys on a cluster.
  it.skipIf(redisMode() === 'cluster')(
    'keeps 20 runs of two workers within 30 requests per minute, without a 429',
    { timeout: 180_000 },
    async () => {
      const LIMIT = 30;
      const WINDOW = 60_000;
      // A provider that answers 429 past 30 requests in the last 60 s.
      const seen: number[] = [];
      model.setDefaultReply((r) => {
        const recent = seen.filter((at) => at > r.at - WINDOW).length;
        seen.push(r.at);
        if (recent >= LIMIT) return { fault: 'status', status: 429, retryAfter: 1 };
        return twoTurns(r);
      });
      const env = {
        RATE_LIMITS: JSON.stringify({ 'gpt-test': { requestsPerMinute: LIMIT } }),
        CONCURRENCY: '4',
      };
      await children.spawn(env);
      await children.spawn(env);
      const runs = await Promise.all(
        Array.from({ length: 20 }, (_, i) => rt.start(plan, `run ${i}`)),
      );
      const reports = await Promise.all(runs.map((r) => settledReport(rt, r.runId, 150_000)));
      expect(reports.map((r) => r.status)).toEqual(Array(20).fill('succeeded'));
      // Two turns of each run, each asked once (a turn is asked again only when its job's lock
      // lapsed and another execution ran it: its journal keeps the first reply).
      const requests = model.requests;
      expect(requests.length).toBeGreaterThanOrEqual(40);
      expect(requests.every((r) => r.answered)).toBe(true);
      const asked = new Set(requests.map((r) => `${String(r.messages[1]?.content)}:${turnOf(r)}`));
      expect(asked.size).toBe(40);
      const times = requests.map((r) => r.at).sort((x, y) => x - y);
      // Any 60 s holds at most 30 of them: the 31st after each is more than 60 s later.
      for (let i = 0; i + LIMIT < times.length; i++) {
        expect(times[i + LIMIT]! - times[i]!).toBeGreaterThan(WINDOW);
      }
      // The calls that found the limit full waited for it, and their runs say so (a turn asked
      // once capacity came back may go at once: not every request past the 30th waits).
      const waits = (await Promise.all(runs.map((r) => waitsOf(r.runId)))).flat();
      expect(waits.length).toBeGreaterThan(0);
      for (const w of waits) {
        expect(w).toMatchObject({ model: 'gpt-test', reason: 'requests', outcome: 'sent' });
      }
      expect(Math.max(...waits.map((w) => Number(w['waitedMs'])))).toBeGreaterThan(30_000);
    },
  );
});

describe('in one process, atomic steps', () => {
  const memory = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(memory)] });
  beforeAll(() => {
    trace.setGlobalTracerProvider(provider);
  });
  afterAll(async () => {
    trace.disable();
    await provider.shutdown();
  });

  it('a wait under a provider host is a span before the call, and an event', async () => {
    const host = new URL(model.url).host;
    const runtime = createRuntime({
      redis: redisUrl(),
      prefix,
      logger: silentLogger,
      rateLimits: { [host]: { requestsPerMinute: 100 } },
    }).agent(scriptedAgent(model, { name: 'writer', systemPrompt: 'Write.' }));
    const worker = runtime.createWorker({ concurrency: 1 });
    try {
      await worker.ready();
      model.enqueue({ fault: 'status', status: 429, retryAfter: 1 }, { text: 'Written.' });
      const run = await runtime.start(
        { name: 'write', steps: [{ id: 'write', kind: 'agent', agent: 'writer' }] },
        'a line',
      );
      expect((await run.settled({ timeoutMs: 15_000 })).status).toBe('succeeded');
      const [refused, sent] = model.requests;
      expect(sent!.at - refused!.at).toBeGreaterThanOrEqual(1000);
      const events: Record<string, unknown>[] = [];
      for await (const e of runtime.events(run.runId)) {
        if (e.type === 'model.rate_limited') events.push(e.data);
      }
      expect(events).toMatchObject([
        { stepId: 'write', turn: 0, limits: [host], reason: 'blocked', outcome: 'sent' },
      ]);
      await spansRecorded();
      const spans = memory
        .getFinishedSpans()
        .filter((span) => span.attributes['flujo.run_id'] === run.runId);
      const waits = spans.filter((span) => span.name === 'flujo.model.rate_limited');
      expect(waits).toHaveLength(1);
      expect(waits[0]!.attributes).toMatchObject({
        'gen_ai.request.model': 'gpt-test',
        'flujo.rate_limit.names': [host],
        'flujo.rate_limit.outcome': 'sent',
        'flujo.step_id': 'write',
      });
      expect(Number(waits[0]!.attributes['flujo.rate_limit.waited_ms'])).toBeGreaterThan(500);
      expect(spans.filter((span) => span.name === 'chat gpt-test')).toHaveLength(2);
    } finally {
      await worker.close();
      await runtime.close();
    }
  });

  it('past maxWaitMs, a call over its tokens gives up with a retryable rate_limit error', async () => {
    const runtime = createRuntime({
      redis: redisUrl(),
      prefix,
      logger: silentLogger,
      rateLimits: { 'gpt-test': { tokensPerMinute: 2000, maxWaitMs: 500 } },
    }).agent(scriptedAgent(model, { name: 'writer', systemPrompt: 'Write.' }));
    const worker = runtime.createWorker({ concurrency: 1 });
    const write: PlanInput = {
      name: 'write',
      steps: [{ id: 'write', kind: 'agent', agent: 'writer' }],
    };
    try {
      await worker.ready();
      // The first reply reports 1,900 tokens: the window has room for no other request this minute.
      model.enqueue({ text: 'Written.', usage: { prompt_tokens: 1500, completion_tokens: 400 } });
      const first = await runtime.start(write, 'a line');
      expect((await first.settled({ timeoutMs: 15_000 })).status).toBe('succeeded');
      const second = await runtime.start(write, 'another line');
      let failed: Record<string, unknown> | undefined;
      for (let i = 0; i < 200 && failed === undefined; i++) {
        for await (const e of runtime.events(second.runId)) {
          if (e.type === 'step.failed') failed = e.data;
        }
        if (failed === undefined) await new Promise((r) => setTimeout(r, 50));
      }
      expect(failed?.['error']).toMatchObject({
        code: 'model_error',
        retryable: true,
        details: { kind: 'rate_limit' },
      });
      expect((failed?.['error'] as { retryAfterMs: number }).retryAfterMs).toBeGreaterThan(30_000);
      const waits: Record<string, unknown>[] = [];
      for await (const e of runtime.events(second.runId)) {
        if (e.type === 'model.rate_limited') waits.push(e.data);
      }
      expect(waits).toMatchObject([{ reason: 'tokens', outcome: 'gave_up', limits: ['gpt-test'] }]);
      expect(model.requestCount).toBe(1);
    } finally {
      await worker.close();
      await runtime.close();
    }
  });
});
