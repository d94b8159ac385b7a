/**
 * Action-level idempotency across runs: an operator step with `idempotency.keyInputs` records its
 * tool calls in the action ledger of (tenant, operator, key values). A second run with the same
 * values gets the first run's receipts and no second effect; other values or another tenant act
 * anew; a call in doubt is resolved through the run, like any other.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { actionCallId, actionLedgerScope } from '../../src/execution/action-keys.js';
import { stepIdempotencyKey, type OperatorContext } from '../../src/execution/execute-step.js';
import { InputValidationError, PlanValidationError } from '../../src/errors.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime, runtimeCore } from '../../src/runtime.js';
import { defineTool } from '../../src/tools/define-tool.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { caught } from '../helpers/caught.js';
import {
  connect,
  deleteRuntimeKeys,
  readPrefix,
  readQuietPrefix,
  redisUrl,
  testPrefix,
} from '../helpers/redis.js';

/** Charges at the "payment service": one entry per effect, with the key it was given. */
const charges: { cents: number; key: string; runId: string }[] = [];
let chargeDelayMs = 0;
const charge = defineTool({
  name: 'charge',
  class: 'external',
  requiresIdempotencyKey: true,
  input: z.object({ cents: z.number() }),
  run: async ({ cents }, ctx) => {
    if (chargeDelayMs > 0) await sleep(chargeDelayMs);
    charges.push({ cents, key: ctx.idempotencyKey, runId: ctx.runId });
    return { charged: cents, n: charges.length };
  },
});
/** Not idempotent: a call in doubt stops its step for a person. */
let ships = 0;
const ship = defineTool({
  name: 'ship',
  class: 'external',
  idempotent: false,
  input: z.object({ order: z.string() }),
  run: ({ order }) => {
    ships++;
    return { shipped: order };
  },
});

const invocations: string[] = [];
const operators = {
  pay: async (ctx: OperatorContext) => {
    invocations.push(ctx.runId);
    const order = (ctx.input as { order: { id: string; cents: number } }).order;
    return ctx.tools.call('charge', { cents: order.cents });
  },
  send: async (ctx: OperatorContext) => {
    invocations.push(ctx.runId);
    return ctx.tools.call('ship', { order: (ctx.input as { order: { id: string } }).order.id });
  },
};

const paying = (operator = 'pay'): PlanInput => ({
  name: 'paying',
  defaults: { retry: { maxAttempts: 2, initialDelayMs: 10, jitter: 0 } },
  steps: [
    {
      id: 'pay',
      kind: 'operator',
      operator,
      effects: ['external'],
      idempotency: { keyInputs: ['order.id'] },
    },
  ],
});

let redis: Redis;
let runtime: Runtime;
let worker: FlujoWorker;
const prefix = testPrefix();

beforeAll(async () => {
  redis = connect();
  runtime = createRuntime({ redis: redisUrl(), prefix, operators, tools: [charge, ship] });
  worker = runtime.createWorker({ concurrency: 4 });
  await worker.ready();
});
afterAll(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
  redis.disconnect();
});

const settle = async (runId: string) =>
  (await runtime.attach(runId)).settled({ timeoutMs: 20_000 });

