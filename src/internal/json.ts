/**
 * Plain-JSON checks. Inputs are fingerprinted, stored in Redis and replayed in other processes, so
 * anything `JSON.stringify` would drop, mangle or choke on is refused up front, with its path.
 */
import { z } from 'zod';
import { InputValidationError, type ValidationIssue } from '../errors.js';

/** A value that survives `JSON.parse(JSON.stringify(value))` unchanged. */
export type JsonValue =
  null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
/** A JSON object. */
export type JsonObject = { [key: string]: JsonValue };

/** One step of a path: an object key or an array index. */
export type PathSegment = string | number;

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

/**
 * The deepest nesting of arrays and objects a value may have: a value inside more than this many
 * levels is refused. Deeper values overflow the call stack of `JSON.stringify`, zod and the Lua
 * JSON codec long before they carry any meaning.
 */
export const MAX_JSON_DEPTH = 512;

/** How many leading segments of a too-deep path a message shows. */
const DEPTH_PATH_SHOWN = 6;

/** The message (its start) for a value nested deeper than {@link MAX_JSON_DEPTH}. */
export const TOO_DEEP = `nested deeper than ${MAX_JSON_DEPTH} levels of arrays and objects; flatten it (at most ${MAX_JSON_DEPTH} levels), or pass the deep part as a JSON string`;

/** Formats a path as `input.user.tags[2]` (keys that are not identifiers as `["a b"]`). */
export function formatPath(root: string, segments: readonly PropertyKey[]): string {
  let out = root;
  for (const segment of segments) {
    if (typeof segment === 'number') out += `[${segment}]`;
    else if (typeof segment === 'symbol') out += `[${String(segment)}]`;
    else if (IDENTIFIER.test(segment)) out += out === '' ? segment : `.${segment}`;
    else out += `[${JSON.stringify(segment)}]`;
  }
  return out;
}

type Report = (segments: readonly PathSegment[], message: string) => void;

/** Why a non-array object is not plain JSON, or undefined when it is a plain object. */
function describeNonPlain(value: object): string | undefined {
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto === Object.prototype || proto === null) return undefined;
  if (value instanceof Date) return 'Date is not JSON; pass an ISO string (date.toISOString())';
  if (value instanceof Map) {
    return 'Map is not JSON; pass a plain object (Object.fromEntries(map)) or an array of [key, value] pairs';
  }
  if (value instanceof Set) return 'Set is not JSON; pass an array ([...set])';
  if (value instanceof RegExp)
    return 'RegExp is not JSON; pass its source as a string (regexp.source)';
  const name = constructorName(proto);
  if (ArrayBuffer.isView(value) || value instanceof ArrayBuffer) {
    return `${name || 'binary data'} is not JSON; pass a base64 string or an array of numbers`;
  }
  if (value instanceof Error) {
    return `${name || 'Error'} is not JSON; pass a plain object such as { name, message }`;
  }
  if (value instanceof Promise) return 'Promise is not JSON; await it and pass the result';
  if (value instanceof Number || value instanceof String || value instanceof Boolean) {
    return `boxed ${name} is not JSON; pass the primitive (value.valueOf())`;
  }
  const what = name ? `instance of class ${name}` : 'object with a custom prototype';
  const hint =
    typeof (value as { toJSON?: unknown }).toJSON === 'function'
      ? 'pass the result of its toJSON() as a plain object'
      : 'pass a plain object with its fields';
  return `${what} is not JSON; ${hint}`;
}

function constructorName(proto: unknown): string {
  try {
    const ctor = (proto as { constructor?: unknown } | null)?.constructor;
    return typeof ctor === 'function' ? ctor.name : '';
  } catch {
    return '';
  }
}

function describePrimitive(value: unknown): string | undefined {
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return undefined;
    case 'number':
      if (Number.isFinite(value)) return undefined;
      return Number.isNaN(value)
        ? 'NaN is not JSON; pass null or a finite number'
        : `${value} is not JSON; pass null, a finite number or a string`;
    case 'bigint':
      return 'BigInt is not JSON; pass it as a string';
    case 'symbol':
      return 'Symbol is not JSON; pass a string';
    case 'function':
      return 'function is not JSON; pass data (register code with the runtime and refer to it by name)';
    case 'undefined':
      return 'undefined is not JSON; pass null';
    default:
      return undefined;
  }
}

