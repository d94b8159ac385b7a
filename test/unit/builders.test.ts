import { describe, expect, it } from 'vitest';
import { defineAgent } from '../../src/agents/define-agent.js';
import { PlanValidationError } from '../../src/errors.js';
import { AGENT_LOOP_DEFAULTS, Pipeline, Step, plan } from '../../src/plan/builders.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import { DEFAULT_RETRY_POLICY } from '../../src/plan/schema.js';

function refusal(build: () => unknown): PlanValidationError {
  try {
    build();
  } catch (error) {
    expect(error).toBeInstanceOf(PlanValidationError);
    return error as PlanValidationError;
  }
  throw new Error('expected the plan to be refused');
}

const researcher = defineAgent({
  name: 'researcher',
  model: 'gpt-4o-mini',
  provider: { baseURL: 'http://127.0.0.1:1/v1', apiKey: 'sk-test' },
  systemPrompt: 'You research.',
});

const loopDefaults = {
  maxTurns: 20,
  historyMaxTokens: 128_000,
  blobThresholdBytes: 20_000,
  enforceIdempotency: false,
};

describe('Step builders', () => {
  it('operator: the kind, id and operator, and only the options given', () => {
    expect(Step.operator('fetch', 'http.get')).toEqual({
      kind: 'operator',
      id: 'fetch',
      operator: 'http.get',
    });
    expect(
      Step.operator('fetch', 'http.get', {
        input: { url: 'https://example.com' },
        dependsOn: ['a'],
        effects: ['external'],
        policyTags: ['net'],
        riskLevel: 'medium',
        cachePolicy: { class: 'external', ttlMs: 1000, provenance: 'example.com' },
        idempotency: { keyInputs: ['url'] },
        gate: { approvers: ['ops'], reason: 'spends money' },
        retry: { maxAttempts: 5 },
        budgets: { maxToolCalls: 3 },
        timeoutMs: 5000,
        description: 'fetch the page',
      }),
    ).toEqual({
      kind: 'operator',
      id: 'fetch',
      operator: 'http.get',
      input: { url: 'https://example.com' },
      dependsOn: ['a'],
      effects: ['external'],
      policyTags: ['net'],
      riskLevel: 'medium',
      cachePolicy: { class: 'external', ttlMs: 1000, provenance: 'example.com' },
      idempotency: { keyInputs: ['url'] },
      gate: { approvers: ['ops'], reason: 'spends money' },
      retry: { maxAttempts: 5 },
      budgets: { maxToolCalls: 3 },
      timeoutMs: 5000,
      description: 'fetch the page',
    });
  });

  it('leaves out options given as undefined, so the schema defaults apply', () => {
    const step = Step.operator('a', 'noop', { description: undefined, riskLevel: undefined });
    expect(step).toEqual({ kind: 'operator', id: 'a', operator: 'noop' });
    expect(Object.keys(step)).toEqual(['kind', 'id', 'operator']);
  });

  it('copies the arrays it is given', () => {
    const dependsOn = ['a'];
    const step = Step.operator('b', 'noop', { dependsOn });
    dependsOn.push('c');
    expect(step.dependsOn).toEqual(['a']);
  });

  it('agent: atomic by default, the loop defaults written out', () => {
    expect(Step.agent('research', 'researcher', 'quantum computing')).toEqual({
      kind: 'agent',
      id: 'research',
      agent: 'researcher',
      input: 'quantum computing',
      mode: 'atomic',
      ...loopDefaults,
    });
    expect(Step.agent('research', 'researcher')).toEqual({
      kind: 'agent',
      id: 'research',
      agent: 'researcher',
      mode: 'atomic',
      ...loopDefaults,
    });
  });

  it('agent: given as a definition or as a name, the same step', () => {
    expect(Step.agent('r', researcher, 'q')).toEqual(Step.agent('r', 'researcher', 'q'));
    expect(Step.granular('r', researcher, 'q')).toEqual(Step.granular('r', 'researcher', 'q'));
    expect(Step.granular('r', researcher).agent).toBe('researcher');
  });

  it('granular: the issue defaults 20 / 128000 / 20000 / false', () => {
    expect(AGENT_LOOP_DEFAULTS).toEqual(loopDefaults);
    expect(Step.granular('research_granular', researcher, 'Research quantum computing')).toEqual({
      kind: 'agent',
      id: 'research_granular',
      agent: 'researcher',
      input: 'Research quantum computing',
      mode: 'granular',
      maxTurns: 20,
      historyMaxTokens: 128000,
      blobThresholdBytes: 20000,
      enforceIdempotency: false,
    });
  });

  it('granular: options override the defaults and carry the common fields', () => {
    expect(
      Step.granular(
        'g',
        'researcher',
        { topic: 'x' },
        {
          maxTurns: 5,
          historyMaxTokens: 4000,
          blobThresholdBytes: 100,
          enforceIdempotency: true,
          dependsOn: ['plan'],
          effects: ['external'],
          riskLevel: 'high',
          gate: {},
          timeoutMs: 60_000,
        },
      ),
    ).toEqual({
      kind: 'agent',
      id: 'g',
      agent: 'researcher',
      input: { topic: 'x' },
      mode: 'granular',
      maxTurns: 5,
      historyMaxTokens: 4000,
      blobThresholdBytes: 100,
      enforceIdempotency: true,
      dependsOn: ['plan'],
      effects: ['external'],
      riskLevel: 'high',
      gate: {},
      timeoutMs: 60_000,
    });
  });

  it('granular: a mode slipped in by a JavaScript caller does not win', () => {
    const options = { mode: 'atomic' } as object;
    expect(Step.granular('g', 'researcher', undefined, options).mode).toBe('granular');
  });

  it('agent: mode granular by option equals Step.granular', () => {
    expect(Step.agent('g', researcher, 'q', { mode: 'granular', maxTurns: 3 })).toEqual(
      Step.granular('g', researcher, 'q', { maxTurns: 3 }),
    );
  });

  it('gate and policy', () => {
    expect(Step.gate('approve')).toEqual({ kind: 'human_gate', id: 'approve' });
    expect(Step.gate('approve', { dependsOn: ['draft'], gate: { approvers: ['alice'] } })).toEqual({
      kind: 'human_gate',
      id: 'approve',
      dependsOn: ['draft'],
      gate: { approvers: ['alice'] },
    });
    expect(Step.policy('check', 'no_pii', { policyTags: ['pii'] })).toEqual({
      kind: 'policy_check',
      id: 'check',
      policy: 'no_pii',
      policyTags: ['pii'],
    });
  });

  it('each builder output is what parsePlan takes: same result as the literal plan', () => {
    const steps = [
      Step.operator('a', 'noop', { input: 1 }),
      Step.agent('b', researcher, 'q', { dependsOn: ['a'] }),
      Step.granular('c', 'researcher', undefined, { dependsOn: ['b'], maxTurns: 7 }),
      Step.policy('d', 'ok', { dependsOn: ['c'] }),
      Step.gate('e', { dependsOn: ['d'] }),
    ];
    const literal = {
      name: 'p',
      steps: [
        { kind: 'operator', id: 'a', operator: 'noop', input: 1 },
        { kind: 'agent', id: 'b', agent: 'researcher', input: 'q', dependsOn: ['a'] },
        {
          kind: 'agent',
          id: 'c',
          agent: 'researcher',
          mode: 'granular',
          dependsOn: ['b'],
          maxTurns: 7,
        },
        { kind: 'policy_check', id: 'd', policy: 'ok', dependsOn: ['c'] },
        { kind: 'human_gate', id: 'e', dependsOn: ['d'] },
      ],
    };
    expect(plan('p', steps)).toEqual(parsePlan(literal));
    expect(Pipeline.of('p', ...steps)).toEqual(parsePlan(literal));
  });
});

