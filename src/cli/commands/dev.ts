/**
 * `flujo dev <job-module>`: one command for working on a job module. It connects to Redis as
 * `flujo run` does (the project's embedded redis-server unless `--redis` or `REDIS_URL` names one;
 * the embedded server keeps running afterwards, as it does after `flujo run`), starts the web view
 * (`flujo ui`), and runs a worker for the module that is replaced whenever the module, or a file
 * of the project it imports, changes. Until SIGINT or SIGTERM, which stop everything.
 *
 * Each generation of the module runs in a worker child process (`flujo worker`), not in this
 * process with a cache-busting query on the module's import URL, because:
 * - a fresh process loads the whole module graph again: the files the module imports are reloaded
 *   too (a query string busts the cache of the module file only);
 * - an old generation is gone once its process exits, with its `setup` teardown run, its servers,
 *   timers and open handles (in one process every generation would stay loaded);
 * - a module that throws, hangs or exits at load cannot hurt the web view or the running worker.
 * It costs a Node start-up per reload (well under a second).
 *
 * A reload: the new generation starts and loads the module; once it is ready, the old worker is
 * sent SIGTERM and closes as `flujo worker` does (its running units finish first). A module that
 * fails to load prints its error, and the old worker keeps running.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { UiServer } from '../../ui/server.js';
import { connect, projectRoot } from '../connect.js';
import { maskRedisUrl, parseConcurrency, type Ctx } from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';
import { listenUi, parsePort } from './ui.js';

/** The package's root (dist/cli/commands → the root), its `flujo` binary and the import recorder. */
const PACKAGE_ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const FLUJO_BIN = join(PACKAGE_ROOT, 'bin', 'flujo.js');
const PRELOAD = fileURLToPath(new URL('../dev-child.js', import.meta.url));
/**
 * How often watched files are checked. Polling (a stat of each of a few files) survives editors
 * that save by replacing the file, which a file watcher loses.
 */
const POLL_MS = 200;
/** Changes closer together than this make one reload. */
const SETTLE_MS = 150;
/** What `flujo worker` prints once it takes work. */
const READY_LINE = 'flujo worker: processing runs';

/** A worker child process running one generation of the module. */
interface Generation {
  n: number;
  child: ChildProcess;
  /** The files this generation loaded (the recorder's list). */
  importsFile: string;
  /** Resolves true once the worker takes work, false if it exits first. */
  ready: Promise<boolean>;
  exited: Promise<number | null>;
  /** Sends SIGTERM (once: a second one would end `flujo worker` at once, not gracefully). */
  stop(): void;
}

