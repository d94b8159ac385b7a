import {
  APIConnectionError,
  APIConnectionTimeoutError,
  APIError,
  APIUserAbortError,
  AuthenticationError,
  BadRequestError,
  ConflictError,
  InternalServerError,
  NotFoundError,
  PermissionDeniedError,
  RateLimitError,
  UnprocessableEntityError,
} from 'openai';
import { describe, expect, it } from 'vitest';
import { ModelError, RunNotFoundError } from '../../src/errors.js';
import { classifyModelError, displayURL, parseRetryAfter } from '../../src/llm/classify-error.js';

const NOW = Date.parse('2030-01-01T00:00:00Z');
const ctx = { model: 'gpt-x', baseURL: 'https://api.example.com/v1', now: () => NOW };
const body = (message: string, code: string | null = null) => ({ message, type: 't', code });
const h = (headers: Record<string, string> = {}) => new Headers(headers);
const classify = (e: unknown) => classifyModelError(e, ctx) as ModelError;
const shape = (e: ModelError) => [e.kind, e.status, e.retryable, e.retryAfterMs];

describe('classifyModelError', () => {
  it.each([
    [new BadRequestError(400, body('bad'), undefined, h()), ['bad_request', 400, false, undefined]],
    [new AuthenticationError(401, body('no'), undefined, h()), ['auth', 401, false, undefined]],
    [new PermissionDeniedError(403, body('no'), undefined, h()), ['auth', 403, false, undefined]],
    [new NotFoundError(404, body('no'), undefined, h()), ['not_found', 404, false, undefined]],
    [new APIError(408, body('slow'), undefined, h()), ['timeout', 408, true, undefined]],
    [new ConflictError(409, body('busy'), undefined, h()), ['conflict', 409, true, undefined]],
    [
      new UnprocessableEntityError(422, body('x'), undefined, h()),
      ['bad_request', 422, false, undefined],
    ],
    [
      new RateLimitError(429, body('slow down'), undefined, h()),
      ['rate_limit', 429, true, undefined],
    ],
    [new InternalServerError(500, body('oops'), undefined, h()), ['server', 500, true, undefined]],
    [new InternalServerError(503, undefined, undefined, h()), ['server', 503, true, undefined]],
    [new APIError(413, body('too big'), undefined, h()), ['bad_request', 413, false, undefined]],
    [
      new APIError(undefined, body('stream error'), undefined, h()),
      ['server', undefined, true, undefined],
    ],
    [
      new APIConnectionError({ message: 'Connection error.' }),
      ['connection', undefined, true, undefined],
    ],
    [new APIConnectionTimeoutError(), ['timeout', undefined, true, undefined]],
  ] as const)('%s', (error, expected) => {
    const e = classify(error);
    expect(e).toBeInstanceOf(ModelError);
    expect(shape(e)).toEqual(expected);
    expect(e.cause).toBe(error);
  });

  it('retry-after-ms wins over retry-after', () => {
    const headers = h({ 'retry-after-ms': '1500.2', 'retry-after': '9' });
    expect(classify(new RateLimitError(429, body('x'), undefined, headers)).retryAfterMs).toBe(
      1501,
    );
  });
  it('retry-after in seconds', () => {
    const headers = h({ 'retry-after': '2' });
    expect(shape(classify(new RateLimitError(429, body('x'), undefined, headers)))).toEqual([
      'rate_limit',
      429,
      true,
      2000,
    ]);
  });
  it('retry-after as an HTTP date', () => {
    const headers = h({ 'retry-after': new Date(NOW + 3000).toUTCString() });
    expect(classify(new InternalServerError(503, body('x'), undefined, headers)).retryAfterMs).toBe(
      3000,
    );
    expect(
      parseRetryAfter(h({ 'retry-after': new Date(NOW - 5000).toUTCString() }), () => NOW),
    ).toBe(0);
  });
  it('unparseable retry headers are ignored', () => {
    expect(
      parseRetryAfter(h({ 'retry-after-ms': 'soon', 'retry-after': 'later' })),
    ).toBeUndefined();
    expect(parseRetryAfter(h({ 'retry-after-ms': 'soon', 'retry-after': '1' }))).toBe(1000);
    expect(parseRetryAfter(undefined)).toBeUndefined();
  });
  it('x-should-retry: false makes a 500 final, true makes a 400 retryable', () => {
    const no = classify(
      new InternalServerError(500, body('x'), undefined, h({ 'x-should-retry': 'false' })),
    );
    expect(shape(no)).toEqual(['server', 500, false, undefined]);
    const yes = classify(
      new BadRequestError(400, body('x'), undefined, h({ 'x-should-retry': 'true' })),
    );
    expect(shape(yes)).toEqual(['bad_request', 400, true, undefined]);
  });
  it('a 429 for an exhausted quota is final unless the provider says otherwise', () => {
    const e = classify(
      new RateLimitError(429, body('quota', 'insufficient_quota'), undefined, h()),
    );
    expect(shape(e)).toEqual(['rate_limit', 429, false, undefined]);
    expect(e.message).toMatch(/plan and billing/);
  });
  it('keeps the request id', () => {
    const e = classify(
      new InternalServerError(500, body('x'), undefined, h({ 'x-request-id': 'req_9' })),
    );
    expect(e.requestId).toBe('req_9');
  });

  it('messages say what to fix and never repeat the key', () => {
    const key = 'sk-secret-123456';
    const auth = classifyModelError(
      new AuthenticationError(401, body(`Incorrect API key provided: ${key}`), undefined, h()),
      { ...ctx, secrets: [key] },
    ) as ModelError;
    expect(auth.message).toMatch(/set OPENAI_API_KEY \(or the agent's provider\.apiKey\)/);
    expect(JSON.stringify(auth)).not.toContain('sk-secret');
    const bad = classifyModelError(
      new BadRequestError(400, body(`bad value ${key}`), undefined, h()),
      { ...ctx, secrets: [key] },
    ) as ModelError;
    expect(bad.message).toBe(
      "bad value *** (400): the request was malformed: check the agent's settings and tools",
    );
    expect(classify(new NotFoundError(404, body('nope'), undefined, h())).message).toMatch(
      /^model "gpt-x" not found at https:\/\/api\.example\.com\/v1 \(404\): check the agent's model name/,
    );
  });
  it('connection messages carry the reason from the cause chain', () => {
    const reason = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:9'), {
      code: 'ECONNREFUSED',
    });
    const e = classify(
      new APIConnectionError({
        message: 'Connection error.',
        cause: new TypeError('fetch failed', { cause: reason }),
      }),
    );
    expect(e.message).toBe(
      'the connection to model "gpt-x" at https://api.example.com/v1 failed: Connection error: fetch failed: connect ECONNREFUSED 127.0.0.1:9; check provider.baseURL and the network',
    );
  });

  it('passes aborts, runtime errors and foreign errors through unchanged', () => {
    const abort = new APIUserAbortError();
    expect(classifyModelError(abort, ctx)).toBe(abort);
    const mine = new RunNotFoundError('r');
    expect(classifyModelError(mine, ctx)).toBe(mine);
    const other = new TypeError('x');
    expect(classifyModelError(other, ctx)).toBe(other);
    expect(classifyModelError('str', ctx)).toBe('str');
  });

  it('shows URLs without credentials or query', () => {
    expect(displayURL('https://u:p@host.example/v1/?key=abc#x')).toBe('https://host.example/v1');
    expect(displayURL('not a url')).toBe('not a url');
  });
});
