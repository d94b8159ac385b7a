/** `parsePlan`: the one door into the runtime for plans. Every problem, with its path, in one error. */
import type { z } from 'zod';
import { PlanValidationError, type ValidationIssue } from '../errors.js';
import { findNonJson, formatPath, locateJsonSyntaxError, TOO_DEEP } from '../internal/json.js';
import {
  cachePolicySchema,
  checkPlanSemantics,
  closestMatch,
  gateSchema,
  idempotencySchema,
  planDefaultsSchema,
  planObjectSchema,
  planSchema,
  retryPolicyInputSchema,
  runBudgetsSchema,
  stepBudgetsSchema,
  stepSchemasByKind,
  whenSchema,
  type Plan,
} from './schema.js';

const MUST_BE = 'the plan must be JSON text or an object';

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/** A short description of a value for messages: `1.5`, `"abc"`, `an array`, `null`. */
function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  switch (typeof value) {
    case 'undefined':
      return 'nothing';
    case 'string':
      return JSON.stringify(value.length > 60 ? `${value.slice(0, 57)}...` : value);
    case 'number':
    case 'boolean':
      return String(value);
    case 'bigint':
      return `${value}n`;
    case 'object': {
      const proto: unknown = Object.getPrototypeOf(value);
      if (proto === Object.prototype || proto === null) return 'an object';
      const name = (proto as { constructor?: { name?: unknown } }).constructor?.name;
      return typeof name === 'string' && name !== '' ? `a ${name}` : 'an object';
    }
    default:
      return `a ${typeof value}`;
  }
}

const NOUNS: Record<string, string> = {
  int: 'an integer',
  number: 'a number',
  string: 'a string',
  boolean: 'a boolean',
  object: 'an object',
  record: 'an object',
  array: 'an array',
};

const plural = (n: number | bigint, noun: string): string =>
  `${n} ${noun}${Number(n) === 1 ? '' : 's'}`;

/** Messages for zod's issue codes that name the expected value and what was received. */
const planErrorMap: z.core.$ZodErrorMap = (issue) => {
  const received = describeValue(issue.input);
  switch (issue.code) {
    case 'invalid_type': {
      const expected = NOUNS[issue.expected] ?? issue.expected;
      return issue.input === undefined
        ? `required (expected ${expected})`
        : `expected ${expected}, received ${received}`;
    }
    case 'too_small': {
      const { minimum, inclusive } = issue;
      if (issue.origin === 'number' || issue.origin === 'int') {
        return `must be ${inclusive === false ? 'greater than' : 'at least'} ${minimum}, received ${received}`;
      }
      if (issue.origin === 'array') return `must have at least ${plural(minimum, 'item')}`;
      if (issue.origin === 'string') {
        return Number(minimum) === 1
          ? 'must not be empty'
          : `must be at least ${plural(minimum, 'character')}`;
      }
      return undefined;
    }
    case 'too_big': {
      const { maximum, inclusive } = issue;
      if (issue.origin === 'number' || issue.origin === 'int') {
        return `must be ${inclusive === false ? 'less than' : 'at most'} ${maximum}, received ${received}`;
      }
      if (issue.origin === 'array') {
        const length = Array.isArray(issue.input) ? ` (it has ${issue.input.length})` : '';
        return `must have at most ${plural(maximum, 'item')}${length}`;
      }
      if (issue.origin === 'string') return `must be at most ${plural(maximum, 'character')}`;
      return undefined;
    }
    case 'invalid_value': {
      const values = issue.values.map((v) => JSON.stringify(v)).join(', ');
      const expected = issue.values.length === 1 ? values : `one of ${values}`;
      return `expected ${expected}, received ${received}`;
    }
    case 'invalid_union': {
      // Discriminated unions (`kind`, `cachePolicy.class`) report the allowed tags.
      const { discriminator, options } = issue as { discriminator?: unknown; options?: unknown };
      if (typeof discriminator !== 'string' || !Array.isArray(options)) return undefined;
      const value = isRecord(issue.input) ? issue.input[discriminator] : undefined;
      const allowed = options.map((o) => JSON.stringify(o)).join(', ');
      return value === undefined
        ? `required (expected one of ${allowed})`
        : `unknown ${discriminator} ${describeValue(value)}: expected one of ${allowed}`;
    }
    default:
      return undefined;
  }
};

const keysOf = (schema: { shape: object }): string[] => Object.keys(schema.shape);
const STEP_KEYS = Object.fromEntries(
  Object.entries(stepSchemasByKind).map(([kind, schema]) => [kind, keysOf(schema)]),
) as Record<string, string[]>;
const CACHE_KEYS = Object.fromEntries(
  cachePolicySchema.options.map((o) => [o.shape.class.value, keysOf(o)]),
) as Record<string, string[]>;
const COMMON_STEP_KEYS = Object.values(STEP_KEYS).reduce((a, b) => a.filter((k) => b.includes(k)));

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let at = root;
  for (const segment of path) {
    if (typeof at !== 'object' || at === null) return undefined;
    at = (at as Record<PropertyKey, unknown>)[segment];
  }
  return at;
}

