import { describe, expect, it } from 'vitest';
import {
  BlobCapExceededError,
  BlobMissingError,
  ErrorCode,
  EventValidationError,
  FlujoError,
  InputValidationError,
  InvariantError,
  PlanValidationError,
  PricingNotConfiguredError,
  RedisUnavailableError,
  ReservationNotFoundError,
  RevivedError,
  RunAlreadyExistsError,
  RunNotFoundError,
  SnapshotConflictError,
  SnapshotCorruptError,
  SnapshotUnsupportedError,
  UnknownError,
  UsageLimitExceededError,
  findCause,
  isFlujoError,
  isRetryable,
  reviveError,
  toFlujoError,
  type SerializedError,
} from '../../src/errors.js';

const issue = [{ path: 'steps[0].id', message: 'bad' }];
const BLOB = 'ab'.repeat(32);
const limitInfo = {
  scope: 'tenant',
  limit: 'maxCostUsd',
  limitValue: 10_000,
  used: 2_000,
  reserved: 5_000,
  requested: 4_000,
  runId: 'r',
  tenantId: 't',
} as const;

// Every error class the runtime raises, with the name, code and retryability it must keep.
const cases: [FlujoError, string, string, boolean][] = [
  [new PlanValidationError(issue), 'PlanValidationError', 'plan_invalid', false],
  [new InputValidationError('run input', issue), 'InputValidationError', 'input_invalid', false],
  [new EventValidationError(issue), 'EventValidationError', 'event_invalid', false],
  [new SnapshotConflictError('r', 3, 4), 'SnapshotConflictError', 'snapshot_conflict', true],
  [new RunNotFoundError('r'), 'RunNotFoundError', 'run_not_found', false],
  [new RunAlreadyExistsError('r'), 'RunAlreadyExistsError', 'run_already_exists', false],
  [
    new SnapshotUnsupportedError('r', 9, 1),
    'SnapshotUnsupportedError',
    'snapshot_unsupported',
    false,
  ],
  [new SnapshotCorruptError('r', 'not JSON'), 'SnapshotCorruptError', 'snapshot_corrupt', false],
  [
    new RedisUnavailableError('down', { retryAfterMs: 50 }),
    'RedisUnavailableError',
    'redis_unavailable',
    true,
  ],
  [new InvariantError('broken'), 'InvariantError', 'invariant', false],
  [new UnknownError('what'), 'UnknownError', 'unknown', false],
  [
    new UsageLimitExceededError(limitInfo),
    'UsageLimitExceededError',
    'usage_limit_exceeded',
    false,
  ],
  [
    new ReservationNotFoundError('t', 'res-1'),
    'ReservationNotFoundError',
    'reservation_not_found',
    false,
  ],
  [new BlobCapExceededError('r', 100, 60, 50), 'BlobCapExceededError', 'blob_cap_exceeded', false],
  [new BlobMissingError('r', 'fetch', BLOB), 'BlobMissingError', 'blob_missing', false],
  [
    new PricingNotConfiguredError('gpt-4o-mini'),
    'PricingNotConfiguredError',
    'pricing_not_configured',
    false,
  ],
];