describe('action keys across runs', { timeout: 30_000 }, () => {
  it('a second run with the same key values gets the first receipt and no second effect; other values act anew', async () => {
    charges.length = 0;
    const first = await runtime.start(paying(), { order: { id: 'o-1', cents: 100 } });
    const one = await settle(first.runId);
    const second = await runtime.start(paying(), { order: { id: 'o-1', cents: 100 } });
    const two = await settle(second.runId);
    expect([one.status, two.status]).toEqual(['succeeded', 'succeeded']);
    // Both runs ran their operator; the service saw one charge, and both got its receipt.
    expect(invocations.filter((r) => r === first.runId || r === second.runId)).toHaveLength(2);
    expect(charges.map((c) => [c.cents, c.runId])).toEqual([[100, first.runId]]);
    expect(two.summary.produced['pay']).toEqual(one.summary.produced['pay']);
    // The second run's ledger lists the shared call, with the first run's receipt.
    const ledger = await runtime.ledger(second.runId);
    expect(ledger.map((e) => [e.state, e.receipt])).toEqual([
      ['SUCCEEDED', { charged: 100, n: 1 }],
    ]);

    const third = await runtime.start(paying(), { order: { id: 'o-2', cents: 100 } });
    expect((await settle(third.runId)).status).toBe('succeeded');
    expect(charges).toHaveLength(2);
    // The tool was given each action's own key, the same for every run of that action.
    expect(charges[0]!.key).not.toBe(charges[1]!.key);
  });

  it('another tenant with the same key values acts anew', async () => {
    charges.length = 0;
    const a = await runtime.start(paying(), { order: { id: 'o-9', cents: 5 } }, { tenantId: 'a' });
    const b = await runtime.start(paying(), { order: { id: 'o-9', cents: 5 } }, { tenantId: 'b' });
    await settle(a.runId);
    await settle(b.runId);
    expect(charges.map((c) => c.runId).sort()).toEqual([a.runId, b.runId].sort());
  });

  it('two runs at once with the same key: one effect (the second waits for the lease), one receipt', async () => {
    charges.length = 0;
    chargeDelayMs = 300;
    try {
      const runs = await Promise.all(
        [1, 2, 3].map(() => runtime.start(paying(), { order: { id: 'o-race', cents: 7 } })),
      );
      const reports = await Promise.all(runs.map((r) => settle(r.runId)));
      expect(reports.map((r) => r.status)).toEqual(['succeeded', 'succeeded', 'succeeded']);
      expect(charges).toHaveLength(1);
      expect(new Set(reports.map((r) => JSON.stringify(r.summary.produced['pay']))).size).toBe(1);
    } finally {
      chargeDelayMs = 0;
    }
  });

  it('a call in doubt in the action ledger stops the step; it is resolved through the run and never re-run', async () => {
    ships = 0;
    const input = { order: { id: 'o-doubt' } };
    // A worker of an earlier run began the call and died: RUNNING with a lapsed lease.
    const step = parsePlan(paying('send')).steps[0]!;
    const key = stepIdempotencyKey('default', 'unused', step, input);
    const callId = actionCallId(key, 'ship', 0);
    const entry = await runtimeCore(runtime).stores.ledger.begin(
      {
        runId: actionLedgerScope(key),
        stepId: 'pay',
        tenantId: 'default',
        callId,
        tool: ship.identity,
        args: { order: 'o-doubt' },
      },
      20,
    );
    expect(entry.state).toBe('RUNNING');
    await sleep(50);

    const run = await runtime.start(paying('send'), input);
    const report = await settle(run.runId);
    expect(report.status).toBe('failed');
    const error = report.steps[0]!.error!;
    expect(error.code).toBe('tool_outcome_unknown');
    expect(error.message).toContain(`flujo ledger resolve ${run.runId} ${callId}`);
    expect(ships).toBe(0);

    await runtime.resolveToolCall(run.runId, callId, { succeeded: { shipped: 'by hand' } }, 'ana');
    await runtime.resume(run.runId, { by: 'ana' });
    const resumed = await settle(run.runId);
    expect(resumed.status).toBe('succeeded');
    expect(resumed.summary.produced['pay']).toEqual({ shipped: 'by hand' });
    expect(ships).toBe(0);
  });
});

describe('key inputs are checked before anything is written', () => {
  it('a key input missing from the run input: InputValidationError naming the path, Redis unchanged', async () => {
    const before = await readQuietPrefix(redis, `${prefix}:`);
    const error = await caught(runtime.start(paying(), { order: { cents: 1 } }));
    expect(error).toBeInstanceOf(InputValidationError);
    expect((error as InputValidationError).issues).toEqual([
      {
        path: 'steps[0].idempotency.keyInputs[0]',
        message: expect.stringContaining(
          '"order.id" leads to no value in the run input of step "pay"',
        ) as string,
      },
    ]);
    expect(await readPrefix(redis, `${prefix}:`)).toEqual(before);
  });

  it('key inputs on a step that is not an operator step are refused with the plan', () => {
    expect(() =>
      parsePlan({
        name: 'x',
        steps: [{ id: 'a', kind: 'agent', agent: 'w', idempotency: { keyInputs: ['order.id'] } }],
      }),
    ).toThrow(PlanValidationError);
    expect(() =>
      parsePlan({
        name: 'x',
        steps: [{ id: 'g', kind: 'human_gate', idempotency: { keyInputs: ['k'] } }],
      }),
    ).toThrow(/steps\[0\]\.idempotency\.keyInputs: only operator steps take key inputs/);
  });
});
