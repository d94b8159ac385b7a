import { describe, expect, it } from 'vitest';
import { classifyFailure } from '../../src/tools/classify-failure.js';
import {
  MissingContextError,
  ModelError,
  reviveError,
  ServiceError,
  UnknownError,
} from '../../src/errors.js';

const http = (status: number, extra: Record<string, unknown> = {}) =>
  Object.assign(new Error(`HTTP ${status}`), { status, ...extra });

describe('classifyFailure: errors of operators and tools', () => {
  it.each([
    ['status 400', 'invalid_input', http(400), false],
    ['statusCode 422', 'invalid_input', Object.assign(new Error('x'), { statusCode: 422 }), false],
    [
      'response.status 401',
      'auth_forbidden',
      Object.assign(new Error('x'), { response: { status: 401 } }),
      false,
    ],
    ['status 403', 'auth_forbidden', http(403), false],
    ['status 404', 'not_found', http(404), false],
    ['status 408', 'service_unavailable', http(408), true],
    ['status 429', 'service_unavailable', http(429), true],
    ['status 500', 'service_unavailable', http(500), true],
    [
      'status 503 as a string',
      'service_unavailable',
      Object.assign(new Error('x'), { status: '503' }),
      true,
    ],
    ['a plain object with a status', 'invalid_input', { status: 400, message: 'bad field' }, false],
  ] as const)('%s → %s', (_name, code, thrown, retryable) => {
    const error = classifyFailure(thrown);
    expect(error).toBeInstanceOf(ServiceError);
    expect(error.code).toBe(code);
    expect(error.retryable).toBe(retryable);
    expect(error.cause).toBe(thrown);
  });

  it('names the status and what to do in the message', () => {
    expect(classifyFailure(http(422)).message).toBe(
      'HTTP 422 (HTTP 422: the input was refused; fix it; retrying will not help)',
    );
    expect(classifyFailure({ status: 400, message: 'bad field' }).message).toContain('bad field');
    expect(classifyFailure(http(503)).message).toContain('transient');
  });

  it('honours retry-after (seconds or HTTP date) and retry-after-ms, on the error or its response', () => {
    expect(classifyFailure(http(429, { headers: { 'retry-after': '2' } })).retryAfterMs).toBe(2000);
    const response = { status: 429, headers: new Headers({ 'retry-after-ms': '150' }) };
    expect(classifyFailure(Object.assign(new Error('x'), { response })).retryAfterMs).toBe(150);
    const date = new Date(Date.now() + 60_000).toUTCString();
    const fromDate = classifyFailure(http(503, { headers: { 'Retry-After': date } })).retryAfterMs;
    expect(fromDate).toBeGreaterThan(50_000);
    expect(fromDate).toBeLessThanOrEqual(60_000);
    expect(classifyFailure(http(429)).retryAfterMs).toBeUndefined();
  });

  it('network resets, refusals and timeouts are transient, also as the cause of a fetch error', () => {
    const reset = classifyFailure(
      Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' }),
    );
    expect(reset).toMatchObject({ code: 'service_unavailable', retryable: true });
    expect(reset.details).toEqual({ networkCode: 'ECONNRESET' });
    const fetchFailed = new TypeError('fetch failed', {
      cause: Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }),
    });
    expect(classifyFailure(fetchFailed).details).toEqual({ networkCode: 'ECONNREFUSED' });
    const timeout = new DOMException('The operation was aborted due to timeout', 'TimeoutError');
    expect(classifyFailure(timeout)).toMatchObject({
      code: 'service_unavailable',
      retryable: true,
    });
  });

  it('an explicit boolean retryable overrides the classification', () => {
    expect(classifyFailure(http(503, { retryable: false })).retryable).toBe(false);
    expect(classifyFailure(http(400, { retryable: true }))).toMatchObject({
      code: 'invalid_input',
      retryable: true,
    });
  });

  it('leaves runtime errors as they are, and anything else unknown and retryable', () => {
    const model = new ModelError({ kind: 'auth', model: 'm', baseURL: 'http://x', status: 401 });
    expect(classifyFailure(model)).toBe(model);
    for (const thrown of [new Error('boom'), http(409), http(302), 'text', { code: 'ENOENT' }]) {
      const error = classifyFailure(thrown);
      expect(error).toBeInstanceOf(UnknownError);
      expect(error.retryable).toBe(true);
    }
    expect(classifyFailure(Object.assign(new Error('no'), { retryable: false })).retryable).toBe(
      false,
    );
  });

  it('keeps code, retryability and details through JSON', () => {
    const error = classifyFailure(http(401));
    const revived = reviveError(JSON.parse(JSON.stringify(error)) as never);
    expect(revived).toMatchObject({
      name: 'ServiceError',
      code: 'auth_forbidden',
      retryable: false,
      details: { status: 401 },
    });
  });
});

describe('MissingContextError', () => {
  it('is final and names the step, the dependency and what was missing', () => {
    const error = new MissingContextError('crawl', 'output.url', { stepId: 'report' });
    expect(error).toMatchObject({ code: 'missing_context', retryable: false });
    expect(error.message).toBe(
      'Missing context: step "report" needs output.url from step "crawl", which did not produce it. Fix "crawl" so it produces output.url, then resume the run.',
    );
    expect(error.details).toEqual({ dependency: 'crawl', missing: 'output.url', stepId: 'report' });
  });
});
