import { describe, expect, it } from 'vitest';
import { PlanValidationError, isFlujoError, type ValidationIssue } from '../../src/errors.js';
import { dependentsOf, findDependencyCycles, topologicalOrder } from '../../src/plan/graph.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import {
  DEFAULT_RETRY_POLICY,
  planSchema,
  resolveRetryPolicy,
  retryPolicySchema,
  stepNeedsApproval,
  type PlanInput,
} from '../../src/plan/schema.js';

/** Parses and returns the PlanValidationError, failing the test if none is thrown. */
function refusal(source: unknown): PlanValidationError {
  try {
    parsePlan(source);
  } catch (error) {
    expect(error).toBeInstanceOf(PlanValidationError);
    return error as PlanValidationError;
  }
  throw new Error('expected parsePlan to refuse the plan');
}

const op = (id: string, extra: Record<string, unknown> = {}) => ({
  id,
  kind: 'operator',
  operator: 'noop',
  ...extra,
});
const planWith = (...steps: unknown[]) => ({ name: 'p', steps });
const withInput = (input: unknown) => planWith(op('a', { input }));

class Point {
  constructor(readonly x: number) {}
}

const cyclicInput = (): unknown => {
  const input: Record<string, unknown> = { k: 1 };
  input.self = input;
  return input;
};

describe('parsePlan: a valid plan', () => {
  const source = {
    name: 'research and send',
    description: 'find facts, draft, approve, send',
    budgets: { maxSteps: 20, maxCostUsd: 1.5 },
    defaults: { retry: { maxAttempts: 5, jitter: 0 } },
    steps: [
      { id: 'fetch', kind: 'operator', operator: 'http.get', input: { url: 'https://x.test' } },
      {
        id: 'draft',
        kind: 'agent',
        agent: 'writer',
        dependsOn: ['fetch'],
        retry: { initialDelayMs: 50, maxDelayMs: 500 },
        cachePolicy: { class: 'stable_nondeterministic', allowCacheHit: true },
      },
      { id: 'check', kind: 'policy_check', policy: 'no-pii', dependsOn: ['draft'] },
      {
        id: 'approve',
        kind: 'human_gate',
        dependsOn: ['check'],
        gate: { approvers: ['ana'], reason: 'sends e-mail' },
      },
      {
        id: 'send',
        kind: 'operator',
        operator: 'email.send',
        dependsOn: ['approve'],
        effects: ['external'],
        riskLevel: 'high',
        policyTags: ['email'],
        idempotency: { keyInputs: ['to', 'subject'] },
        cachePolicy: { class: 'external', ttlMs: 60_000, provenance: 'smtp' },
        budgets: { maxToolCalls: 3 },
        timeoutMs: 30_000,
      },
    ],
  } satisfies PlanInput;

  it('applies defaults and resolves each retry policy (step over plan defaults over built-ins)', () => {
    const plan = parsePlan(source);
    expect(plan.schemaVersion).toBe(1);
    const [fetch, draft, check, approve, send] = plan.steps;
    expect(fetch).toEqual({
      id: 'fetch',
      kind: 'operator',
      operator: 'http.get',
      input: { url: 'https://x.test' },
      dependsOn: [],
      effects: [],
      policyTags: [],
      riskLevel: 'low',
      cachePolicy: { class: 'none' },
      idempotency: { keyInputs: [] },
      retry: {
        maxAttempts: 5,
        initialDelayMs: 1000,
        backoffCoefficient: 2,
        maxDelayMs: 300_000,
        jitter: 0,
      },
    });
    expect(draft).toMatchObject({
      mode: 'atomic',
      maxTurns: 20,
      historyMaxTokens: 128_000,
      blobThresholdBytes: 20_000,
      enforceIdempotency: false,
      retry: {
        maxAttempts: 5,
        initialDelayMs: 50,
        backoffCoefficient: 2,
        maxDelayMs: 500,
        jitter: 0,
      },
    });
    expect(check!.retry).toEqual({ ...DEFAULT_RETRY_POLICY, maxAttempts: 5, jitter: 0 });
    expect(approve!.gate).toEqual({ approvers: ['ana'], reason: 'sends e-mail' });
    expect(send).toMatchObject({ riskLevel: 'high', effects: ['external'], timeoutMs: 30_000 });
  });

  it('is plain JSON, the same from text, and parses to itself again', () => {
    const plan = parsePlan(source);
    expect(JSON.parse(JSON.stringify(plan))).toStrictEqual(plan);
    expect(parsePlan(JSON.stringify(source))).toStrictEqual(plan);
    expect(parsePlan(plan)).toStrictEqual(plan);
    expect(planSchema.parse(source)).toStrictEqual(plan);
  });

  it('shares nothing with the source object', () => {
    const input = { url: 'a' };
    const plan = parsePlan(withInput(input));
    input.url = 'changed';
    expect(plan.steps[0]!.input).toEqual({ url: 'a' });
  });

  it('drops undefined properties, as JSON does', () => {
    const plan = parsePlan({ name: 'p', description: undefined, steps: [op('a')] });
    expect('description' in plan).toBe(false);
  });

  it('says which steps need approval', () => {
    const plan = parsePlan(source);
    // The last step's riskLevel is high: it waits as if it had a gate.
    expect(plan.steps.map(stepNeedsApproval)).toEqual([false, false, false, true, true]);
    const gated = parsePlan(planWith(op('a', { gate: {} })));
    expect(stepNeedsApproval(gated.steps[0]!)).toBe(true);
  });
});

