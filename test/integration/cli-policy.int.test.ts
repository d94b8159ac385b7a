/**
 * The real `flujo` binary (bin/flujo.js → dist, rebuilt when src/ changes) on refusals and
 * plan fields: too deep plans and inputs, policies, a resume with a changed plan.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runFlujo } from '../helpers/cli.js';
import { connect, deletePrefix, readPrefix, testPrefix } from '../helpers/redis.js';

const LINE = 'test/fixtures/jobs/line.ts';
const POLICY = 'test/fixtures/jobs/policy.ts';

const flujo = (args: string[], prefix: string) => runFlujo(args, { prefix, user: 'tester' });

let redis: Redis;
let dir: string;
const prefixes: string[] = [];
function newPrefix(): string {
  const p = testPrefix();
  prefixes.push(p);
  return p;
}
/** Every key of the prefix and its queue with contents, but BullMQ's expiring stalled-check mark. */
async function everything(prefix: string): Promise<Record<string, unknown>> {
  const all = {
    ...(await readPrefix(redis, `${prefix}:`)),
    ...(await readPrefix(redis, `{${prefix}:q}`)),
  };
  return Object.fromEntries(Object.entries(all).filter(([k]) => !k.endsWith(':stalled-check')));
}
const deep = (levels: number) => `${'{"a":'.repeat(levels)}1${'}'.repeat(levels)}`;

beforeAll(() => {
  redis = connect();
  dir = mkdtempSync(join(tmpdir(), 'flujo-cli-policy-'));
});
afterAll(async () => {
  for (const p of prefixes) {
    await deletePrefix(redis, `${p}:`);
    await deletePrefix(redis, `{${p}:q}`);
  }
  redis.disconnect();
  rmSync(dir, { recursive: true, force: true });
});

describe('too deep plans and inputs through the CLI', { timeout: 60_000 }, () => {
  it('validate refuses a plan nested 5,000 levels deep with exit 2 and the path', async () => {
    const file = join(dir, 'deep-plan.json');
    writeFileSync(
      file,
      `{"name":"p","steps":[{"id":"a","kind":"operator","operator":"x","input":${deep(5000)}}]}`,
    );
    const r = await flujo(['validate', file], newPrefix());
    expect(r.code).toBe(2);
    expect(r.err).toContain('steps[0].input.a.a.a: nested deeper than 512 levels');
    expect(r.err).not.toContain('RangeError');
  });

  it('run --input nested 5,000 levels deep exits 2 and leaves Redis as it was', async () => {
    const prefix = newPrefix();
    const first = await flujo(['run', LINE, '--input', '{"n":1}'], prefix);
    expect(first.code).toBe(0);
    const before = await everything(prefix);
    const r = await flujo(['run', LINE, '--input', deep(5000), '--request-key', 'k'], prefix);
    expect(r.code).toBe(2);
    expect(r.err).toContain('input.a.a.a.a.a.a: nested deeper than 512 levels');
    expect(r.out).toBe('');
    expect(await everything(prefix)).toEqual(before);
    const active = await redis.smembers(`${prefix}:active-runs`);
    expect(active).toEqual([]);
  });
});

describe('policies through the CLI', { timeout: 60_000 }, () => {
  it('run: an allowing policy_check and tagged policy let the run succeed (exit 0)', async () => {
    const r = await flujo(['run', POLICY], newPrefix());
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    expect(r.out).toContain('pay: RUNNING → SUCCEEDED');
  });

  it('run: a policy_check denial fails the run (exit 1) with policy_denied and the reason; pay never runs', async () => {
    const r = await flujo(['run', POLICY, '--input', '{"limit":100}'], newPrefix());
    expect(r.code).toBe(1);
    expect(r.out).toContain('check: RUNNING → FAILED_FINAL');
    expect(r.out).toContain('pay: PENDING → CANCELLED');
    expect(r.out).not.toContain('pay: PENDING → RUNNING');
    expect(r.out).toContain('blocked at: check');
    expect(r.out).toMatch(/reason: policy_denied.*amount 120 is over the limit 100/);
  });

  it('run: a tagged policy denial stops the tagged step before its operator (exit 1)', async () => {
    const r = await flujo(['run', POLICY, '--input', '{"limit":500,"closed":true}'], newPrefix());
    expect(r.code).toBe(1);
    expect(r.out).toContain('pay: RUNNING → FAILED_FINAL');
    expect(r.out).toMatch(/reason: policy_denied.*payments are closed/);
  });

  it('run: a policy the module does not define, or a tag no policy applies to, is refused (exit 2) before anything is written', async () => {
    const prefix = newPrefix();
    const cases: [string, string, RegExp][] = [
      [
        'unknown-policy.mjs',
        `export const plan = { name: 'u', steps: [{ id: 'c', kind: 'policy_check', policy: 'nope' }] };
export const policies = { other: () => ({ allow: true }) };`,
        /step "c" uses policy "nope", which the module's policies do not define \(it defines: other\)/,
      ],
      [
        'unbound-tag.mjs',
        `export const plan = { name: 'u', steps: [{ id: 'o', kind: 'operator', operator: 'o', policyTags: ['pii'] }] };
export const operators = { o: () => 1 };`,
        /step "o" carries policy tag "pii", which none of the module's policies applies to/,
      ],
      [
        'bad-policy.mjs',
        `export const plan = { name: 'u', steps: [{ id: 'c', kind: 'policy_check', policy: 'p' }] };
export const policies = { p: { check: () => ({ allow: true }), appliesTo: { tags: 'pii' } } };`,
        /policies\.p.*appliesTo\.tags: must be a non-empty array of tags/,
      ],
    ];
    for (const [file, text, message] of cases) {
      writeFileSync(join(dir, file), text);
      const r = await flujo(['run', join(dir, file)], prefix);
      expect(r.code).toBe(2);
      expect(r.err).toMatch(message);
      expect(r.out).toBe('');
    }
    expect(await everything(prefix)).toEqual({});
  });
});

