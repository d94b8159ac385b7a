import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  ErrorCode,
  FlujoError,
  InputValidationError,
  RevivedError,
  ToolCallBusyError,
  ToolInputError,
  ToolOutcomeUnknownError,
} from '../../src/errors.js';
import { createLedger, type Ledger } from '../../src/persistence/ledger.js';
import { callTool, type CallToolOptions } from '../../src/tools/call-tool.js';
import { defineTool, type ToolContext } from '../../src/tools/define-tool.js';
import { connect, deletePrefix, testPrefix } from '../helpers/redis.js';
import { caught } from '../helpers/caught.js';

/** A retryable failure, as a tool would raise for a timeout. */
class FlakyError extends FlujoError {
  override name = 'FlakyError';
  readonly code = ErrorCode.Unknown;
  constructor() {
    super('upstream timed out', true);
  }
}

let redis: Redis;
let prefix: string;
let now: number;
let ledger: Ledger;
let effects: Map<string, number>;
let seen: ToolContext[];

const ctx = { runId: 'run-1', stepId: 'notify', tenantId: 'acme', attempt: 1 };
const input = z.object({ to: z.string(), subject: z.string().default('hello') });
const effect = (args: z.output<typeof input>, c: ToolContext) => {
  seen.push(c);
  effects.set(c.idempotencyKey, (effects.get(c.idempotencyKey) ?? 0) + 1);
  return { sent: args.to, subject: args.subject, n: effects.get(c.idempotencyKey) };
};
const plain = () =>
  defineTool({
    name: 'send_email',
    input,
    idempotent: false,
    requiresIdempotencyKey: false,
    run: effect,
  });
const keyed = () =>
  defineTool({ name: 'send_email', input, requiresIdempotencyKey: true, run: effect });
const total = (): number => [...effects.values()].reduce((a, b) => a + b, 0);
const call = (over: Partial<CallToolOptions> = {}) =>
  callTool({ ledger, tool: plain(), args: { to: 'ann' }, ctx, ...over });
/** Leaves the call as a crashed worker would: RUNNING, then the lease runs out. */
async function crashMidCall(callId: string, tool = 'send_email@1'): Promise<void> {
  await ledger.prepare({ ...ctx, callId, tool, args: { to: 'ann', subject: 'hello' } });
  await ledger.markRunning(ctx.runId, ctx.tenantId, callId, 100);
  now += 101;
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
  effects = new Map();
  seen = [];
});
afterEach(async () => {
  await deletePrefix(redis, prefix);
});

