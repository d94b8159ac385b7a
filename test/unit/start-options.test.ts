/**
 * The start options of priority, singleton and debounce as checked before a start writes anything:
 * the BullMQ priority a run's priority maps to, and the refusals, each naming its field.
 */
import { describe, expect, it } from 'vitest';
import { assertPriority, bullPriority, PRIORITY_MAX, PRIORITY_MIN } from '../../src/actors/jobs.js';
import { InputValidationError } from '../../src/errors.js';
import { checkDebounce, checkDebouncedStart } from '../../src/operations/debounce.js';
import { checkSingleton } from '../../src/operations/singleton.js';
import { parseHolder } from '../../src/persistence/singletons.js';

/** The paths of the issues `fn` throws (an `InputValidationError`). */
function paths(fn: () => unknown): string[] {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(InputValidationError);
    return (error as InputValidationError).issues.map((i) => i.path);
  }
  throw new Error('did not throw');
}

describe('priority', () => {
  it('maps higher priorities to lower BullMQ numbers, all of them prioritized (1 or more)', () => {
    expect(bullPriority(PRIORITY_MAX)).toBe(1);
    expect(bullPriority(0)).toBe(1001);
    expect(bullPriority(PRIORITY_MIN)).toBe(2001);
    expect(bullPriority(10)).toBeLessThan(bullPriority(0));
    // BullMQ's largest priority is 2 097 152.
    expect(bullPriority(PRIORITY_MIN)).toBeLessThan(2_097_152);
  });

  it('refuses what is not an integer from -1000 to 1000', () => {
    for (const p of [0, 1000, -1000, 7]) expect(() => assertPriority(p)).not.toThrow();
    for (const p of [1.5, '3', 1001, -1001, Number.NaN, null, Infinity]) {
      expect(paths(() => assertPriority(p))).toEqual(['priority']);
    }
  });
});

describe('singleton', () => {
  it('takes a key and a mode (skip by default)', () => {
    expect(checkSingleton({ key: 'k' })).toEqual({ key: 'k', mode: 'skip' });
    expect(checkSingleton({ key: 'k', mode: 'cancel_previous' })).toEqual({
      key: 'k',
      mode: 'cancel_previous',
    });
  });

  it('refuses an empty or long key, an unknown mode, and what is not an object', () => {
    expect(paths(() => checkSingleton({ key: '' }))).toEqual(['singleton.key']);
    expect(paths(() => checkSingleton({ key: 'x'.repeat(513) }))).toEqual(['singleton.key']);
    expect(paths(() => checkSingleton({ key: 'k', mode: 'replace' }))).toEqual(['singleton.mode']);
    expect(paths(() => checkSingleton('k'))).toEqual(['singleton']);
  });

  it('reads a stored holder: its claim time, then its run id (which may hold "|")', () => {
    expect(parseHolder('1700000000000|run|1')).toEqual({
      runId: 'run|1',
      at: 1_700_000_000_000,
      raw: '1700000000000|run|1',
    });
    expect(parseHolder('nobar')).toBeNull();
  });
});

describe('debounce', () => {
  it('takes a key, a delay and an optional cap of at least the delay', () => {
    expect(checkDebounce({ key: 'k', delayMs: 300 })).toEqual({ key: 'k', delayMs: 300 });
    expect(checkDebounce({ key: 'k', delayMs: 300, maxDelayMs: 300 }).maxDelayMs).toBe(300);
  });

  it('refuses a delay of 0, a fraction, an empty key, a cap below the delay', () => {
    expect(paths(() => checkDebounce({ key: 'k', delayMs: 0 }))).toEqual(['debounce.delayMs']);
    expect(paths(() => checkDebounce({ key: 'k', delayMs: 1.5 }))).toEqual(['debounce.delayMs']);
    expect(paths(() => checkDebounce({ key: '', delayMs: 10 }))).toEqual(['debounce.key']);
    expect(paths(() => checkDebounce({ key: 'k', delayMs: 10, maxDelayMs: 5 }))).toEqual([
      'debounce.maxDelayMs',
    ]);
    expect(paths(() => checkDebounce(null))).toEqual(['debounce']);
  });

  it('refuses the start options a burst cannot honour', () => {
    expect(paths(() => checkDebouncedStart({ runId: 'r', requestKey: 'k' }))).toEqual([
      'runId',
      'requestKey',
    ]);
    expect(() => checkDebouncedStart({ priority: 3 })).not.toThrow();
  });
});