describe('declared effects in flujo validate', { timeout: 60_000 }, () => {
  it('says which tool-calling steps declare no effects, and says nothing when all do', async () => {
    const file = join(dir, 'effects-plan.json');
    const steps = [
      { id: 'fetch', kind: 'operator', operator: 'fetch', effects: ['read_only'] },
      { id: 'send', kind: 'operator', operator: 'send', dependsOn: ['fetch'] },
      { id: 'ok', kind: 'human_gate', dependsOn: ['send'] },
    ];
    writeFileSync(file, JSON.stringify({ name: 'fx', steps }));
    const r = await flujo(['validate', file], newPrefix());
    expect(r.code).toBe(0);
    expect(r.lines.at(-1)).toBe(
      'note: step send declares no effects, so its tool calls are not checked against a class; declare e.g. effects: ["read_only", "external"] to refuse any other class before it runs',
    );
    const json = await flujo(['validate', file, '--json'], newPrefix());
    expect((JSON.parse(json.out) as { notes: string[] }).notes).toHaveLength(1);
    steps[1]!.effects = ['external'];
    writeFileSync(file, JSON.stringify({ name: 'fx', steps }));
    const all = await flujo(['validate', file], newPrefix());
    expect(all.code).toBe(0);
    expect(all.out).not.toContain('note:');
  });
});

describe('resume with another plan', { timeout: 60_000 }, () => {
  /** A job module without imports: `a` → `b` → `c`, plus `extra`; `b` fails finally unless `fixed`. */
  const moduleText = (o: { fixed: boolean; bRetries: number; extra: boolean }) => `
const calls = [];
export const plan = {
  name: 'changing',
  defaults: { retry: { maxAttempts: 2, initialDelayMs: 10, jitter: 0 } },
  steps: [
    { id: 'a', kind: 'operator', operator: 'ok' },
    { id: 'b', kind: 'operator', operator: 'b', dependsOn: ['a'], retry: { maxAttempts: ${o.bRetries} } },
    { id: 'c', kind: 'operator', operator: 'ok', dependsOn: ['b'] },
    ${o.extra ? "{ id: 'extra', kind: 'operator', operator: 'ok' }," : ''}
  ],
};
export const operators = {
  ok: () => ({ ok: true }),
  b: ({ attempt }) => {
    if (${o.fixed}) return { attempt };
    throw Object.assign(new Error('b is broken'), { retryable: false });
  },
};`;

  it('says which steps and fields differ and that the stored plan is used; failed steps go on with their attempts', async () => {
    const prefix = newPrefix();
    const first = join(dir, 'changing-1.mjs');
    const second = join(dir, 'changing-2.mjs');
    writeFileSync(first, moduleText({ fixed: false, bRetries: 2, extra: false }));
    writeFileSync(second, moduleText({ fixed: true, bRetries: 5, extra: true }));
    const run = await flujo(['run', first, '--json', '--request-key', 'rk'], prefix);
    expect(run.code).toBe(1);
    const runId = (JSON.parse(run.lines[0]!) as { runId: string }).runId;

    // The same plan: nothing to say. The resume gives b one more attempt (2), which fails.
    const same = await flujo(['resume', runId, first], prefix);
    expect(same.code).toBe(1);
    expect(same.err).toBe('');
    expect(same.out).toContain('b: FAILED_FINAL → READY (attempt 2)');
    expect(same.out).toContain('b: READY → RUNNING (attempt 2)');

    const resumed = await flujo(['resume', runId, second], prefix);
    expect(resumed.err).toBe(
      `flujo: warning: the plan of job module "${second}" differs from the plan run "${runId}" was started with (step "b": retry.maxAttempts; step "extra": added); the run goes on with its stored plan, with the module's operators, policies, tools and agents\n`,
    );
    expect(resumed.code).toBe(0);
    // The stored plan: no step "extra"; b is reopened with its attempts going on, c after it.
    expect(resumed.out).not.toContain('extra');
    expect(resumed.out).toContain('b: FAILED_FINAL → READY (attempt 3)');
    expect(resumed.out).toContain('b: READY → RUNNING (attempt 3)');
    expect(resumed.out).toContain('c: CANCELLED → PENDING');
    expect(resumed.out).toContain('c: READY → RUNNING (attempt 1)');

    // Run again with the request key: the existing run, and the same warning.
    const again = await flujo(['run', second, '--request-key', 'rk'], prefix);
    expect(again.code).toBe(0);
    expect(again.lines[0]).toBe(`run ${runId} (existing run of request key "rk")`);
    expect(again.err).toContain(`differs from the plan run "${runId}" was started with`);
  });
});
