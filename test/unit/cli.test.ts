import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { main } from '../../src/cli/main.js';
import { createCliLogger } from '../../src/cli/log.js';

const dir = mkdtempSync(join(tmpdir(), 'flujo-cli-'));
function file(name: string, text: string): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
}

async function capture(argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  vi.spyOn(console, 'log').mockImplementation((...a: unknown[]) => void out.push(a.join(' ')));
  vi.spyOn(console, 'error').mockImplementation((...a: unknown[]) => void err.push(a.join(' ')));
  const code = await main(argv);
  return { code, out: out.join('\n'), err: err.join('\n') };
}

afterEach(() => {
  vi.restoreAllMocks();
});

describe('flujo validate', () => {
  it('prints a valid plan in dependency order and exits 0', async () => {
    const r = await capture(['validate', 'examples/kernel-tour/plan.json']);
    expect(r.code).toBe(0);
    expect(r.out).toBe(
      [
        'plan "kernel-tour": 5 steps, valid',
        '  fetch (operator)',
        '  summarize (operator) after fetch',
        '  translate (operator) after fetch',
        '  review (human_gate) after summarize, translate [approval]',
        '  publish (operator) after review',
        'note: steps summarize, translate declare no effects, so their tool calls are not checked against a class; declare e.g. effects: ["read_only", "external"] to refuse any other class before it runs',
      ].join('\n'),
    );
  });

  it('refuses an invalid plan with every problem and its path, exit 2', async () => {
    const bad = file(
      'bad.json',
      JSON.stringify({
        name: 'x',
        steps: [
          { id: 'a', kind: 'operator', operator: 'o', dependsOn: ['fetch'] },
          { id: 'a', kind: 'operator', operator: 'o' },
        ],
      }),
    );
    const r = await capture(['validate', bad]);
    expect(r.code).toBe(2);
    expect(r.out).toBe('');
    expect(r.err).toContain('Invalid plan (2 problems)');
    expect(r.err).toContain('steps[0].dependsOn[0]: unknown step "fetch"');
    expect(r.err).toContain('steps[1].id: duplicate step id "a"');
  });

  it('--json prints the plan or the error as one JSON object', async () => {
    const ok = await capture(['validate', 'examples/kernel-tour/plan.json', '--json']);
    expect(ok.code).toBe(0);
    expect((JSON.parse(ok.out) as { plan: { name: string } }).plan.name).toBe('kernel-tour');
    const bad = await capture(['validate', file('j.json', '{"name":"x"'), '--json']);
    expect(bad.code).toBe(2);
    const parsed = JSON.parse(bad.out) as {
      ok: boolean;
      error: { code: string; retryable: boolean };
    };
    expect(parsed).toMatchObject({ ok: false, error: { code: 'plan_invalid', retryable: false } });
  });

  it('names the fix for a missing or unreadable file, exit 2', async () => {
    expect((await capture(['validate'])).err).toBe(
      'flujo validate: name the plan file, e.g. `flujo validate plan.json`.',
    );
    const missing = await capture(['validate', join(dir, 'nope.json')]);
    expect(missing.code).toBe(2);
    expect(missing.err).toMatch(/cannot read ".*nope\.json": ENOENT/);
  });

  it('refuses unknown commands and options, exit 2', async () => {
    const r = await capture(['frobnicate']);
    expect(r.code).toBe(2);
    expect(r.err).toBe('flujo: unknown command "frobnicate". See `flujo --help`.');
    const o = await capture(['validate', '--frob']);
    expect(o.code).toBe(2);
    expect(o.err).toContain("Unknown option '--frob'");
  });

  it('prints help and the version', async () => {
    expect((await capture(['--help'])).out).toContain('flujo validate <plan.json | job-module>');
    expect((await capture(['--version'])).out).toMatch(/^\d+\.\d+\.\d+$/);
  });
});

describe('the command log', () => {
  it('writes readable lines from warn up, or from FLUJO_LOG_LEVEL', () => {
    const lines: string[] = [];
    const log = createCliLogger((l) => lines.push(l), {});
    log.info({ a: 1 }, 'quiet');
    log.warn({ model: 'x', n: 2 }, 'heads up');
    log.error({}, 'broken');
    expect(lines).toEqual(['flujo: warning: heads up (model=x n=2)\n', 'flujo: error: broken\n']);
    const chatty = createCliLogger((l) => lines.push(l), { FLUJO_LOG_LEVEL: 'debug' });
    chatty.debug({ k: [1] }, 'detail');
    expect(lines.at(-1)).toBe('flujo: debug: detail (k=[1])\n');
  });
});
