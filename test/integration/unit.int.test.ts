/**
 * The phases of a unit of work, called one by one without a BullMQ worker: a run is started
 * through the public API (no worker takes its jobs), and a unit host on the same prefix admits,
 * guards, runs and commits its units. What they did is checked in the committed snapshot, the
 * event stream and the ledger.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { runStepUnit } from '../../src/actors/step.js';
import { runTurnUnit } from '../../src/actors/turn.js';
import {
  abortUnit,
  admitUnit,
  createUnitHost,
  guardUnit,
  type Chain,
  type UnitHost,
} from '../../src/actors/unit.js';
import { runUnit } from '../../src/worker/worker.js';
import {
  createRuntime,
  defineTool,
  type OperatorContext,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { StepTimeoutError } from '../../src/errors.js';
import { silentLogger } from '../../src/logging.js';
import type { RunEventRecord } from '../../src/persistence/snapshot-store.js';
import { RuntimeCore } from '../../src/actors/core.js';
import { abortMessage } from '../../src/actors/runtime-queues.js';
import { JobName, type JobData } from '../../src/actors/jobs.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';

/** The run's stored events, as plain records. */
async function eventsOf(runtime: Runtime, runId: string): Promise<RunEventRecord[]> {
  const out: RunEventRecord[] = [];
  for await (const e of runtime.events(runId)) out.push(e.data);
  return out;
}

const identity = { host: 'test-host', pid: 4242, id: 'unittest' };
/** A chain that may not go on: each unit is one job. */
const single = (self: string): Chain => ({ self, until: -Infinity });
/** A chain that may go on for a while. */
const chained = (self: string): Chain => ({ self, until: performance.now() + 60_000 });

let ran: { n: number }[] = [];
const record = defineTool({
  name: 'record',
  class: 'external',
  idempotent: false,
  input: z.object({ n: z.number() }),
  run: (args) => {
    ran.push(args);
    return { recorded: args.n };
  },
});

async function callsRecord(ctx: OperatorContext) {
  const receipt = await ctx.tools.call<{ recorded: number }>('record', { n: 7 });
  return { got: receipt.recorded };
}

const line: PlanInput = {
  name: 'line',
  steps: [
    { id: 'a', kind: 'operator', operator: 'callsRecord' },
    { id: 'b', kind: 'operator', operator: 'echo', dependsOn: ['a'] },
  ],
};

describe('the unit host, phase by phase', () => {
  let prefix: string;
  let runtime: Runtime;
  let core: RuntimeCore;
  let host: UnitHost;

  beforeEach(() => {
    prefix = `t-${randomUUID().slice(0, 8)}`;
    ran = [];
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
    core = new RuntimeCore({ redis: redisUrl(), prefix, logger: silentLogger });
    core.registry.operators.set('callsRecord', callsRecord);
    core.registry.operators.set('echo', (ctx) => ({ from: ctx.deps }));
    core.registry.tools.register(record);
    host = createUnitHost(core, { leaseMs: 5000, identity });
  });
  afterEach(async () => {
    await runtime.close();
    await core.close();
    await deleteRuntimeKeys(prefix);
  });

  it('admitUnit admits the due attempt and turns away any other', async () => {
    const { runId } = await runtime.start(line, null);
    const admitted = await admitUnit(host, { runId, stepId: 'a', attempt: 1 }, 'job-1');
    expect(typeof admitted).toBe('object');
    if (typeof admitted === 'string') throw new Error(admitted);
    expect(admitted.state.status).toBe('READY');
    expect(admitted.state.attempt).toBe(1);
    expect(admitted.step.id).toBe('a');
    expect(admitted.meta.plan.name).toBe('line');
    expect(await admitUnit(host, { runId, stepId: 'a', attempt: 2 }, 'job-1')).toBe('already-done');
    // b waits for a: not due.
    expect(await admitUnit(host, { runId, stepId: 'b', attempt: 1 }, 'job-1')).toBe('already-done');
  });

  it('runStepUnit runs the step once, commits it with its tool call and run, and the ledger holds the call', async () => {
    const { runId } = await runtime.start(line, null);
    const data: JobData = { runId, stepId: 'a', attempt: 1 };
    expect(await runStepUnit(host, data, single('job-a'))).toBe('succeeded');
    expect(ran).toEqual([{ n: 7 }]);

    const report = await runtime.status(runId);
    const a = report.steps.find((s) => s.stepId === 'a')!;
    expect(a.status).toBe('SUCCEEDED');
    expect(a.output).toEqual({ got: 7 });
    expect(report.steps.find((s) => s.stepId === 'b')!.status).toBe('READY');

    const events = await eventsOf(runtime, runId);
    const ofA = events.filter((e) => e['stepId'] === 'a').map((e) => e.type);
    // The first change is the run's creation making a READY.
    expect(ofA).toEqual([
      'step.changed',
      'step.started',
      'step.changed',
      'tool.called',
      'step.ran',
      'step.succeeded',
      'step.changed',
    ]);
    const ranEvent = events.find((e) => e.type === 'step.ran')!;
    expect(ranEvent['worker']).toEqual({ host: 'test-host', pid: 4242 });

    const ledger = await runtime.ledger(runId);
    expect(ledger).toHaveLength(1);
    expect(ledger[0]!.tool).toBe('record@1');
    expect(ledger[0]!.state).toBe('SUCCEEDED');
    expect(ledger[0]!.runs).toBe(1);
    expect(ledger[0]!.receipt).toEqual({ recorded: 7 });

    // The same unit again (a redelivered job): its guard finds it done; nothing runs again.
    expect(await runStepUnit(host, data, single('job-a'))).toBe('already-done');
    expect(ran).toHaveLength(1);
    expect(await runtime.ledger(runId)).toHaveLength(1);
  });

  it('with a chain that may go on, the commit hands back the next unit, admitted; runUnit runs it', async () => {
    const { runId } = await runtime.start(line, null);
    const chain = chained('job-a');
    const first = await runStepUnit(host, { runId, stepId: 'a', attempt: 1 }, chain);
    if (typeof first !== 'object' || !('next' in first)) throw new Error(JSON.stringify(first));
    expect(first.ended).toBe('succeeded');
    expect(first.next.name).toBe(JobName.step);
    expect(first.next.data).toEqual({ runId, stepId: 'b', attempt: 1 });
    expect(first.admitted.step.id).toBe('b');
    const second = await runUnit(host, first.next.name, first.next.data, chain, undefined, {
      ...first.admitted,
    });
    expect(second).toBe('succeeded');
    const report = await runtime.status(runId);
    expect(report.status).toBe('succeeded');
    expect(report.steps.find((s) => s.stepId === 'b')!.output).toEqual({
      from: { a: { got: 7 } },
    });
    expect(ran).toHaveLength(1);
  });

  it('guardUnit fails the attempt when its limit is up and aborts the work', async () => {
    let seen: AbortSignal | undefined;
    const limit = { ms: 50, error: () => new StepTimeoutError('a', 1, 50) };
    const where = { runId: 'r1', stepId: 'a', attempt: 1 };
    const result = await guardUnit(host, where, undefined, limit, async (signal) => {
      seen = signal;
      await sleep(5000, undefined, { signal }).catch(() => {});
      return { kind: 'succeeded' as const, output: 'late' };
    });
    expect(result.kind).toBe('failed');
    if (result.kind !== 'failed') throw new Error('not failed');
    expect(result.error.code).toBe('timeout');
    expect(seen?.aborted).toBe(true);
    expect(host.aborts.size).toBe(0);
  });

  it('abortUnit aborts the running attempt it names, and no other', async () => {
    const where = { runId: 'r2', stepId: 'a', attempt: 1 };
    let started!: () => void;
    const running = new Promise<void>((resolve) => (started = resolve));
    const guarded = guardUnit(host, where, undefined, null, async (signal) => {
      started();
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      return { kind: 'failed' as const, error: { code: 'cancelled' } as never };
    });
    await running;
    expect(abortUnit(host, abortMessage('r2', 'a', 2))).toBe(false);
    expect(abortUnit(host, abortMessage('r2', 'a', 1))).toBe(true);
    await guarded;
    expect(host.aborts.size).toBe(0);
  });
});

