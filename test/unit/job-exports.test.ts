import { describe, expect, it } from 'vitest';
import { closestExport } from '../../src/cli/job-module.js';
import { displayPath } from '../../src/cli/render.js';
import { parseOutageLimit } from '../../src/cli/outage.js';
import { checkRedisTimeout, redisClientOptions } from '../../src/persistence/redis-errors.js';

describe('job module export names', () => {
  it('a misspelt export names the export meant; other names are left alone', () => {
    expect(closestExport('tool')).toBe('tools');
    expect(closestExport('operator')).toBe('operators');
    expect(closestExport('Operators')).toBe('operators');
    expect(closestExport('Plan')).toBe('plan');
    expect(closestExport('plan_s')).toBe('plans');
    expect(closestExport('polices')).toBe('policies');
    expect(closestExport('setUp')).toBe('setup');
    expect(closestExport('plan')).toBeUndefined();
    expect(closestExport('helper')).toBeUndefined();
    expect(closestExport('sendEmail')).toBeUndefined();
  });
});

describe('printed paths', () => {
  it('is relative inside the working directory, absolute outside it', () => {
    expect(displayPath('/p/jobs/a.ts', '/p')).toBe('jobs/a.ts');
    expect(displayPath('jobs/a.ts', '/p')).toBe('jobs/a.ts');
    expect(displayPath('/q/a.ts', '/p')).toBe('/q/a.ts');
  });
});

describe('Redis timeouts', () => {
  it('every command gets the timeout; blocking connections get none and retry forever', () => {
    const o = redisClientOptions(1500);
    expect(o).toMatchObject({
      connectTimeout: 1500,
      commandTimeout: 1500,
      maxRetriesPerRequest: 1,
    });
    expect(o.retryStrategy(1000)).toBe(1500);
    const blocking = redisClientOptions(1500, { blocking: true });
    expect(blocking.commandTimeout).toBeUndefined();
    expect(blocking.maxRetriesPerRequest).toBeNull();
    const brief = redisClientOptions(1000, { reconnect: 'briefly' });
    expect(brief.retryStrategy(5)).toBe(500);
    expect(brief.retryStrategy(11)).toBeNull();
  });

  it('bad values are refused with the field and an example', () => {
    expect(checkRedisTimeout(undefined, 'redisTimeoutMs')).toBe(2000);
    expect(() => checkRedisTimeout(50, 'redisTimeoutMs')).toThrow(
      'redisTimeoutMs must be a whole number of milliseconds from 100 to 600000, e.g. 2000',
    );
    const bad = (message: string): never => {
      throw new Error(message);
    };
    expect(parseOutageLimit(undefined, bad)).toBe(60_000);
    expect(() => parseOutageLimit('1m', bad)).toThrow('--redis-outage-limit "1m"');
  });
});
