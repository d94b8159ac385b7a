/**
 * The `flujo` binary (bin/flujo.js → dist, rebuilt when src/ changes) deciding on gates:
 * approvers refuse anyone else (exit 2, nothing written), the gate's reason is shown where a person
 * decides, and `flujo skip`.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runFlujo } from '../helpers/cli.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';

const JOB = 'test/fixtures/jobs/approvers.ts';

const flujo = (args: string[], prefix: string) => runFlujo(args, { prefix, user: 'tester' });

/** Every key of the prefix with its content (streams included). */
async function dump(prefix: string): Promise<Record<string, unknown>> {
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

let redis: Redis;
const prefixes: string[] = [];
beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  for (const p of prefixes) {
    await deletePrefix(redis, `${p}:`);
    await deletePrefix(redis, `{${p}:q}`);
  }
  redis.disconnect();
});

describe('flujo approve, reject and skip with approvers', { timeout: 60_000 }, () => {
  it('shows the reason and the approvers; anyone else is refused with exit 2 and nothing changes', async () => {
    const prefix = testPrefix();
    prefixes.push(prefix);
    const run = await flujo(['run', JOB], prefix);
    expect(run.code).toBe(3);
    const runId = /^run (\S+) /.exec(run.out)![1]!;
    expect(run.out).toContain(
      `waiting for approval: review (npx flujo approve ${runId} review --by ana, or npx flujo reject …)`,
    );
    expect(run.out).toContain('    reason: the draft goes to customers');
    expect(run.out).toContain('    approvers: ana');

    const status = await flujo(['status', runId], prefix);
    expect(status.code).toBe(3);
    expect(status.out).toContain('    reason: the draft goes to customers');
    const json = JSON.parse((await flujo(['status', runId, '--json'], prefix)).out) as {
      approvals: unknown[];
    };
    expect(json.approvals).toEqual([
      {
        stepId: 'review',
        reason: 'the draft goes to customers',
        approvers: ['ana'],
        riskLevel: 'low',
        call: null,
      },
    ]);

    const before = await dump(prefix);
    for (const command of [
      ['approve', runId, 'review', '--by', 'mallory'],
      ['reject', runId, 'review', '--by', 'mallory'],
      ['skip', runId, 'review', '--by', 'mallory', '--reason', 'hurry'],
    ]) {
      const refused = await flujo(command, prefix);
      expect(refused.code).toBe(2);
      expect(refused.err).toContain('mallory may not decide on step "review"');
      expect(refused.err).toContain('only ana may approve or reject it');
    }
    const noReason = await flujo(['skip', runId, 'review', '--by', 'ana'], prefix);
    expect(noReason.code).toBe(2);
    expect(noReason.err).toContain('--reason');
    expect(await dump(prefix)).toEqual(before);

    const skipped = await flujo(['skip', runId, 'review', '--by', 'ana', '--reason', 'ok'], prefix);
    expect(skipped.code).toBe(0);
    expect(skipped.out).toContain(`skipped step "review" of run ${runId} (by ana): ok`);
    const resumed = await flujo(['resume', runId, JOB], prefix);
    expect(resumed.code).toBe(0);
    expect(resumed.out).toContain('produced: draft, send');
    const done = JSON.parse((await flujo(['status', runId, '--json'], prefix)).out) as {
      steps: { stepId: string; status: string; output: unknown }[];
    };
    expect(done.steps.map((s) => s.status)).toEqual(['SUCCEEDED', 'SKIPPED', 'SUCCEEDED']);
    // The skipped gate gave nothing: send saw its output null.
    expect(done.steps[2]!.output).toEqual({ sent: true, review: null });
  });

  it('a rejected gate skipped: the failed run goes on, and its cancelled dependent runs with the gate null', async () => {
    const prefix = testPrefix();
    prefixes.push(prefix);
    const run = await flujo(['run', JOB], prefix);
    expect(run.code).toBe(3);
    const runId = /^run (\S+) /.exec(run.out)![1]!;
    const rejected = await flujo(['reject', runId, 'review', '--by', 'ana'], prefix);
    expect(rejected.code).toBe(0);
    expect(rejected.out).toContain(`run ${runId} is failed (approval_rejected)`);

    const skipped = await flujo(
      ['skip', runId, 'review', '--by', 'ana', '--reason', 'sent by hand'],
      prefix,
    );
    expect(skipped.code).toBe(0);
    expect(skipped.out).toContain(`skipped step "review" of run ${runId} (by ana): sent by hand`);
    expect(skipped.out).toContain(`run ${runId} is running; continue it with`);
    const resumed = await flujo(['resume', runId, JOB], prefix);
    expect(resumed.code).toBe(0);
    expect(resumed.out).toContain('produced: draft, send');
    const done = JSON.parse((await flujo(['status', runId, '--json'], prefix)).out) as {
      status: string;
      steps: { stepId: string; status: string; output: unknown }[];
    };
    expect(done.status).toBe('succeeded');
    expect(done.steps.map((s) => s.status)).toEqual(['SUCCEEDED', 'SKIPPED', 'SUCCEEDED']);
    expect(done.steps[2]!.output).toEqual({ sent: true, review: null });

    // Skipped already: a second skip is refused, exit 2, nothing written.
    const before = await dump(prefix);
    const again = await flujo(['skip', runId, 'review', '--by', 'ana', '--reason', 'x'], prefix);
    expect(again.code).toBe(2);
    expect(again.err).toContain('is SKIPPED; only a step that has not succeeded or been skipped');
    expect(await dump(prefix)).toEqual(before);
  });
});

