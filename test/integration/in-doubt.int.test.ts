import { randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createRuntime, defineTool, type FlujoWorker, type Runtime } from '../../src/index.js';
import { ledgerCallId } from '../../src/persistence/ledger.js';
import { runFlujo } from '../helpers/cli.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';

/**
 * A non-idempotent tool whose outcome is unknown (a worker started it and died before recording a
 * receipt) stops its step for a person; after `flujo ledger resolve` and a resume, the run goes on
 * and the tool is called again only when the person said so.
 */
describe('an in-doubt tool call, resolved by a person', () => {
  let runtime: Runtime;
  let worker: FlujoWorker | undefined;
  let charges: number;
  const prefix = `t-${randomUUID().slice(0, 8)}`;
  const charge = defineTool({
    name: 'charge_card',
    input: z.object({ cents: z.number().int() }),
    idempotent: false,
    run: () => {
      charges++;
      return { charged: true, by: 'tool' };
    },
  });
  const plan = {
    name: 'pay',
    steps: [{ id: 'pay', kind: 'operator' as const, operator: 'pay', retry: { maxAttempts: 1 } }],
  };

  beforeEach(() => {
    charges = 0;
    runtime = createRuntime({ redis: redisUrl(), prefix })
      .operator('pay', async ({ tools }) => tools.call('charge_card', { cents: 500 }))
      .tool(charge);
  });
  afterEach(async () => {
    await worker?.close();
    await runtime.close();
    await deleteRuntimeKeys(prefix);
  });

  /** Starts the run, then leaves its charge in doubt as a dead worker would. */
  async function inDoubtRun(): Promise<{ runId: string; callId: string }> {
    const run = await runtime.start(plan, null);
    const args = { cents: 500 };
    const callId = ledgerCallId({
      tenantId: 'default',
      runId: run.runId,
      stepId: 'pay',
      tool: charge.identity,
      args,
    });
    const { ledger } = runtimeCore(runtime).stores;
    await ledger.prepare({
      runId: run.runId,
      stepId: 'pay',
      tenantId: 'default',
      callId,
      tool: charge.identity,
      args,
    });
    await ledger.markRunning(run.runId, 'default', callId, 1);
    await new Promise((r) => setTimeout(r, 20)); // the lease lapses: outcome unknown
    worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
    const failed = await run.settled({ timeoutMs: 10_000 });
    expect(failed.status).toBe('failed');
    expect(failed.summary).toMatchObject({ blockedStep: 'pay', reason: 'tool_outcome_unknown' });
    expect(JSON.stringify(failed.summary.detail)).toContain(
      `flujo ledger resolve ${run.runId} ${callId} --succeeded`,
    );
    expect(charges).toBe(0); // never a blind re-run
    return { runId: run.runId, callId };
  }

  /** `flujo <args>` on the test's prefix; throws with its stderr unless it exits 0. */
  async function flujo(...args: string[]) {
    const r = await runFlujo([...args, '--prefix', prefix]);
    if (r.code !== 0) throw new Error(`flujo ${args.join(' ')} exited ${r.code}: ${r.err}`);
    return { stdout: r.out };
  }

  it('--succeeded records the receipt; the resumed run uses it without calling the tool', async () => {
    const { runId, callId } = await inDoubtRun();
    const { stdout } = await flujo(
      'ledger',
      'resolve',
      runId,
      callId,
      '--succeeded',
      '{"charged":true,"by":"ops"}',
      '--by',
      'ops',
    );
    expect(stdout).toContain('(charge_card@1) as succeeded (by ops)');
    await runtime.resume(runId, { by: 'ops' });
    const done = await (await runtime.attach(runId)).settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced).toEqual({ pay: { charged: true, by: 'ops' } });
    expect(charges).toBe(0);
    const [entry] = await runtime.ledger(runId);
    expect(entry).toMatchObject({ state: 'SUCCEEDED', resolution: { by: 'ops', as: 'succeeded' } });
  });

  it('--retry lets the resumed step call the tool again, once', async () => {
    const { runId, callId } = await inDoubtRun();
    await flujo('ledger', 'resolve', runId, callId, '--retry', '--by', 'ops');
    await runtime.resume(runId);
    const done = await (await runtime.attach(runId)).settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(charges).toBe(1);
    const entries = await runtime.ledger(runId);
    expect(entries).toHaveLength(1);
    expect(entries[0]).toMatchObject({ state: 'SUCCEEDED', resolution: { as: 'retry' } });
  });
});
