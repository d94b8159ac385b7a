import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineAgent, type AgentSpec } from '../../src/agents/define-agent.js';
import {
  FINGERPRINT_FIELDS,
  agentFingerprint,
  assertSameFingerprint,
  compareFingerprints,
  type FingerprintParts,
} from '../../src/agents/fingerprint.js';
import { toolParametersSchema } from '../../src/agents/tool-schema.js';
import { ConfigurationError, InputValidationError, ResumeError } from '../../src/errors.js';
import { defineTool } from '../../src/tools/define-tool.js';

const search = defineTool({
  name: 'search',
  description: 'Searches the corpus',
  input: z.object({ q: z.string(), limit: z.number().int().optional() }),
  class: 'read_only',
  run: () => [],
});
const notes = defineTool({
  name: 'write_note',
  input: z.object({ text: z.string() }),
  requiresIdempotencyKey: true,
  run: () => null,
});

const spec: AgentSpec = {
  name: 'researcher',
  model: 'gpt-x',
  provider: { baseURL: 'http://127.0.0.1:9/v1/', apiKey: 'sk-secret-key' },
  systemPrompt: 'Research.',
  tools: [search, notes],
  settings: { temperature: 0, maxTokens: 200, seed: 7 },
};

const refusal = (s: unknown): ConfigurationError => {
  try {
    defineAgent(s as AgentSpec);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigurationError);
    return e as ConfigurationError;
  }
  throw new Error('not refused');
};

describe('defineAgent', () => {
  it('returns a frozen definition with defaults, the key out of sight', () => {
    const agent = defineAgent(spec);
    expect(agent).toMatchObject({ name: 'researcher', timeoutMs: 60_000, stream: false });
    expect(agent.provider.baseURL).toBe('http://127.0.0.1:9/v1');
    expect(agent.provider.apiKey).toBe('sk-secret-key');
    expect(Object.isFrozen(agent) && Object.isFrozen(agent.provider)).toBe(true);
    expect(Object.isFrozen(agent.tools) && Object.isFrozen(agent.settings)).toBe(true);
    expect(JSON.stringify(agent)).not.toContain('sk-secret');
    expect(JSON.stringify({ ...agent.provider })).toBe('{"baseURL":"http://127.0.0.1:9/v1"}');
    const fn = defineAgent({
      ...spec,
      provider: { baseURL: 'https://x.test/v1', apiKey: () => 'k' },
      stream: true,
      timeoutMs: 5,
    });
    expect([typeof fn.provider.apiKey, fn.stream, fn.timeoutMs]).toEqual(['function', true, 5]);
  });

  it.each([
    [
      { ...spec, provider: { apiKey: 'k' } },
      'provider.baseURL',
      "set provider.baseURL (e.g. https://api.openai.com/v1 or the scripted server's url)",
    ],
    [
      { ...spec, provider: { baseURL: 'localhost:8080' } },
      'provider.baseURL',
      'must be an http or https URL',
    ],
    [{ ...spec, provider: { baseURL: 'nope' } }, 'provider.baseURL', 'is not a URL'],
    [
      { ...spec, provider: { baseURL: 'https://u:p@x.test' } },
      'provider.baseURL',
      'must not carry credentials',
    ],
    [{ ...spec, provider: undefined }, 'provider', 'set provider: { baseURL, apiKey }'],
    [{ ...spec, model: ' ' }, 'model', "set model to the provider's model name"],
    [{ ...spec, model: undefined }, 'model', "set model to the provider's model name"],
    [{ ...spec, name: 'a b' }, 'name', 'agent name "a b" is invalid'],
    [{ ...spec, systemPrompt: 3 }, 'systemPrompt', 'systemPrompt must be a string'],
    [{ ...spec, settings: { temperature: 3 } }, 'settings.temperature', 'from 0 to 2'],
    [{ ...spec, settings: { maxTokens: 1.5 } }, 'settings.maxTokens', 'positive integer'],
    [{ ...spec, settings: { topP: 0 } }, 'settings.topP', 'above 0 and at most 1'],
    [
      { ...spec, settings: { max_tokens: 5 } },
      'settings',
      'unknown option "max_tokens" in settings: use temperature, maxTokens, seed, topP',
    ],
    [{ ...spec, timeout: 5 }, 'spec', 'unknown option "timeout": use name, model'],
    [{ ...spec, timeoutMs: -1 }, 'timeoutMs', 'positive integer'],
    [{ ...spec, stream: 'yes' }, 'stream', 'stream must be true or false'],
    [{ ...spec, tools: [{}] }, 'tools[0]', 'defineTool'],
    [{ ...spec, tools: [search, search] }, 'tools[1].name', 'two tools are named "search"'],
    [null, 'spec', 'defineAgent needs an object'],
  ])('refuses %#: %s', (bad, field, text) => {
    const e = refusal(bad);
    expect(e.field).toBe(field);
    expect(e.message).toContain(text);
  });

  it('never echoes an invalid API key', () => {
    const e = refusal({ ...spec, provider: { baseURL: 'https://x.test', apiKey: 12345678 } });
    expect([e.field, e.message]).toEqual([
      'provider.apiKey',
      'Invalid agent "researcher": provider.apiKey must be a string or a function that returns one (or leave it out to read OPENAI_API_KEY)',
    ]);
  });

  it('refuses a tool a model cannot be shown', () => {
    const when = defineTool({
      name: 'when',
      input: z.object({ at: z.date() }),
      class: 'read_only',
      run: () => 1,
    });
    expect(refusal({ ...spec, tools: [when] }).message).toMatch(
      /tool "when" has an input schema a model cannot be shown/,
    );
    const scalar = defineTool({
      name: 'scalar',
      input: z.string(),
      class: 'read_only',
      run: () => 1,
    });
    const e = refusal({ ...spec, tools: [scalar] });
    expect([e.field, e.message]).toEqual([
      'tools[0].input',
      'Invalid agent "researcher": tool "scalar" takes a string but models call tools with an object of arguments: make its input a z.object({ ... })',
    ]);
  });

  it('shows tools to the model as JSON Schema without $schema', () => {
    expect(toolParametersSchema(search)).toMatchObject({
      type: 'object',
      properties: { q: { type: 'string' }, limit: { type: 'integer' } },
      required: ['q'],
    });
    expect(toolParametersSchema(search)).not.toHaveProperty('$schema');
    expect(Object.isFrozen(toolParametersSchema(search))).toBe(true);
  });
});

