/**
 * OpenTelemetry across processes: the test process starts a granular agent run (its SDK records
 * the `flujo.run` span in memory), a worker child with an SDK of its own
 * (test/fixtures/otel-file-sdk.mjs, one JSON line per ended span) is killed with SIGKILL mid-run,
 * and another child finishes it. All spans of both children belong to the run's one trace.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { trace } from '@opentelemetry/api';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { renderTraceHtml } from '../../src/observability/trace-html.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import { silentLogger } from '../../src/logging.js';
import {
  agentChildren,
  crashAndResume as crashAndResumeWith,
  researchPlan,
  scriptThreeTurns,
} from '../helpers/agent-child.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';
import { useScriptedModel } from '../helpers/scripted-agent.js';

const PRELOAD = join(import.meta.dirname, '..', 'fixtures', 'otel-file-sdk.mjs');
const OUT = join(import.meta.dirname, '..', '..', 'test-results', 'tracing-crash');

const plan = researchPlan('traced-agent');

/** A span as the children's exporter wrote it. */
interface FileSpan {
  name: string;
  traceId: string;
  spanId: string;
  parentSpanId: string | null;
  attributes: Record<string, unknown>;
  status: { code: number; message?: string };
  scope: string;
  pid: number;
}

const model = useScriptedModel();
let rt: Runtime;
let prefix: string;
let dir: string;
const memory = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(memory)] });
const children = agentChildren(() => ({
  REDIS_URL: redisUrl(),
  FLUJO_PREFIX: prefix,
  MODEL_URL: model.url,
  EFFECT_FILE: join(dir, 'effects.log'),
  OTEL_SPAN_FILE: join(dir, 'spans.jsonl'),
  NODE_OPTIONS: `--import=${PRELOAD}`,
  RECOVERY_MS: '1000',
}));

function spans(): FileSpan[] {
  const file = join(dir, 'spans.jsonl');
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as FileSpan);
}

/** Starts the run, lets a child die at `killAt`, finishes it with another child. */
async function crashAndResume(killAt: string): Promise<{ runId: string; pids: number[] }> {
  const { runId, report, pids } = await crashAndResumeWith(rt, plan, children, killAt);
  expect(report.status).toBe('succeeded');
  return { runId, pids };
}

/** The run's one span, recorded in this process. */
function runSpan(runId: string) {
  const found = memory.getFinishedSpans().filter((s) => s.attributes['flujo.run_id'] === runId);
  expect(found.map((s) => s.name)).toEqual(['flujo.run']);
  return found[0]!;
}

beforeAll(() => {
  trace.setGlobalTracerProvider(provider);
});
afterAll(async () => {
  trace.disable();
  await provider.shutdown();
});
beforeEach(async () => {
  scriptThreeTurns(model);
  memory.reset();
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-tracing-'));
  rt = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
});
afterEach(async () => {
  await children.killAll();
  await rt.close();
  await deleteRuntimeKeys(prefix);
  await rm(dir, { recursive: true, force: true });
});

