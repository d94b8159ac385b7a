/**
 * The fingerprint check of a granular turn: a turn after the first runs only
 * under the fingerprint the first turn stored; any change of what shapes the turns is an
 * irrecoverable ResumeError naming the change, raised before the model or any tool is touched.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { stepFingerprint } from '../../src/execution/agent-fingerprint.js';
import { modelClients } from '../../src/execution/model-call.js';
import { takeTurn, type TurnDeps } from '../../src/actors/turn.js';
import { defineAgent, type AgentSpec } from '../../src/agents/define-agent.js';
import { ResumeError } from '../../src/errors.js';
import type { JsonValue } from '../../src/internal/json.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import type { AgentStep } from '../../src/plan/schema.js';
import { createFingerprintStore } from '../../src/persistence/fingerprint-store.js';
import { createHistoryStore } from '../../src/persistence/history.js';
import { createLedger } from '../../src/persistence/ledger.js';
import { createModelJournal } from '../../src/persistence/model-journal.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { defineTool } from '../../src/tools/define-tool.js';
import { caught } from '../helpers/caught.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';

const search = defineTool({
  name: 'search',
  input: z.object({ q: z.string() }),
  class: 'read_only',
  run: () => ({ hits: [] }),
});
const searchV2 = defineTool({
  name: 'search',
  input: z.object({ q: z.string(), limit: z.number().optional() }),
  class: 'read_only',
  run: () => ({ hits: [] }),
});

let model: ScriptedModelServer;
let redis: Redis;
let prefix: string;
let deps: TurnDeps;
let calls: number;

const spec = (over: Partial<AgentSpec> = {}): AgentSpec => ({
  name: 'researcher',
  model: 'gpt-test',
  provider: { baseURL: model.url, apiKey: 'test-key' },
  systemPrompt: 'Research, then answer.',
  tools: [search],
  settings: { temperature: 0 },
  ...over,
});

const step = parsePlan({
  name: 'p',
  steps: [{ id: 'research', kind: 'agent', agent: 'researcher', mode: 'granular' }],
}).steps[0] as AgentStep;

beforeAll(async () => {
  model = await startScriptedModelServer();
  redis = connect();
});
afterAll(async () => {
  await model.close();
  redis.disconnect();
});
beforeEach(async () => {
  model.reset();
  if (prefix !== undefined) await deletePrefix(redis, prefix);
  prefix = testPrefix();
  calls = 0;
  const stores = { redis, prefix };
  const history = createHistoryStore(stores);
  deps = {
    ledger: createLedger(stores),
    leaseMs: 5000,
    guard: {
      beforeRun: () => {
        calls++;
        return Promise.resolve();
      },
    },
    clients: modelClients(),
    journal: createModelJournal(stores),
    fingerprints: createFingerprintStore(stores),
    histories: { read: (runId, stepId, cursor) => history.read(runId, stepId, { to: cursor }) },
  };
});

/** Takes turn 0 with `first`, then turn 1 with `second` under turn 0's stored fingerprint. */
async function resumeWith(
  first: AgentSpec,
  second: AgentSpec,
  input: { first: JsonValue; second: JsonValue } = { first: 'Go.', second: 'Go.' },
) {
  const runId = `r-${randomUUID().slice(0, 8)}`;
  model.enqueue({ toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'x' } }] });
  const agent = defineAgent(first);
  const signal = new AbortController().signal;
  const base = { step, runId, tenantId: 't', attempt: 1, signal };
  const turn0 = await takeTurn(deps, {
    ...base,
    agent,
    input: input.first,
    turn: 0,
    cursor: 0,
    fingerprint: null,
  });
  expect(turn0.fingerprint).toBe(stepFingerprint(agent, step, input.first).hash);
  const before = { requests: model.requestCount, tools: calls };
  const error = await caught(
    takeTurn(deps, {
      ...base,
      agent: defineAgent(second),
      input: input.second,
      turn: 1,
      cursor: 3,
      fingerprint: turn0.fingerprint,
    }),
  );
  // Nothing ran: no model call, no tool call, nothing journaled for turn 1.
  expect(model.requestCount).toBe(before.requests);
  expect(calls).toBe(before.tools);
  expect(await deps.journal.get(runId, 'research', 1)).toBeNull();
  return error;
}

describe('the fingerprint of a granular step', () => {
  it.each([
    ['tools', { tools: [searchV2] }, /the agent's tools changed/],
    [
      'systemPrompt',
      { systemPrompt: 'Research, then answer in French.' },
      /the system prompt changed/,
    ],
    ['model', { model: 'gpt-test-2' }, /the agent's model changed/],
    ['settings', { settings: { temperature: 0.7 } }, /the agent's settings .* changed/],
  ] as const)(
    'a change of %s is an irrecoverable ResumeError naming it',
    async (field, over, message) => {
      const error = await resumeWith(spec(), spec(over));
      expect(error).toBeInstanceOf(ResumeError);
      expect(error).toMatchObject({ recoverable: false, retryable: false, field });
      expect((error as Error).message).toMatch(message);
    },
  );

  it('a change of the input is an irrecoverable ResumeError naming it', async () => {
    const error = await resumeWith(spec(), spec(), { first: { q: 'a' }, second: { q: 'b' } });
    expect(error).toMatchObject({ recoverable: false, field: 'input' });
    expect((error as Error).message).toMatch(/the step's input changed/);
  });

  it('the same configuration resumes: turn 1 runs', async () => {
    const runId = `r-${randomUUID().slice(0, 8)}`;
    model.enqueue(
      { toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'x' } }] },
      { text: 'Done.' },
    );
    const signal = new AbortController().signal;
    const base = { step, runId, tenantId: 't', attempt: 1, signal, input: 'Go.' };
    const t0 = await takeTurn(deps, {
      ...base,
      agent: defineAgent(spec()),
      turn: 0,
      cursor: 0,
      fingerprint: null,
    });
    expect(t0.final).toBeNull();
    const t1 = await takeTurn(deps, {
      ...base,
      agent: defineAgent(spec()),
      turn: 1,
      cursor: 0,
      fingerprint: t0.fingerprint,
    });
    expect(t1.fingerprint).toBe(t0.fingerprint);
    expect(t1.final?.answer).toBe('Done.');
    expect(model.requestCount).toBe(2);
    expect(calls).toBe(1);
  });

  it('names nothing it cannot know: without the stored parts the error still refuses to run', async () => {
    const runId = `r-${randomUUID().slice(0, 8)}`;
    const agent = defineAgent(spec());
    const error = await caught(
      takeTurn(deps, {
        step,
        runId,
        tenantId: 't',
        attempt: 1,
        signal: new AbortController().signal,
        agent,
        input: 'Go.',
        turn: 1,
        cursor: 3,
        fingerprint: 'f'.repeat(64),
      }),
    );
    expect(error).toMatchObject({ recoverable: false, field: undefined });
    expect((error as Error).message).toMatch(/fingerprint changed since the run started/);
    expect(model.requestCount).toBe(0);
  });
});