describe('plan and Pipeline', () => {
  it('plan: a parsed plan with defaults applied, budgets and defaults carried', () => {
    const built = plan('research', [Step.granular('r', researcher, 'q')], {
      budgets: { maxSteps: 10 },
      defaults: { retry: { maxAttempts: 5 } },
      description: 'one agent',
    });
    expect(built).toEqual({
      schemaVersion: 1,
      name: 'research',
      description: 'one agent',
      budgets: { maxSteps: 10 },
      defaults: { retry: { maxAttempts: 5 } },
      steps: [
        {
          kind: 'agent',
          id: 'r',
          agent: 'researcher',
          input: 'q',
          mode: 'granular',
          ...loopDefaults,
          degradedReplay: false,
          dependsOn: [],
          effects: [],
          policyTags: [],
          riskLevel: 'low',
          cachePolicy: { class: 'none' },
          idempotency: { keyInputs: [] },
          retry: { ...DEFAULT_RETRY_POLICY, maxAttempts: 5 },
        },
      ],
    });
  });

  it('plan and Pipeline.of never infer dependencies', () => {
    const steps = [Step.operator('a', 'noop'), Step.operator('b', 'noop')];
    expect(plan('p', steps).steps.map((s) => s.dependsOn)).toEqual([[], []]);
    expect(Pipeline.of('p', ...steps).steps.map((s) => s.dependsOn)).toEqual([[], []]);
  });

  it('Pipeline.line chains the steps without an explicit dependsOn', () => {
    const built = Pipeline.line(
      'line',
      Step.operator('a', 'noop'),
      Step.agent('b', researcher),
      Step.granular('c', researcher),
      Step.gate('d'),
      Step.operator('e', 'noop', { dependsOn: ['a'] }),
      Step.operator('f', 'noop', { dependsOn: [] }),
      Step.policy('g', 'ok'),
    );
    expect(Object.fromEntries(built.steps.map((s) => [s.id, s.dependsOn]))).toEqual({
      a: [],
      b: ['a'],
      c: ['b'],
      d: ['c'],
      e: ['a'],
      f: [],
      g: ['f'],
    });
  });

  it('Pipeline.chain returns new steps and leaves the given ones alone', () => {
    const a = Step.operator('a', 'noop');
    const b = Step.operator('b', 'noop');
    expect(Pipeline.chain([a, b])).toEqual([a, { ...b, dependsOn: ['a'] }]);
    expect(b).toEqual({ kind: 'operator', id: 'b', operator: 'noop' });
    const built = plan('p', Pipeline.chain([a, b]), { budgets: { maxSteps: 2 } });
    expect(built.steps[1]!.dependsOn).toEqual(['a']);
    expect(built.budgets).toEqual({ maxSteps: 2 });
  });

  it('a built plan round-trips through JSON', () => {
    const built = Pipeline.line(
      'round-trip',
      Step.operator('a', 'noop', { input: { n: [1, 'two', null, true] } }),
      Step.granular('b', researcher, 'q', { enforceIdempotency: true, retry: { jitter: 0 } }),
      Step.gate('c', { gate: { reason: 'check' } }),
    );
    const text = JSON.stringify(built);
    expect(JSON.parse(text)).toEqual(built);
    expect(parsePlan(text)).toEqual(built);
  });
});