const HOLE = Symbol('hole');
const UNDEFINED_IN_ARRAY = Symbol('undefined in array');
/** Key of a stack entry that closes an object's subtree. */
const LEAVE = Symbol('leave');
/** Clean subtrees of at least this many values are not walked again when shared. */
const MEMO_MIN_NODES = 32;
/** Key of the root entry. */
const ROOT = Symbol('root');

/**
 * Walks `root` once and reports every place that is not plain JSON. Iterative, on flat stacks of
 * (value, key) pairs, so deep values cannot overflow the call stack. Cycles are detected with the
 * set of objects on the current path; shared subtrees already found clean are not walked again.
 */
function walk(
  root: unknown,
  report: Report,
  describeFirstSeen: (segments: readonly PathSegment[]) => string,
): void {
  // Most values checked are small (a tool's arguments, a step's output): settled without the
  // walk's stacks when they are plain for certain.
  if (quickPlain(root)) return;
  const path: PathSegment[] = [];
  // Objects being walked, outermost first, with their path lengths; a Set for fast lookups.
  const onPath = new Set<object>();
  const open: object[] = [];
  const openDepth: number[] = [];
  const clean = new Set<object>();
  let issues = 0;
  const emit = (message: string): void => {
    issues++;
    report(path, message);
  };
  const values: unknown[] = [root];
  const keys: (PathSegment | typeof LEAVE | typeof ROOT)[] = [ROOT];
  // Counts when each open object was entered; popped by its LEAVE entry.
  const entries: { issues: number; visited: number }[] = [];
  let visited = 0;

  while (values.length > 0) {
    const value = values.pop();
    const key = keys.pop()!;
    if (key === LEAVE) {
      const object = value as object;
      onPath.delete(object);
      open.pop();
      openDepth.pop();
      const entry = entries.pop()!;
      // Remember only big clean subtrees: enough to keep shared ones linear, cheap for the rest.
      if (issues === entry.issues && visited - entry.visited >= MEMO_MIN_NODES) clean.add(object);
      path.pop();
      continue;
    }
    visited++;
    const isRoot = key === ROOT;
    if (!isRoot) path.push(key);
    if (value === HOLE) emit('empty slot in a sparse array is not JSON; fill it with null');
    else if (value === UNDEFINED_IN_ARRAY) emit('undefined inside an array is not JSON; use null');
    else if (typeof value !== 'object') {
      const problem = describePrimitive(value);
      if (problem !== undefined) emit(problem);
    } else if (value !== null && path.length >= MAX_JSON_DEPTH) {
      // Reported once, at the first place past the limit; nothing below it is walked.
      tooDeep();
    } else if (value !== null && !clean.has(value) && enter(value)) {
      continue; // the path stays until the LEAVE entry
    }
    if (!isRoot) path.pop();
  }

  /** Reports a value past the depth limit under the first few segments of its path. */
  function tooDeep(): void {
    issues++;
    const shown = path.slice(0, DEPTH_PATH_SHOWN);
    const where =
      path.length > shown.length ? ` (at depth ${path.length} from the root, below this path)` : '';
    report(shown, `${TOO_DEEP}${where}`);
  }

  /** Checks an object; returns true when it pushed its children and its LEAVE entry. */
  function enter(value: object): boolean {
    if (onPath.has(value)) {
      const seenAt = openDepth[open.indexOf(value)]!;
      emit(
        `cycle: this value contains itself (first seen at ${describeFirstSeen(path.slice(0, seenAt))})`,
      );
      return false;
    }
    const before = issues;
    const mark = values.length;
    try {
      if (Array.isArray(value)) {
        values.push(value);
        keys.push(LEAVE);
        for (let i = value.length - 1; i >= 0; i--) {
          const item: unknown = i in value ? value[i] : HOLE;
          values.push(item === undefined ? UNDEFINED_IN_ARRAY : item);
          keys.push(i);
        }
      } else {
        const problem = describeNonPlain(value);
        if (problem !== undefined) {
          emit(problem);
          return false;
        }
        for (const symbol of Object.getOwnPropertySymbols(value)) {
          if (Object.prototype.propertyIsEnumerable.call(value, symbol)) {
            emit(
              `property keyed by ${String(symbol)} is not JSON (JSON.stringify drops it); use a string key`,
            );
          }
        }
        values.push(value);
        keys.push(LEAVE);
        const record = value as Record<string, unknown>;
        const own = Object.keys(record);
        for (let i = own.length - 1; i >= 0; i--) {
          const k = own[i]!;
          const item = record[k];
          // Like JSON.stringify: an undefined property is an absent property.
          if (item === undefined) continue;
          values.push(item);
          keys.push(k);
        }
      }
    } catch (error) {
      // Proxies and throwing getters: report instead of crashing the caller.
      values.length = mark;
      keys.length = mark;
      emit(`could not read this value (${error instanceof Error ? error.message : String(error)})`);
      return false;
    }
    onPath.add(value);
    open.push(value);
    openDepth.push(path.length);
    entries.push({ issues: before, visited });
    return true;
  }
}

