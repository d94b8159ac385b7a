import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadJobModule } from '../../src/cli/job-module.js';
import { checkRateLimits, rateLimitNames } from '../../src/execution/rate-limits.js';
import { InputValidationError } from '../../src/errors.js';

describe('rateLimitNames', () => {
  const limits = {
    'gpt-4o': { requestsPerMinute: 1 },
    openai: { requestsPerMinute: 1 },
    'openrouter/openai': { requestsPerMinute: 1 },
    'api.openai.com': { requestsPerMinute: 1 },
    'localhost:8080': { requestsPerMinute: 1 },
  };

  it('matches the model exactly, its provider prefixes and the provider host', () => {
    expect(rateLimitNames(limits, 'gpt-4o', 'https://api.openai.com/v1')).toEqual([
      'gpt-4o',
      'api.openai.com',
    ]);
    expect(rateLimitNames(limits, 'openai/gpt-4o', 'https://gateway.example/v1')).toEqual([
      'openai',
    ]);
    expect(rateLimitNames(limits, 'openrouter/openai/gpt-4o', 'http://localhost:8080/v1')).toEqual([
      'openrouter/openai',
      'localhost:8080',
    ]);
  });

  it('does not match a longer or shorter model name', () => {
    expect(rateLimitNames(limits, 'gpt-4o-mini', 'http://127.0.0.1:1/v1')).toEqual([]);
    expect(rateLimitNames({ 'gpt-4o-mini': { requestsPerMinute: 1 } }, 'gpt-4o', 'x')).toEqual([]);
  });
});

describe('checkRateLimits', () => {
  it('takes positive integers', () => {
    expect(
      checkRateLimits({ a: { requestsPerMinute: 30 }, b: { tokensPerMinute: 9, maxWaitMs: 5 } }),
    ).toEqual({ a: { requestsPerMinute: 30 }, b: { tokensPerMinute: 9, maxWaitMs: 5 } });
  });

  it('names every bad field', () => {
    let thrown: unknown;
    try {
      checkRateLimits({
        a: { requestsPerMinute: 0 },
        b: { tokensPerMinute: -3, requestsPerMinute: 2.5 },
        c: {},
        d: { requestsPerMinute: 1, perHour: 3 },
        e: 5,
      });
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(InputValidationError);
    const paths = (thrown as InputValidationError).issues.map((i) => i.path);
    expect(paths).toEqual([
      'rateLimits.a.requestsPerMinute',
      'rateLimits.b.tokensPerMinute',
      'rateLimits.b.requestsPerMinute',
      'rateLimits.c',
      'rateLimits.d.perHour',
      'rateLimits.e',
    ]);
  });

  it('refuses what is not an object', () => {
    expect(() => checkRateLimits([])).toThrow(/rateLimits: must be an object/);
    expect(() => checkRateLimits(null)).toThrow(InputValidationError);
  });
});

describe('a job module with rate limits', () => {
  const moduleText = (limits: string) => `
export const plan = { name: 'rated', steps: [{ id: 'a', kind: 'operator', operator: 'a' }] };
export const operators = { a: () => ({ ok: true }) };
export const rateLimits = ${limits};
`;

  it('takes them as createRuntime does, and refuses bad ones naming the field', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'flujo-rate-job-'));
    try {
      await writeFile(
        join(dir, 'good.mjs'),
        moduleText("{ 'gpt-test': { requestsPerMinute: 30 } }"),
      );
      const job = await loadJobModule('good.mjs', dir);
      expect(job.rateLimits).toEqual({ 'gpt-test': { requestsPerMinute: 30 } });
      await writeFile(join(dir, 'bad.mjs'), moduleText("{ 'gpt-test': { requestsPerMinute: 0 } }"));
      await expect(loadJobModule('bad.mjs', dir)).rejects.toThrow(
        'rateLimits.gpt-test.requestsPerMinute must be a positive integer, got 0',
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
