/**
 * A refused start writes nothing: too deep inputs and plans, an existing run id. Every key of the
 * runtime's prefix (and of its queue) is compared before and after.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  InputValidationError,
  PlanValidationError,
  RunAlreadyExistsError,
} from '../../src/errors.js';
import { MAX_JSON_DEPTH } from '../../src/internal/json.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import { caught } from '../helpers/caught.js';
import { connect, deleteRuntimeKeys, readPrefix, redisUrl, testPrefix } from '../helpers/redis.js';

/** `{"a": {"a": … 1 …}}` with `levels` objects, built without recursion. */
function nested(levels: number): unknown {
  let value: unknown = 1;
  for (let i = 0; i < levels; i++) value = { a: value };
  return value;
}

const plan: PlanInput = {
  name: 'p',
  steps: [{ id: 'one', kind: 'operator', operator: 'noop' }],
};

let redis: Redis;
let runtime: Runtime;
const prefix = testPrefix();
const everything = async () => ({
  ...(await readPrefix(redis, `${prefix}:`)),
  ...(await readPrefix(redis, `{${prefix}:q}`)),
});

beforeAll(() => {
  redis = connect();
  runtime = createRuntime({ redis: redisUrl(), prefix }).operator('noop', () => null);
});
afterAll(async () => {
  await runtime.close();
  await deleteRuntimeKeys(prefix);
  redis.disconnect();
});

describe('start refuses before its first write', () => {
  it('a run input nested deeper than the limit: InputValidationError naming the path, nothing written', async () => {
    // Something in Redis already, so "as before" is not just "empty".
    await runtime.start(plan, { ok: true }, { runId: 'before', requestKey: 'k0' });
    const before = await everything();
    for (const levels of [MAX_JSON_DEPTH + 1, 5000]) {
      const error = await caught(
        runtime.start(plan, nested(levels), { runId: 'deep', requestKey: 'k1' }),
      );
      expect(error).toBeInstanceOf(InputValidationError);
      const issues = (error as InputValidationError).issues;
      expect(issues).toHaveLength(1);
      expect(issues[0]!.path).toBe('input.a.a.a.a.a.a');
      expect(issues[0]!.message).toContain(`nested deeper than ${MAX_JSON_DEPTH} levels`);
    }
    expect(await everything()).toEqual(before);
    // At the limit it is accepted.
    const ok = await runtime.start(plan, nested(MAX_JSON_DEPTH), { runId: 'at-limit' });
    expect(ok.created).toBe(true);
  });

  it('a plan whose step input is nested too deep: PlanValidationError naming the step, nothing written', async () => {
    const before = await everything();
    const deep: PlanInput = {
      name: 'deep',
      steps: [{ id: 'one', kind: 'operator', operator: 'noop', input: nested(5000) }],
    };
    const deepText = `{"a":`.repeat(5000) + '1' + '}'.repeat(5000);
    const text = `{"name":"deep","steps":[{"id":"one","kind":"operator","operator":"noop","input":${deepText}}]}`;
    for (const source of [deep, text]) {
      const error = await caught(runtime.start(source, null, { runId: 'deep-plan' }));
      expect(error).toBeInstanceOf(PlanValidationError);
      const issues = (error as PlanValidationError).issues;
      expect(issues.map((i) => i.path)).toEqual(['steps[0].input.a.a.a']);
    }
    expect(await everything()).toEqual(before);
  });

  it('an existing run id: RunAlreadyExistsError, and neither the request key nor the active set is touched', async () => {
    await runtime.start(plan, null, { runId: 'taken' });
    const before = await everything();
    const error = await caught(runtime.start(plan, null, { runId: 'taken', requestKey: 'fresh' }));
    expect(error).toBeInstanceOf(RunAlreadyExistsError);
    expect(await everything()).toEqual(before);
    expect(await redis.exists(`${prefix}:request:default:fresh`)).toBe(0);
  });
});
