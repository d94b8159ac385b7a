/**
 * Granular agent steps across crashes: a worker child (test/fixtures/agent-child.ts) is killed
 * with SIGKILL at each named point of a turn (DESIGN §3), another child resumes the run, and the
 * test checks what the model was asked (the scripted server records every request), what the
 * tools did (the children's effect file), the ledger and the final answer.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type RunReport, type Runtime } from '../../src/runtime.js';
import { silentLogger } from '../../src/logging.js';
import {
  startScriptedModelServer,
  type RecordedRequest,
  type ScriptedModelServer,
  type ScriptedReply,
} from '../../src/testing/index.js';
import { spawnAgentChild, type AgentChild } from '../helpers/agent-child.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const plan: PlanInput = {
  name: 'agent-crash',
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

/** The turn a request asks for: how many replies of the model it already holds. */
const turnOf = (r: RecordedRequest): number =>
  r.messages.filter((m) => m.role === 'assistant').length;

// Turn 0 asks for three tools at once, turn 1 for one, turn 2 answers. Fixed usage figures, so
// a run's usage does not depend on how long its id (its input) is.
const replies: ScriptedReply[] = [
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

let model: ScriptedModelServer;
let rt: Runtime;
let prefix: string;
let dir: string;
let effectFile: string;
const children = new Set<AgentChild>();

async function spawnChild(env: Record<string, string> = {}): Promise<AgentChild> {
  const child = await spawnAgentChild({
    REDIS_URL: redisUrl(),
    FLUJO_PREFIX: prefix,
    MODEL_URL: model.url,
    EFFECT_FILE: effectFile,
    RECOVERY_MS: '1000',
    ...env,
  });
  children.add(child);
  void child.exited.then(() => children.delete(child));
  return child;
}

function effects(runId: string): { tool: string; args: unknown; pid: number }[] {
  if (!existsSync(effectFile)) return [];
  return readFileSync(effectFile, 'utf8')
    .split('\n')
    .filter((l) => l.startsWith(`${runId} `))
    .map((l) => {
      const [, tool, args, pid] = l.split(' ');
      return { tool: tool!, args: JSON.parse(args!) as unknown, pid: Number(pid) };
    });
}

/** How many times the model was asked for each turn of the run. */
function asked(runId: string): number[] {
  const counts: number[] = [];
  for (const r of model.requests) {
    const first = r.messages.find((m) => m.role === 'user');
    if (first?.content !== runId) continue;
    const t = turnOf(r);
    counts[t] = (counts[t] ?? 0) + 1;
  }
  return counts;
}

async function settled(runId: string, timeoutMs = 20_000): Promise<RunReport> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const report = await rt.status(runId);
    if (report.status !== 'running' || Date.now() > deadline) return report;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Starts a run, lets a child die at `killAt`, resumes with a fresh child; returns the report. */
async function crashAndResume(
  killAt: string,
  resumeEnv: Record<string, string> = {},
  bothEnv: Record<string, string> = {},
): Promise<{ runId: string; report: RunReport }> {
  const runId = `run-${Math.random().toString(36).slice(2, 10)}`;
  // The run's input is its id, so the model's requests name the run they belong to.
  await rt.start(plan, runId, { runId });
  const doomed = await spawnChild({ ...bothEnv, FLUJO_KILL_AT: killAt });
  const exit = await Promise.race([
    doomed.exited,
    new Promise<'alive'>((r) => setTimeout(() => r('alive'), 15_000)),
  ]);
  expect(exit, `the child did not die at ${killAt}: ${doomed.stderr()}`).toEqual({
    code: null,
    signal: 'SIGKILL',
  });
  const resumer = await spawnChild({ ...bothEnv, ...resumeEnv });
  const report = await settled(runId);
  resumer.proc.kill('SIGTERM');
  await resumer.exited;
  return { runId, report };
}

beforeAll(async () => {
  model = await startScriptedModelServer();
});
afterAll(async () => {
  await model.close();
});
beforeEach(async () => {
  model.reset();
  // Every request gets the reply of its turn, whoever asks and however often.
  model.enqueue(...Array.from({ length: 40 }, () => (r: RecordedRequest) => replies[turnOf(r)]!));
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-agent-crash-'));
  effectFile = join(dir, 'effects.log');
  rt = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
});
afterEach(async () => {
  for (const child of children) child.proc.kill('SIGKILL');
  await Promise.all([...children].map((c) => c.exited));
  await rt.close();
  await deleteRuntimeKeys(prefix);
  await rm(dir, { recursive: true, force: true });
});

describe('granular agent steps across SIGKILL', () => {
  let uncrashed: unknown;

  it('uncrashed: three turns, four tool effects, one answer', async () => {
    const runId = 'uncrashed';
    await rt.start(plan, runId, { runId });
    const child = await spawnChild();
    const report = await settled(runId);
    child.proc.kill('SIGTERM');
    await child.exited;
    expect(report.status).toBe('succeeded');
    uncrashed = report.summary.produced['research'];
    expect(uncrashed).toEqual({
      answer: 'Alpha and beta, noted twice.',
      turns: 3,
      toolCalls: 4,
      usage: { promptTokens: 460, completionTokens: 51 },
    });
    expect(effects(runId).map((e) => `${e.tool} ${JSON.stringify(e.args)}`)).toEqual([
      'search {"q":"alpha"}',
      'save_note {"text":"first","key":true}',
      'search {"q":"beta"}',
      'save_note {"text":"second","key":true}',
    ]);
    expect(asked(runId)).toEqual([1, 1, 1]);
  });

  it.each([
    // The reply was lost with the worker: the model is asked again for that turn, once more.
    ['after the model reply, before the journal', 'after-model-reply:research:0', [2, 1, 1]],
    ['after the journal, before the first tool', 'after-journal:research:0', [1, 1, 1]],
    ['between two tools of one reply', 'between-tools:research:0:2', [1, 1, 1]],
    ['after the tools, before the commit', 'after-tools:research:1', [1, 1, 1]],
    ['after the commit, before the enqueue', 'after-commit:research:1', [1, 1, 1]],
  ])('killed %s: each effect once, the answer unchanged', async (_name, killAt, perTurn) => {
    const { runId, report } = await crashAndResume(killAt);
    expect(report.status).toBe('succeeded');
    expect(report.summary.produced['research']).toEqual(uncrashed ?? expect.anything());
    expect(report.summary.produced['research']).toMatchObject({
      answer: 'Alpha and beta, noted twice.',
      turns: 3,
      toolCalls: 4,
    });
    const done = effects(runId).map((e) => `${e.tool} ${JSON.stringify(e.args)}`);
    expect(done.sort()).toEqual(
      [
        'search {"q":"alpha"}',
        'save_note {"text":"first","key":true}',
        'search {"q":"beta"}',
        'save_note {"text":"second","key":true}',
      ].sort(),
    );
    expect(asked(runId)).toEqual(perTurn);
    const ledger = await rt.ledger(runId);
    expect(ledger.map((e) => [e.state, e.runs])).toEqual([
      ['SUCCEEDED', 1],
      ['SUCCEEDED', 1],
      ['SUCCEEDED', 1],
      ['SUCCEEDED', 1],
    ]);
  });

  it('killed between the second and the third tool of a reply, the resume runs only the third', async () => {
    const { runId, report } = await crashAndResume('between-tools:research:0:2');
    expect(report.status).toBe('succeeded');
    const byPid = effects(runId);
    const first = byPid[0]!.pid;
    expect(byPid.slice(0, 2).every((e) => e.pid === first)).toBe(true);
    expect(byPid[2]).toMatchObject({ tool: 'search', args: { q: 'beta' } });
    expect(byPid[2]!.pid).not.toBe(first);
    expect(byPid).toHaveLength(4);
  });

  it('a large tool result is a blob in the history; a worker that resumes after a crash puts it back for the model', async () => {
    // Turn 0's two searches return 50 KB each and are committed; then the worker dies.
    const { runId, report } = await crashAndResume(
      'after-commit:research:0',
      {},
      {
        BIG_RESULT_BYTES: '50000',
      },
    );
    expect(report.status).toBe('succeeded');
    const history = await rt.core.history.read(runId, 'research');
    const stored = history.filter(
      (m) => m.role === 'tool' && (m.tool_call_id === 's1' || m.tool_call_id === 's2'),
    );
    expect(stored).toHaveLength(2);
    for (const m of stored)
      expect(m.content).toMatch(/^<<FL_BLOB_REF:[0-9a-f]{64}:size=500\d\d>>$/);
    // The fresh worker read both blobs back for turn 1's request: the model saw the pages.
    const turn1 = model.requests.find(
      (r) => r.messages.find((m) => m.role === 'user')?.content === runId && turnOf(r) === 1,
    );
    const pages = turn1!.messages
      .filter((m) => m.role === 'tool')
      .map((m) => (JSON.parse(String(m.content)) as { page?: string }).page)
      .filter((p) => p !== undefined);
    expect(pages.map((p) => p?.length)).toEqual([50_000, 50_000]);
    expect(pages[0]!.startsWith('alpha-0 ')).toBe(true);
    expect(pages[1]!.startsWith('beta-0 ')).toBe(true);
    expect(asked(runId)).toEqual([1, 1, 1]);
  });

  it('a changed system prompt between the crash and the resume fails the run, naming it; nothing runs', async () => {
    const { runId, report } = await crashAndResume('after-journal:research:1', {
      SYSTEM_PROMPT: 'Research with search, keep notes, answer at length.',
    });
    expect(report.status).toBe('failed');
    expect(report.summary.reason).toBe('resume_error');
    expect(report.summary.blockedStep).toBe('research');
    const error = report.steps[0]!.error!;
    expect(error.retryable).toBe(false);
    expect(error.details).toMatchObject({ recoverable: false, field: 'systemPrompt' });
    expect(error.message).toMatch(/fingerprint mismatch: the system prompt changed/);
    // Turn 0's three effects, none of turn 1's: the resumed worker ran nothing.
    expect(effects(runId)).toHaveLength(3);
    expect(asked(runId)).toEqual([1, 1]);
    expect(report.steps[0]!.agent).toMatchObject({ turns: 1 });
  });
});