describe('the unit host: one turn of a granular agent step', () => {
  const model = useScriptedModel();
  let prefix: string;
  let runtime: Runtime;
  let core: RuntimeCore;
  let host: UnitHost;

  beforeEach(() => {
    ran = [];
    prefix = `t-${randomUUID().slice(0, 8)}`;
    const agent = scriptedAgent(model, {
      name: 'recorder',
      systemPrompt: 'Record 3, then answer.',
      tools: [record],
      timeoutMs: 5000,
    });
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
    core = new RuntimeCore({ redis: redisUrl(), prefix, logger: silentLogger });
    core.registry.agents.set('recorder', agent);
    core.registry.tools.register(record);
    host = createUnitHost(core, { leaseMs: 5000, identity });
  });
  afterEach(async () => {
    await runtime.close();
    await core.close();
    await deleteRuntimeKeys(prefix);
  });

  it('runTurnUnit commits each turn with its messages; the tool runs once, in the ledger', async () => {
    const plan: PlanInput = {
      name: 'turns',
      steps: [{ id: 'loop', kind: 'agent', agent: 'recorder', mode: 'granular', maxTurns: 4 }],
    };
    const { runId } = await runtime.start(plan, 'go');
    model.enqueue(
      { toolCalls: [{ id: 'c0', name: 'record', arguments: { n: 3 } }] },
      { text: 'Recorded.' },
    );
    const turn0: JobData = { runId, stepId: 'loop', attempt: 1, turn: 0 };
    expect(await runTurnUnit(host, turn0, single('job-t0'))).toBe('turn');
    expect(ran).toEqual([{ n: 3 }]);
    let report = await runtime.status(runId);
    expect(report.steps[0]!.status).toBe('RUNNING');

    // The same turn again (redelivered after its commit): nothing runs, nothing is asked.
    expect(await runTurnUnit(host, turn0, single('job-t0'))).toBe('turn-committed');
    expect(model.requests).toHaveLength(1);

    expect(await runTurnUnit(host, { ...turn0, turn: 1 }, single('job-t1'))).toBe('succeeded');
    report = await runtime.status(runId);
    expect(report.status).toBe('succeeded');
    expect(ran).toHaveLength(1);
    expect(model.requests).toHaveLength(2);

    const events = await eventsOf(runtime, runId);
    const commits = events.filter((e) => e.type === 'turn.committed');
    expect(commits.map((e) => [e['turn'], e['cursor']])).toEqual([
      [0, 3],
      [1, 4],
    ]);
    expect(events.filter((e) => e.type === 'turn.ran')).toHaveLength(2);
    expect(events.filter((e) => e.type === 'tool.called')).toHaveLength(1);
    const ledger = await runtime.ledger(runId);
    expect(ledger.map((e) => [e.tool, e.state, e.runs])).toEqual([['record@1', 'SUCCEEDED', 1]]);
  });
});