/** The keys allowed in the object at `path` of the plan, when known. */
function allowedKeysAt(path: readonly PropertyKey[], root: unknown): string[] | undefined {
  const at = path.map((s) => (typeof s === 'number' ? '#' : String(s))).join('/');
  const step = valueAt(root, path.slice(0, 2));
  const kind = isRecord(step) && typeof step.kind === 'string' ? step.kind : undefined;
  const cache = valueAt(root, [...path.slice(0, 2), 'cachePolicy']);
  const cacheClass = isRecord(cache) && typeof cache.class === 'string' ? cache.class : undefined;
  switch (at) {
    case '':
      return keysOf(planObjectSchema);
    case 'budgets':
      return keysOf(runBudgetsSchema);
    case 'defaults':
      return keysOf(planDefaultsSchema);
    case 'defaults/retry':
    case 'steps/#/retry':
      return keysOf(retryPolicyInputSchema);
    case 'steps/#':
      return (kind === undefined ? undefined : STEP_KEYS[kind]) ?? COMMON_STEP_KEYS;
    case 'steps/#/budgets':
      return keysOf(stepBudgetsSchema);
    case 'steps/#/idempotency':
      return keysOf(idempotencySchema);
    case 'steps/#/gate':
      return keysOf(gateSchema);
    case 'steps/#/when':
      return keysOf(whenSchema);
    case 'steps/#/cachePolicy':
      return cacheClass === undefined ? undefined : CACHE_KEYS[cacheClass];
    default:
      return undefined;
  }
}

function unrecognizedKeyMessage(key: string, path: readonly PropertyKey[], root: unknown): string {
  const base = `unrecognized key ${JSON.stringify(key)}`;
  if (path.length === 2 && path[0] === 'steps') {
    const kinds = Object.keys(STEP_KEYS).filter((k) => STEP_KEYS[k]!.includes(key));
    if (kinds.length > 0) {
      return `${base}: only ${kinds.join(' and ')} steps have it`;
    }
  }
  const allowed = allowedKeysAt(path, root);
  if (allowed === undefined) return base;
  const guess = closestMatch(key, allowed);
  return guess === undefined
    ? `${base} (allowed: ${allowed.join(', ')})`
    : `${base} (did you mean ${JSON.stringify(guess)}?)`;
}

function toIssues(issue: z.core.$ZodIssue, root: unknown): ValidationIssue[] {
  const path = formatPath('', issue.path);
  if (issue.code === 'unrecognized_keys') {
    return issue.keys.map((key) => ({
      path,
      message: unrecognizedKeyMessage(key, issue.path, root),
    }));
  }
  return [{ path, message: issue.message }];
}

/** Whether `path` is `prefix` or inside it. */
function isWithin(path: string, prefix: string): boolean {
  if (prefix === '') return true;
  if (!path.startsWith(prefix)) return false;
  const next = path[prefix.length];
  return next === undefined || next === '.' || next === '[';
}

/**
 * Parses and validates a plan given as JSON text or as an object. Returns a plain, JSON-safe
 * {@link Plan} with defaults applied and each step's retry policy resolved. Throws one
 * {@link PlanValidationError} listing every problem, each with a path like `steps[2].dependsOn[0]`.
 */
export function parsePlan(source: unknown): Plan {
  let value = source;
  if (typeof source === 'string') {
    const text = source.replace(/^\uFEFF/, '');
    try {
      value = JSON.parse(text) as unknown;
    } catch (error) {
      const reason = error instanceof Error ? error.message : String(error);
      const where = locateJsonSyntaxError(text);
      const place =
        where === undefined
          ? ''
          : ` at line ${where.line}, column ${where.column} (position ${where.position})`;
      throw new PlanValidationError([
        { path: '', message: `not valid JSON${place}: ${reason}; ${MUST_BE}` },
      ]);
    }
  }
  if (!isRecord(value)) {
    throw new PlanValidationError([
      { path: '', message: `expected a plan object, received ${describeValue(value)}; ${MUST_BE}` },
    ]);
  }

  // Parsed text is plain JSON, but may still be nested too deep for what comes next.
  const nonJson = findNonJson(value, '');
  if (nonJson.some((issue) => issue.path === '')) throw new PlanValidationError(nonJson);
  if (nonJson.some((issue) => issue.message.startsWith(TOO_DEEP))) {
    // Zod and the semantic checks would recurse through it: the depth is the whole answer.
    throw new PlanValidationError(nonJson);
  }
  // A fresh copy, so the returned plan shares nothing with the caller's object.
  const input: unknown =
    typeof source === 'string' || nonJson.length > 0 ? value : JSON.parse(JSON.stringify(value));

  const result = planSchema.safeParse(input, { error: planErrorMap });
  if (result.success && nonJson.length === 0) return result.data;

  const found: ValidationIssue[] = [];
  for (const zodIssue of result.error?.issues ?? []) found.push(...toIssues(zodIssue, input));
  // Zod skips refinements after some problems; the semantic checks must always be reported.
  for (const { path, message } of checkPlanSemantics(input)) {
    found.push({ path: formatPath('', path), message });
  }

  const issues: ValidationIssue[] = [...nonJson];
  const seen = new Set(issues.map((i) => `${i.path}\n${i.message}`));
  for (const issue of found) {
    // A non-JSON value already explains whatever zod says about it.
    if (nonJson.some((n) => isWithin(issue.path, n.path))) continue;
    const key = `${issue.path}\n${issue.message}`;
    if (seen.has(key)) continue;
    seen.add(key);
    issues.push(issue);
  }
  throw new PlanValidationError(issues);
}
