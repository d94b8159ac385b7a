/**
 * From install to a first durable run, as a new user does it: the repo is packed (`npm pack`,
 * of the built dist), the tarball installed into a fresh project outside the repo with one
 * `npm install`, `npx flujo init` scaffolds a job (with Node 24 as a devDependency, unless
 * `--no-node`), `npx flujo run` runs it to success on the
 * embedded Redis, `tsc` type-checks it, and a step naming a missing operator is a type error and
 * a `flujo validate` error.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { root, spawnChild, type ChildResult } from '../helpers/cli.js';

// npm and npx run on the pinned Node (as they would on the user's Node 22.12 or newer).
const PATH = [join(root, 'node_modules', 'node', 'bin'), process.env['PATH'] ?? ''].join(delimiter);

function sh(command: string, args: string[], cwd: string): Promise<ChildResult> {
  const env: NodeJS.ProcessEnv = { ...process.env, PATH };
  for (const k of Object.keys(env)) if (k.startsWith('npm_')) delete env[k];
  delete env['REDIS_URL'];
  delete env['FLUJO_PREFIX'];
  return spawnChild(command, args, { cwd, env }).done;
}

describe('npm pack → npm install → npx flujo init → npx flujo run', () => {
  const tmp = mkdtempSync(join(tmpdir(), 'flujo-install-'));
  const project = join(tmp, 'my-jobs');
  let tarball: string;
  const typescript = (
    JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
      devDependencies: Record<string, string>;
    }
  ).devDependencies['typescript']!;

  beforeAll(async () => {
    const pack = await sh('npm', ['pack', '--ignore-scripts', '--pack-destination', tmp], root);
    expect(pack.code, pack.err).toBe(0);
    tarball = join(tmp, pack.out.trim().split('\n').at(-1)!);
    mkdirSync(project);
    // As the README's "Use it in your project" says: npm init -y (npm 11 writes "type": "commonjs"; init makes it "module").
    const npmInit = await sh('npm', ['init', '-y'], project);
    expect(npmInit.code, npmInit.err).toBe(0);
    const install = await sh(
      'npm',
      [
        'install',
        tarball,
        `typescript@${typescript}`,
        '@types/node@^24',
        '--prefer-offline',
        '--no-audit',
        '--no-fund',
      ],
      project,
    );
    expect(install.code, install.err).toBe(0);
  }, 120_000);

  afterAll(async () => {
    await sh('npx', ['flujo', 'redis', 'stop'], project);
    rmSync(tmp, { recursive: true, force: true });
  });

  it('one install brings the bin, the package, its types and the peers (zod, openai)', () => {
    for (const pkg of ['flujo', 'zod', 'openai']) {
      const json = JSON.parse(
        readFileSync(join(project, 'node_modules', pkg, 'package.json'), 'utf8'),
      ) as { name: string };
      expect(json.name).toBe(pkg);
    }
    const installed = JSON.parse(
      readFileSync(join(project, 'node_modules', 'flujo', 'package.json'), 'utf8'),
    ) as { peerDependencies: Record<string, string>; dependencies: Record<string, string> };
    expect(Object.keys(installed.peerDependencies).sort()).toEqual(['openai', 'zod']);
    expect(installed.dependencies['node']).toBeUndefined();
  });

  it('the published types leave out internal members and check without skipLibCheck', async () => {
    const dist = join(project, 'node_modules', 'flujo', 'dist');
    const runtimeTypes = readFileSync(join(dist, 'runtime.d.ts'), 'utf8');
    expect(runtimeTypes).toContain('export interface Runtime {');
    expect(runtimeTypes).not.toMatch(/readonly core\b/);
    expect(runtimeTypes).not.toContain('runtimeCore');
    // In the project, so 'flujo' resolves as a user's code resolves it; .mts, whatever its type.
    const check = join(project, 'types-check');
    mkdirSync(check);
    try {
      writeFileSync(
        join(check, 'uses.mts'),
        [
          "import { createRuntime, type Runtime } from 'flujo';",
          "import { startScriptedModelServer } from 'flujo/testing';",
          'export const uses = [createRuntime, startScriptedModelServer];',
          "// @ts-expect-error the runtime's core is not part of its published type",
          'export const core = (runtime: Runtime) => runtime.core;',
          '',
        ].join('\n'),
      );
      writeFileSync(
        join(check, 'tsconfig.json'),
        JSON.stringify({
          compilerOptions: {
            module: 'NodeNext',
            moduleResolution: 'NodeNext',
            target: 'ES2022',
            strict: true,
            noEmit: true,
            skipLibCheck: false,
            types: ['node'],
          },
          files: ['uses.mts'],
        }),
      );
      const tsc = await sh('npx', ['tsc', '-p', 'types-check'], project);
      expect(tsc.out.split('\n').filter((l) => l.includes('flujo/dist'))).toEqual([]);
      expect(tsc.code, tsc.out).toBe(0);
    } finally {
      rmSync(check, { recursive: true, force: true });
    }
  }, 60_000);

  it('init scaffolds a typed job that runs to success and type-checks', async () => {
    const init = await sh('npx', ['flujo', 'init'], project);
    expect(init.code, init.err).toBe(0);
    expect(init.out).toContain('job module: jobs/hello.ts');
    expect(init.out).toContain('run it:     npx flujo run jobs/hello.ts');
    const pkg = JSON.parse(readFileSync(join(project, 'package.json'), 'utf8')) as {
      type: string;
      scripts: Record<string, string>;
      dependencies: Record<string, string>;
      devDependencies: Record<string, string>;
      allowScripts: Record<string, unknown>;
    };
    expect(pkg.type).toBe('module');
    // Node 24 for npx and the npm scripts, whatever node is on PATH, with npm 11's allowance for
    // its install script; the dependencies installed before stay.
    expect(pkg.devDependencies).toEqual({ node: '^24' });
    expect(Object.keys(pkg.dependencies)).toEqual(
      expect.arrayContaining(['flujo', 'typescript', '@types/node']),
    );
    expect(pkg.allowScripts).toEqual({ node: true });
    expect(init.out).toContain('node:       Node ^24 as a devDependency');
    expect(init.out).toContain('then:       npm install');
    expect(Object.keys(pkg.scripts)).toEqual(
      expect.arrayContaining(['run', 'resume', 'worker', 'typecheck']),
    );

    const run = await sh('npx', ['flujo', 'run', 'jobs/hello.ts'], project);
    expect(run.code, run.err).toBe(0);
    const runId = /^run (\S+) /.exec(run.out)?.[1];
    expect(run.out).toContain(`resume: npx flujo resume ${runId} jobs/hello.ts`);
    expect(run.out).toMatch(/count: RUNNING → SUCCEEDED/);
    expect(run.out).toContain(`run ${runId} succeeded`);
    expect(run.err).toContain(`data ${join(project, '.flujo', 'redis')}`);

    // From a subfolder: the same project, the same embedded Redis, the run is there.
    const status = await sh('npx', ['flujo', 'status', runId!, '--json'], join(project, 'jobs'));
    expect(status.code, status.err).toBe(0);
    expect((JSON.parse(status.out) as { status: string }).status).toBe('succeeded');
    expect(status.err).not.toContain('started the embedded');

    const tsc = await sh('npx', ['tsc', '-p', '.'], project);
    expect(tsc.code, tsc.out).toBe(0);
  }, 90_000);

  it('init --no-node adds no Node devDependency and no allowScripts entry', async () => {
    const init = await sh('npx', ['flujo', 'init', 'without-node', '--no-node'], project);
    expect(init.code, init.err).toBe(0);
    const pkg = JSON.parse(
      readFileSync(join(project, 'without-node', 'package.json'), 'utf8'),
    ) as Record<string, unknown>;
    expect(pkg['type']).toBe('module');
    expect(pkg['devDependencies']).toBeUndefined();
    expect(pkg['allowScripts']).toBeUndefined();
    expect(init.out).not.toContain('devDependency');
    expect(init.out).not.toContain('npm install (in');
    expect(init.out).toContain('job module: without-node/jobs/hello.ts');
  });

  it('a step naming an operator the job lacks is a type error and a validate error', async () => {
    const bad = readFileSync(join(root, 'test/fixtures/jobs/typed-bad.ts'), 'utf8').replace(
      /\s*\/\/ @ts-expect-error[^\n]*/,
      '',
    );
    writeFileSync(join(project, 'jobs', 'bad.ts'), bad);
    try {
      const tsc = await sh('npx', ['tsc', '-p', '.'], project);
      expect(tsc.code).not.toBe(0);
      expect(tsc.out).toContain("Property 'summarise' is missing");
      const validate = await sh('npx', ['flujo', 'validate', 'jobs/bad.ts'], project);
      expect(validate.code).toBe(2);
      expect(validate.err).toContain(
        'step "b" uses operator "summarise", which the module\'s operators do not define',
      );
    } finally {
      rmSync(join(project, 'jobs', 'bad.ts'));
    }
  }, 60_000);
});
