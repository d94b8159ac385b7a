import { describe, expect, it } from 'vitest';
import {
  ModelError,
  ResumeError,
  reviveError,
  type FingerprintField,
  type ModelErrorKind,
  type SerializedError,
} from '../../src/errors.js';

const at = { model: 'gpt-x', baseURL: 'http://127.0.0.1:1/v1' };
const roundTrip = (e: ModelError | ResumeError) =>
  reviveError(JSON.parse(JSON.stringify(e)) as SerializedError);

describe('ModelError', () => {
  const kinds: [ModelErrorKind, boolean][] = [
    ['rate_limit', true],
    ['timeout', true],
    ['conflict', true],
    ['server', true],
    ['connection', true],
    ['auth', false],
    ['bad_request', false],
    ['not_found', false],
  ];
  it.each(kinds)('%s: retryable %s, survives JSON', (kind, retryable) => {
    const e = new ModelError({ ...at, kind, status: 500, requestId: 'req_1' }, { retryAfterMs: 7 });
    expect([e.name, e.code, e.kind, e.retryable, e.retryAfterMs]).toEqual([
      'ModelError',
      'model_error',
      kind,
      retryable,
      7,
    ]);
    const back = roundTrip(e);
    expect([back.name, back.code, back.retryable, back.retryAfterMs, back.message]).toEqual([
      'ModelError',
      'model_error',
      retryable,
      7,
      e.message,
    ]);
    expect(back.details).toEqual({ kind, ...at, status: 500, requestId: 'req_1' });
  });

  it('says what to fix for final failures', () => {
    const msg = (kind: ModelErrorKind, status: number, providerMessage?: string) =>
      new ModelError({ ...at, kind, status, ...(providerMessage ? { providerMessage } : {}) })
        .message;
    expect(msg('auth', 401, 'Incorrect API key provided: sk-abc')).toBe(
      "the provider refused the API key (401) at http://127.0.0.1:1/v1: set OPENAI_API_KEY (or the agent's provider.apiKey)",
    );
    expect(msg('auth', 403)).toMatch(/refused access \(403\) to model "gpt-x".*may use this model/);
    expect(msg('not_found', 404)).toMatch(
      /^model "gpt-x" not found at http:\/\/127\.0\.0\.1:1\/v1 \(404\): check the agent's model name/,
    );
    expect(msg('bad_request', 400, "Unknown parameter: 'x'.")).toBe(
      "Unknown parameter: 'x'. (400): the request was malformed: check the agent's settings and tools",
    );
  });

  it('x-should-retry style overrides keep the kind', () => {
    const e = new ModelError({ ...at, kind: 'bad_request', status: 400 }, { retryable: true });
    expect([e.kind, e.retryable]).toEqual(['bad_request', true]);
  });
});

describe('ResumeError', () => {
  it('a gap is recoverable (retryable)', () => {
    const e = new ResumeError('gap: stored turn 2, job for turn 4', { recoverable: true });
    expect([e.name, e.code, e.retryable, e.recoverable, e.field]).toEqual([
      'ResumeError',
      'resume_error',
      true,
      true,
      undefined,
    ]);
    expect(roundTrip(e).toJSON()).toEqual(e.toJSON());
  });

  const fields: FingerprintField[] = [
    'input',
    'systemPrompt',
    'model',
    'provider',
    'pricing',
    'tools',
    'settings',
    'policyVersion',
    'toggles',
    'mode',
  ];
  it.each(fields)('a fingerprint mismatch on %s is irrecoverable and names it', (field) => {
    const e = ResumeError.fingerprintMismatch(field, { runId: 'r1', stepId: 'research' });
    expect([e.code, e.retryable, e.recoverable, e.field]).toEqual([
      'resume_error',
      false,
      false,
      field,
    ]);
    expect(e.message).toMatch(/start a new run, or restore .* to resume/);
    const back = roundTrip(e);
    expect([back.name, back.retryable]).toEqual(['ResumeError', false]);
    expect(back.details).toEqual({ recoverable: false, field, runId: 'r1', stepId: 'research' });
  });

  it('names the system prompt in words', () => {
    expect(ResumeError.fingerprintMismatch('systemPrompt').message).toBe(
      'Cannot resume the step: fingerprint mismatch: the system prompt changed since the run started; start a new run, or restore the previous prompt to resume.',
    );
  });
});
