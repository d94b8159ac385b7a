import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { InputValidationError, isFlujoError } from '../../src/errors.js';
import {
  assertPlainJson,
  findNonJson,
  formatPath,
  isPlainJson,
  jsonValueSchema,
  locateJsonSyntaxError,
} from '../../src/internal/json.js';

class Point {
  constructor(
    readonly x: number,
    readonly y: number,
  ) {}
}

class Stamp {
  toJSON(): string {
    return 'stamp';
  }
}

describe('formatPath', () => {
  it('uses dots for identifier keys, brackets for indexes and other keys', () => {
    expect(formatPath('input', ['user', 'tags', 2])).toBe('input.user.tags[2]');
    expect(formatPath('', ['steps', 0, 'id'])).toBe('steps[0].id');
    expect(formatPath('input', ['a b', 0, 'c-d', '$ok'])).toBe('input["a b"][0]["c-d"].$ok');
    expect(formatPath('', [3])).toBe('[3]');
    expect(formatPath('x', [])).toBe('x');
  });
});

describe('findNonJson', () => {
  const refused: [string, unknown, string, string][] = [
    [
      'a function',
      { user: { hook: () => 1 } },
      'input.user.hook',
      'function is not JSON; pass data',
    ],
    ['a symbol', { s: Symbol('s') }, 'input.s', 'Symbol is not JSON; pass a string'],
    ['a BigInt', { n: 10n }, 'input.n', 'BigInt is not JSON; pass it as a string'],
    ['NaN', { list: [1, NaN] }, 'input.list[1]', 'NaN is not JSON; pass null or a finite number'],
    ['Infinity', { n: Infinity }, 'input.n', 'Infinity is not JSON; pass null, a finite number'],
    ['-Infinity', { n: -Infinity }, 'input.n', '-Infinity is not JSON; pass null, a finite number'],
    [
      'a Date',
      { when: new Date(0) },
      'input.when',
      'Date is not JSON; pass an ISO string (date.toISOString())',
    ],
    ['a Map', { m: new Map() }, 'input.m', 'Map is not JSON; pass a plain object'],
    ['a Set', { 'a b': new Set([1]) }, 'input["a b"]', 'Set is not JSON; pass an array ([...set])'],
    ['a RegExp', { r: /x/ }, 'input.r', 'RegExp is not JSON; pass its source as a string'],
    ['a Uint8Array', { b: new Uint8Array(2) }, 'input.b', 'Uint8Array is not JSON; pass a base64'],
    ['a Buffer', { b: Buffer.from('hi') }, 'input.b', 'Buffer is not JSON; pass a base64 string'],
    [
      'an Error',
      { e: new TypeError('x') },
      'input.e',
      'TypeError is not JSON; pass a plain object',
    ],
    ['a class instance', { p: new Point(1, 2) }, 'input.p', 'instance of class Point is not JSON'],
    [
      'an instance with toJSON',
      { s: new Stamp() },
      'input.s',
      'instance of class Stamp is not JSON; pass the result of its toJSON()',
    ],
    ['a Promise', { p: Promise.resolve(1) }, 'input.p', 'Promise is not JSON; await it'],
    ['a boxed number', { n: new Number(1) }, 'input.n', 'boxed Number is not JSON'],
    ['undefined in an array', { a: [1, undefined] }, 'input.a[1]', 'undefined inside an array'],
    // eslint-disable-next-line no-sparse-arrays
    ['an array hole', { a: [1, , 3] }, 'input.a[1]', 'empty slot in a sparse array'],
    ['undefined at the root', undefined, 'input', 'undefined is not JSON; pass null'],
  ];

  it.each(refused)('refuses %s with its path', (_label, value, path, message) => {
    const issues = findNonJson(value, 'input');
    expect(issues).toHaveLength(1);
    expect(issues[0]!.path).toBe(path);
    expect(issues[0]!.message).toContain(message);
  });

  it('reports every bad place in one pass, in document order', () => {
    const issues = findNonJson({ a: 1n, b: [new Date(0), 'ok', NaN], c: { d: () => 0 } }, 'input');
    expect(issues.map((i) => i.path)).toEqual(['input.a', 'input.b[0]', 'input.b[2]', 'input.c.d']);
  });

  it('accepts plain JSON, null prototypes, undefined properties and shared references', () => {
    const shared = { tags: ['a', 'b'], n: 1 };
    const bare = Object.assign(Object.create(null) as object, { k: 'v' });
    const value = {
      s: 'x',
      n: -0.5,
      t: true,
      z: null,
      list: [1, 'two', [3], { four: 4 }],
      first: shared,
      second: shared,
      again: [shared, shared],
      bare,
      absent: undefined,
      'a b': {},
    };
    expect(findNonJson(value, 'input')).toEqual([]);
    expect(isPlainJson(value)).toBe(true);
    expect(findNonJson('text', 'input')).toEqual([]);
    expect(findNonJson(null, 'input')).toEqual([]);
  });

  it('reports a cycle once, naming where the value was first seen', () => {
    const node: Record<string, unknown> = { name: 'n' };
    node.self = node;
    expect(findNonJson({ user: node }, 'input')).toEqual([
      {
        path: 'input.user.self',
        message: 'cycle: this value contains itself (first seen at input.user)',
      },
    ]);
    const list: unknown[] = [1];
    list.push(list);
    expect(findNonJson(list, '')).toEqual([
      { path: '[1]', message: 'cycle: this value contains itself (first seen at (root))' },
    ]);
  });

  it('finds a cycle through a shared value however it is reached', () => {
    const a: Record<string, unknown> = {};
    const b: Record<string, unknown> = { a };
    a.b = b;
    const issues = findNonJson({ x: a, y: b }, 'v');
    expect(issues).toEqual([
      { path: 'v.x.b.a', message: 'cycle: this value contains itself (first seen at v.x)' },
      { path: 'v.y.a.b', message: 'cycle: this value contains itself (first seen at v.y)' },
    ]);
  });

  it('reports a bad value in a shared subtree at every path that reaches it', () => {
    const shared = { when: new Date(0) };
    expect(findNonJson({ a: shared, b: shared }, 'input').map((i) => i.path)).toEqual([
      'input.a.when',
      'input.b.when',
    ]);
  });

  it('refuses symbol-keyed properties, which JSON.stringify drops', () => {
    const key = Symbol('k');
    expect(findNonJson({ o: { [key]: 1 } }, 'input')).toEqual([
      {
        path: 'input.o',
        message:
          'property keyed by Symbol(k) is not JSON (JSON.stringify drops it); use a string key',
      },
    ]);
  });

  it('handles values nested deeper than the call stack: one issue, past the depth limit', () => {
    let deep: unknown = 'leaf';
    for (let i = 0; i < 100_000; i++) deep = [deep];
    const issues = findNonJson(deep, '');
    expect(issues).toHaveLength(1);
    expect(issues[0]!.message).toMatch(/^nested deeper than 512 levels/);
  });

  it('finds a bad place in small and large values, shallow and deep, alike', () => {
    // Small values are settled by a quick check, large or deep ones by the walk: both must report.
    for (const size of [1, 10, 63, 64, 65, 200]) {
      const list = [...Array.from({ length: size }, (_, i) => ({ i })), { bad: NaN }];
      expect(
        findNonJson({ list }, 'v').map((i) => i.path),
        `${size} items`,
      ).toEqual([`v.list[${size}].bad`]);
      expect(findNonJson({ list: list.slice(0, -1) }, 'v'), `${size} items`).toEqual([]);
    }
    for (const depth of [1, 7, 8, 9, 20]) {
      let deep: unknown = { bad: undefined, also: [undefined] };
      for (let d = 0; d < depth; d++) deep = { d: deep };
      expect(findNonJson(deep, 'v'), `depth ${depth}`).toHaveLength(1);
    }
  });

  it('reports a throwing getter instead of throwing', () => {
    const value = {
      get bad(): never {
        throw new Error('boom');
      },
    };
    expect(findNonJson({ v: value }, 'input')).toEqual([
      { path: 'input.v', message: 'could not read this value (boom)' },
    ]);
  });
});

