import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { expect } from 'vitest';
import type { PlanInput } from '../../src/plan/schema.js';
import type { RunReport, Runtime } from '../../src/runtime.js';
import type {
  RecordedRequest,
  ScriptedModelServer,
  ScriptedReply,
} from '../../src/testing/index.js';

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

/**
 * A plan named `name` of one granular step, `research`, of the children's agent `researcher`:
 * three attempts, 50 to 200 ms apart, no jitter.
 */
export function researchPlan(name: string): PlanInput {
  return {
    name,
    steps: [
      {
        id: 'research',
        kind: 'agent',
        agent: 'researcher',
        mode: 'granular',
        retry: { maxAttempts: 3, initialDelayMs: 50, maxDelayMs: 200, jitter: 0 },
      },
    ],
  };
}

/** The turn a request asks for: how many replies of the model it already holds. */
export const turnOf = (r: RecordedRequest): number =>
  r.messages.filter((m) => m.role === 'assistant').length;

/**
 * Turn 0 asks for three tools at once, turn 1 for one, turn 2 answers. Fixed usage figures, so a
 * run's usage does not depend on how long its id (its input) is.
 */
export const THREE_TURNS: readonly ScriptedReply[] = [
  {
    toolCalls: [
      { id: 's1', name: 'search', arguments: { q: 'alpha' } },
      { id: 'n1', name: 'save_note', arguments: { text: 'first' } },
      { id: 's2', name: 'search', arguments: { q: 'beta' } },
    ],
    usage: { prompt_tokens: 100, completion_tokens: 30 },
  },
  {
    toolCalls: [{ id: 'n2', name: 'save_note', arguments: { text: 'second' } }],
    usage: { prompt_tokens: 160, completion_tokens: 12 },
  },
  { text: 'Alpha and beta, noted twice.', usage: { prompt_tokens: 200, completion_tokens: 9 } },
];

/** Scripts 40 requests, each getting the reply of its turn, whoever asks and however often. */
export function scriptThreeTurns(model: ScriptedModelServer): void {
  model.enqueue(
    ...Array.from({ length: 40 }, () => (r: RecordedRequest) => THREE_TURNS[turnOf(r)]!),
  );
}

/** The worker children a test started, so that none outlives it. */
export interface AgentChildren {
  /** Starts a child with the pool's environment and then `env`; resolves once it is ready. */
  spawn: (env?: Record<string, string>) => Promise<AgentChild>;
  /** Kills (SIGKILL) every child still running and waits until they are gone. */
  killAll: () => Promise<void>;
}

/** A pool of agent children whose environment is `base()` (read at each start) and then theirs. */
export function agentChildren(base: () => Record<string, string>): AgentChildren {
  const running = new Set<AgentChild>();
  return {
    spawn: async (env = {}) => {
      const child = await spawnAgentChild({ ...base(), ...env });
      running.add(child);
      void child.exited.then(() => running.delete(child));
      return child;
    },
    killAll: async () => {
      for (const child of running) child.proc.kill('SIGKILL');
      await Promise.all([...running].map((c) => c.exited));
    },
  };
}

/** `runId`'s report once it no longer runs, or as it is after `timeoutMs`. */
export async function settledReport(
  rt: Runtime,
  runId: string,
  timeoutMs = 20_000,
): Promise<RunReport> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const report = await rt.status(runId);
    if (report.status !== 'running' || Date.now() > deadline) return report;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Starts a run of `plan` whose input is its id (so the model's requests name the run they belong
 * to), lets a child die at the debug point `killAt`, and resumes the run with a fresh child until it
 * settles. `both` is the environment of both children, `resume` more of the second's.
 */
export async function crashAndResume(
  rt: Runtime,
  plan: PlanInput,
  children: AgentChildren,
  killAt: string,
  env: { both?: Record<string, string>; resume?: Record<string, string> } = {},
): Promise<{ runId: string; report: RunReport; pids: [number, number] }> {
  const runId = `run-${Math.random().toString(36).slice(2, 10)}`;
  await rt.start(plan, runId, { runId });
  const doomed = await children.spawn({ ...env.both, FLUJO_KILL_AT: killAt });
  const exit = await Promise.race([
    doomed.exited,
    new Promise<'alive'>((r) => setTimeout(() => r('alive'), 15_000)),
  ]);
  expect(exit, `the child did not die at ${killAt}: ${doomed.stderr()}`).toEqual({
    code: null,
    signal: 'SIGKILL',
  });
  const resumer = await children.spawn({ ...env.both, ...env.resume });
  const report = await settledReport(rt, runId);
  resumer.proc.kill('SIGTERM');
  await resumer.exited;
  return { runId, report, pids: [doomed.proc.pid!, resumer.proc.pid!] };
}
