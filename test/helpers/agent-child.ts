import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';

const ROOT = join(import.meta.dirname, '..', '..');
const NODE = join(ROOT, 'node_modules', '.bin', 'node');
const CHILD = join(ROOT, 'test', 'fixtures', 'agent-child.ts');

/** How a worker child ended. */
export interface ChildExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** A worker process of test/fixtures/agent-child.ts. */
export interface AgentChild {
  proc: ChildProcess;
  exited: Promise<ChildExit>;
  stderr: () => string;
}

/**
 * Starts test/fixtures/agent-child.ts with `env` (over this process's environment) and resolves
 * once it prints `ready`; rejects with its stderr if it exits first. Run with the tsx loader, not
 * the tsx CLI, so a SIGKILL reaches the worker itself.
 */
export async function spawnAgentChild(env: Record<string, string>): Promise<AgentChild> {
  const proc = spawn(NODE, ['--import', 'tsx', CHILD], {
    cwd: ROOT,
    env: { ...process.env, FLUJO_KILL_AT: '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  const exited = new Promise<ChildExit>((resolve) =>
    proc.on('close', (code, signal) => resolve({ code, signal })),
  );
  await new Promise<void>((resolve, reject) => {
    proc.stdout.on('data', (chunk: Buffer) => {
      stdout += chunk.toString();
      if (stdout.includes('ready ')) resolve();
    });
    proc.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    void exited.then((e) =>
      reject(new Error(`agent child exited before ready (${JSON.stringify(e)}): ${stderr}`)),
    );
  });
  return { proc, exited, stderr: () => stderr };
}