describe('callTool', () => {
  it('runs once; a second call returns the receipt without running the tool', async () => {
    const first = await call();
    expect(first).toMatchObject({
      replayed: false,
      receipt: { sent: 'ann', subject: 'hello', n: 1 },
    });
    expect(first.entry).toMatchObject({ state: 'SUCCEEDED', runs: 1, tool: 'send_email@1' });
    const second = await call();
    expect(second).toEqual({ receipt: first.receipt, replayed: true, entry: first.entry });
    expect(total()).toBe(1);
    expect(seen[0]).toMatchObject({
      ...ctx,
      callId: first.entry.callId,
      idempotencyKey: first.entry.callId,
    });
    expect(seen[0]?.signal).toBeInstanceOf(AbortSignal);
  });

  it('asks the guard only when the tool will really run; a throw there runs nothing', async () => {
    let counted = 0;
    const guard = {
      beforeRun: () => {
        counted++;
      },
    };
    await call({ guard });
    await call({ guard });
    expect([counted, total()]).toEqual([1, 1]);
    const over = await caught(
      call({
        args: { to: 'bob' },
        guard: {
          beforeRun: () => {
            throw new Error('budget exhausted');
          },
        },
      }),
    );
    expect(over).toEqual(new Error('budget exhausted'));
    expect(total()).toBe(1);
    expect((await ledger.list('run-1', 'acme'))[1]).toMatchObject({ state: 'PREPARED', runs: 0 });
  });

  it('key order and defaults do not change the call id', async () => {
    const a = await call({ args: { to: 'ann' } });
    const b = await call({ args: { subject: 'hello', to: 'ann' } });
    expect(b.entry.callId).toBe(a.entry.callId);
    expect(b.replayed).toBe(true);
    const c = await call({ args: { to: 'ann', subject: 'other' } });
    expect(c.entry.callId).not.toBe(a.entry.callId);
    expect((await call({ callId: 'model-call-7' })).entry.callId).toBe('model-call-7');
    expect(total()).toBe(3);
  });

  it('an in-doubt call of a non-idempotent tool is refused with the resolve command, not re-run', async () => {
    await crashMidCall('c-1');
    const e = await caught(call({ callId: 'c-1' }));
    expect(e).toBeInstanceOf(ToolOutcomeUnknownError);
    expect((e as Error).message).toBe(
      `Tool "send_email@1" call c-1 of step "notify" started but its outcome is unknown (its worker stopped before recording a receipt) and the tool is not idempotent, so it was not run again. Check the tool's side effect, then resolve it: flujo ledger resolve run-1 c-1 --succeeded '<receipt json>'  or  flujo ledger resolve run-1 c-1 --retry (then flujo resume run-1)`,
    );
    expect(effects.get('c-1')).toBeUndefined();
    expect((await ledger.get('run-1', 'acme', 'c-1'))?.state).toBe('IN_DOUBT');
    // A person checks and says it did happen: the next call returns that receipt.
    await ledger.resolve(
      'run-1',
      'acme',
      'c-1',
      { succeeded: { sent: 'ann', manual: true } },
      'ops',
    );
    expect(await call({ callId: 'c-1' })).toMatchObject({
      replayed: true,
      receipt: { manual: true },
    });
    expect(effects.get('c-1')).toBeUndefined();
  });

  it('after resolve --retry the call runs again', async () => {
    await crashMidCall('c-1');
    await expect(call({ callId: 'c-1' })).rejects.toThrow(ToolOutcomeUnknownError);
    await ledger.resolve('run-1', 'acme', 'c-1', { retry: true }, 'ops');
    const result = await call({ callId: 'c-1' });
    expect(result).toMatchObject({ replayed: false, entry: { state: 'SUCCEEDED', runs: 2 } });
    expect(effects.get('c-1')).toBe(1);
  });

  it('an in-doubt call of an idempotent tool is re-run with the same idempotency key', async () => {
    await crashMidCall('c-1');
    const result = await call({ tool: keyed(), callId: 'c-1' });
    expect(result).toMatchObject({ replayed: false, entry: { state: 'SUCCEEDED', runs: 2 } });
    expect(seen.map((c) => c.idempotencyKey)).toEqual(['c-1']);
    expect(total()).toBe(1);
  });

  it('a retryable failure is recorded as FAILED and a later call runs again', async () => {
    let fail = true;
    const tool = defineTool({
      name: 'send_email',
      input,
      requiresIdempotencyKey: true,
      run: (args, c) => {
        if (fail) throw new FlakyError();
        return effect(args, c);
      },
    });
    const e = await caught(call({ tool }));
    expect(e).toBeInstanceOf(FlakyError);
    const [entry] = await ledger.list('run-1', 'acme');
    expect(entry).toMatchObject({
      state: 'FAILED',
      runs: 1,
      error: { name: 'FlakyError', retryable: true },
    });
    fail = false;
    const later = await call({ tool });
    expect(later).toMatchObject({
      replayed: false,
      entry: { state: 'SUCCEEDED', runs: 2, error: null },
    });
    expect(total()).toBe(1);
  });

  it('a final failure is the outcome: later calls throw it again without running the tool', async () => {
    let runs = 0;
    const tool = defineTool({
      name: 'pay',
      input: z.object({ cents: z.number() }),
      idempotent: false,
      run: () => {
        runs++;
        // A failure the tool says is final (a plain Error without the flag counts as transient).
        throw Object.assign(new Error('card declined'), { retryable: false });
      },
    });
    const first = await caught(call({ tool, args: { cents: 5 } }));
    expect(first).toMatchObject({
      name: 'UnknownError',
      code: 'unknown',
      message: 'card declined',
      retryable: false,
    });
    expect((first as Error).cause).toBeInstanceOf(Error);
    const again = await caught(call({ tool, args: { cents: 5 } }));
    expect(again).toBeInstanceOf(RevivedError);
    expect(again).toMatchObject({
      name: 'UnknownError',
      message: 'card declined',
      retryable: false,
    });
    expect(runs).toBe(1);
  });

  it('refuses invalid arguments before the ledger sees them', async () => {
    const e = await caught(call({ args: { to: 42 } }));
    expect(e).toBeInstanceOf(ToolInputError);
    expect((e as ToolInputError).issues).toEqual([
      { path: 'args.to', message: 'Invalid input: expected string, received number' },
    ]);
    expect(await ledger.list('run-1', 'acme')).toEqual([]);
    expect(total()).toBe(0);
  });

  it('records an invalid result as a final failure: the effect happened, it never runs again', async () => {
    const tool = defineTool({
      ...{ name: 'send_email', input, idempotent: true },
      output: z.object({ id: z.string() }),
      run: effect,
    });
    await expect(call({ tool })).rejects.toThrow(InputValidationError);
    const [entry] = await ledger.list('run-1', 'acme');
    expect(entry).toMatchObject({
      state: 'FAILED',
      error: { code: 'input_invalid', retryable: false },
    });
    await expect(call({ tool })).rejects.toThrow(/output\.id/);
    expect(total()).toBe(1);
  });

  it('a live lease of another worker makes the call busy, retryable', async () => {
    await ledger.prepare({
      ...ctx,
      callId: 'c-1',
      tool: 'send_email@1',
      args: { to: 'ann', subject: 'hello' },
    });
    await ledger.markRunning('run-1', 'acme', 'c-1', 1000);
    now += 400;
    const e = await caught(call({ tool: keyed(), callId: 'c-1' }));
    expect(e).toBeInstanceOf(ToolCallBusyError);
    expect((e as ToolCallBusyError).retryAfterMs).toBe(600);
    expect(total()).toBe(0);
  });

  it('renews the lease while a slow tool runs, so nobody finds it in doubt', async () => {
    const real = createLedger({ redis, prefix });
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const slow = defineTool({
      name: 'slow',
      input: z.object({}),
      idempotent: false,
      run: async () => {
        await gate;
        return 'done';
      },
    });
    const running = callTool({ ledger: real, tool: slow, args: {}, ctx, leaseMs: 150 });
    await new Promise((r) => setTimeout(r, 500)); // over three lease lengths
    const e = await caught(callTool({ ledger: real, tool: slow, args: {}, ctx, leaseMs: 150 }));
    expect(e).toBeInstanceOf(ToolCallBusyError);
    release();
    expect(await running).toMatchObject({
      receipt: 'done',
      entry: { state: 'SUCCEEDED', runs: 1 },
    });
  });

  it('does not start when the signal is already aborted', async () => {
    const controller = new AbortController();
    controller.abort(new Error('shutting down'));
    await expect(call({ ctx: { ...ctx, signal: controller.signal } })).rejects.toThrow(
      'shutting down',
    );
    expect(total()).toBe(0);
    // Nothing started, so nothing is recorded (a call with a budget check is left PREPARED).
    expect(await ledger.list('run-1', 'acme')).toEqual([]);
    await expect(
      call({ ctx: { ...ctx, signal: controller.signal }, guard: { beforeRun: () => undefined } }),
    ).rejects.toThrow('shutting down');
    expect(total()).toBe(0);
    expect((await ledger.list('run-1', 'acme'))[0]?.state).toBe('PREPARED');
  });

  it('an aborted keyed tool may run again; an aborted plain tool is left for its lease to lapse', async () => {
    const abortable = (idempotent: boolean) => {
      const controller = new AbortController();
      const tool = defineTool({
        name: idempotent ? 'keyed' : 'plain',
        input: z.object({}),
        idempotent,
        run: (_args, c) => {
          controller.abort(new Error('stop'));
          c.signal.throwIfAborted();
        },
      });
      return call({ tool, args: {}, ctx: { ...ctx, signal: controller.signal } });
    };
    await expect(abortable(true)).rejects.toThrow('stop');
    await expect(abortable(false)).rejects.toThrow('stop');
    const [keyedEntry, plainEntry] = await ledger.list('run-1', 'acme');
    expect(keyedEntry).toMatchObject({
      tool: 'keyed@1',
      state: 'FAILED',
      error: { retryable: true },
    });
    expect(plainEntry).toMatchObject({ tool: 'plain@1', state: 'RUNNING', runs: 1 });
  });
});

