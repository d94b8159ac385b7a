/**
 * `flujo dev` as a user runs it, in a project folder outside the repo: it prints the Redis URL
 * (the project's embedded redis-server, as `flujo run` uses it), the web view's URL and what it
 * watches; runs started through that Redis are run by its worker; saving the module, or a file it
 * imports, replaces the worker so the next run gets the new code; a module that does not load
 * leaves the old worker running; SIGTERM stops it with exit 0 and no worker left behind (the
 * embedded Redis stays, as after `flujo run`, until `flujo redis stop`). The real binary (build
 * first with `npx tsc -p tsconfig.build.json`).
 */
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createRuntime, type Runtime } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { root, runFlujo, startFlujo } from '../helpers/cli.js';

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

const jobSource = (suffix: string) => `import { word } from './word.ts';

export const plan = { name: 'greet', steps: [{ id: 'say', kind: 'operator', operator: 'say' }] };
export const operators = { say: () => ({ text: \`\${word}\${'${suffix}'}\` }) };
`;

describe('flujo dev', () => {
  const project = mkdtempSync(join(tmpdir(), 'flujo-dev-'));
  afterAll(async () => {
    await runFlujo(['redis', 'stop'], { cwd: project, redis: 'none' });
    rmSync(project, { recursive: true, force: true });
  });

  it('runs, reloads on save, keeps the old worker through a broken save, serves the web view, stops on SIGTERM', async () => {
    writeFileSync(join(project, 'package.json'), '{ "name": "dev-try", "type": "module" }\n');
    mkdirSync(join(project, 'node_modules'));
    symlinkSync(root, join(project, 'node_modules', 'flujo'));
    writeFileSync(join(project, 'word.ts'), "export const word = 'hello';\n");
    writeFileSync(join(project, 'job.ts'), jobSource('!'));

    const dev = startFlujo(['dev', 'job.ts', '--port', '0'], {
      cwd: project,
      redis: 'none',
      timeoutMs: 170_000,
    });
    let runtime: Runtime | undefined;
    /** The first line of stdout, from character `after` on, that matches `pattern`. */
    const waitFor = async (pattern: RegExp, after = 0): Promise<RegExpExecArray> => {
      const match = () => {
        for (const l of dev.out().slice(after).split('\n')) {
          const found = pattern.exec(l);
          if (found !== null) return found;
        }
        return null;
      };
      await expect
        .poll(() => match() !== null || dev.child.exitCode !== null, {
          timeout: 60_000,
          interval: 100,
        })
        .toBe(true);
      const found = match();
      expect(found, `${pattern}:\n${dev.out()}\n${dev.err()}`).not.toBeNull();
      return found!;
    };
    const greet = async (): Promise<unknown> => {
      const run = await runtime!.start(
        { name: 'greet', steps: [{ id: 'say', kind: 'operator', operator: 'say' }] },
        null,
      );
      const report = await run.settled({ timeoutMs: 20_000 });
      expect(report.status).toBe('succeeded');
      return report.summary.produced['say'];
    };
    try {
      const redisUrl = (await waitFor(/^flujo dev: Redis (redis:\/\/\S+) \(prefix flujo\)/))[1]!;
      const webView = (await waitFor(/^flujo dev: web view (http:\/\/\S+)$/))[1]!;
      const first = Number((await waitFor(/^flujo dev: worker 1 \(pid (\d+)\) runs job\.ts/))[1]);
      await waitFor(/^flujo dev: watching job\.ts and 1 file it imports \(word\.ts\)/);
      expect(dev.err()).toContain(`data ${join(project, '.flujo', 'redis')}`);

      runtime = createRuntime({ redis: redisUrl, logger: silentLogger });
      expect(await greet()).toEqual({ text: 'hello!' });

      // A file the module imports.
      let seen = dev.out().length;
      writeFileSync(join(project, 'word.ts'), "export const word = 'bonjour';\n");
      const second = await waitFor(
        /^flujo dev: word\.ts changed: worker 2 \(pid (\d+)\) runs the new version; worker 1 stopped/,
        seen,
      );
      expect(alive(first)).toBe(false);
      expect(await greet()).toEqual({ text: 'bonjour!' });

      // The module itself: an operator's output.
      seen = dev.out().length;
      writeFileSync(join(project, 'job.ts'), jobSource('?'));
      await waitFor(/^flujo dev: job\.ts changed: worker 3 \(pid \d+\) runs the new version/, seen);
      expect(alive(Number(second[1]))).toBe(false);
      expect(await greet()).toEqual({ text: 'bonjour?' });

      // A module that does not load: its error is printed, worker 3 goes on with the last one.
      seen = dev.out().length;
      writeFileSync(join(project, 'job.ts'), 'export const plan = {\n');
      await waitFor(
        /^flujo dev: job\.ts changed: the module did not load \(worker 4 exited with code 2\); worker 3 \(pid \d+\) keeps running/,
        seen,
      );
      expect(dev.err()).toContain(
        '[worker 4] flujo worker: cannot load job module "job.ts": syntax error',
      );
      expect(await greet()).toEqual({ text: 'bonjour?' });

      const page = await fetch(webView);
      expect(page.status).toBe(200);
      expect(await page.text()).toContain('<html');

      const workerPids = [...dev.out().matchAll(/\(pid (\d+)\)/g)].map((m) => Number(m[1]));
      dev.child.kill('SIGTERM');
      const ended = await dev.done;
      expect(ended.code, ended.err).toBe(0);
      expect(ended.out).toContain('flujo dev: stopping');
      expect(ended.out).toContain('[worker 3] flujo worker: stopping (running units finish first;');
      for (const pid of workerPids) expect(alive(pid), `worker pid ${pid}`).toBe(false);

      // The embedded Redis it started stays for the next command, as after `flujo run`.
      const server = JSON.parse(
        readFileSync(join(project, '.flujo', 'redis', 'server.json'), 'utf8'),
      ) as { pid: number; port: number };
      expect(redisUrl).toBe(`redis://127.0.0.1:${server.port}`);
      expect(alive(server.pid)).toBe(true);
      await runtime.close();
      runtime = undefined;
      const stop = await runFlujo(['redis', 'stop'], { cwd: project, redis: 'none' });
      expect(stop.code, stop.err).toBe(0);
      await expect.poll(() => alive(server.pid), { timeout: 5000 }).toBe(false);
    } finally {
      await runtime?.close();
      if (dev.child.exitCode === null) dev.child.kill('SIGKILL');
    }
  }, 180_000);
});
