/**
 * A worker child of the crash tests: a fixture script run with tsx on the pinned Node, the
 * suite's environment under the variables given, that prints `ready <pid>` once it listens.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';

const ROOT = join(import.meta.dirname, '..', '..');
const NODE = join(ROOT, 'node_modules', '.bin', 'node');

/** How a child ended. */
export interface ChildExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** A child that said it is ready. */
export interface ReadyChild {
  proc: ChildProcess;
  pid: number;
  /** Resolves when the child is gone. */
  exited: Promise<ChildExit>;
}

/**
 * Spawns `test/fixtures/<script>` and resolves once it printed `ready `; rejects with its stderr
 * if it exits before. Every child is added to `children` (the test kills what is left there).
 */
export async function spawnReadyChild(
  script: string,
  env: Record<string, string>,
  children: { add(proc: ChildProcess): unknown },
): Promise<ReadyChild> {
  const proc = spawn(NODE, ['--import', 'tsx', join(ROOT, 'test', 'fixtures', script)], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(proc);
  const exited = new Promise<ChildExit>((resolve) =>
    proc.on('close', (code, signal) => resolve({ code, signal })),
  );
  let stdout = '';
  let stderr = '';
  proc.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  await new Promise<void>((resolve, reject) => {
    proc.stdout.on('data', (c: Buffer) => {
      stdout += c.toString();
      if (stdout.includes('ready ')) resolve();
    });
    void exited.then((e) =>
      reject(new Error(`the child exited before it was ready (${JSON.stringify(e)}): ${stderr}`)),
    );
  });
  return { proc, pid: proc.pid!, exited };
}

/** Kills (SIGKILL) each child still running. */
export function killChildren(children: Iterable<ChildProcess>): void {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
}