// Each entry has exactly one problem: [label, source, path ('' = root), message fragment].
const corpus: [string, unknown, string, string][] = [
  ['not JSON text', '{"name": "p", ', '', 'not valid JSON at line 1, column 15 (position 14): '],
  [
    'text that is not JSON',
    '\n  steps: []',
    '',
    'not valid JSON at line 2, column 3 (position 3): ',
  ],
  [
    'a number',
    42,
    '',
    'expected a plan object, received 42; the plan must be JSON text or an object',
  ],
  ['an array', [], '', 'expected a plan object, received an array'],
  ['null', null, '', 'expected a plan object, received null'],
  ['JSON text of a string', '"plan"', '', 'expected a plan object, received "plan"'],
  ['a Map as the plan', new Map(), '', 'Map is not JSON'],
  ['missing steps', { name: 'p' }, 'steps', 'required (expected an array)'],
  ['empty steps', planWith(), 'steps', 'must have at least 1 item'],
  [
    'too many steps',
    planWith(...Array.from({ length: 1001 }, (_, i) => op(`s${i}`))),
    'steps',
    'must have at most 1000 items (it has 1001)',
  ],
  ['missing name', { steps: [op('a')] }, 'name', 'required (expected a string)'],
  ['empty name', { name: '', steps: [op('a')] }, 'name', 'must not be empty'],
  [
    'long name',
    { name: 'n'.repeat(201), steps: [op('a')] },
    'name',
    'must be at most 200 characters',
  ],
  [
    'unsupported schemaVersion',
    { schemaVersion: 2, name: 'p', steps: [op('a')] },
    'schemaVersion',
    'unsupported schemaVersion 2: this release reads schemaVersion 1',
  ],
  [
    'unknown top-level key',
    { name: 'p', descripton: 'x', steps: [op('a')] },
    '',
    'unrecognized key "descripton" (did you mean "description"?)',
  ],
  [
    'step id with a colon',
    planWith(op('fetch:1')),
    'steps[0].id',
    'step id "fetch:1" is not allowed: use 1 to 128 letters, digits',
  ],
  ['step id with a space', planWith(op('a b')), 'steps[0].id', 'step id "a b" is not allowed'],
  ['step id with braces', planWith(op('{a}')), 'steps[0].id', 'step id "{a}" is not allowed'],
  ['step id starting with "-"', planWith(op('-a')), 'steps[0].id', 'step id "-a" is not allowed'],
  [
    'step id of 129 chars',
    planWith(op('a'.repeat(129))),
    'steps[0].id',
    `step id "${'a'.repeat(129)}" is not allowed`,
  ],
  [
    'duplicate step ids',
    planWith(op('a'), op('b'), op('a')),
    'steps[2].id',
    'duplicate step id "a" (first used by steps[0])',
  ],
  [
    'unknown dependency',
    planWith(op('a'), op('b'), op('c', { dependsOn: ['fetch'] })),
    'steps[2].dependsOn[0]',
    'unknown step "fetch"',
  ],
  [
    'unknown dependency that looks like a typo',
    planWith(op('fetch'), op('b', { dependsOn: ['fetc'] })),
    'steps[1].dependsOn[0]',
    'unknown step "fetc" (did you mean "fetch"?)',
  ],
  [
    'self dependency',
    planWith(op('a', { dependsOn: ['a'] })),
    'steps[0].dependsOn[0]',
    'step "a" depends on itself',
  ],
  [
    'duplicate dependency',
    planWith(op('a'), op('b', { dependsOn: ['a', 'a'] })),
    'steps[1].dependsOn[1]',
    'duplicate dependency "a" (already listed at dependsOn[0])',
  ],
  [
    'dependsOn not an array',
    planWith(op('a', { dependsOn: 'b' })),
    'steps[0].dependsOn',
    'expected an array, received "b"',
  ],
  [
    '2-cycle',
    planWith(op('a', { dependsOn: ['b'] }), op('b', { dependsOn: ['a'] })),
    'steps[0].dependsOn',
    'dependency cycle a → b → a (each step depends on the next',
  ],
  [
    '3-cycle, named in dependency order',
    planWith(
      op('x'),
      op('a', { dependsOn: ['c'] }),
      op('b', { dependsOn: ['a', 'x'] }),
      op('c', { dependsOn: ['b'] }),
    ),
    'steps[1].dependsOn',
    'dependency cycle a → c → b → a',
  ],
  [
    'unknown kind',
    planWith({ id: 'a', kind: 'tool' }),
    'steps[0].kind',
    'unknown kind "tool": expected one of "operator", "agent", "policy_check", "human_gate", "wait", "map", "run"',
  ],
  [
    'missing kind',
    planWith({ id: 'a' }),
    'steps[0].kind',
    'required (expected one of "operator", "agent", "policy_check", "human_gate", "wait", "map", "run")',
  ],
  ['a step that is not an object', planWith('a'), 'steps[0]', 'expected an object, received "a"'],
  [
    'operator step without operator',
    planWith({ id: 'a', kind: 'operator' }),
    'steps[0].operator',
    'required (expected a string)',
  ],
  [
    'agent field on an operator step',
    planWith(op('a', { mode: 'granular' })),
    'steps[0]',
    'unrecognized key "mode": only agent steps have it',
  ],
  [
    'misspelt step key',
    planWith(op('a'), op('b', { dependOn: ['a'] })),
    'steps[1]',
    'unrecognized key "dependOn" (did you mean "dependsOn"?)',
  ],
  [
    'agent step without agent',
    planWith({ id: 'a', kind: 'agent' }),
    'steps[0].agent',
    'required (expected a string)',
  ],
  [
    'bad agent mode',
    planWith({ id: 'a', kind: 'agent', agent: 'w', mode: 'turbo' }),
    'steps[0].mode',
    'expected one of "atomic", "granular", received "turbo"',
  ],
  [
    'maxTurns 0',
    planWith({ id: 'a', kind: 'agent', agent: 'w', maxTurns: 0 }),
    'steps[0].maxTurns',
    'must be at least 1, received 0',
  ],
  [
    'maxTurns above 10000',
    planWith({ id: 'a', kind: 'agent', agent: 'w', maxTurns: 10_001 }),
    'steps[0].maxTurns',
    'must be at most 10000, received 10001',
  ],
  [
    "map's run item without a plan",
    planWith(op('a'), {
      id: 'm',
      kind: 'map',
      over: 'a',
      dependsOn: ['a'],
      item: { kind: 'run', plan: '' },
    }),
    'steps[1].item.plan',
    'must not be empty',
  ],
  [
    'enforceIdempotency on an atomic agent step',
    planWith({ id: 'a', kind: 'agent', agent: 'w', enforceIdempotency: true }),
    'steps[0].enforceIdempotency',
    'only granular agent steps take the turn\'s idempotency key: set mode: "granular"',
  ],
  [
    'policy_check without policy',
    planWith({ id: 'a', kind: 'policy_check' }),
    'steps[0].policy',
    'required (expected a string)',
  ],
  [
    'retry.maxAttempts 0',
    planWith(op('a', { retry: { maxAttempts: 0 } })),
    'steps[0].retry.maxAttempts',
    'must be at least 1, received 0',
  ],
  [
    'retry.maxAttempts 1.5',
    planWith(op('a', { retry: { maxAttempts: 1.5 } })),
    'steps[0].retry.maxAttempts',
    'expected an integer, received 1.5',
  ],
  [
    'retry.maxAttempts 101',
    planWith(op('a', { retry: { maxAttempts: 101 } })),
    'steps[0].retry.maxAttempts',
    'must be at most 100, received 101',
  ],
  [
    'negative retry.initialDelayMs',
    planWith(op('a', { retry: { initialDelayMs: -5 } })),
    'steps[0].retry.initialDelayMs',
    'must be at least 0, received -5',
  ],
  [
    'retry.backoffCoefficient 0.5',
    planWith(op('a', { retry: { backoffCoefficient: 0.5 } })),
    'steps[0].retry.backoffCoefficient',
    'must be at least 1, received 0.5',
  ],
  [
    'retry.jitter 1.5',
    planWith(op('a', { retry: { jitter: 1.5 } })),
    'steps[0].retry.jitter',
    'must be at most 1, received 1.5',
  ],
  [
    'retry.maxDelayMs below initialDelayMs',
    planWith(op('a', { retry: { initialDelayMs: 1000, maxDelayMs: 500 } })),
    'steps[0].retry',
    'retry.maxDelayMs (500) is below retry.initialDelayMs (1000): raise maxDelayMs or lower initialDelayMs',
  ],
  [
    'retry.initialDelayMs above the inherited maxDelayMs',
    {
      name: 'p',
      defaults: { retry: { maxDelayMs: 2000 } },
      steps: [op('a', { retry: { initialDelayMs: 5000 } })],
    },
    'steps[0].retry',
    'retry.maxDelayMs (2000, from defaults.retry) is below retry.initialDelayMs (5000)',
  ],
  [
    'defaults.retry.maxDelayMs below the default initialDelayMs',
    { name: 'p', defaults: { retry: { maxDelayMs: 10 } }, steps: [op('a')] },
    'defaults.retry',
    'retry.maxDelayMs (10) is below retry.initialDelayMs (1000, the default)',
  ],
  [
    'unknown retry key',
    planWith(op('a', { retry: { attempts: 3 } })),
    'steps[0].retry',
    'unrecognized key "attempts" (allowed: maxAttempts, initialDelayMs, backoffCoefficient, maxDelayMs, jitter)',
  ],
  [
    'negative run budget',
    { name: 'p', budgets: { maxTokens: -1 }, steps: [op('a')] },
    'budgets.maxTokens',
    'must be greater than 0, received -1',
  ],
  [
    'zero run budget',
    { name: 'p', budgets: { maxSteps: 0 }, steps: [op('a')] },
    'budgets.maxSteps',
    'must be greater than 0, received 0',
  ],
  [
    'non-integer run budget',
    { name: 'p', budgets: { maxWallClockMs: 1.5 }, steps: [op('a')] },
    'budgets.maxWallClockMs',
    'expected an integer, received 1.5',
  ],
  [
    'zero step cost budget',
    planWith(op('a', { budgets: { maxCostUsd: 0 } })),
    'steps[0].budgets.maxCostUsd',
    'must be greater than 0, received 0',
  ],
  [
    'maxSteps in a step budget',
    planWith(op('a', { budgets: { maxSteps: 3 } })),
    'steps[0].budgets',
    'unrecognized key "maxSteps"',
  ],
  [
    'timeoutMs 0',
    planWith(op('a', { timeoutMs: 0 })),
    'steps[0].timeoutMs',
    'must be greater than 0, received 0',
  ],
  [
    'external cachePolicy without ttl',
    planWith(op('a', { cachePolicy: { class: 'external', provenance: 'api' } })),
    'steps[0].cachePolicy.ttlMs',
    'required (expected a number)',
  ],
  [
    'unknown cachePolicy class',
    planWith(op('a', { cachePolicy: { class: 'forever' } })),
    'steps[0].cachePolicy.class',
    'unknown class "forever": expected one of "none", "deterministic", "stable_nondeterministic", "external"',
  ],
  [
    'bad riskLevel',
    planWith(op('a', { riskLevel: 'extreme' })),
    'steps[0].riskLevel',
    'expected one of "low", "medium", "high", "critical", received "extreme"',
  ],
  [
    'bad effect class',
    planWith(op('a', { effects: ['network'] })),
    'steps[0].effects[0]',
    'expected one of "read_only", "local", "memory", "external", received "network"',
  ],
  [
    'duplicate idempotency key input',
    planWith(op('a', { idempotency: { keyInputs: ['to', 'to'] } })),
    'steps[0].idempotency.keyInputs[1]',
    'duplicate key input "to" (already listed at keyInputs[0])',
  ],
  [
    'empty approver',
    planWith(op('a', { gate: { approvers: [''] } })),
    'steps[0].gate.approvers[0]',
    'must not be empty',
  ],
  ['function in input', withInput({ fn: () => 1 }), 'steps[0].input.fn', 'function is not JSON'],
  [
    'BigInt in input',
    withInput({ n: 1n }),
    'steps[0].input.n',
    'BigInt is not JSON; pass it as a string',
  ],
  ['NaN in input', withInput({ n: NaN }), 'steps[0].input.n', 'NaN is not JSON'],
  [
    'Infinity in input',
    withInput({ n: [Infinity] }),
    'steps[0].input.n[0]',
    'Infinity is not JSON',
  ],
  [
    'Date in input',
    withInput({ when: new Date(0) }),
    'steps[0].input.when',
    'Date is not JSON; pass an ISO string (date.toISOString())',
  ],
  ['Map in input', withInput({ m: new Map() }), 'steps[0].input.m', 'Map is not JSON'],
  [
    'class instance in input',
    withInput({ p: new Point(1) }),
    'steps[0].input.p',
    'instance of class Point is not JSON',
  ],
  [
    'cycle in input',
    withInput(cyclicInput()),
    'steps[0].input.self',
    'cycle: this value contains itself (first seen at steps[0].input)',
  ],
  [
    'undefined in an input array',
    withInput({ list: [1, undefined] }),
    'steps[0].input.list[1]',
    'undefined inside an array is not JSON; use null',
  ],
  [
    'Date outside the input',
    { name: 'p', description: new Date(0), steps: [op('a')] },
    'description',
    'Date is not JSON',
  ],
];

