/**
 * A receipt that cannot be recorded because Redis does not answer is recorded once it does, not
 * dropped: the tool ran once, its receipt is in the ledger, and the call is never in doubt. A call
 * another worker took over meanwhile keeps that worker's ownership.
 */
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { RedisUnavailableError, ToolCallBusyError } from '../../src/errors.js';
import { createLedger, LedgerState, type Ledger } from '../../src/persistence/ledger.js';
import { callTool } from '../../src/tools/call-tool.js';
import { defineTool } from '../../src/tools/define-tool.js';
import { caught } from '../helpers/caught.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';

const ctx = { runId: 'run-1', stepId: 'notify', tenantId: 'acme', attempt: 1 };
let redis: Redis;
let prefix: string;
let now: number;
let ledger: Ledger;
let effects: number;

const tool = (requiresIdempotencyKey: boolean) =>
  defineTool({
    name: 'send_email',
    input: z.object({ to: z.string() }),
    idempotent: false,
    requiresIdempotencyKey,
    run: () => ({ sent: ++effects }),
  });

/** Makes the ledger's receipt writes fail as an unreachable Redis does, `times` times. */
function failReceipts(times: number, onFailure: () => Promise<void> = async () => {}): void {
  const original = ledger.markSucceeded.bind(ledger);
  let left = times;
  ledger.markSucceeded = async (...args) => {
    if (left-- > 0) {
      await onFailure();
      throw new RedisUnavailableError(
        'Redis at 127.0.0.1:1 is unavailable (Connection is closed.)',
      );
    }
    return original(...args);
  };
}

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  await redis.quit();
});
beforeEach(() => {
  prefix = testPrefix();
  now = 5_000_000;
  ledger = createLedger({ redis, prefix, clock: () => now });
  effects = 0;
});
afterEach(async () => {
  await deletePrefix(redis, prefix);
});

describe('a receipt that fails to record', () => {
  it('is recorded once Redis answers: the tool ran once and the call is not in doubt', async () => {
    failReceipts(3);
    const result = await callTool({ ledger, tool: tool(false), args: { to: 'ann' }, ctx });
    expect(result).toMatchObject({ receipt: { sent: 1 }, replayed: false });
    expect(result.entry.state).toBe(LedgerState.Succeeded);
    const again = await callTool({ ledger, tool: tool(false), args: { to: 'ann' }, ctx });
    expect(again).toMatchObject({ receipt: { sent: 1 }, replayed: true });
    expect(effects).toBe(1);
  });

  it('is not recorded over a run that took the call over while Redis did not answer', async () => {
    const leaseMs = 100;
    const callId = 'c-1';
    // While the receipt waits, the lease lapses and another run of the keyed call takes it over.
    failReceipts(1, async () => {
      now += leaseMs + 1;
      await ledger.markRunning(ctx.runId, ctx.tenantId, callId, 5000, { rerunInDoubt: true });
    });
    const error = await caught(
      callTool({ ledger, tool: tool(true), args: { to: 'bob' }, ctx, leaseMs, callId }),
    );
    expect(error).toBeInstanceOf(ToolCallBusyError);
    const entry = (await ledger.get(ctx.runId, ctx.tenantId, callId))!;
    expect(entry).toMatchObject({ state: LedgerState.Running, runs: 2, receipt: null });
  });
});