describe('builder mistakes are refused by parsePlan, with the path', () => {
  it('maxTurns 0 → steps[0].maxTurns', () => {
    const error = refusal(() => plan('p', [Step.granular('g', researcher, 'q', { maxTurns: 0 })]));
    expect(error.issues).toEqual([
      { path: 'steps[0].maxTurns', message: expect.stringMatching(/at least 1/) as unknown },
    ]);
  });

  it('several mistakes, each with its path', () => {
    const error = refusal(() =>
      Pipeline.line(
        'p',
        Step.operator('a', ''),
        Step.agent('has space', researcher, 'q', { historyMaxTokens: 0 }),
        Step.operator('c', 'noop', { dependsOn: ['nope'] }),
      ),
    );
    const paths = error.issues.map((i) => i.path);
    expect(paths).toEqual(
      expect.arrayContaining([
        'steps[0].operator',
        'steps[1].id',
        'steps[1].historyMaxTokens',
        'steps[2].dependsOn[0]',
      ]),
    );
  });

  it('an empty agent name, an unknown option and no steps', () => {
    expect(refusal(() => plan('p', [Step.agent('a', '')])).issues[0]!.path).toBe('steps[0].agent');
    const typo = { riskLevl: 'high' } as object;
    const error = refusal(() => plan('p', [Step.operator('a', 'noop', typo)]));
    expect(error.issues[0]).toEqual({
      path: 'steps[0]',
      message: expect.stringMatching(/riskLevl.*did you mean "riskLevel"/) as unknown,
    });
    expect(refusal(() => Pipeline.of('p')).issues[0]!.path).toBe('steps');
  });

  it('an agent given as something without a name → steps[0].agent', () => {
    const error = refusal(() => plan('p', [Step.agent('a', {} as { name: string })]));
    expect(error.issues.map((i) => i.path)).toEqual(['steps[0].agent']);
  });
});
