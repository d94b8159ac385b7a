/**
 * The model journal of atomic agent steps: every model reply of an attempt is journaled (one
 * record per call) before its tool calls run, so `reproduce` lists each of them, and an attempt run
 * again after a SIGKILL takes the journaled replies instead of asking the model again. Worker
 * children (test/fixtures/agent-child.ts) on the scripted model server, which counts the requests.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { reproducedLines } from '../../src/cli/commands/replay.js';
import { silentLogger } from '../../src/logging.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import {
  agentChildren,
  crashAndResume,
  scriptThreeTurns,
  settledReport,
  turnOf,
} from '../helpers/agent-child.js';
import { expectIntact } from '../helpers/integrity.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';
import { useScriptedModel } from '../helpers/scripted-agent.js';

const plan: PlanInput = {
  name: 'atomic-journal',
  steps: [
    {
      id: 'research',
      kind: 'agent',
      agent: 'researcher',
      mode: 'atomic',
      retry: { maxAttempts: 3, initialDelayMs: 50, maxDelayMs: 200, jitter: 0 },
    },
  ],
};

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

beforeEach(async () => {
  scriptThreeTurns(model);
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-atomic-journal-'));
  effectFile = join(dir, 'effects.log');
  rt = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
});
afterEach(async () => {
  await children.killAll();
  await rt.close();
  await deleteRuntimeKeys(prefix);
  await rm(dir, { recursive: true, force: true });
});

/** How many times the model was asked for each turn (call) of the run. */
function asked(runId: string): number[] {
  const counts: number[] = [];
  for (const r of model.requests) {
    if (r.messages.find((m) => m.role === 'user')?.content !== runId) continue;
    const t = turnOf(r);
    counts[t] = (counts[t] ?? 0) + 1;
  }
  return counts;
}

function effects(runId: string): string[] {
  if (!existsSync(effectFile)) return [];
  return readFileSync(effectFile, 'utf8')
    .split('\n')
    .filter((l) => l.startsWith(`${runId} `))
    .map((l) => l.split(' ').slice(1, 3).join(' '));
}

const FOUR_EFFECTS = [
  'save_note {"text":"first","key":false}',
  'save_note {"text":"second","key":false}',
  'search {"q":"alpha"}',
  'search {"q":"beta"}',
];

const ANSWER = {
  answer: 'Alpha and beta, noted twice.',
  turns: 3,
  toolCalls: 4,
  usage: { promptTokens: 460, completionTokens: 51 },
};

/** What reproduce lists of the run's journal: (attempt, call, the reply's text or tool names). */
async function journaled(runId: string) {
  const r = await rt.replay(runId, { mode: 'reproduce' });
  const replies = r.modelReplies.map((m) => ({
    stepId: m.stepId,
    turn: m.turn,
    attempt: m.attempt,
    call: m.call,
    said: m.replies.map(
      (x) => x.message.content ?? x.message.tool_calls?.map((c) => c.name).join(','),
    ),
  }));
  return { replies, lines: reproducedLines(r) };
}

describe('atomic agent steps: the model journal', () => {
  it('a run never paused: reproduce lists every model reply, as many as the model was sent', async () => {
    const runId = `run-${Math.random().toString(36).slice(2, 10)}`;
    await rt.start(plan, runId, { runId });
    const child = await children.spawn();
    const report = await settledReport(rt, runId);
    child.proc.kill('SIGTERM');
    await child.exited;
    expect(report.status).toBe('succeeded');
    expect(report.summary.produced['research']).toEqual(ANSWER);
    expect(asked(runId)).toEqual([1, 1, 1]);
    const { replies, lines } = await journaled(runId);
    expect(replies).toHaveLength(model.requestCount);
    expect(replies).toEqual([
      { stepId: 'research', turn: null, attempt: 1, call: 0, said: ['search,save_note,search'] },
      { stepId: 'research', turn: null, attempt: 1, call: 1, said: ['save_note'] },
      { stepId: 'research', turn: null, attempt: 1, call: 2, said: [ANSWER.answer] },
    ]);
    expect(lines[0]).toContain(', 3 journaled model replies;');
    expect(lines.filter((l) => l.startsWith('  reply    research attempt 1 call '))).toHaveLength(
      3,
    );
  });

  it.each([
    // Turn 0's reply is journaled, its first two tools ran; its third did not.
    ['between the tools of the first reply', 'after-receipt:save_note'],
    // Two replies journaled, their four tools ran; the last model call not made.
    ['after the tools of the second reply', 'after-tools:research:1'],
    // Every reply journaled, the answer among them; nothing committed.
    ['after the final reply, before the commit', 'after-journal:research:2'],
  ])(
    'killed %s: the attempt run again asks the model nothing it was asked, each effect once',
    async (_name, killAt) => {
      const { runId, report } = await crashAndResume(rt, plan, children, killAt);
      expect(report.status).toBe('succeeded');
      expect(report.summary.produced['research']).toEqual(ANSWER);
      expect(report.steps[0]).toMatchObject({ attempt: 1 });
      // One request per call: the journaled calls were not sent again.
      expect(asked(runId)).toEqual([1, 1, 1]);
      expect(effects(runId).sort()).toEqual(FOUR_EFFECTS);
      const ledger = await rt.ledger(runId);
      expect(ledger.map((e) => [e.state, e.runs])).toEqual([
        ['SUCCEEDED', 1],
        ['SUCCEEDED', 1],
        ['SUCCEEDED', 1],
        ['SUCCEEDED', 1],
      ]);
      const { replies } = await journaled(runId);
      expect(replies.map((r) => [r.attempt, r.call])).toEqual([
        [1, 0],
        [1, 1],
        [1, 2],
      ]);
      await expectIntact(rt, runId);
    },
  );
});
