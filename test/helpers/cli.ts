/**
 * Child processes of the tests: the built `flujo` binary (bin/flujo.js → dist, which the
 * integration tests' global setup rebuilds when src/ is newer) on the pinned Node, or any other
 * command, with what it printed and how it ended collected.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { redisUrl } from './redis.js';

/** The repository's root (with a trailing slash). */
export const root = fileURLToPath(new URL('../..', import.meta.url));
/** The Node the repo pins (a devDependency), not the one on PATH. */
export const pinnedNode = join(root, 'node_modules', '.bin', 'node');
/** The `flujo` command as a user runs it: it loads the compiled CLI from dist. */
export const flujoBin = join(root, 'bin', 'flujo.js');

/** How a child ended and everything it printed. */
export interface ChildResult {
  /** The exit code; null when a signal ended it. */
  code: number | null;
  signal: NodeJS.Signals | null;
  out: string;
  err: string;
  /** The non-empty lines of `out`. */
  lines: string[];
  /** From the spawn to the close, in milliseconds. */
  ms: number;
}

/** A child still running: its output so far, and its result once it closes. */
export interface RunningChild {
  child: ChildProcess;
  out: () => string;
  err: () => string;
  /** Resolves when the child closes; rejects if it could not be started. */
  done: Promise<ChildResult>;
}

/** Where and how a child runs. */
export interface SpawnOptions {
  /** The working directory: the repository's root unless given. */
  cwd?: string | undefined;
  /** The whole environment: this process's unless given. */
  env?: NodeJS.ProcessEnv | undefined;
  /** Called with all of stdout so far whenever more arrives (to wait for a line, or kill). */
  onOutput?: ((out: string, child: ChildProcess) => void) | undefined;
  /** SIGTERM after this many milliseconds, so a hung child fails its test instead of hanging it. */
  timeoutMs?: number | undefined;
}

/** Starts `command` and collects its stdout and stderr as text. */
export function spawnChild(
  command: string,
  args: readonly string[],
  options: SpawnOptions = {},
): RunningChild {
  const started = performance.now();
  const child = spawn(command, args, { cwd: options.cwd ?? root, env: options.env ?? process.env });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
    options.onOutput?.(out, child);
  });
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const timer =
    options.timeoutMs === undefined ? undefined : setTimeout(() => child.kill(), options.timeoutMs);
  const done = new Promise<ChildResult>((resolve, reject) => {
    child.once('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      const lines = out.split('\n').filter((l) => l !== '');
      resolve({ code, signal, out, err, lines, ms: performance.now() - started });
    });
  });
  return { child, out: () => out, err: () => err, done };
}

/** The environment a `flujo` command runs with, and where. */
export interface FlujoOptions extends Omit<SpawnOptions, 'env'> {
  /** FLUJO_PREFIX; left unset otherwise (a command may still take `--prefix`). */
  prefix?: string | undefined;
  /**
   * REDIS_URL: the suite's Redis (`'suite'`, the default), or unset (`'none'`: the command then
   * starts the embedded server, or is given `--redis`).
   */
  redis?: 'suite' | 'none' | undefined;
  /** USER, the name the CLI records for a person's decision when `--by` is not given. */
  user?: string | undefined;
  /** More variables, set over the others. */
  env?: Record<string, string> | undefined;
  /** Node's own flags, before the script (e.g. `--import`). */
  nodeArgs?: readonly string[] | undefined;
}

/**
 * The environment of a `flujo` command: this process's, without any REDIS_URL or FLUJO_PREFIX of
 * the shell that ran the tests, then the options'.
 */
export function flujoEnv(options: FlujoOptions = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env['REDIS_URL'];
  delete env['FLUJO_PREFIX'];
  if ((options.redis ?? 'suite') === 'suite') env['REDIS_URL'] = redisUrl();
  if (options.prefix !== undefined) env['FLUJO_PREFIX'] = options.prefix;
  if (options.user !== undefined) env['USER'] = options.user;
  return { ...env, ...options.env };
}

/** Starts `flujo <args>` (the built binary, on the pinned Node) and returns it while it runs. */
export function startFlujo(args: readonly string[], options: FlujoOptions = {}): RunningChild {
  return spawnChild(pinnedNode, [...(options.nodeArgs ?? []), flujoBin, ...args], {
    cwd: options.cwd,
    env: flujoEnv(options),
    onOutput: options.onOutput,
    timeoutMs: options.timeoutMs,
  });
}

/** Runs `flujo <args>` (the built binary, on the pinned Node) to its end. */
export function runFlujo(
  args: readonly string[],
  options: FlujoOptions = {},
): Promise<ChildResult> {
  return startFlujo(args, options).done;
}