describe('parsePlan: map items', () => {
  it("takes a map's run item naming a plan", () => {
    const plan = parsePlan(
      planWith(op('a'), {
        id: 'm',
        kind: 'map',
        over: 'a',
        dependsOn: ['a'],
        item: { kind: 'run', plan: 'child' },
      }),
    );
    const map = plan.steps[1]!;
    expect(map.kind === 'map' ? map.item : null).toEqual({ kind: 'run', plan: 'child' });
  });
});

describe('parsePlan: malformed plans', () => {
  it('has a corpus of at least 32 cases', () => {
    expect(corpus.length).toBeGreaterThanOrEqual(32);
  });

  it.each(corpus)('refuses %s', (_label, source, path, fragment) => {
    const error = refusal(source);
    expect(error.code).toBe('plan_invalid');
    expect(isFlujoError(error, 'plan_invalid')).toBe(true);
    expect(error.issues).toHaveLength(1);
    const issue = error.issues[0]!;
    expect(issue.path).toBe(path);
    expect(issue.message).toContain(fragment);
    expect(error.message).toContain(`${path === '' ? '(root)' : path}: ${fragment}`);
  });

  it('says a syntax error needs JSON text or an object', () => {
    const error = refusal('{"name": }');
    expect(error.issues).toHaveLength(1);
    expect(error.issues[0]!.message).toMatch(
      /^not valid JSON at line 1, column 10 \(position 9\): .+; the plan must be JSON text or an object$/,
    );
  });

  it('survives a JSON round trip of the error', () => {
    const error = refusal(planWith(op('a', { dependsOn: ['b'] })));
    const json = JSON.parse(JSON.stringify(error)) as { code: string; details: unknown };
    expect(json.code).toBe('plan_invalid');
    expect(json.details).toEqual({
      issues: [{ path: 'steps[0].dependsOn[0]', message: 'unknown step "b"' }],
    });
  });

  it('reports every problem of a plan in one error', () => {
    const error = refusal({
      name: '',
      extra: true,
      steps: [
        op('a', { mode: 'atomic', retry: { maxAttempts: 0 } }),
        { id: 'b', kind: 'tool' },
        op('a', { dependsOn: ['nope', 'c'] }),
        op('c', { dependsOn: ['d'], input: { when: new Date(0) } }),
        op('d', { dependsOn: ['c'], budgets: { maxTokens: 1.5 } }),
      ],
    });
    const lines = error.issues.map((i: ValidationIssue) => `${i.path}: ${i.message}`);
    expect(lines).toEqual([
      'steps[3].input.when: Date is not JSON; pass an ISO string (date.toISOString())',
      'name: must not be empty',
      'steps[0].retry.maxAttempts: must be at least 1, received 0',
      'steps[0]: unrecognized key "mode": only agent steps have it',
      'steps[1].kind: unknown kind "tool": expected one of "operator", "agent", "policy_check", "human_gate", "wait", "map", "run"',
      'steps[4].budgets.maxTokens: expected an integer, received 1.5',
      ': unrecognized key "extra" (allowed: schemaVersion, name, description, budgets, concurrency, defaults, steps)',
      'steps[2].id: duplicate step id "a" (first used by steps[0])',
      'steps[2].dependsOn[0]: unknown step "nope"',
      'steps[3].dependsOn: dependency cycle c → d → c (each step depends on the next; remove one of these dependencies)',
    ]);
    expect(error.message).toContain('Invalid plan (10 problems):');
  });

  it('reports one cycle per group of entangled steps, in plan order', () => {
    const error = refusal(
      planWith(
        op('p', { dependsOn: ['q'] }),
        op('q', { dependsOn: ['p'] }),
        op('a', { dependsOn: ['b'] }),
        op('b', { dependsOn: ['c', 'a'] }),
        op('c', { dependsOn: ['a'] }),
      ),
    );
    expect(error.issues).toEqual([
      {
        path: 'steps[0].dependsOn',
        message:
          'dependency cycle p → q → p (each step depends on the next; remove one of these dependencies)',
      },
      {
        path: 'steps[2].dependsOn',
        message:
          'dependency cycle a → b → a (each step depends on the next; remove one of these dependencies); also caught in cycles with them: c',
      },
    ]);
  });

  it('does not call a dependency unknown when some step id is unreadable', () => {
    const error = refusal(
      planWith({ id: 7, kind: 'operator', operator: 'x' }, op('b', { dependsOn: ['7'] })),
    );
    expect(error.issues).toEqual([
      { path: 'steps[0].id', message: 'expected a string, received 7' },
    ]);
  });
});

