/**
 * What the terminal shows whole, on the built binary (bin/flujo.js → dist, rebuilt when src/
 * changes): every line of an error (its causes too; stacks with --verbose), each attempt's error
 * in `flujo status`, payloads uncut with --full, where and why a failed run stopped in `flujo
 * list`, events in the order they happened, a held tool call said to be held, a Redis password
 * never printed, and a tool a model cannot be shown refused by `flujo validate` and `flujo
 * worker`.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runFlujo, type ChildResult } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const WHOLE = 'test/fixtures/jobs/whole.ts';

let prefix: string;
let redis: Redis;

const flujo = (args: string[], env: Record<string, string> = {}) =>
  runFlujo(args, { prefix, user: 'tester', env });

const runIdOf = (r: ChildResult): string => /^run (\S+) /.exec(r.lines[0] ?? '')?.[1] ?? '';

beforeAll(() => {
  prefix = testPrefix();
  redis = connect();
});
afterAll(async () => {
  redis.disconnect();
  await deleteRuntimeKeys(prefix);
});

describe('errors and payloads whole', () => {
  let runId = '';

  beforeAll(async () => {
    const r = await flujo(['run', WHOLE]);
    expect(r.code, r.err).toBe(1);
    runId = runIdOf(r);
    // The run's summary: the tool's problem, not only the line that announces it.
    const reason = r.lines.findIndex((l) =>
      l.startsWith('  reason: tool_input_invalid: ToolInputError: Invalid arguments for tool'),
    );
    expect(reason, r.out).toBeGreaterThan(0);
    expect(r.lines[reason + 1]).toMatch(/^\s+- args\.cents: .*expected number, received string$/);
  }, 30_000);

  it('status shows the problem lines of a tool_input_invalid error', async () => {
    const r = await flujo(['status', runId]);
    expect(r.code).toBe(1);
    const at = r.lines.findIndex((l) =>
      l.trim().startsWith('tool_input_invalid: ToolInputError: Invalid arguments for tool'),
    );
    expect(at, r.out).toBeGreaterThan(0);
    expect(r.lines[at]).toContain('(1 problem):');
    expect(r.lines[at + 1]).toMatch(/^\s+- args\.cents: .*expected number, received string$/);
  });

  it('status shows each failed attempt with its number, code and whole message and cause', async () => {
    const r = await flujo(['status', runId]);
    const lines = r.lines.map((l) => l.trim());
    for (const n of [1, 2]) {
      const at = lines.findIndex((l) => l.startsWith(`attempt ${n}: `));
      expect(at, r.out).toBeGreaterThan(0);
      expect(lines[at]).toMatch(/ failed on \S+ pid \d+$/);
      expect(lines.slice(at + 1, at + 5)).toEqual([
        `unknown: Error: attempt ${n} broke`,
        `second line of attempt ${n}`,
        `caused by Error: socket closed ${n}`,
        'by the peer',
      ]);
    }
    expect(lines.find((l) => l.startsWith('attempt 3: '))).toMatch(/ succeeded on /);
    // No stack without --verbose; with it, the frame of the operator that threw.
    expect(r.out).not.toMatch(/^\s+at /m);
    const verbose = await flujo(['status', runId, '--verbose']);
    expect(verbose.out).toMatch(/^\s+at flaky \(.*whole\.ts:\d+:\d+\)$/m);
    // The JSON carries each attempt's error.
    const json = JSON.parse((await flujo(['status', runId, '--json'])).out) as {
      attempts: { stepId: string; attempt: number; error: { code: string } | null }[];
    };
    expect(json.attempts.map((a) => [a.stepId, a.attempt, a.error?.code ?? null])).toEqual([
      ['flaky', 1, 'unknown'],
      ['flaky', 2, 'unknown'],
      ['flaky', 3, null],
      ['charge', 1, 'tool_input_invalid'],
    ]);
  });

  it('events prints a payload of 500 characters whole with --full, and cut without', async () => {
    const output = JSON.stringify({ text: `${'x'.repeat(486)}END` });
    expect(output.length).toBe(500);
    const cut = await flujo(['events', runId]);
    const line = cut.lines.find((l) => l.includes('step.succeeded flaky'))!;
    expect(line).not.toContain('END');
    expect(line.endsWith('…')).toBe(true);
    expect(line.length).toBeLessThan(200);
    const full = await flujo(['events', runId, '--full']);
    expect(full.lines.find((l) => l.includes('step.succeeded flaky'))).toMatch(
      new RegExp(`: ${output.replace(/[{}]/g, '\\$&')}$`),
    );
    // An error is whole in both.
    for (const r of [cut, full]) {
      const at = r.lines.findIndex((l) => l.includes('step.failed    charge attempt 1'));
      expect(r.lines[at + 1]).toMatch(/^\s+- args\.cents: /);
    }
  });

  it('list shows where and why a failed run stopped', async () => {
    const r = await flujo(['list']);
    expect(r.code, r.err).toBe(0);
    const row = r.lines.find((l) => l.startsWith(runId))!;
    expect(row).toMatch(/\sfailed\s.*\scharge \(failed: tool_input_invalid\)$/);
    const json = JSON.parse((await flujo(['list', '--json'])).out) as Record<string, unknown>[];
    expect(json.find((e) => e['runId'] === runId)).toMatchObject({
      status: 'failed',
      blockedStep: 'charge',
      reason: 'tool_input_invalid',
    });
  });
});

describe('events in the order they happened', () => {
  it('the text view is ordered by time although the stream is in commit order', async () => {
    // `a` sleeps, `b` does not: b commits first, a's start (earlier) is committed after it.
    const r = await flujo(['run', 'test/fixtures/jobs/pair.ts', '--input', '{"slowMs":300}']);
    expect(r.code, r.err).toBe(0);
    const runId = runIdOf(r);
    const json = await flujo(['events', runId, '--json']);
    const streamed = json.lines.map((l) => (JSON.parse(l) as { data: { at: number } }).data.at);
    const backwards = streamed.filter((at, i) => i > 0 && at < streamed[i - 1]!);
    expect(backwards.length).toBeGreaterThan(0);
    const text = await flujo(['events', runId]);
    const times = text.lines.map((l) => Date.parse(l.slice(0, 24)));
    expect(times).toHaveLength(streamed.length);
    expect(times).toEqual([...streamed].sort((x, y) => x - y));
    const startedA = text.lines.findIndex((l) => / step\.started +a attempt 1$/.test(l));
    const succeededB = text.lines.findIndex((l) => / step\.succeeded b attempt 1:/.test(l));
    expect(startedA).toBeGreaterThanOrEqual(0);
    expect(startedA).toBeLessThan(succeededB);
  }, 30_000);
});

describe('a held tool call', () => {
  it('tool.called says held, not executed, for a call that waits for approval', async () => {
    const r = await flujo(['run', 'test/fixtures/jobs/risky-tool.ts']);
    expect(r.code, r.err).toBe(3);
    const events = await flujo(['events', runIdOf(r)]);
    const called = events.lines.filter((l) => / tool\.called /.test(l));
    expect(called).toHaveLength(1);
    expect(called[0]).toContain('transfer@1 (external) held (not executed: waits for approval),');
    expect(called[0]).not.toContain('executed,');
  }, 30_000);
});

describe('a Redis password', () => {
  it('is masked in every printed command, with a hint to use REDIS_URL, in text and JSON', async () => {
    const password = 's3cr3t-Pw';
    const url = redisUrl().replace('redis://', `redis://:${password}@`);
    const opts = { prefix, user: 'tester', redis: 'none' as const };
    const text = await runFlujo(['run', 'test/fixtures/jobs/gated.ts', '--redis', url], opts);
    expect(text.code, text.err).toBe(3);
    const masked = `redis://:***@${new URL(redisUrl()).host}`;
    expect(text.lines[1]).toMatch(
      new RegExp(
        `^resume: (npx )?flujo resume \\S+ test/fixtures/jobs/gated\\.ts --redis '${masked.replace(/[*.]/g, '\\$&')}'$`,
      ),
    );
    expect(text.lines[2]).toMatch(
      /^note: the password given with --redis is printed as \*\*\*: set REDIS_URL/,
    );
    expect(text.out).toContain('  then continue with: ');
    expect(text.lines.filter((l) => l.startsWith('  note: the password given'))).toHaveLength(1);
    const json = await runFlujo(
      ['run', 'test/fixtures/jobs/gated.ts', '--redis', url, '--json'],
      opts,
    );
    expect(json.code, json.err).toBe(3);
    const first = JSON.parse(json.lines[0]!) as { resume: string; note: string };
    expect(first.resume).toContain(`--redis '${masked}'`);
    expect(first.note).toContain('set REDIS_URL');
    for (const r of [text, json]) {
      expect(r.out + r.err).not.toContain(password);
    }
    // A URL that is not one is refused without printing it either.
    const bad = await runFlujo(['list', '--redis', `redis//:${password}@host`], opts);
    expect(bad.code).toBe(2);
    expect(bad.out + bad.err).not.toContain(password);
  }, 30_000);
});

describe('a tool a model cannot be shown', () => {
  it('flujo validate and flujo worker refuse it, naming the tool, the agent, the step and the fix', async () => {
    const job = 'test/fixtures/jobs/agent-bad-tool.ts';
    // A prefix of its own: keys the file's other tests left (some with a TTL) are not counted.
    const own = testPrefix();
    const keys = async () => {
      let n = 0;
      for (const pattern of [`${own}:*`, `{${own}:*`]) {
        let cursor = '0';
        do {
          const [next, batch] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 500);
          cursor = next;
          n += batch.length;
        } while (cursor !== '0');
      }
      return n;
    };
    const before = await keys();
    for (const args of [
      ['validate', job],
      ['worker', job],
    ]) {
      const r = await runFlujo(args, { prefix: own, user: 'tester' });
      expect(r.code, r.out).toBe(2);
      expect(r.err).toContain(
        `agent "planner" (used by step "plan_trip" (granular)) has tool "book_slot", which has an input schema a model cannot be shown (Custom types cannot be represented in JSON Schema)`,
      );
      expect(r.err).toContain('fix the input of tool "book_slot" (a z.object({ … }) of JSON types');
    }
    expect(await keys()).toBe(before);
    expect(before).toBe(0);
  }, 30_000);
});
