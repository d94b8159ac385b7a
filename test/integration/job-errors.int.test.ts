/**
 * Errors keep their identity, and a job module is checked in the user's terms before anything is
 * written: a thrown error's class, stack and causes are stored with the failed attempt and shown
 * by `flujo status`; a module with a syntax error, a misspelt export, ES module code in a
 * CommonJS package, or an old Node is refused with the place and the fix.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { describeThrown } from '../../src/errors.js';
import { createRuntime } from '../../src/index.js';
import { root, runFlujo } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const prefix = testPrefix();
// The refusals run under a prefix of their own, which nothing else writes: "nothing written" is
// then "no key at all", untouched by what the runs of the other tests leave expiring.
const refusals = testPrefix();

const flujo = (args: string[], cwd = root, nodeArgs: string[] = [], under = prefix) =>
  runFlujo(args, { prefix: under, cwd, nodeArgs });

/** How many keys the test prefix has: a refused module must leave it unchanged. */
async function keyCount(): Promise<number> {
  const redis = connect();
  try {
    const [, keys] = await redis.scan('0', 'MATCH', `${refusals}*`, 'COUNT', 10_000);
    const [, queue] = await redis.scan('0', 'MATCH', `{${refusals}:q}*`, 'COUNT', 10_000);
    return keys.length + queue.length;
  } finally {
    redis.disconnect();
  }
}

const dirs: string[] = [];
function project(files: Record<string, string>): string {
  const dir = mkdtempSync(join(tmpdir(), 'flujo-mod-'));
  dirs.push(dir);
  for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
  return dir;
}

afterAll(async () => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  await deleteRuntimeKeys(prefix);
  await deleteRuntimeKeys(refusals);
});

describe('a failed attempt keeps what was thrown', () => {
  it('describeThrown keeps class, message, at most 20 frames and the cause chain', () => {
    const deep = (n: number): never => (n === 0 ? fail() : deep(n - 1));
    const fail = (): never => {
      throw new TypeError('bad', { cause: new RangeError('inner', { cause: 'text cause' }) });
    };
    let thrown: unknown;
    try {
      deep(40);
    } catch (e) {
      thrown = e;
    }
    const d = describeThrown(thrown)!;
    expect(d.name).toBe('TypeError');
    expect(d.message).toBe('bad');
    // As many frames as V8 keeps (Error.stackTraceLimit, 10 by default), at most 20.
    expect(d.stack!.split('\n')).toHaveLength(Math.min(20, Error.stackTraceLimit));
    expect(d.stack!.length).toBeLessThanOrEqual(4096);
    expect(d.causes).toEqual([
      { name: 'RangeError', message: 'inner' },
      { name: 'string', message: '"text cause"' },
    ]);
    expect(describeThrown('not an error')).toBeUndefined();
  });

  it('the runtime stores the TypeError (not UnknownError) with its stack and cause', async () => {
    const runtime = createRuntime({
      redis: redisUrl(),
      prefix,
      operators: {
        parse: () => {
          throw new TypeError('cannot parse', { cause: new RangeError('out of range') });
        },
      },
    });
    const worker = runtime.createWorker();
    try {
      await worker.ready();
      const plan = {
        name: 'throws',
        steps: [
          { id: 'parse', kind: 'operator' as const, operator: 'parse', retry: { maxAttempts: 1 } },
        ],
      };
      const done = await (await runtime.start(plan)).settled({ timeoutMs: 20_000 });
      expect(done.status).toBe('failed');
      const error = done.steps[0]!.error!;
      expect(error.code).toBe('unknown');
      expect(error.thrown?.name).toBe('TypeError');
      expect(error.thrown?.message).toBe('cannot parse');
      expect(error.thrown?.stack).toMatch(/^at /);
      expect(error.thrown?.causes).toEqual([{ name: 'RangeError', message: 'out of range' }]);
    } finally {
      await worker.close();
      await runtime.close();
    }
  });

  it('flujo status shows the class and the cause, and with --verbose the stack', async () => {
    const run = await flujo(['run', 'test/fixtures/jobs/throws.ts']);
    expect(run.code, run.err).toBe(1);
    const runId = /^run (\S+) /.exec(run.out)![1]!;
    const status = await flujo(['status', runId]);
    expect(status.code).toBe(1);
    const lines = status.out.split('\n');
    const at = lines.findIndex((l) => l.includes('unknown: TypeError: cannot parse amount "12,5"'));
    expect(at, status.out).toBeGreaterThan(0);
    expect(lines[at + 1]).toMatch(/^\s+caused by RangeError: amount out of range$/);
    expect(status.out).not.toMatch(/^\s+at /m);
    const verbose = await flujo(['status', runId, '--verbose']);
    const vlines = verbose.out.split('\n');
    const vat = vlines.findIndex((l) => l.includes('TypeError: cannot parse amount "12,5"'));
    expect(vlines[vat + 1]).toMatch(/^\s+at parseAmount \(.*throws\.ts:\d+:\d+\)$/);
    expect(verbose.out).toContain('caused by RangeError: amount out of range');
  }, 30_000);
});

