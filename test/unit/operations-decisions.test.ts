import { describe, expect, it } from 'vitest';
import {
  ApprovalNotAllowedError,
  InputValidationError,
  StepNotSkippableError,
  StepNotWaitingError,
} from '../../src/errors.js';
import { runSteps } from '../../src/machines/kernel.js';
import {
  authorize,
  checkBy,
  checkSkip,
  decide,
  reopenedSteps,
  setTenantQuota,
  skippable,
  skipStep,
  tenantQuotaUpdate,
  type SkipInput,
} from '../../src/operations/decisions.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import { runEvents as e, traceTransitions } from '../../src/testing/index.js';
import { caught } from '../helpers/caught.js';
import { stubCore } from '../helpers/core-stub.js';

/** What `fn` threw, or undefined. */
function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (error) {
    return error;
  }
  return undefined;
}

const line = {
  name: 'line',
  steps: [
    { id: 'a', kind: 'operator' as const, operator: 'op', retry: { maxAttempts: 1 } },
    { id: 'b', kind: 'operator' as const, operator: 'op', dependsOn: ['a'] },
  ],
};
const gated = parsePlan({
  name: 'gated',
  steps: [
    { id: 'send', kind: 'operator', operator: 'op', gate: { approvers: ['ana'], reason: 'money' } },
    { id: 'open', kind: 'operator', operator: 'op', gate: {} },
  ],
});

/** The step `stepId` of a run of `line` after `events`, with the run's snapshot. */
function stepAfter(stepId: string, events: Parameters<typeof traceTransitions>[1]) {
  const { snapshot } = traceTransitions(line, events);
  const step = runSteps(snapshot).find((s) => s.stepId === stepId);
  if (step === undefined) throw new Error(`no step ${stepId}`);
  return { snapshot, step };
}

describe('checkBy and checkSkip: who decides, and why a step is skipped', () => {
  it('refuses a decision without a name, saying how to give one', () => {
    for (const by of [undefined, '', 42]) {
      const error = thrown(() => checkBy(by, 'decision'));
      expect(error).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues).toEqual([
        { path: 'by', message: 'say who decides, e.g. { by: "ana" } (--by NAME on the CLI)' },
      ]);
      expect((error as Error).message).toContain('Invalid decision');
    }
    expect(() => checkBy('ana', 'decision')).not.toThrow();
  });

  it('refuses a skip without a name or a reason', () => {
    expect(thrown(() => checkSkip(undefined as unknown as SkipInput))).toBeInstanceOf(
      InputValidationError,
    );
    const error = thrown(() => checkSkip({ by: 'ana', reason: '  ' })) as InputValidationError;
    expect(error.message).toContain('Invalid skip');
    expect(error.issues).toEqual([
      { path: 'reason', message: 'say why, e.g. { reason: "done by hand" } (--reason TEXT)' },
    ]);
    expect(() => checkSkip({ by: 'ana', reason: 'done by hand' })).not.toThrow();
  });
});

describe('skippable', () => {
  it('takes a step that has not succeeded or been skipped', () => {
    const ready = stepAfter('a', []);
    expect(skippable(ready.snapshot, ready.step)).toBe(true);
    const pending = stepAfter('b', []);
    expect(skippable(pending.snapshot, pending.step)).toBe(true);
    const failed = stepAfter('a', [e.fail('a', 1, false)]);
    expect(failed.step.status).toBe('FAILED_FINAL');
    expect(skippable(failed.snapshot, failed.step)).toBe(true);
  });

  it('refuses a step that succeeded or was skipped, and a closed step of a cancelled run', () => {
    const done = stepAfter('a', [e.ok('a')]);
    expect(skippable(done.snapshot, done.step)).toBe(false);
    const skipped = stepAfter('a', [e.skip('a')]);
    expect(skipped.step.status).toBe('SKIPPED');
    expect(skippable(skipped.snapshot, skipped.step)).toBe(false);
    const cancelled = stepAfter('b', [e.cancel()]);
    expect(cancelled.step.status).toBe('CANCELLED');
    expect(skippable(cancelled.snapshot, cancelled.step)).toBe(false);
  });
});

describe('reopenedSteps', () => {
  it('names the steps a transition took from a final status back to an open one', () => {
    const { transitions } = traceTransitions(line, [e.fail('a', 1, false), e.resume()]);
    const resumed = transitions.at(-1)!;
    expect(reopenedSteps(resumed.changes).sort()).toEqual(['a', 'b']);
    expect(reopenedSteps(transitions[1]!.changes)).toEqual([]);
  });
});