/** How many values {@link quickPlain} looks at before it leaves a value to the walk. */
const QUICK_NODES = 64;
/** How deep {@link quickPlain} goes before it leaves a value to the walk. */
const QUICK_DEPTH = 8;

/**
 * True when `value` is small plain JSON for certain: strings, booleans, null, finite numbers,
 * arrays without holes or undefined items, and objects with a plain prototype and no symbol keys,
 * at most {@link QUICK_NODES} values and {@link QUICK_DEPTH} levels. False when it is not, or is not
 * known to be: the walk then decides, and says where and why.
 */
function quickPlain(value: unknown): boolean {
  let budget = QUICK_NODES;
  const plain = (v: unknown, depth: number): boolean => {
    if (--budget < 0) return false;
    switch (typeof v) {
      case 'string':
      case 'boolean':
        return true;
      case 'number':
        return Number.isFinite(v);
      case 'object':
        break;
      default:
        return false;
    }
    if (v === null) return true;
    if (depth >= QUICK_DEPTH) return false;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        if (!(i in v)) return false;
        const item: unknown = v[i];
        if (item === undefined || !plain(item, depth + 1)) return false;
      }
      return true;
    }
    const proto: unknown = Object.getPrototypeOf(v);
    if (proto !== Object.prototype && proto !== null) return false;
    if (Object.getOwnPropertySymbols(v).length > 0) return false;
    const record = v as Record<string, unknown>;
    for (const k of Object.keys(record)) {
      const item = record[k];
      // Like JSON.stringify: an undefined property is an absent property.
      if (item !== undefined && !plain(item, depth + 1)) return false;
    }
    return true;
  };
  try {
    return plain(value, 0);
  } catch {
    return false; // a throwing getter or proxy: the walk reports it
  }
}

/** Every place in `value` that is not plain JSON, with paths starting at `rootPath` (e.g. `input`). */
export function findNonJson(value: unknown, rootPath: string): ValidationIssue[] {
  const issues: ValidationIssue[] = [];
  walk(
    value,
    (segments, message) => issues.push({ path: formatPath(rootPath, segments), message }),
    (segments) => formatPath(rootPath, segments) || '(root)',
  );
  return issues;
}

/**
 * Throws {@link InputValidationError} (`Invalid ${what}`) listing every non-JSON place in `value`.
 * Paths start at `rootPath` (default: empty, so the value itself is `(root)`).
 */
export function assertPlainJson(
  value: unknown,
  what: string,
  rootPath = '',
): asserts value is JsonValue {
  const issues = findNonJson(value, rootPath);
  if (issues.length > 0) throw new InputValidationError(what, issues);
}

/** True when `value` is plain JSON. */
export function isPlainJson(value: unknown): value is JsonValue {
  let ok = true;
  walk(
    value,
    () => {
      ok = false;
    },
    () => '',
  );
  return ok;
}