/** `flujo dev <job-module> [--port P] [--host H] [--concurrency N]` */
export async function cmdDev(ctx: Ctx): Promise<number> {
  const v = ctx.values;
  const path = ctx.args[0];
  if (path === undefined || path === '') {
    badInput('name the job module, e.g. `flujo dev jobs/hello.ts`; see `flujo --help`');
  }
  if (ctx.args.length > 1) badInput(`unexpected argument "${ctx.args[1]}"; see \`flujo --help\``);
  const file = resolve(ctx.cwd, path);
  let isFile = false;
  try {
    isFile = statSync(file).isFile();
  } catch {
    badInput(`job module "${path}" not found; pass the path to a module that exports plan`);
  }
  if (!isFile)
    badInput(`job module "${path}" is not a file; pass the path to a module (.js, .mjs or .ts)`);
  const port = parsePort(v.port);
  const host = v.host ?? '127.0.0.1';
  if (host.trim() === '') badInput('--host is empty; pass an address, e.g. --host 127.0.0.1');
  const concurrency = parseConcurrency(v.concurrency);
  const shown = relative(ctx.cwd, file) || file;
  const say = (line: string) => console.log(`flujo dev: ${line}`);

  const conn = await connect({ ...v, cwd: ctx.cwd, env: ctx.env, long: true });
  const scratch = mkdtempSync(join(tmpdir(), 'flujo-dev-'));
  let ui: UiServer | undefined;
  try {
    ui = await listenUi(conn.runtime(), port, host);
    // A URL with a password is not printed: its server is named, and the user has its URL.
    const secret = maskRedisUrl(conn.url) !== conn.url;
    say(
      secret
        ? `Redis ${conn.target} (prefix ${conn.prefix}); other commands reach it with the --redis URL given here`
        : `Redis ${conn.url} (prefix ${conn.prefix}); other commands reach it with --redis ${conn.url}`,
    );
    say(`web view ${ui.url}`);

    // The worker children reach this very Redis and prefix, whatever the environment says.
    const childArgs = [
      '--redis',
      conn.url,
      '--prefix',
      conn.prefix,
      '--concurrency',
      String(concurrency),
      ...(v['redis-timeout'] === undefined ? [] : ['--redis-timeout', v['redis-timeout']]),
      ...(v.replicas === undefined ? [] : ['--replicas', v.replicas]),
      ...(v['replicas-timeout'] === undefined ? [] : ['--replicas-timeout', v['replicas-timeout']]),
    ];
    let count = 0;
    const start = (): Generation => {
      const n = ++count;
      const importsFile = join(scratch, `imports-${n}.txt`);
      const child = spawn(
        process.execPath,
        ['--import', PRELOAD, FLUJO_BIN, 'worker', path, ...childArgs],
        {
          cwd: ctx.cwd,
          env: { ...ctx.env, FLUJO_DEV_IMPORTS: importsFile },
          // stdin: a pipe that closes when this process ends, which stops the worker (dev-child.ts).
          stdio: ['pipe', 'pipe', 'pipe'],
        },
      );
      let readyNow: (ok: boolean) => void = () => {};
      const ready = new Promise<boolean>((r) => (readyNow = r));
      let isReady = false;
      const forward = (stream: NodeJS.ReadableStream, to: NodeJS.WriteStream, err: boolean) => {
        let rest = '';
        stream.setEncoding('utf8');
        stream.on('data', (chunk: string) => {
          rest += chunk;
          const lines = rest.split('\n');
          rest = lines.pop() ?? '';
          for (const line of lines) {
            to.write(`[worker ${n}] ${line}\n`);
            if (!isReady && !err && line.startsWith(READY_LINE)) {
              isReady = true;
              readyNow(true);
            }
          }
        });
      };
      forward(child.stdout, process.stdout, false);
      forward(child.stderr, process.stderr, true);
      // Ended at 'close' (its output read to the end), or a second after 'exit' when something
      // the worker started still holds its output open.
      const exited = new Promise<number | null>((r) => {
        const end = (code: number | null) => {
          readyNow(false);
          r(code);
        };
        child.once('error', () => end(null));
        child.once('close', end);
        child.once('exit', (code) => setTimeout(() => end(code), 1000).unref());
      });
      let signalled = false;
      const stop = () => {
        if (signalled || child.exitCode !== null || child.signalCode !== null) return;
        signalled = true;
        child.kill('SIGTERM');
      };
      return { n, child, importsFile, ready, exited, stop };
    };

    /** The module file and the project files the generation loaded (not packages, not flujo). */
    const watchList = (gen: Generation | undefined): string[] => {
      const files = new Set([file]);
      if (gen === undefined) return [...files];
      const project = projectRoot(ctx.cwd) + sep;
      const flujoDist = join(PACKAGE_ROOT, 'dist') + sep;
      let recorded: string[] = [];
      try {
        recorded = readFileSync(gen.importsFile, 'utf8').split('\n');
      } catch {
        // Nothing recorded (a Node without module.registerHooks): the module file alone.
      }
      for (const f of recorded) {
        if (f === '' || !f.startsWith(project) || f.startsWith(flujoDist)) continue;
        if (f.split(sep).includes('node_modules') || f === FLUJO_BIN) continue;
        files.add(f);
      }
      return [...files];
    };

    let current: Generation | undefined;
    let starting: Generation | undefined;
    let watched: string[] = [];
    let stopping = false;
    let settle: NodeJS.Timeout | undefined;
    let reloading: Promise<void> | undefined;
    let again = false;
    let reload = (_changed: string): Promise<void> => Promise.resolve();
    /** The files changed since the last reload began, for its message. */
    const changed = new Set<string>();
    /** Each watched file's last seen state: mtime, size and inode ('' when it is missing). */
    const seenState = new Map<string, string>();
    const stateOf = (f: string): string => {
      try {
        const st = statSync(f);
        return `${st.mtimeMs}:${st.size}:${st.ino}`;
      } catch {
        return '';
      }
    };
    const poll = setInterval(() => {
      if (stopping) return;
      for (const [f, before] of seenState) {
        const now = stateOf(f);
        if (now === before) continue;
        seenState.set(f, now);
        changed.add(relative(ctx.cwd, f) || f);
        clearTimeout(settle);
        settle = setTimeout(() => {
          const what = [...changed].join(', ');
          changed.clear();
          void reload(what);
        }, SETTLE_MS);
      }
    }, POLL_MS);
    const watch = (files: string[]) => {
      if (files.join('\n') === watched.join('\n')) return;
      watched = files;
      for (const f of [...seenState.keys()]) if (!files.includes(f)) seenState.delete(f);
      for (const f of files) if (!seenState.has(f)) seenState.set(f, stateOf(f));
      const others = watched.filter((f) => f !== file).map((f) => relative(ctx.cwd, f));
      say(
        `watching ${shown}${
          others.length === 0
            ? ''
            : ` and ${others.length} file${others.length === 1 ? '' : 's'} it imports (${others.join(', ')})`
        }; saving one reloads the worker`,
      );
    };

    /** Starts a generation; true when it took work (it is then the current one). */
    const launch = async (why: string): Promise<boolean> => {
      const next = start();
      starting = next;
      const ok = await next.ready;
      starting = undefined;
      if (stopping) {
        next.stop();
        await next.exited;
        return false;
      }
      if (!ok) {
        const code = await next.exited;
        const kept =
          current === undefined
            ? 'no worker runs until the module loads; fix it and save'
            : `worker ${current.n} (pid ${current.child.pid}) keeps running the last version that loaded`;
        say(`${why}: the module did not load (worker ${next.n} exited with code ${code}); ${kept}`);
        // The files the failed generation loaded still tell what to watch: keep the old list too.
        watch([...new Set([...watched, ...watchList(next)])]);
        rmSync(next.importsFile, { force: true });
        return false;
      }
      const old = current;
      current = next;
      if (old !== undefined) {
        old.stop();
        await old.exited;
        rmSync(old.importsFile, { force: true });
        say(
          `${why}: worker ${next.n} (pid ${next.child.pid}) runs the new version; worker ${old.n} stopped (its running units finished first)`,
        );
      } else {
        say(`worker ${next.n} (pid ${next.child.pid}) runs ${shown}; Ctrl-C stops everything`);
      }
      watch(watchList(next));
      return true;
    };

    /** One launch at a time; changes that come meanwhile make one more. */
    let pending = '';
    const run = (why: string): Promise<void> => {
      if (reloading !== undefined) {
        again = true;
        pending = pending === '' ? why : `${pending}, ${why}`;
        return reloading;
      }
      reloading = (async () => {
        let reason = why;
        do {
          again = false;
          await launch(reason);
          reason = pending;
          pending = '';
        } while (again && !stopping);
        reloading = undefined;
      })();
      return reloading;
    };
    reload = (what) => run(`${what} changed`);

    const stopped = new Promise<void>((done) => {
      const stop = () => {
        process.off('SIGINT', stop);
        process.off('SIGTERM', stop);
        stopping = true;
        done();
      };
      process.on('SIGINT', stop);
      process.on('SIGTERM', stop);
    });
    // The first generation; a module that does not load yet is waited for (fix it and save). The
    // module file is watched from now on, so a save while it loads reloads it once more.
    watch([file]);
    void run('start');
    await stopped;

    clearTimeout(settle);
    clearInterval(poll);
    say('stopping (the worker finishes its running units first)');
    starting?.stop();
    await reloading;
    if (current !== undefined) {
      current.stop();
      await current.exited;
    }
    return ExitCode.ok;
  } finally {
    await ui?.close();
    await conn.close();
    rmSync(scratch, { recursive: true, force: true });
  }
}
