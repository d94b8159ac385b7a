import { describe, expect, it } from 'vitest';
import { InputValidationError, PlanValidationError, RunNotFoundError } from '../../src/errors.js';
import { attachRun, beginRun, runHandle } from '../../src/operations/starting.js';
import { PlanCache } from '../../src/plan/plan-cache.js';
import { caught } from '../helpers/caught.js';
import { stubCore } from '../helpers/core-stub.js';

const plan = { name: 'one', steps: [{ id: 'a', kind: 'operator' as const, operator: 'op' }] };

describe('beginRun', () => {
  it('refuses an input that is not plain JSON before it writes anything', async () => {
    const core = stubCore({ meta: { plans: new PlanCache(10) } });
    const error = await caught(beginRun(core, plan, { when: new Date(0) }));
    expect(error).toBeInstanceOf(InputValidationError);
    expect((error as Error).message).toContain('Invalid run input');
  });

  it('refuses a plan that does not parse, naming the field', async () => {
    const core = stubCore({ meta: { plans: new PlanCache(10) } });
    const error = await caught(beginRun(core, JSON.stringify({ name: 'one', steps: 'none' })));
    expect(error).toBeInstanceOf(PlanValidationError);
    expect((error as PlanValidationError).issues[0]?.path).toContain('steps');
  });
});

describe('attachRun and runHandle', () => {
  it('refuses a run that does not exist', async () => {
    const core = stubCore({
      stores: {
        store: { tryLoad: () => Promise.resolve(null) },
        notFound: (runId: string) => Promise.resolve(new RunNotFoundError(runId)),
      },
    });
    const error = await caught(attachRun(core, 'gone'));
    expect(error).toBeInstanceOf(RunNotFoundError);
    expect((error as RunNotFoundError).runId).toBe('gone');
  });

  it('hands back a run that exists, as found rather than created', async () => {
    const core = stubCore({
      stores: { store: { tryLoad: () => Promise.resolve({ snapshot: {} }) } },
    });
    const handle = await attachRun(core, 'r1');
    expect(handle).toMatchObject({ runId: 'r1', created: false });
    expect(runHandle(core, 'r2', true)).toMatchObject({ runId: 'r2', created: true });
    expect(Object.keys(handle).sort()).toEqual([
      'created',
      'outcomes',
      'runId',
      'settled',
      'status',
    ]);
  });
});