describe('assertPlainJson', () => {
  it('throws InputValidationError listing every problem with the root path', () => {
    let thrown: unknown;
    try {
      assertPlainJson({ when: new Date(0), n: 1n }, 'run input', 'input');
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(InputValidationError);
    expect(isFlujoError(thrown, 'input_invalid')).toBe(true);
    const error = thrown as InputValidationError;
    expect(error.issues).toEqual([
      { path: 'input.when', message: 'Date is not JSON; pass an ISO string (date.toISOString())' },
      { path: 'input.n', message: 'BigInt is not JSON; pass it as a string' },
    ]);
    expect(error.message).toContain('Invalid run input (2 problems)');
    expect(error.message).toContain(
      'input.when: Date is not JSON; pass an ISO string (date.toISOString())',
    );
  });

  it('defaults the root path to empty', () => {
    expect(() => assertPlainJson(NaN, 'value')).toThrow(
      '(root): NaN is not JSON; pass null or a finite number',
    );
  });

  it('passes plain JSON', () => {
    const value: unknown = { a: [1, { b: null }] };
    assertPlainJson(value, 'value');
    expect(value).toEqual({ a: [1, { b: null }] });
  });
});

describe('jsonValueSchema', () => {
  const schema = z.object({ output: jsonValueSchema });

  it('accepts JSON and keeps the value as is', () => {
    const output = { a: [1, 'x', null, { b: true }] };
    const parsed = schema.parse({ output });
    expect(parsed.output).toBe(output);
  });

  it('names each non-JSON place with its zod path', () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.me = cyclic;
    const result = schema.safeParse({ output: { when: new Date(0), list: [1n], c: cyclic } });
    expect(result.success).toBe(false);
    expect(result.error!.issues.map((i) => [i.path, i.message])).toEqual([
      [['output', 'when'], 'Date is not JSON; pass an ISO string (date.toISOString())'],
      [['output', 'list', 0], 'BigInt is not JSON; pass it as a string'],
      [
        ['output', 'c', 'me'],
        'cycle: this value contains itself (first seen at c within this value)',
      ],
    ]);
  });

  it('refuses a missing required value', () => {
    const result = schema.safeParse({});
    expect(result.error!.issues.map((i) => [i.path, i.message])).toEqual([
      [['output'], 'undefined is not JSON; pass null'],
    ]);
  });

  it('has a JSON Schema (any value)', () => {
    const json = z.toJSONSchema(schema) as { properties: Record<string, unknown> };
    expect(json.properties.output).toEqual({});
  });
});