describe('agentFingerprint', () => {
  const parts: FingerprintParts = {
    input: { topic: 'redis', depth: 2, tags: ['a', 'é', '😀'] },
    systemPrompt: 'Research.',
    model: 'gpt-x',
    provider: { baseURL: 'http://127.0.0.1:9/v1' },
    tools: [search, notes],
    settings: { temperature: 0, maxTokens: 200 },
    toggles: { enforceIdempotency: false, blobThresholdBytes: 20_000, historyMaxTokens: 128_000 },
    mode: 'granular',
  };
  const fp = agentFingerprint(parts);

  it('is stable: same parts, any key or tool order, same hash; JSON-safe', () => {
    expect(fp.hash).toMatch(/^[0-9a-f]{64}$/);
    expect(Object.keys(fp.parts)).toEqual([...FINGERPRINT_FIELDS]);
    const reordered: FingerprintParts = {
      mode: 'granular',
      toggles: { historyMaxTokens: 128_000, blobThresholdBytes: 20_000, enforceIdempotency: false },
      settings: { maxTokens: 200, temperature: 0 },
      tools: [notes, search],
      provider: { baseURL: 'http://127.0.0.1:9/v1' },
      model: 'gpt-x',
      systemPrompt: 'Research.',
      input: { tags: ['a', 'é', '😀'], depth: 2, topic: 'redis' },
    };
    expect(agentFingerprint(reordered)).toEqual(fp);
    expect(JSON.parse(JSON.stringify(fp))).toEqual(fp);
    expect(compareFingerprints(fp, agentFingerprint(reordered))).toBeNull();
    expect(() => assertSameFingerprint(fp, agentFingerprint(parts))).not.toThrow();
  });

  const changed = (over: Partial<FingerprintParts>) => agentFingerprint({ ...parts, ...over });
  const renamed = defineTool({
    name: 'find',
    input: search.input,
    class: 'read_only',
    run: () => [],
  });
  const reschemed = defineTool({
    name: 'search',
    input: z.object({ q: z.string() }),
    class: 'read_only',
    run: () => [],
  });
  it.each([
    ['tools', { tools: [renamed, notes] }],
    ['tools', { tools: [reschemed, notes] }],
    ['tools', { tools: [search] }],
    ['systemPrompt', { systemPrompt: 'Research carefully.' }],
    ['model', { model: 'gpt-y' }],
    ['settings', { settings: { temperature: 0.1, maxTokens: 200 } }],
    ['settings', { settings: { temperature: 0, maxTokens: 200, seed: 1 } }],
    ['input', { input: { topic: 'redis', depth: 3, tags: ['a', 'é', '😀'] } }],
    ['provider', { provider: { baseURL: 'https://api.openai.com/v1' } }],
    ['pricing', { pricingPlan: { inputPerMTok: 1 } }],
    ['policyVersion', { policyVersion: '2' }],
    ['toggles', { toggles: { ...parts.toggles, enforceIdempotency: true } }],
    ['toggles', { toggles: { ...parts.toggles, blobThresholdBytes: 1 } }],
    ['mode', { mode: 'atomic' as const }],
  ] as const)('a change to %s is named', (field, over) => {
    const current = changed(over);
    expect(current.hash).not.toBe(fp.hash);
    expect(compareFingerprints(fp, current)).toEqual({ field });
    let thrown: unknown;
    try {
      assertSameFingerprint(fp, current, { runId: 'r1', stepId: 's1' });
    } catch (e) {
      thrown = e;
    }
    expect(thrown).toBeInstanceOf(ResumeError);
    expect(thrown).toMatchObject({ field, recoverable: false, retryable: false, runId: 'r1' });
  });

  it('names the first changed field in a fixed order', () => {
    expect(
      compareFingerprints(fp, changed({ model: 'y', systemPrompt: 'z', mode: 'atomic' })),
    ).toEqual({ field: 'systemPrompt' });
  });

  it('the API key never affects it', () => {
    const a = defineAgent({ ...spec, provider: { baseURL: spec.provider.baseURL, apiKey: 'one' } });
    const b = defineAgent({
      ...spec,
      provider: { baseURL: spec.provider.baseURL, apiKey: () => 'two' },
    });
    const of = (agent: typeof a) => agentFingerprint({ ...parts, provider: agent.provider });
    expect(of(a)).toEqual(of(b));
    expect(of(a).hash).toBe(fp.hash);
  });

  it('refuses input that is not JSON, naming the place', () => {
    expect(() => agentFingerprint({ ...parts, input: { at: new Date(0) } })).toThrow(
      InputValidationError,
    );
    expect(() => agentFingerprint({ ...parts, input: { n: Number.NaN } })).toThrow(
      /input\.n: NaN is not JSON/,
    );
    expect(() => agentFingerprint({ ...parts, settings: { temperature: Number.NaN } })).toThrow(
      InputValidationError,
    );
  });
});
