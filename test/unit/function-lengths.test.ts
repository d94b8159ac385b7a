import { describe, expect, it } from 'vitest';
import {
  DEFAULT_LIMIT,
  formatFunction,
  measureFunctions,
  measureSource,
} from '../../scripts/function-lengths.mjs';

describe('function lengths in src/', () => {
  it(`no function has more than ${DEFAULT_LIMIT} lines of its own`, () => {
    const over = measureFunctions()
      .filter((fn) => fn.ownLines > DEFAULT_LIMIT)
      .map(formatFunction);
    expect(over, `split these into named phases (npm run lint:functions)`).toEqual([]);
  });

  it('finds the source files (a walk that finds nothing would pass)', () => {
    const files = new Set(measureFunctions().map((fn) => fn.file));
    expect(files).toContain('src/observability/run-trace.ts');
    expect(files).toContain('src/cli/job-module.ts');
  });
});

describe('measureSource', () => {
  it('counts the lines of a body less those of the functions and classes nested in it', () => {
    const text = [
      'export function outer(items: number[]): number {', // 1
      '  const a = 1;', // 2
      '  const double = (n: number) => {', // 3
      '    return n * 2;', // 4
      '  };', // 5
      '  class Box {', // 6
      '    get value() {', // 7
      '      return a;', // 8
      '    }', // 9
      '  }', // 10
      '  return items.map(double).length + new Box().value;', // 11
      '}', // 12
    ].join('\n');
    const byName = Object.fromEntries(measureSource('x.ts', text).map((fn) => [fn.name, fn]));
    // Lines 1-12 less 3-5 (double) and 6-10 (Box).
    expect(byName['outer']).toEqual({ file: 'x.ts', line: 1, name: 'outer', ownLines: 4 });
    expect(byName['double']?.ownLines).toBe(3);
    expect(byName['Box.get value']?.ownLines).toBe(3);
  });

  it('names functions after what holds them', () => {
    const text = [
      'class Store {',
      '  constructor() {}',
      '  save(): void {}',
      '  handler = () => 1;',
      '}',
      'const api = { read: function () {}, write() {} };',
      'export default () => 0;',
      'function run(xs: number[]) {',
      '  return xs.map((x) => x + 1);',
      '}',
    ].join('\n');
    const names = measureSource('x.ts', text).map((fn) => fn.name);
    expect(names).toEqual([
      'Store.constructor',
      'Store.save',
      'Store.handler',
      'read',
      'write',
      'default',
      'run',
      '<arrow passed to xs.map in run>',
    ]);
  });
});