describe('errors', () => {
  it.each(cases)('%s has its name, code and retryability', (error, name, code, retryable) => {
    expect(error).toBeInstanceOf(Error);
    expect(error.name).toBe(name);
    expect(error.code).toBe(code);
    expect(error.retryable).toBe(retryable);
    expect(Object.values(ErrorCode)).toContain(code);
  });

  it.each(cases)('%s survives a JSON round trip', (error, name, code, retryable) => {
    const json = JSON.parse(JSON.stringify(error)) as SerializedError;
    expect(json).toMatchObject({ name, code, retryable, message: error.message });
    expect(json).not.toHaveProperty('stack');
    const revived = reviveError(json);
    expect(revived).toBeInstanceOf(RevivedError);
    expect(revived).toBeInstanceOf(FlujoError);
    expect(revived.name).toBe(name);
    expect(revived.code).toBe(code);
    expect(revived.retryable).toBe(retryable);
    expect(revived.message).toBe(error.message);
    expect(revived.retryAfterMs).toBe(error.retryAfterMs);
    expect(revived.details).toEqual(error.details);
    expect(JSON.stringify(revived)).toBe(JSON.stringify(error));
    expect(isFlujoError(revived, error.code)).toBe(true);
    expect(isFlujoError(json, error.code)).toBe(true);
  });

  it('a conflict names both versions, in fields and message', () => {
    const e = new SnapshotConflictError('run-7', 3, 5);
    expect(e.message).toContain('expected version 3, found version 5');
    expect(e.details).toEqual({ runId: 'run-7', expectedVersion: 3, actualVersion: 5 });
  });

  it('a usage limit error names scope, limit, numbers and fix', () => {
    const tenant = new UsageLimitExceededError(limitInfo);
    expect(tenant.message).toBe(
      'Tenant "t" (run "r") would exceed its quota maxCostUsd: limit $0.010000, spent $0.002000, reserved $0.005000, this call needs $0.004000. Nothing was reserved. Raise the tenant\'s quota (maxMicroUsd of tenant "t") to allow more.',
    );
    expect(tenant.details).toEqual(limitInfo);
    const run = new UsageLimitExceededError({ ...limitInfo, scope: 'run', limit: 'maxTokens' });
    expect(run.message).toMatch(
      /^Run "r" would exceed its budget maxTokens: limit 10000 tokens, spent 2000 tokens, .* Raise budgets\.maxTokens in the plan/,
    );
  });

  it('blob errors name the blob, the step, the cap and the setting to change', () => {
    const missing = new BlobMissingError('r', 'fetch', BLOB);
    expect(missing.message).toContain(`Blob ${BLOB} needed by step "fetch" of run "r" is missing`);
    expect(missing.message).toMatch(/retentionMs.*degraded replay/);
    expect(missing.details).toEqual({ runId: 'r', stepId: 'fetch', blobId: BLOB });
    const cap = new BlobCapExceededError('r', 100, 60, 50);
    expect(cap.message).toMatch(
      /60 bytes for run "r".* 50 bytes .* cap is 100 bytes.*maxBytesPerRun/,
    );
    expect(cap.details).toEqual({ runId: 'r', maxBytesPerRun: 100, size: 60, storedBytes: 50 });
    expect(new ReservationNotFoundError('t', 'x').details).toEqual({
      tenantId: 't',
      reservationId: 'x',
    });
  });

  it('a missing price names the model and the exact setting to add', () => {
    const e = new PricingNotConfiguredError('gpt-4o-mini');
    expect(e.message).toBe(
      'No price for model "gpt-4o-mini": add it to the pricing table (pricing.models["gpt-4o-mini"] = { inputPerMillion, outputPerMillion } in createRuntime({ pricing }) or in the pricing file), or turn strictPricing off',
    );
    expect(e.details).toEqual({ model: 'gpt-4o-mini', setting: 'pricing.models["gpt-4o-mini"]' });
    expect(new PricingNotConfiguredError('a"b').setting).toBe('pricing.models["a\\"b"]');
  });

  it('validation errors list every issue with its path', () => {
    const e = new PlanValidationError([
      { path: 'steps[2].dependsOn[0]', message: 'unknown step "fetch"' },
      { path: '', message: 'root problem' },
    ]);
    expect(e.message).toBe(
      'Invalid plan (2 problems):\n  - steps[2].dependsOn[0]: unknown step "fetch"\n  - (root): root problem',
    );
  });

  it('retryability can be overridden where the error is created', () => {
    expect(new RedisUnavailableError('no binary', { retryable: false }).retryable).toBe(false);
    expect(isRetryable(new RedisUnavailableError('down'))).toBe(true);
    expect(isRetryable(new Error('plain'))).toBe(false);
  });

  it('toFlujoError normalizes anything thrown and keeps the cause', () => {
    const plain = new TypeError('x is undefined');
    const e = toFlujoError(plain);
    expect(e).toBeInstanceOf(UnknownError);
    expect(e.message).toBe('x is undefined');
    expect(e.cause).toBe(plain);
    expect(toFlujoError('text').message).toBe('text');
    const own = new InvariantError('kept');
    expect(toFlujoError(own)).toBe(own);
  });

  it('isFlujoError checks the code, not only the class', () => {
    expect(isFlujoError(new RunNotFoundError('r'), 'run_not_found')).toBe(true);
    expect(isFlujoError(new RunNotFoundError('r'), 'snapshot_conflict')).toBe(false);
    expect(isFlujoError({ name: 'X', code: 'x', retryable: true })).toBe(true);
    expect(isFlujoError({ name: 'X', code: 'x' })).toBe(false);
    expect(isFlujoError(new Error('plain'))).toBe(false);
  });

  it('findCause walks causes and aggregate errors, once each', () => {
    const root = new RedisUnavailableError('down');
    const wrapped = new Error('outer', { cause: new AggregateError([new Error('a'), root]) });
    expect(findCause(wrapped, (e) => isFlujoError(e, 'redis_unavailable'))).toBe(root);
    const loop: Error & { cause?: unknown } = new Error('loop');
    loop.cause = loop;
    expect(findCause(loop, () => false)).toBeUndefined();
  });
});

describe('toFlujoError retryability', () => {
  it("keeps a foreign error's retryable flag, else uses the default given", () => {
    expect(toFlujoError(new Error('x')).retryable).toBe(false);
    expect(toFlujoError(new Error('x'), true).retryable).toBe(true);
    expect(toFlujoError(Object.assign(new Error('x'), { retryable: false }), true).retryable).toBe(
      false,
    );
    expect(toFlujoError(Object.assign(new Error('x'), { retryable: true })).retryable).toBe(true);
  });
});
