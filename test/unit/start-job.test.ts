/**
 * The data of a `start` job and the queue it goes to: each refusal names its field and the fix.
 */
import { describe, expect, it } from 'vitest';
import { InputValidationError } from '../../src/errors.js';
import { JobName } from '../../src/actors/jobs.js';
import {
  DEFAULT_QUEUE_NAME,
  parseStartJobData,
  runQueue,
  START_JOB_NAME,
  startJobDataSchema,
} from '../../src/worker/start-job.js';

const plan = { name: 'p', steps: [{ id: 'a', kind: 'operator', operator: 'a' }] };

/** The issues `parseStartJobData` refuses `data` with. */
function refusal(data: unknown): { path: string; message: string }[] {
  try {
    parseStartJobData(data);
  } catch (error) {
    expect(error).toBeInstanceOf(InputValidationError);
    expect((error as Error).message).toMatch(/^Invalid start job \(\d problems?\):/);
    return [...(error as InputValidationError).issues];
  }
  throw new Error('accepted');
}

describe('start job data', () => {
  it('takes a plan object or its JSON text, with optional input, runId, requestKey and tenantId', () => {
    expect(parseStartJobData({ plan })).toEqual({ plan });
    const full = { plan, input: { a: [1] }, runId: 'r', requestKey: 'k', tenantId: 't' };
    expect(parseStartJobData(full)).toEqual(full);
    expect(parseStartJobData({ plan: JSON.stringify(plan), input: null })).toEqual({
      plan: JSON.stringify(plan),
      input: null,
    });
    expect(startJobDataSchema.safeParse({ plan }).success).toBe(true);
    expect(START_JOB_NAME).toBe('start');
    expect(JobName.start).toBe(START_JOB_NAME);
  });

  it('refuses data that is not an object', () => {
    for (const [data, got] of [
      ['text', 'a string'],
      [[plan], 'an array'],
      [null, 'null'],
      [undefined, 'nothing'],
      [3, 'a number'],
    ] as const) {
      expect(refusal(data)).toEqual([
        {
          path: '',
          message: `the job data must be an object { plan, input?, runId?, requestKey?, tenantId?, priority? }, got ${got}`,
        },
      ]);
    }
  });

  it('refuses a missing plan, and one that is neither an object nor text', () => {
    expect(refusal({ input: 1 })).toEqual([
      {
        path: 'plan',
        message:
          'missing: add the plan to run, an object { name, steps: [...] } (as runtime.start takes it) or its JSON text',
      },
    ]);
    expect(refusal({ plan: [plan] })).toEqual([
      {
        path: 'plan',
        message: 'must be a plan object { name, steps: [...] } or its JSON text, got an array',
      },
    ]);
  });

  it('refuses ids that are not strings, naming each field with an example', () => {
    expect(refusal({ plan, runId: 5, requestKey: {}, tenantId: null })).toEqual([
      { path: 'runId', message: 'must be a string, e.g. runId: "order-42", got a number' },
      {
        path: 'requestKey',
        message: 'must be a string, e.g. requestKey: "order-42", got an object',
      },
      { path: 'tenantId', message: 'must be a string, e.g. tenantId: "acme", got null' },
    ]);
  });

  it('refuses unknown fields, suggesting the field meant', () => {
    const known = 'a start job takes plan, input, runId, requestKey, tenantId, priority';
    expect(refusal({ plan, inptu: 1, Plan: 2, colour: 3 })).toEqual([
      { path: 'inptu', message: `unknown field; did you mean "input"? ${known}` },
      { path: 'Plan', message: `unknown field; did you mean "plan"? ${known}` },
      { path: 'colour', message: `unknown field; ${known}` },
    ]);
  });
});

describe('runQueue', () => {
  it('is the queue a runtime with these options reads: name and hash-tagged BullMQ prefix', () => {
    expect(runQueue()).toEqual({ name: 'runs', prefix: '{flujo:q}' });
    expect(DEFAULT_QUEUE_NAME).toBe('runs');
    expect(runQueue({ prefix: 'acme' })).toEqual({ name: 'runs', prefix: '{acme:q}' });
    expect(runQueue({ prefix: 'acme:prod', queueName: 'intake' })).toEqual({
      name: 'intake',
      prefix: '{acme:prod:q}',
    });
  });

  it('refuses a prefix or queue name the runtime or BullMQ would refuse', () => {
    expect(() => runQueue({ prefix: 'a{b' })).toThrow(/prefix: must not contain "\{" or "\}"/);
    expect(() => runQueue({ prefix: '' })).toThrow(/prefix: must not be empty/);
    for (const queueName of ['a:b', '']) {
      expect(() => runQueue({ queueName })).toThrow(
        `queueName: must be a non-empty string without ":", e.g. "runs", got ${JSON.stringify(queueName)}`,
      );
    }
  });
});
