/**
 * Worker children of the crash tests (test/fixtures/driver-child.ts), as the driver crash test
 * spawns them: the tsx loader on the pinned Node, `ready <pid>` awaited, SIGKILL on demand.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { pinnedNode, root } from './cli.js';

const CHILD = join(root, 'test', 'fixtures', 'driver-child.ts');

/** How a child ended. */
export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** A worker child. */
export interface WorkerChild {
  proc: ChildProcess;
  pid: number;
  exited: Promise<Exit>;
  stderr: () => string;
  /** It printed `ready`: its worker listens. */
  ready: boolean;
  /** SIGKILL; resolves when the process is gone. */
  kill: () => Promise<Exit>;
}

/**
 * Spawns a worker child with `env` (REDIS_URL, FLUJO_PREFIX, QUEUE_NAME, EFFECT_FILE, … as
 * driver-child.ts reads them) over this process's environment, and waits for its `ready` line.
 * `children` collects it while it lives. With `noWait`, it is returned once spawned.
 */
export async function spawnWorkerChild(
  env: Record<string, string>,
  children: Set<WorkerChild>,
  options: { noWait?: boolean } = {},
): Promise<WorkerChild> {
  const proc = spawn(pinnedNode, ['--import', 'tsx', CHILD], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  const exited = new Promise<Exit>((resolve) =>
    proc.on('close', (code, signal) => resolve({ code, signal })),
  );
  const ready = new Promise<void>((resolve, reject) => {
    proc.stdout.on('data', (chunk: Buffer) => {
      stdout += chunk.toString();
      if (stdout.includes('ready ')) resolve();
    });
    proc.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    void exited.then((e) =>
      reject(new Error(`worker child exited before ready (${JSON.stringify(e)}): ${stderr}`)),
    );
  });
  const child: WorkerChild = {
    proc,
    pid: proc.pid!,
    exited,
    stderr: () => stderr,
    ready: false,
    kill: async () => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      return exited;
    },
  };
  children.add(child);
  void exited.then(() => children.delete(child));
  // A child expected to die early is returned at once (`noWait`).
  if (options.noWait === true) {
    ready.then(() => (child.ready = true)).catch(() => {});
    return child;
  }
  await ready;
  child.ready = true;
  return child;
}
