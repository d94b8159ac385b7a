import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { listFilterOf, parseTimeOption } from '../../src/cli/commands/list.js';
import { maskRedisUrl, repeatFlags, type Ctx } from '../../src/cli/context.js';
import { CliError } from '../../src/cli/exit-codes.js';
import {
  attemptsOf,
  duration,
  errorText,
  eventLine,
  idleLine,
  inTimeOrder,
  listLines,
  nextCommands,
} from '../../src/cli/render.js';
import { checkRunListFilter } from '../../src/worker/run-list.js';
import type { StoredRunEvent } from '../../src/persistence/snapshot-store.js';

const ev = (type: string, data: Record<string, unknown>): StoredRunEvent => ({
  id: '1-0',
  version: 1,
  type,
  data: { type, ...data },
});
const worker = { host: 'box', pid: 42 };
const ctx = (values: Ctx['values'], args: string[] = []): Ctx => ({
  args,
  values,
  cwd: '.',
  env: {},
});
const refusal = (f: () => unknown): string => {
  try {
    f();
  } catch (error) {
    if (error instanceof CliError) return error.message;
    throw error;
  }
  throw new Error('not refused');
};

describe('how runs are shown', () => {
  it('durations read as people say them', () => {
    expect([5.25, 850, 12_345, 245_000, 7_380_000, -1].map(duration)).toEqual([
      '5.3 ms',
      '850 ms',
      '12.3 s',
      '4 min 05 s',
      '2 h 03 min',
      '-',
    ]);
  });

  it('describes tool, model, ran and taken-over events', () => {
    const at = Date.UTC(2026, 10, 26, 9, 0, 0);
    expect(
      eventLine(
        ev('tool.called', {
          stepId: 'pay',
          attempt: 1,
          callId: 'abcdef0123456789',
          tool: 'charge@1',
          class: 'external',
          replayed: true,
          durationMs: 3.5,
          outcome: 'succeeded',
          at,
        }),
      ),
    ).toBe(
      '2026-11-26T09:00:00.000Z  tool.called    pay attempt 1: charge@1 (external) receipt replayed, succeeded, 3.5 ms; call abcdef012345',
    );
    expect(
      eventLine(
        ev('model.called', {
          stepId: 'a',
          attempt: 2,
          turn: 1,
          model: 'gpt-4o-mini',
          inputTokens: 100,
          outputTokens: 7,
          costUsd: 0.000123,
          durationMs: 250,
          charged: 'usage',
          reservationId: 'a:1:x',
          at,
        }),
      ),
    ).toContain('a attempt 2 turn 1: gpt-4o-mini 100 in + 7 out tokens, $0.000123, 250 ms');
    expect(
      eventLine(ev('step.ran', { stepId: 's', attempt: 1, worker, durationMs: 1200, at })),
    ).toContain('s attempt 1: ran 1.2 s on box pid 42');
    expect(
      eventLine(
        ev('step.takenOver', {
          stepId: 's',
          attempt: 1,
          worker,
          previousWorker: { host: 'old', pid: 7 },
          previousStartedAt: at,
          at,
        }),
      ),
    ).toContain('s attempt 1: run again by box pid 42; old pid 7 started it at 09:00:00.000');
  });

  it('attempts from events: start, end, duration, outcome, worker, take-overs', () => {
    const attempts = attemptsOf([
      ev('step.started', { stepId: 's', attempt: 1, at: 1000 }),
      ev('step.ran', {
        stepId: 's',
        attempt: 1,
        worker,
        startedAt: 1000,
        durationMs: 50,
        at: 1050,
      }),
      ev('step.failed', { stepId: 's', attempt: 1, at: 1050 }),
      ev('step.takenOver', { stepId: 's', attempt: 2, worker, at: 2000 }),
      ev('step.started', { stepId: 's', attempt: 2, at: 2000 }),
      ev('step.succeeded', { stepId: 's', attempt: 2, at: 2300 }),
      ev('step.started', { stepId: 't', attempt: 1, at: 2400 }),
    ]);
    expect(
      attempts.map((a) => [a.stepId, a.attempt, a.durationMs, a.outcome, a.takenOver]),
    ).toEqual([
      ['s', 1, 50, 'failed', 0],
      ['s', 2, 300, 'succeeded', 1],
      ['t', 1, null, null, 0],
    ]);
    expect(attempts[0]!.worker).toBe('box pid 42');
  });

  it('the list table and the idle notice', () => {
    const lines = listLines(
      [
        {
          runId: 'r1',
          planName: 'p',
          tenantId: 'acme',
          status: 'waiting',
          createdAt: 0,
          endedAt: null,
          durationMs: 0,
          waitingStep: 'review',
          currentStep: null,
          blockedStep: null,
          reason: null,
        },
      ],
      90_000,
    );
    expect(lines[1]).toMatch(
      /^r1\s+p\s+acme\s+waiting\s+-\s+1 min 30 s\s+review \(waits for approval\)$/,
    );
    expect(listLines([], 0)).toEqual(['no runs']);
    const idle = { stepId: 's', dueSince: 0, idleMs: 6000 };
    const flags = ['--redis', 'redis://h:1', '--redis-outage-limit', '5000'];
    expect(idleLine(idle, nextCommands('r1', join(process.cwd(), 'jobs/x.ts'), flags))).toMatch(
      /^ {2}no worker has taken step s for 6\.0 s: start one with `(npx )?flujo worker jobs\/x\.ts --redis redis:\/\/h:1`, or continue it with `(npx )?flujo resume r1 jobs\/x\.ts --redis redis:\/\/h:1 --redis-outage-limit 5000`$/,
    );
    expect(idleLine(idle, nextCommands('r1', null))).toMatch(
      /start one with `(npx )?flujo worker <job-module>`, or continue it with `(npx )?flujo resume r1 <job-module>` \(<job-module> is a placeholder for the path of the job module that started the run/,
    );
  });
});

describe('whole errors, ordered events, masked passwords', () => {
  const error = {
    name: 'ToolInputError',
    code: 'tool_input_invalid',
    message: 'Invalid arguments for tool "t" (1 problem):\n  - args.a: expected number',
    retryable: false,
    thrown: {
      name: 'ToolInputError',
      message: 'Invalid arguments for tool "t" (1 problem):\n  - args.a: expected number',
      stack: 'at parse (x.js:1:1)\nat run (y.js:2:2)',
      causes: [{ name: 'Error', message: 'root\nsecond' }],
    },
  };

  it('an error is every line of its message and its causes; the stack only when verbose', () => {
    expect(errorText(error)).toEqual([
      'tool_input_invalid: ToolInputError: Invalid arguments for tool "t" (1 problem):',
      '    - args.a: expected number',
      '  caused by Error: root',
      '    second',
    ]);
    expect(errorText(error, true).slice(2, 4)).toEqual([
      '  at parse (x.js:1:1)',
      '  at run (y.js:2:2)',
    ]);
    const line = eventLine(ev('step.failed', { stepId: 's', attempt: 2, error, at: 1000 }));
    expect(line.split('\n')).toHaveLength(4);
    expect(line.split('\n')[1]).toMatch(/^ {41} {4}- args\.a: expected number$/);
  });

  it('a held tool call is not said to be executed; --full keeps the call id whole', () => {
    const held = ev('tool.called', {
      stepId: 'pay',
      attempt: 1,
      callId: 'abcdef0123456789',
      tool: 'transfer@1',
      class: 'external',
      replayed: false,
      durationMs: 2,
      outcome: 'held',
      at: 1000,
    });
    expect(eventLine(held)).toContain(
      'transfer@1 (external) held (not executed: waits for approval), 2.0 ms; call abcdef012345',
    );
    expect(eventLine(held, { full: true })).toMatch(/; call abcdef0123456789$/);
  });

  it('events are put in the order of their own time, ties in stream order', () => {
    const events = [
      ev('step.started', { stepId: 'b', attempt: 1, at: 20 }),
      ev('step.succeeded', { stepId: 'b', attempt: 1, at: 30 }),
      ev('step.started', { stepId: 'a', attempt: 1, at: 10 }),
      ev('step.ran', { stepId: 'a', attempt: 1, at: 30 }),
    ];
    expect(inTimeOrder(events).map((e) => `${String(e.data['stepId'])} ${e.type}`)).toEqual([
      'a step.started',
      'b step.started',
      'b step.succeeded',
      'a step.ran',
    ]);
  });

  it('a failed run in the list shows its blocked step and reason', () => {
    const lines = listLines(
      [
        {
          runId: 'r2',
          planName: 'p',
          tenantId: 'acme',
          status: 'failed',
          createdAt: 0,
          endedAt: 1000,
          durationMs: 1000,
          waitingStep: null,
          currentStep: null,
          blockedStep: 'charge',
          reason: 'tool_input_invalid',
        },
      ],
      90_000,
    );
    expect(lines[1]).toMatch(/\sfailed\s.*\scharge \(failed: tool_input_invalid\)$/);
  });

  it('a Redis password is masked in repeated flags', () => {
    expect(maskRedisUrl('redis://:secret@127.0.0.1:6390')).toBe('redis://:***@127.0.0.1:6390');
    expect(maskRedisUrl('redis://ana:secret@h:1/2')).toBe('redis://ana:***@h:1/2');
    expect(maskRedisUrl('redis://127.0.0.1:6390')).toBe('redis://127.0.0.1:6390');
    expect(maskRedisUrl('not a url :secret@x')).toBe('<not a URL>');
    const flags = repeatFlags({ redis: 'redis://:secret@h:1', prefix: 'p' });
    expect(flags).toEqual(['--redis', 'redis://:***@h:1', '--prefix', 'p']);
    const next = nextCommands('r1', join(process.cwd(), 'jobs/x.ts'), flags);
    expect(`${next.worker} ${next.resume} ${next.note}`).not.toContain('secret');
    expect(next.note).toContain('set REDIS_URL');
  });
});

describe('list filters', () => {
  it('parses ages and ISO times; refuses anything else naming the flag', () => {
    expect(parseTimeOption('30m', '--since', 10_000_000)).toBe(10_000_000 - 1_800_000);
    expect(parseTimeOption('2026-11-26T09:00:00Z', '--until', 0)).toBe(Date.UTC(2026, 10, 26, 9));
    expect(refusal(() => parseTimeOption('yesterday', '--since', 0))).toContain(
      '--since must be an ISO time',
    );
  });

  it('turns options into a filter, refusing bad values before connecting', () => {
    expect(
      listFilterOf(ctx({ status: 'failed,running', plan: 'p', tenant: 't', limit: '5' }), 0),
    ).toEqual({ status: ['failed', 'running'], plan: 'p', tenantId: 't', limit: 5 });
    expect(refusal(() => listFilterOf(ctx({ status: 'done' }), 0))).toContain('--status');
    expect(refusal(() => listFilterOf(ctx({ limit: '0' }), 0))).toContain('--limit');
    expect(refusal(() => listFilterOf(ctx({ limit: '2.5' }), 0))).toContain('--limit');
    expect(refusal(() => listFilterOf(ctx({}, ['extra']), 0))).toContain('unexpected argument');
  });

  it('the API filter names each bad field', () => {
    expect(() => checkRunListFilter({ since: 10, until: 5 })).toThrow(
      /since: must not be after until/,
    );
    expect(() => checkRunListFilter({ limit: 1001 })).toThrow(
      /limit: must be an integer from 1 to 1000/,
    );
    expect(() => checkRunListFilter({ status: [] })).toThrow(/status: must be one of/);
    expect(checkRunListFilter({})).toEqual({
      statuses: null,
      since: -Infinity,
      until: Infinity,
      limit: 50,
    });
  });
});