describe('callTool: read-only tools take no lease', () => {
  let runs: number;
  const lookup = () =>
    defineTool({
      name: 'lookup',
      input: z.object({ q: z.string() }),
      class: 'read_only',
      run: ({ q }) => ({ q, n: ++runs }),
    });
  const read = (over: Partial<CallToolOptions> = {}) =>
    callTool({ ledger, tool: lookup(), args: { q: 'x' }, ctx, callId: 'c-ro', ...over });
  beforeEach(() => {
    runs = 0;
  });

  it('runs, then records the receipt in one write; a second call replays it', async () => {
    const first = await read();
    expect(first).toMatchObject({ replayed: false, receipt: { q: 'x', n: 1 } });
    expect(first.entry).toMatchObject({
      state: 'SUCCEEDED',
      runs: 1,
      leaseUntil: null,
      tool: 'lookup@1',
      seq: 1,
    });
    const second = await read();
    expect(second).toEqual({ receipt: first.receipt, replayed: true, entry: first.entry });
    // Read beforehand (as a granular turn does beside its journal write): the same answer.
    const third = await read({ known: ledger.get('run-1', 'acme', 'c-ro') });
    expect(third.replayed).toBe(true);
    expect(runs).toBe(1);
  });

  it('a receipt another run recorded meanwhile stands: the later run returns it', async () => {
    // The other run read the ledger before this one recorded: it runs the tool too.
    const stale = Promise.resolve(null);
    const first = await read();
    const late = await read({ known: stale });
    expect(runs).toBe(2);
    expect(late).toMatchObject({ replayed: true, receipt: first.receipt });
    expect(await ledger.list('run-1', 'acme')).toEqual([first.entry]);
  });

  it('is never in doubt: a call left RUNNING by a dead worker just runs again', async () => {
    await ledger.prepare({ ...ctx, callId: 'c-ro', tool: 'lookup@1', args: { q: 'x' } });
    await ledger.markRunning(ctx.runId, ctx.tenantId, 'c-ro', 100);
    now += 101;
    const result = await read();
    expect(result).toMatchObject({ replayed: false, receipt: { q: 'x', n: 1 } });
    expect(result.entry).toMatchObject({ state: 'SUCCEEDED', runs: 2, leaseUntil: null });
  });

  it('records a failure; the same call id with other arguments is refused, nothing runs', async () => {
    const failing = defineTool({
      name: 'lookup',
      input: z.object({ q: z.string() }),
      class: 'read_only',
      run: () => {
        throw new FlakyError();
      },
    });
    const error = await caught(
      callTool({ ledger, tool: failing, args: { q: 'x' }, ctx, callId: 'c-ro' }),
    );
    expect(error).toBeInstanceOf(FlakyError);
    expect(await ledger.get('run-1', 'acme', 'c-ro')).toMatchObject({
      state: 'FAILED',
      error: { name: 'FlakyError', retryable: true },
    });
    // A retryable failure runs again, and the receipt replaces it.
    expect((await read()).entry).toMatchObject({ state: 'SUCCEEDED', runs: 2 });
    const other = await caught(read({ args: { q: 'y' } }));
    expect(other).toMatchObject({ code: 'non_determinism' });
    expect(runs).toBe(1);
  });
});
