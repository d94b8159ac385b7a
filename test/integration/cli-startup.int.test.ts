/**
 * What a command loads before Redis answers: the runtime, its stores' schemas and the agent code
 * cost most of a command's start-up, so a command that cannot reach Redis (or only reads) must
 * fail without them. Checked by the modules a `flujo` child resolves (the built CLI).
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runFlujo } from '../helpers/cli.js';

const IMPORT_LOG = join(import.meta.dirname, '..', 'fixtures', 'log-imports.mjs');
const dir = mkdtempSync(join(tmpdir(), 'flujo-startup-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

// Port 9 (discard) on loopback: nothing listens, every connection is refused at once.
const REFUSED = 'redis://127.0.0.1:9';

/** The modules of flujo's own dist/ that `flujo <args>` loaded, as paths below dist/. */
async function loaded(args: string[]): Promise<{ code: number | null; modules: string[] }> {
  const log = join(dir, `${randomUUID()}.log`);
  const r = await runFlujo([...args, '--redis', REFUSED, '--redis-timeout', '1000'], {
    redis: 'none',
    nodeArgs: [`--import=${IMPORT_LOG}`],
    env: { IMPORT_LOG: log },
  });
  const modules = readFileSync(log, 'utf8')
    .split('\n')
    .map((url) => /\/dist\/(.+\.js)$/.exec(url)?.[1])
    .filter((m): m is string => m !== undefined);
  return { code: r.code, modules };
}

describe('a command that cannot reach Redis', () => {
  it.each([
    [['status', 'run-1']],
    [['events', 'run-1']],
    [['list']],
    [['ledger', 'run-1']],
    [['usage', 'run-1']],
    [['approve', 'run-1', 'review', '--by', 'ana']],
    [['reject', 'run-1', 'review', '--by', 'ana']],
    [['cancel', 'run-1']],
  ])(
    'flujo %j exits 6 without loading the runtime or the stores',
    async (args) => {
      const { code, modules } = await loaded(args);
      expect(code).toBe(6);
      // The CLI itself was loaded and logged: the check below is not vacuous.
      expect(modules).toContain('cli/main.js');
      const heavy = modules.filter((m) =>
        /^(runtime|actors\/.*|persistence\/(quota-store|snapshot-store|ledger))\.js$/.test(m),
      );
      expect(heavy).toEqual([]);
    },
    30_000,
  );
});