describe('flujo approve --call: a decision bound to the tool call a person saw', () => {
  it('approves the named call only; another id or a stale one is refused with exit 2 and nothing changes', async () => {
    const prefix = testPrefix();
    prefixes.push(prefix);
    const dir = mkdtempSync(join(tmpdir(), 'flujo-call-'));
    const env = { EFFECT_FILE: join(dir, 'effects.log') };
    const effects = () =>
      existsSync(env.EFFECT_FILE)
        ? readFileSync(env.EFFECT_FILE, 'utf8').split('\n').filter(Boolean)
        : [];
    const job = 'test/fixtures/jobs/risky-tool.ts';
    const run = await runFlujo(['run', job], { prefix, user: 'tester', env });
    expect(run.code, run.err).toBe(3);
    const runId = /^run (\S+) /.exec(run.out)![1]!;
    const first = /tool call ([0-9a-f]{12}): transfer@1 \{"cents":500\}/.exec(run.out)![1]!;
    expect(run.out).toContain(`approve ${runId} pay --call ${first} --by NAME`);
    expect(effects()).toEqual([]);

    // A call id the step does not wait on: refused, nothing written.
    const before = await dump(prefix);
    const wrong = await flujo(['approve', runId, 'pay', '--call', 'ffffffffffff'], prefix);
    expect(wrong.code).toBe(2);
    expect(wrong.err).toContain(`waits on tool call ${first} (transfer@1), not ffffffffffff`);
    expect(await dump(prefix)).toEqual(before);

    const approved = await flujo(['approve', runId, 'pay', '--call', first, '--by', 'ana'], prefix);
    expect(approved.code, approved.err).toBe(0);
    expect(approved.out).toContain(`approved step "pay" (tool call ${first}) of run ${runId}`);
    // The step goes on to its second call, which waits in turn; the first one ran once.
    const resumed = await runFlujo(['resume', runId, job], { prefix, user: 'tester', env });
    expect(resumed.code, resumed.err).toBe(3);
    expect(effects()).toEqual(['500']);
    const second = /tool call ([0-9a-f]{12}): transfer@1 \{"cents":700\}/.exec(resumed.out)![1]!;
    expect(second).not.toBe(first);

    // The first call's id is stale now: refused, nothing written.
    const staleBefore = await dump(prefix);
    const stale = await flujo(['approve', runId, 'pay', '--call', first, '--by', 'ana'], prefix);
    expect(stale.code).toBe(2);
    expect(stale.err).toContain(`waits on tool call ${second} (transfer@1), not ${first}`);
    expect(await dump(prefix)).toEqual(staleBefore);

    expect(
      (await flujo(['approve', runId, 'pay', '--call', second, '--by', 'ana'], prefix)).code,
    ).toBe(0);
    const done = await runFlujo(['resume', runId, job], { prefix, user: 'tester', env });
    expect(done.code, done.err).toBe(0);
    expect(effects()).toEqual(['500', '700']);
    rmSync(dir, { recursive: true, force: true });
  });
});