describe('one trace per run across SIGKILL and resume', () => {
  it('killed after turn 0 committed: one trace, turns under the run, calls under turns', async () => {
    const { runId, pids } = await crashAndResume('after-commit:research:0');
    const root = runSpan(runId);
    const rootId = root.spanContext();
    const all = spans();
    expect(new Set(all.map((s) => s.traceId))).toEqual(new Set([rootId.traceId]));
    expect(new Set(all.map((s) => s.scope))).toEqual(new Set(['flujo']));
    // Both processes exported spans: the killed one turn 0, the resumer turns 1 and 2.
    const turns = all.filter((s) => s.name === 'flujo.turn');
    expect(turns.map((t) => [t.attributes['flujo.turn'], t.pid])).toEqual([
      [0, pids[0]],
      [1, pids[1]],
      [2, pids[1]],
    ]);
    for (const t of turns) {
      expect(t.parentSpanId).toBe(rootId.spanId);
      expect(t.attributes).toMatchObject({
        'flujo.run_id': runId,
        'flujo.step_id': 'research',
        'flujo.attempt': 1,
        'flujo.step.kind': 'agent',
      });
    }
    expect(turns.map((t) => t.attributes['flujo.outcome'])).toEqual(['turn', 'turn', 'turn']);
    // Each turn's children: its model call, then its tool calls, in the order they ran.
    const childrenOf = (turn: FileSpan) =>
      all.filter((s) => s.parentSpanId === turn.spanId).map((s) => s.name);
    expect(turns.map(childrenOf)).toEqual([
      ['chat gpt-test', 'execute_tool search', 'execute_tool save_note', 'execute_tool search'],
      ['chat gpt-test', 'execute_tool save_note'],
      ['chat gpt-test'],
    ]);
    // Every span descends from the run's span: none is left without its parent.
    const ids = new Set([rootId.spanId, ...all.map((s) => s.spanId)]);
    expect(all.filter((s) => !ids.has(s.parentSpanId ?? ''))).toEqual([]);
    const chats = all.filter((s) => s.name === 'chat gpt-test');
    expect(chats.map((c) => c.attributes)).toEqual(
      [
        [0, 100, 30],
        [1, 160, 12],
        [2, 200, 9],
      ].map(([turn, input, output]): unknown =>
        expect.objectContaining({
          'gen_ai.system': 'openai',
          'gen_ai.operation.name': 'chat',
          'gen_ai.request.model': 'gpt-test',
          'gen_ai.usage.input_tokens': input,
          'gen_ai.usage.output_tokens': output,
          'flujo.run_id': runId,
          'flujo.step_id': 'research',
          'flujo.attempt': 1,
          'flujo.turn': turn,
        }),
      ),
    );
    const tools = all.filter((s) => s.name.startsWith('execute_tool '));
    expect(tools.map((t) => t.attributes['flujo.tool.verdict'])).toEqual([
      'executed',
      'executed',
      'executed',
      'executed',
    ]);
    // The stored trace of the same run names the same trace id and holds the same tree.
    const stored = await rt.trace(runId);
    mkdirSync(OUT, { recursive: true });
    writeFileSync(join(OUT, 'granular-after-crash.html'), renderTraceHtml(stored));
    expect(stored.traceId).toBe(rootId.traceId);
    const [attempt] = stored.steps[0]!.attempts;
    expect(stored.steps[0]!.attempts).toHaveLength(1);
    expect(attempt!.turns.map((t) => [t.turn, t.outcome])).toEqual([
      [0, 'committed'],
      [1, 'committed'],
      [2, 'committed'],
    ]);
    expect(attempt!.modelCalls.map((m) => [m.turn, m.inputTokens])).toEqual([
      [0, 100],
      [1, 160],
      [2, 200],
    ]);
    expect(attempt!.toolCalls.map((c) => [c.tool, c.turn, c.verdict])).toEqual([
      ['search@1', 0, 'executed'],
      ['save_note@1', 0, 'executed'],
      ['search@1', 0, 'executed'],
      ['save_note@1', 1, 'executed'],
    ]);
  });

  it('killed between two tools of a reply: the resumer replays the receipts it finds', async () => {
    const { runId, pids } = await crashAndResume('between-tools:research:0:2');
    const rootId = runSpan(runId).spanContext();
    const all = spans();
    expect(new Set(all.map((s) => s.traceId))).toEqual(new Set([rootId.traceId]));
    const tools = all
      .filter((s) => s.name.startsWith('execute_tool '))
      .map((s) => [s.pid, s.attributes['gen_ai.tool.name'], s.attributes['flujo.tool.verdict']]);
    expect(tools).toEqual([
      [pids[0], 'search', 'executed'],
      [pids[0], 'save_note', 'executed'],
      [pids[1], 'search', 'receipt_replayed'],
      [pids[1], 'save_note', 'receipt_replayed'],
      [pids[1], 'search', 'executed'],
      [pids[1], 'save_note', 'executed'],
    ]);
    // The killed worker's turn never ended, so it was never exported: its model call and tool
    // calls name a parent that is not there. The resumer's turns hang under the run's span.
    const turns = all.filter((s) => s.name === 'flujo.turn');
    expect(turns.map((t) => [t.pid, t.attributes['flujo.turn'], t.parentSpanId])).toEqual([
      [pids[1], 0, rootId.spanId],
      [pids[1], 1, rootId.spanId],
      [pids[1], 2, rootId.spanId],
    ]);
    const killed = all.filter((s) => s.pid === pids[0]);
    expect(killed.map((s) => s.name)).toEqual([
      'chat gpt-test',
      'execute_tool search',
      'execute_tool save_note',
    ]);
    expect(new Set(killed.map((s) => s.parentSpanId)).size).toBe(1);
    // The turn the resumer took again found the reply journaled: no second model call for it.
    expect(
      all.filter((s) => s.name === 'chat gpt-test').map((s) => s.attributes['flujo.turn']),
    ).toEqual([0, 1, 2]);
  });
});