describe('a job module is checked before anything is written', () => {
  it('a syntax error names the file, line and column (.mjs and .ts)', async () => {
    const source = 'export const plan = {\n  name: "x",\n  steps: [ oops oops ]\n};\n';
    const dir = project({ 'bad.mjs': source, 'bad.ts': source });
    const before = await keyCount();
    expect(before).toBe(0);
    for (const file of ['bad.mjs', 'bad.ts']) {
      const r = await flujo(['run', file], dir, [], refusals);
      expect(r.code, r.err).toBe(2);
      expect(r.err).toContain(`syntax error at "${file}:3:17"`);
    }
    expect(await keyCount()).toBe(before);
  });

  it('a misspelt export is named with what was meant, and nothing is written', async () => {
    const before = await keyCount();
    expect(before).toBe(0);
    const r = await flujo(['run', 'test/fixtures/jobs/misspelt.ts'], root, [], refusals);
    expect(r.code).toBe(2);
    expect(r.err.trim()).toBe(
      'flujo run: job module "test/fixtures/jobs/misspelt.ts" exports "operator", which flujo does not read; did you mean "operators"? Rename it: `export const operators = …`',
    );
    const tool = project({
      'job.mjs':
        "export const plan = { name: 'p', steps: [] };\nexport const operators = {};\nexport const tool = [];\n",
    });
    const t = await flujo(['run', 'job.mjs'], tool, [], refusals);
    expect(t.code).toBe(2);
    expect(t.err).toContain('exports "tool", which flujo does not read; did you mean "tools"?');
    expect(await keyCount()).toBe(before);
  });

  it('a default export that is the job is read, also beside a named plan the module shares', async () => {
    const dir = project({
      'job.mjs': [
        "export const plan = { name: 'shared', steps: [{ id: 'a', kind: 'operator', operator: 'a' }] };",
        "export default { plan, operators: { a: () => ({ from: 'the default export' }) } };",
      ].join('\n'),
    });
    const r = await flujo(['run', 'job.mjs', '--json'], dir);
    expect(r.code, r.err).toBe(0);
    const result = r.lines
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { type: string; status?: string })
      .find((e) => e.type === 'result');
    expect(result?.status).toBe('succeeded');
  });

  it('ES module code in a CommonJS package says so and how to fix it', async () => {
    const before = await keyCount();
    expect(before).toBe(0);
    const dir = project({
      'package.json': '{ "type": "commonjs" }',
      'job.js': "import { readFileSync } from 'node:fs';\nexport const plan = {};\n",
    });
    const r = await flujo(['run', 'job.js'], dir, [], refusals);
    expect(r.code).toBe(2);
    expect(r.err).toContain(
      'it is ES module code (import/export), but its package.json (package.json) says "type": "commonjs", so Node loads it as CommonJS; add "type": "module" to that package.json, or rename the module to .mjs',
    );
    expect(await keyCount()).toBe(before);
  });

  it('on a Node older than 22.12 the command says which version it needs, and loads nothing', async () => {
    const before = await keyCount();
    expect(before).toBe(0);
    // The preload makes this Node report an old version, as an old Node would.
    const old =
      'data:text/javascript,Object.defineProperty(process.versions,"node",{value:"20.11.1"})';
    const r = await flujo(['run', 'test/fixtures/jobs/line.ts'], root, ['--import', old], refusals);
    expect(r.code).toBe(2);
    expect(r.out).toBe('');
    expect(r.err).toMatch(
      /^flujo: this is Node 20\.11\.1 \(.*\); flujo needs Node 22\.12 or newer/,
    );
    // The fix within the project comes first: Node 24 as a devDependency, then npx / npm run.
    const fix = r.err.indexOf(
      'npm pkg set allowScripts.node=true --json && npm install -D node@24',
    );
    expect(fix).toBeGreaterThan(0);
    expect(r.err.indexOf('then run flujo as npx flujo')).toBeGreaterThan(fix);
    expect(r.err.indexOf('nvm install 24')).toBeGreaterThan(fix);
    expect(await keyCount()).toBe(before);
  });

  it('on Node 20, flujo init still sets a project up (with Node 24 as a devDependency)', async () => {
    const old =
      'data:text/javascript,Object.defineProperty(process.versions,"node",{value:"20.11.1"})';
    const dir = mkdtempSync(join(tmpdir(), 'flujo-init-old-'));
    try {
      const r = await flujo(['init', 'proj'], dir, ['--import', old], refusals);
      expect(r.err).toBe('');
      expect(r.code).toBe(0);
      const pkg = JSON.parse(readFileSync(join(dir, 'proj', 'package.json'), 'utf8')) as {
        devDependencies?: Record<string, string>;
      };
      expect(pkg.devDependencies?.node).toBe('^24');
      // Any other command is still refused on that Node, with the fix.
      const run = await flujo(['validate', 'proj/jobs/hello.ts'], dir, ['--import', old], refusals);
      expect(run.code).toBe(2);
      expect(run.err).toMatch(/flujo needs Node 22\.12 or newer/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