describe('authorize', () => {
  const core = stubCore({ meta: { read: () => Promise.resolve({ plan: gated }) } });

  it("refuses a name the gate's approvers do not list", async () => {
    const error = await caught(authorize(core, undefined, 'r1', 'send', 'bo', 'approve'));
    expect(error).toBeInstanceOf(ApprovalNotAllowedError);
    expect((error as ApprovalNotAllowedError).approvers).toEqual(['ana']);
  });

  it('asks the hook after the approvers, and refuses unless it answers true', async () => {
    const asked: unknown[] = [];
    const hook = (...args: unknown[]) => {
      asked.push(args);
      return args[2] === 'ana';
    };
    await authorize(core, hook, 'r1', 'send', 'ana', 'approve');
    await authorize(core, undefined, 'r1', 'open', 'anyone', 'skip');
    const error = await caught(authorize(core, hook, 'r1', 'open', 'cy', 'skip'));
    expect(error).toBeInstanceOf(ApprovalNotAllowedError);
    expect((error as Error).message).toContain('refused by authorizeDecision');
    expect(asked).toEqual([
      ['r1', 'send', 'ana', 'approve'],
      ['r1', 'open', 'cy', 'skip'],
    ]);
  });
});

describe('decide and skipStep refuse before they write', () => {
  const { snapshot } = traceTransitions(line, []);
  const env = { snapshot, version: 1, updatedAt: 0 };
  const core = stubCore({ stores: { store: { load: () => Promise.resolve(env) } } });

  it('refuses a decision without a name before it reads the run', async () => {
    const error = await caught(
      decide(stubCore(), undefined, 'r1', 'a', {} as never, 'gate.approved'),
    );
    expect(error).toBeInstanceOf(InputValidationError);
  });

  it('refuses a decision on a step that does not wait for one, naming its status', async () => {
    const error = await caught(decide(core, undefined, 'r1', 'a', { by: 'ana' }, 'gate.approved'));
    expect(error).toBeInstanceOf(StepNotWaitingError);
    expect((error as Error).message).toContain('READY');
    const missing = await caught(
      decide(core, undefined, 'r1', 'z', { by: 'ana' }, 'gate.rejected'),
    );
    expect(missing).toBeInstanceOf(StepNotWaitingError);
  });

  it('refuses a skip of a step that does not exist or succeeded', async () => {
    const error = await caught(skipStep(core, undefined, 'r1', 'z', { by: 'ana', reason: 'x' }));
    expect(error).toBeInstanceOf(StepNotSkippableError);
    expect((error as Error).message).toContain('Its steps: a, b.');
  });
});

describe('tenant quotas', () => {
  it('gives the store micro-USD and leaves an omitted field out', () => {
    expect(tenantQuotaUpdate({ maxCostUsd: 1.5 })).toEqual({ maxMicroUsd: 1_500_000 });
    expect(tenantQuotaUpdate({ maxTokens: 10, maxCostUsd: null })).toEqual({
      maxTokens: 10,
      maxMicroUsd: null,
    });
    expect(tenantQuotaUpdate({})).toEqual({});
  });

  it('refuses a cost that is not a number ≥ 0 or null', () => {
    for (const cost of [-1, Number.NaN, '2']) {
      const error = thrown(() => tenantQuotaUpdate({ maxCostUsd: cost as number }));
      expect(error).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues[0]).toEqual({
        path: 'maxCostUsd',
        message: `must be a number ≥ 0 (USD) or null, got ${String(cost)}`,
      });
    }
  });

  it('sets the quota and answers in USD', async () => {
    const given: unknown[] = [];
    const core = stubCore({
      stores: {
        quota: {
          setTenantQuota: (tenantId: string, quota: unknown) => {
            given.push([tenantId, quota]);
            return Promise.resolve({ maxTokens: 5, maxMicroUsd: 250_000 });
          },
        },
      },
    });
    expect(await setTenantQuota(core, 'acme', { maxCostUsd: 0.25 })).toEqual({
      maxTokens: 5,
      maxCostUsd: 0.25,
    });
    expect(given).toEqual([['acme', { maxMicroUsd: 250_000 }]]);
    await expect(setTenantQuota(stubCore(), '', {})).rejects.toBeInstanceOf(InputValidationError);
  });
});
