import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { root, runFlujo } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys } from '../helpers/redis.js';

/** `flujo <args>`; the prefix is each command's `--prefix`. */
const flujo = (args: string[], env: Record<string, string>, cwd = root) =>
  runFlujo(args, { cwd, env, timeoutMs: 30_000 });

describe('flujo run with an agent step', () => {
  let model: ScriptedModelServer;
  const prefix = `t-${randomUUID().slice(0, 8)}`;
  beforeAll(async () => {
    model = await startScriptedModelServer();
  });
  afterAll(async () => {
    await model.close();
    await deleteRuntimeKeys(prefix);
  });

  it('runs the agent to its answer and exits 0', async () => {
    model.enqueue({ text: 'Hello from the model.' });
    const r = await flujo(['run', 'test/fixtures/jobs/agent.ts', '--prefix', prefix, '--json'], {
      MODEL_URL: model.url,
    });
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    const result = r.out
      .trim()
      .split('\n')
      .map(
        (l) => JSON.parse(l) as { type: string; summary?: { produced: Record<string, unknown> } },
      )
      .find((l) => l.type === 'result');
    expect(result?.summary?.produced['ask']).toMatchObject({
      answer: 'Hello from the model.',
      turns: 1,
    });
    expect(model.requestCount).toBe(1);
  });

  it('shows a streaming agent’s reply live; --quiet hides it', async () => {
    model.enqueue({ text: 'Hello, streamed world.' }, { text: 'Hello, streamed world.' });
    const env = { MODEL_URL: model.url };
    const shown = await flujo(
      ['run', 'test/fixtures/jobs/agent-stream.ts', '--prefix', prefix],
      env,
    );
    expect(shown.code, shown.err).toBe(0);
    const lines = shown.out.split('\n');
    const says = lines.findIndex((l) => l.includes('talk: turn 1 says:'));
    expect(says).toBeGreaterThan(0);
    expect(lines[says + 1]).toBe('    Hello, streamed world.');
    const quiet = await flujo(
      ['run', 'test/fixtures/jobs/agent-stream.ts', '--prefix', prefix, '--quiet'],
      env,
    );
    expect(quiet.code, quiet.err).toBe(0);
    expect(quiet.out).not.toContain('says:');
    expect(quiet.out).not.toContain('Hello, streamed world.');
    expect(quiet.out).toContain('talk: RUNNING → SUCCEEDED');
  });

  it('flujo usage shows each model call: reserved, spent, how it was reconciled; --json too', async () => {
    model.enqueue({ text: 'Counted.', usage: { prompt_tokens: 42, completion_tokens: 7 } });
    const runId = `usage-${randomUUID().slice(0, 8)}`;
    const run = await flujo(
      ['run', 'test/fixtures/jobs/agent.ts', '--prefix', prefix, '--run-id', runId],
      { MODEL_URL: model.url },
    );
    expect(run.code).toBe(0);
    const human = await flujo(['usage', runId, '--prefix', prefix], {});
    expect(human.code).toBe(0);
    const lines = human.out.trim().split('\n');
    expect(lines[0]).toMatch(/^STEP\s+TURN\s+RESERVED\s+SPENT\s+COST\s+RECONCILED\s+AT$/);
    expect(lines[1]).toMatch(
      /^ask\s+0\s+\d+ tok \$0\.000000\s+42\+7 tok\s+\$0\.000000\s+usage \(the provider's\)/,
    );
    expect(lines[2]).toBe('model calls: 1; released without a call: 0');
    expect(lines[3]).toMatch(/^total: spent 49 tokens \$0\.000000; reserved now 0 tokens/);
    const json = await flujo(['usage', runId, '--prefix', prefix, '--json'], {});
    const usage = JSON.parse(json.out) as {
      reservations: { turn: number; outcome: string; charged: { tokens: number } }[];
      totals: { spentTokens: number };
    };
    expect(usage.reservations).toMatchObject([
      { turn: 0, outcome: 'usage', charged: { tokens: 49 } },
    ]);
    expect(usage.totals.spentTokens).toBe(49);
    const unknown = await flujo(['usage', 'no-such-run', '--prefix', prefix], {});
    expect(unknown.code).toBe(2);
    expect(unknown.err).toMatch(/no-such-run/);
  });

  it('prices model calls from the pricing file a job module names; strict pricing refuses an unpriced model', async () => {
    model.enqueue({ text: 'Priced.', usage: { prompt_tokens: 1000, completion_tokens: 500 } });
    const priced = `priced-${randomUUID().slice(0, 8)}`;
    const job = 'test/fixtures/jobs/agent-priced.ts';
    const run = await flujo(['run', job, '--prefix', prefix, '--run-id', priced], {
      MODEL_URL: model.url,
    });
    expect(run.code).toBe(0);
    const usage = await flujo(['usage', priced, '--prefix', prefix, '--json'], {});
    // 1000 × 0.15 + 500 × 0.6 micro-USD.
    expect(JSON.parse(usage.out)).toMatchObject({ totals: { spentMicroUsd: 450 } });

    const seen = model.requestCount;
    const unpriced = `unpriced-${randomUUID().slice(0, 8)}`;
    const refused = await flujo(['run', job, '--prefix', prefix, '--run-id', unpriced], {
      MODEL_URL: model.url,
      MODEL: 'llama-3-8b',
    });
    expect(refused.code).toBe(1);
    expect(refused.out).toContain('pricing_not_configured');
    expect(model.requestCount).toBe(seen);

    const bad = await flujo(['run', job, '--prefix', prefix], { PRICING: './pricing-bad.json' });
    expect(bad.code).toBe(2);
    expect(bad.err.trim().split('\n')).toHaveLength(1);
    expect(bad.err).toMatch(/pricing-bad\.json.*models\["gpt-4o-mini"\]\.inputPerMillion/);
  });

  it('refuses a module whose agent step names an agent it does not define, writing nothing', async () => {
    const r = await flujo(['run', 'test/fixtures/jobs/agent-unknown.ts', '--prefix', prefix], {});
    expect(r.code).toBe(2);
    expect(r.err.trim().split('\n')).toHaveLength(1);
    expect(r.err).toContain('step "ask" uses agent "ghost"');
    expect(r.err).toContain('export const agents');
  });
});

describe('a job module whose agents are a function, built after setup', () => {
  const job = join(root, 'test/fixtures/jobs/agents-after-setup.ts');
  let model: ScriptedModelServer;
  let cwd: string;
  const prefix = `t-${randomUUID().slice(0, 8)}`;
  const log = () => readFileSync(join(cwd, '.flujo', 'data', 'agents.log'), 'utf8');

  beforeAll(async () => {
    model = await startScriptedModelServer();
    cwd = mkdtempSync(join(tmpdir(), 'flujo-cli-agents-'));
  });
  afterAll(async () => {
    await model.close();
    rmSync(cwd, { recursive: true, force: true });
    await deleteRuntimeKeys(prefix);
  });

  it('calls setup, then agents() with the same dataDir, runs the agent, and exits 0', async () => {
    model.enqueue({ text: 'Hello after setup.' });
    const r = await flujo(
      ['run', job, '--prefix', prefix, '--json'],
      { MODEL_URL: model.url, AGENTS_CASE: '' },
      cwd,
    );
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    const last = JSON.parse(r.out.trim().split('\n').at(-1)!) as {
      summary: { produced: Record<string, unknown> };
    };
    expect(last.summary.produced['ask']).toMatchObject({ answer: 'Hello after setup.' });
    expect(log()).toBe('setup\nagents same dataDir\nteardown\n');
  });

  it.each([
    {
      case: 'throws',
      says: 'its agents() threw: the model server is not up; fix the agents builder (it runs after setup)',
    },
    {
      case: 'not-array',
      says: 'agents() is not an array; return an array of defineAgent({ … }) definitions',
    },
    {
      case: 'other-name',
      says: 'step "ask" uses agent "helper", which the module\'s agents() do not define (it defines: other); add defineAgent({ name: "helper", … }) to the array agents() returns',
    },
    {
      case: 'twice',
      says: 'agents()[1] and agents()[0] are both named "helper"; give each agent its own name',
    },
  ])(
    'agents() that $case: one line naming the fix, exit 2, teardown called, nothing written',
    async (c) => {
      rmSync(join(cwd, '.flujo', 'data', 'agents.log'), { force: true });
      const other = `t-${randomUUID().slice(0, 8)}`;
      const r = await flujo(
        ['run', job, '--prefix', other],
        { MODEL_URL: model.url, AGENTS_CASE: c.case },
        cwd,
      );
      expect(r.code).toBe(2);
      expect(r.out).toBe('');
      expect(r.err.trim().split('\n')).toHaveLength(1);
      expect(r.err).toContain(`job module ${JSON.stringify(job)}: ${c.says}`);
      expect(log()).toBe(`setup\nagents same dataDir\nteardown\n`);
      // No run, no job, no event under the prefix. (BullMQ may record its queue's version in
      // the queue's meta key as the runtime connects, as for any command that connects.)
      const redis = connect();
      const keys: string[] = [];
      let cursor = '0';
      do {
        const [next, batch] = await redis.scan(cursor, 'MATCH', `*${other}*`, 'COUNT', 1000);
        cursor = next;
        keys.push(...batch);
      } while (cursor !== '0');
      redis.disconnect();
      expect(keys.filter((k) => k !== `{${other}:q}:runs:meta`)).toEqual([]);
    },
  );
});