describe('retry policies', () => {
  it('resolves layers, most specific first', () => {
    expect(resolveRetryPolicy({ jitter: 0 }, { jitter: 0.5, maxAttempts: 7 })).toEqual({
      maxAttempts: 7,
      initialDelayMs: 1000,
      backoffCoefficient: 2,
      maxDelayMs: 300_000,
      jitter: 0,
    });
    expect(resolveRetryPolicy()).toEqual(DEFAULT_RETRY_POLICY);
  });

  it('retryPolicySchema resolves and checks the delay order', () => {
    expect(retryPolicySchema.parse({ maxAttempts: 2 })).toEqual({
      ...DEFAULT_RETRY_POLICY,
      maxAttempts: 2,
    });
    const result = retryPolicySchema.safeParse({ initialDelayMs: 1000, maxDelayMs: 500 });
    expect(result.error?.issues.map((i) => i.message)).toEqual([
      'retry.maxDelayMs (500) is below retry.initialDelayMs (1000): raise maxDelayMs or lower initialDelayMs',
    ]);
  });
});

describe('plan graph', () => {
  const plan = parsePlan(
    planWith(
      op('d', { dependsOn: ['b', 'c'] }),
      op('a'),
      op('c', { dependsOn: ['a'] }),
      op('b', { dependsOn: ['a'] }),
      op('e'),
    ),
  );

  it('lists dependents in plan order', () => {
    expect(dependentsOf(plan)).toEqual({ d: [], a: ['c', 'b'], c: ['d'], b: ['d'], e: [] });
  });

  it('orders steps after their dependencies, in plan order among free steps', () => {
    expect(topologicalOrder(plan)).toEqual(['a', 'c', 'b', 'd', 'e']);
  });

  it('keeps plan order when nothing depends on anything', () => {
    const flat = parsePlan(planWith(op('z'), op('y'), op('x')));
    expect(topologicalOrder(flat)).toEqual(['z', 'y', 'x']);
  });

  it('finds cycles deterministically and ignores unknown ids', () => {
    const deps: Record<string, string[]> = { a: ['b', 'zz'], b: ['a'], c: ['c'], d: [] };
    expect(findDependencyCycles(['d', 'c', 'b', 'a'], (id) => deps[id] ?? [])).toEqual([
      { cycle: ['c'], component: ['c'] },
      { cycle: ['b', 'a'], component: ['b', 'a'] },
    ]);
  });

  it('handles a long chain without overflowing the stack', () => {
    const steps = Array.from({ length: 1000 }, (_, i) =>
      op(`s${i}`, i === 0 ? {} : { dependsOn: [`s${i - 1}`] }),
    );
    const long = parsePlan(planWith(...steps.reverse()));
    expect(topologicalOrder(long)[999]).toBe('s999');
  });
});
