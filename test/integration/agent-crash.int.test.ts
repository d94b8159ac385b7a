/**
 * Granular agent steps across crashes: a worker child (test/fixtures/agent-child.ts) is killed
 * with SIGKILL at each named point of a turn, another child resumes the run, and the
 * test checks what the model was asked (the scripted server records every request), what the
 * tools did (the children's effect file), the ledger and the final answer.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createRuntime, type Runtime, runtimeCore } from '../../src/runtime.js';
import { silentLogger } from '../../src/logging.js';
import {
  agentChildren,
  crashAndResume as crashAndResumeWith,
  researchPlan,
  scriptThreeTurns,
  settledReport,
  turnOf,
} from '../helpers/agent-child.js';
import { expectIntact } from '../helpers/integrity.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';
import { useScriptedModel } from '../helpers/scripted-agent.js';

const plan = researchPlan('agent-crash');

const model = useScriptedModel();
let rt: Runtime;
let prefix: string;
let dir: string;
let effectFile: string;
const children = agentChildren(() => ({
  REDIS_URL: redisUrl(),
  FLUJO_PREFIX: prefix,
  MODEL_URL: model.url,
  EFFECT_FILE: effectFile,
  RECOVERY_MS: '1000',
}));
const spawnChild = children.spawn;

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

const settled = (runId: string) => settledReport(rt, runId);

/** Starts a run, lets a child die at `killAt`, resumes with a fresh child; returns the report. */
const crashAndResume = (
  killAt: string,
  resume: Record<string, string> = {},
  both: Record<string, string> = {},
) => crashAndResumeWith(rt, plan, children, killAt, { both, resume });

beforeEach(async () => {
  scriptThreeTurns(model);
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-agent-crash-'));
  effectFile = join(dir, 'effects.log');
  rt = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
});
afterEach(async () => {
  await children.killAll();
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
    await expectIntact(rt, runId);
  });

  it('killed after the tools of turn 1: the stream shows the turn taken over, its calls replayed', async () => {
    const { runId, report } = await crashAndResume('after-tools:research:1');
    expect(report.status).toBe('succeeded');
    const events: { type: string; data: Record<string, unknown> }[] = [];
    for await (const e of rt.events(runId)) events.push(e);
    const of = (type: string) => events.filter((e) => e.type === type).map((e) => e.data);
    const taken = of('turn.takenOver');
    expect(taken).toHaveLength(1);
    expect(taken[0]).toMatchObject({ stepId: 'research', attempt: 1, turn: 1 });
    const [before, after] = [taken[0]!['previousWorker'], taken[0]!['worker']] as { pid: number }[];
    expect(before!.pid).not.toBe(after!.pid);
    // Turn 0 was committed by the killed worker; turn 1's calls ran there, and are receipts now.
    const calls = of('tool.called').map((c) => [c['turn'], c['replayed']]);
    expect(calls.filter(([turn]) => turn === 0).every(([, replayed]) => replayed === false)).toBe(
      true,
    );
    const turn1 = calls.filter(([turn]) => turn === 1);
    expect(turn1.length).toBeGreaterThan(0);
    expect(turn1.every(([, replayed]) => replayed === true)).toBe(true);
    // Turn 1's reply came from the journal: no second model call for it. The call the killed
    // worker made for it is recorded by the turn's commit, as made by an uncommitted execution.
    expect(of('model.called').map((c) => [c['turn'], c['uncommitted'] === true])).toEqual([
      [0, false],
      [1, true],
      [2, false],
    ]);
    const ran = of('turn.ran').map((r) => [r['turn'], (r['worker'] as { pid: number }).pid]);
    expect(ran).toEqual([
      [0, before!.pid],
      [1, after!.pid],
      [2, after!.pid],
    ]);
    await expectIntact(rt, runId);
  });

  it("killed after the tools of turn 0, whose last call is read-only: that call's receipt comes with the commit, so only it runs again", async () => {
    const { runId, report } = await crashAndResume('after-tools:research:0');
    expect(report.status).toBe('succeeded');
    expect(report.summary.produced['research']).toEqual(uncrashed ?? expect.anything());
    const done = effects(runId);
    expect(done.map((e) => `${e.tool} ${JSON.stringify(e.args)}`)).toEqual([
      'search {"q":"alpha"}',
      'save_note {"text":"first","key":true}',
      'search {"q":"beta"}',
      'search {"q":"beta"}',
      'save_note {"text":"second","key":true}',
    ]);
    expect(done[3]!.pid).not.toBe(done[2]!.pid);
    expect(asked(runId)).toEqual([1, 1, 1]);
    const ledger = await rt.ledger(runId);
    expect(ledger.map((e) => [e.state, e.runs])).toEqual([
      ['SUCCEEDED', 1],
      ['SUCCEEDED', 1],
      ['SUCCEEDED', 1],
      ['SUCCEEDED', 1],
    ]);
    await expectIntact(rt, runId);
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
    await expectIntact(rt, runId);
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
    const history = await runtimeCore(rt).stores.history.read(runId, 'research');
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
    await expectIntact(rt, runId);
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
  it.each([
    ["the price of the agent's model", 'pricing', { INPUT_PRICE: '0.15' }, { INPUT_PRICE: '0.3' }],
    [
      'the policy version',
      'policyVersion',
      { POLICY_VERSION: '2026-10' },
      { POLICY_VERSION: '2026-11' },
    ],
  ] as const)(
    'a change of %s between the crash and the resume fails the run, naming it; nothing runs',
    async (_what, field, before, after) => {
      const runId = `run-${Math.random().toString(36).slice(2, 10)}`;
      await rt.start(plan, runId, { runId });
      const doomed = await spawnChild({ ...before, FLUJO_KILL_AT: 'after-journal:research:1' });
      expect(await doomed.exited).toEqual({ code: null, signal: 'SIGKILL' });
      const resumer = await spawnChild({ ...after });
      const report = await settled(runId);
      resumer.proc.kill('SIGTERM');
      await resumer.exited;
      expect(report.status).toBe('failed');
      expect(report.summary.reason).toBe('resume_error');
      expect(report.steps[0]!.error!.details).toMatchObject({ recoverable: false, field });
      expect(effects(runId)).toHaveLength(3);
      expect(asked(runId)).toEqual([1, 1]);
      expect(report.steps[0]!.agent).toMatchObject({ turns: 1 });
    },
  );

  it('the same price and policy version after the crash: the run resumes and succeeds', async () => {
    const same = { INPUT_PRICE: '0.15', POLICY_VERSION: '2026-11' };
    const { runId, report } = await crashAndResume('after-journal:research:1', same, same);
    expect(report.status).toBe('succeeded');
    expect(asked(runId)).toEqual([1, 1, 1]);
    await expectIntact(rt, runId);
  });
});