function makeJsonValueSchema(): z.ZodType<JsonValue> {
  // A check, not a recursive union: it is cycle-safe, names each bad place, and keeps the value as
  // is. Built on z.unknown() so its JSON Schema is `{}` (any JSON value).
  const schema = z.unknown().superRefine((value, ctx) => {
    walk(
      value,
      (segments, message) => ctx.addIssue({ code: 'custom', message, path: [...segments] }),
      // Zod knows the absolute path, the check does not: name the first place relative to the value.
      (segments) =>
        segments.length === 0
          ? 'the root of this value'
          : `${formatPath('', segments)} within this value`,
    );
  });
  // Sound: the check refuses every value that is not JSON.
  return schema as z.ZodType<unknown> as z.ZodType<JsonValue>;
}

/** Zod schema of a plain JSON value; refuses each non-JSON place with its path and the fix. */
export const jsonValueSchema: z.ZodType<JsonValue> = makeJsonValueSchema();

/** Where a JSON syntax error is: offset from 0, line and column from 1. */
export interface JsonSyntaxErrorPosition {
  position: number;
  line: number;
  column: number;
}

const JSON_NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const JSON_ESCAPES = new Set(['"', '\\', '/', 'b', 'f', 'n', 'r', 't']);
const HEX4 = /^[0-9A-Fa-f]{4}$/;

/**
 * Finds the first syntax error in JSON text, or undefined when the text is valid JSON. `JSON.parse`
 * does not always say where it failed; messages need the place. Iterative, so deep text is fine.
 */
export function locateJsonSyntaxError(text: string): JsonSyntaxErrorPosition | undefined {
  const n = text.length;
  let i = 0;
  const at = (position: number): JsonSyntaxErrorPosition => {
    let line = 1;
    let lineStart = 0;
    for (let j = 0; j < position; j++) {
      if (text.charCodeAt(j) === 10) {
        line++;
        lineStart = j + 1;
      }
    }
    return { position, line, column: position - lineStart + 1 };
  };
  const skipSpace = (): void => {
    while (i < n) {
      const c = text[i];
      if (c !== ' ' && c !== '\t' && c !== '\n' && c !== '\r') break;
      i++;
    }
  };
  /** Scans a string at `i`; returns the error offset, or -1 when it is well formed. */
  const scanString = (): number => {
    if (text[i] !== '"') return i;
    i++;
    while (i < n) {
      const code = text.charCodeAt(i);
      if (code === 34) {
        i++;
        return -1;
      }
      if (code < 0x20) return i;
      if (code === 92) {
        const next = text[i + 1];
        if (next === 'u') {
          if (!HEX4.test(text.slice(i + 2, i + 6))) return i;
          i += 6;
        } else if (next !== undefined && JSON_ESCAPES.has(next)) i += 2;
        else return i;
      } else i++;
    }
    return n;
  };
  /** Scans `"key":` at `i`; returns the error offset, or -1. */
  const scanKey = (): number => {
    skipSpace();
    const bad = scanString();
    if (bad !== -1) return bad;
    skipSpace();
    if (text[i] !== ':') return i;
    i++;
    return -1;
  };

  const open: string[] = [];
  let expectValue = true;
  for (;;) {
    skipSpace();
    if (expectValue) {
      const c = text[i];
      if (c === '{' || c === '[') {
        i++;
        skipSpace();
        if (text[i] === (c === '{' ? '}' : ']')) {
          i++;
          expectValue = false;
          continue;
        }
        open.push(c);
        if (c === '{') {
          const bad = scanKey();
          if (bad !== -1) return at(bad);
        }
        continue;
      }
      if (c === '"') {
        const bad = scanString();
        if (bad !== -1) return at(bad);
      } else if (text.startsWith('true', i)) i += 4;
      else if (text.startsWith('false', i)) i += 5;
      else if (text.startsWith('null', i)) i += 4;
      else {
        JSON_NUMBER.lastIndex = i;
        if (!JSON_NUMBER.test(text)) return at(i);
        i = JSON_NUMBER.lastIndex;
      }
      expectValue = false;
      continue;
    }
    const top = open[open.length - 1];
    if (top === undefined) return i === n ? undefined : at(i);
    const c = text[i];
    if (c === ',') {
      i++;
      if (top === '{') {
        const bad = scanKey();
        if (bad !== -1) return at(bad);
      }
      expectValue = true;
    } else if (c === (top === '{' ? '}' : ']')) {
      open.pop();
      i++;
    } else return at(i);
  }
}
