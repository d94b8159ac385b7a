/**
 * `flujo trace` through the real binary (bin/flujo.js → dist, rebuilt when src/ changes) against
 * the suite's Redis: the JSON trace of a finished run, the HTML timeline written with --out, and
 * the bad inputs, each refused with exit 2 and a message naming the fix, writing nothing.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunTrace } from '../../src/index.js';
import { runFlujo } from '../helpers/cli.js';
import { deleteRuntimeKeys, testPrefix } from '../helpers/redis.js';

const LINE = 'test/fixtures/jobs/line.ts';

const prefix = testPrefix();
let dir: string;

const flujo = (args: string[]) => runFlujo(args, { prefix });

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'flujo-cli-trace-'));
  const run = await flujo(['run', LINE, '--run-id', 'traced-line']);
  expect(run.code, run.err).toBe(0);
});
afterAll(async () => {
  await deleteRuntimeKeys(prefix);
  rmSync(dir, { recursive: true, force: true });
});

describe('flujo trace', () => {
  it('prints the run as a JSON trace', async () => {
    const r = await flujo(['trace', 'traced-line']);
    expect(r.code, r.err).toBe(0);
    const trace = JSON.parse(r.out) as RunTrace;
    expect(trace).toMatchObject({ runId: 'traced-line', planName: 'line', status: 'succeeded' });
    expect(trace.steps.map((s) => [s.stepId, s.attempts.map((a) => a.outcome)])).toEqual([
      ['a', ['succeeded']],
      ['b', ['succeeded']],
      ['c', ['succeeded']],
    ]);
    // Each step starts after the one it depends on ended.
    const [a, b, c] = trace.steps.map((s) => s.attempts[0]!);
    expect(b!.start).toBeGreaterThanOrEqual(a!.end!);
    expect(c!.start).toBeGreaterThanOrEqual(b!.end!);
  });

  it('writes the HTML timeline to --out', async () => {
    const file = join(dir, 'line.html');
    const r = await flujo(['trace', 'traced-line', '--html', '--out', file]);
    expect(r.code, r.err).toBe(0);
    expect(r.out).toContain(`wrote the timeline of run traced-line to ${file}`);
    const html = readFileSync(file, 'utf8');
    expect(html.startsWith('<!doctype html>')).toBe(true);
    expect(html).toContain('"runId":"traced-line"');
    // Self-contained: no script, style sheet or image from elsewhere.
    expect(html).not.toMatch(/<(script|link|img)[^>]+(src|href)=/i);
  });

  it.each([
    [['trace'], 'name the run id'],
    [['trace', 'traced-line', 'extra'], 'unexpected argument "extra"'],
    [['trace', 'no-such-run'], 'no-such-run'],
    [['trace', 'traced-line', '--json'], '--json does not apply'],
  ])('refuses %j with exit 2', async (args, message) => {
    const r = await flujo(args);
    expect(r.code).toBe(2);
    expect(r.err).toContain(message);
    expect(r.out).toBe('');
  });

  it('refuses an --out whose folder does not exist, before reading anything', async () => {
    const file = join(dir, 'missing', 'line.html');
    const r = await flujo(['trace', 'traced-line', '--html', '--out', file]);
    expect(r.code).toBe(2);
    expect(r.err).toContain(`--out ${file}: the folder ${join(dir, 'missing')} does not exist`);
    expect(existsSync(join(dir, 'missing'))).toBe(false);
    const folder = await flujo(['trace', 'traced-line', '--out', dir]);
    expect(folder.code).toBe(2);
    expect(folder.err).toContain(`--out ${dir} is a folder`);
  });
});