describe('locateJsonSyntaxError', () => {
  it('finds the first error with line and column', () => {
    expect(locateJsonSyntaxError('{"a": 1,}')).toEqual({ position: 8, line: 1, column: 9 });
    expect(locateJsonSyntaxError('{\n  "a": tru\n}')).toEqual({ position: 9, line: 2, column: 8 });
    expect(locateJsonSyntaxError('[1, 2')).toEqual({ position: 5, line: 1, column: 6 });
    expect(locateJsonSyntaxError('')).toEqual({ position: 0, line: 1, column: 1 });
    expect(locateJsonSyntaxError('{"a" 1}')).toEqual({ position: 5, line: 1, column: 6 });
    expect(locateJsonSyntaxError('"\\x"')).toEqual({ position: 1, line: 1, column: 2 });
  });

  it('agrees with JSON.parse on what is valid', () => {
    const texts = [
      '{}',
      '[]',
      '0',
      '-0.5e+3',
      '"\\u00e9\\n"',
      ' null ',
      '{"a":[1,{"b":false}],"c":"d"}',
      '01',
      '1.',
      '.5',
      '+1',
      '-',
      '[1,]',
      '{"a":1,}',
      '{a:1}',
      "'x'",
      'nul',
      'true false',
      '"\\u12"',
      '"tab\there"',
      '[',
      ']',
      '{"a":1}}',
      '[1 2]',
      '{"a":1 "b":2}',
      '1e',
      '"\\q"',
      '['.repeat(50_000) + ']'.repeat(50_000),
    ];
    for (const text of texts) {
      let valid = true;
      try {
        JSON.parse(text);
      } catch {
        valid = false;
      }
      expect(locateJsonSyntaxError(text) === undefined, text.slice(0, 40)).toBe(valid);
    }
  });
});
