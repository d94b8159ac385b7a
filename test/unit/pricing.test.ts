import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigurationError, PricingNotConfiguredError, isFlujoError } from '../../src/errors.js';
import {
  costMicroUsd,
  loadPricingFile,
  mergePricing,
  microUsdToUsd,
  parsePricing,
  priceFor,
  resolvePrice,
  type PricingTable,
} from '../../src/llm/pricing.js';
import { caught } from '../helpers/caught.js';

const SOURCE = 'createRuntime({ pricing })';
const mini = { inputPerMillion: 0.15, outputPerMillion: 0.6 };
const four = { inputPerMillion: 2.5, outputPerMillion: 10 };

const refusal = (value: unknown): ConfigurationError => {
  try {
    parsePricing(value, SOURCE);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigurationError);
    return e as ConfigurationError;
  }
  throw new Error('not refused');
};

describe('parsePricing', () => {
  it('returns a valid table as given', () => {
    const table = {
      models: {
        'gpt-4o': four,
        'gpt-4o-mini': mini,
        free: { inputPerMillion: 0, outputPerMillion: 0 },
      },
    };
    expect(parsePricing(table, SOURCE)).toEqual(table);
    expect(parsePricing({ models: {} }, SOURCE)).toEqual({ models: {} });
  });

  it.each([
    [
      { models: { 'gpt-4o': { inputPerMillion: -1, outputPerMillion: 10 } } },
      'models["gpt-4o"].inputPerMillion',
      'models["gpt-4o"].inputPerMillion: must be a number ≥ 0: the price in USD per million input tokens, e.g. 2.5',
    ],
    [
      { models: { 'gpt-4o': { inputPerMillion: 2.5, outputPerMillion: '10' } } },
      'models["gpt-4o"].outputPerMillion',
      'models["gpt-4o"].outputPerMillion: must be a number ≥ 0: the price in USD per million output tokens, e.g. 2.5',
    ],
    [
      { models: { 'gpt-4o': { outputPerMillion: 10 } } },
      'models["gpt-4o"].inputPerMillion',
      'models["gpt-4o"].inputPerMillion: missing: set it to the price in USD per million input tokens, e.g. 2.5',
    ],
    [
      { models: { gpt4: { inputPerMillion: Infinity, outputPerMillion: NaN } } },
      'models.gpt4.inputPerMillion',
      'models.gpt4.inputPerMillion: must be a number ≥ 0: the price in USD per million input tokens, e.g. 2.5; models.gpt4.outputPerMillion: must be a number ≥ 0: the price in USD per million output tokens, e.g. 2.5',
    ],
    [
      { models: { 'gpt-4o': { ...four, cachedPerMillion: 1 } }, currency: 'EUR' },
      'models["gpt-4o"]',
      'models["gpt-4o"]: unknown field "cachedPerMillion": use inputPerMillion, outputPerMillion; unknown field "currency": use models',
    ],
    [
      { models: { 'gpt-4o': 2.5 } },
      'models["gpt-4o"]',
      'models["gpt-4o"]: must be an object { inputPerMillion, outputPerMillion }',
    ],
    [{ models: { '': four } }, 'models[""]', 'models[""]: a model name must not be empty'],
    [
      {},
      'models',
      'models: missing: set models to an object of model name → { inputPerMillion, outputPerMillion }',
    ],
    [
      { models: [four] },
      'models',
      'models: must be an object of model name → { inputPerMillion, outputPerMillion }',
    ],
  ])('refuses %j, naming the field and the fix', (value, field, problems) => {
    const e = refusal(value);
    expect(e.message).toBe(`Invalid pricing in ${SOURCE}: ${problems}`);
    expect(e.field).toBe(field);
    expect(e.code).toBe('configuration_invalid');
  });

  it.each([null, [], 'gpt-4o', 3])('refuses %j at the root', (value) => {
    const e = refusal(value);
    expect(e.message).toBe(
      `Invalid pricing in ${SOURCE}: the pricing table must be an object { models: { "<model>": { inputPerMillion, outputPerMillion } } }`,
    );
    expect(e.field).toBeUndefined();
  });
});

describe('loadPricingFile', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'flujo-pricing-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('reads and checks a JSON table', async () => {
    const path = join(dir, 'ok.json');
    await writeFile(path, JSON.stringify({ models: { 'gpt-4o-mini': mini } }));
    expect(await loadPricingFile(path)).toEqual({ models: { 'gpt-4o-mini': mini } });
  });

  it('names the path and the fix for a missing file', async () => {
    const path = join(dir, 'absent.json');
    const e = await caught(loadPricingFile(path));
    expect(e).toBeInstanceOf(ConfigurationError);
    expect((e as ConfigurationError).message).toBe(
      `Pricing file ${path} not found: create it with {"models": {"<model>": {"inputPerMillion": 2.5, "outputPerMillion": 10}}}, or fix the path`,
    );
  });

  it('names the path and the error code for an unreadable file', async () => {
    const e = await caught(loadPricingFile(dir));
    expect((e as ConfigurationError).message).toBe(
      `Pricing file ${dir} could not be read (EISDIR): check that it is a readable file`,
    );
  });

  it('names the path for a file that is not JSON', async () => {
    const path = join(dir, 'broken.json');
    await writeFile(path, '{"models": {');
    const e = await caught(loadPricingFile(path));
    expect(e).toBeInstanceOf(ConfigurationError);
    expect((e as ConfigurationError).message).toMatch(
      new RegExp(
        `^Pricing file ${path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} is not JSON \\(.+\\): write it as \\{"models": `,
      ),
    );
  });

  it('names the file as the source of an invalid table', async () => {
    const path = join(dir, 'bad.json');
    await writeFile(
      path,
      '{"models": {"gpt-4o": {"inputPerMillion": -2, "outputPerMillion": 10}}}',
    );
    const e = await caught(loadPricingFile(path));
    expect((e as ConfigurationError).message).toBe(
      `Invalid pricing in pricing file ${path}: models["gpt-4o"].inputPerMillion: must be a number ≥ 0: the price in USD per million input tokens, e.g. 2.5`,
    );
    expect((e as ConfigurationError).field).toBe('models["gpt-4o"].inputPerMillion');
  });
});

describe('mergePricing', () => {
  it('later tables win per model, and the inputs are left alone', () => {
    const a: PricingTable = { models: { 'gpt-4o': four, 'gpt-4o-mini': mini } };
    const b: PricingTable = { models: { 'gpt-4o': { inputPerMillion: 5, outputPerMillion: 15 } } };
    expect(mergePricing(a, b)).toEqual({
      models: { 'gpt-4o': { inputPerMillion: 5, outputPerMillion: 15 }, 'gpt-4o-mini': mini },
    });
    expect(mergePricing(b, a).models['gpt-4o']).toBe(four);
    expect(a.models['gpt-4o']).toBe(four);
    expect(mergePricing()).toEqual({ models: {} });
  });
});

describe('priceFor', () => {
  const snapshot = { inputPerMillion: 5, outputPerMillion: 15 };
  const routed = { inputPerMillion: 3, outputPerMillion: 12 };
  const table: PricingTable = {
    models: {
      'gpt-4o': four,
      'gpt-4o-mini': mini,
      'gpt-4o-2024-05-13': snapshot,
      'gpt-4': { inputPerMillion: 30, outputPerMillion: 60 },
      'claude-3-5-sonnet': { inputPerMillion: 3, outputPerMillion: 15 },
      'openrouter/gpt-4o': routed,
    },
  };

  it.each([
    ['gpt-4o', four],
    ['gpt-4o-mini', mini],
    // A dated snapshot takes its family's price...
    ['gpt-4o-mini-2024-07-18', mini],
    ['gpt-4o-2024-08-06', four],
    ['gpt-4-0613', table.models['gpt-4']],
    ['claude-3-5-sonnet-20241022', table.models['claude-3-5-sonnet']],
    // ...unless it is priced under its own name.
    ['gpt-4o-2024-05-13', snapshot],
    // The provider prefix is dropped only when the full name has no price.
    ['openai/gpt-4o-mini', mini],
    ['openai/gpt-4o-mini-2024-07-18', mini],
    ['openrouter/gpt-4o', routed],
    ['openrouter/gpt-4o-2024-08-06', routed],
  ])('%s is priced', (model, price) => {
    expect(priceFor(table, model)).toBe(price);
  });

  it.each([
    // A variant is not a snapshot: gpt-4o's price is not gpt-4o-mini's.
    ['gpt-4o-audio-preview', { models: { 'gpt-4o': four } }],
    ['gpt-4o-mini', { models: { 'gpt-4o': four } }],
    ['gpt-4-turbo', table],
    ['gpt-4-1106-preview', table],
    ['gpt-4o-mini-2024-07', table],
    ['gpt', table],
    ['GPT-4o', table],
    ['toString', table],
    ['__proto__', table],
    ['openai/', table],
    ['', table],
  ])('%s has no price', (model, t) => {
    expect(priceFor(t, model)).toBeNull();
  });
});

describe('resolvePrice', () => {
  const table: PricingTable = { models: { 'gpt-4o': four } };

  it('returns the price, strict or not', () => {
    expect(resolvePrice(table, 'gpt-4o-2024-08-06', { strict: true })).toBe(four);
    expect(resolvePrice(table, 'gpt-4o', { strict: false })).toBe(four);
  });

  it('strict: an unpriced model throws, naming the model and the setting', () => {
    let thrown: unknown;
    try {
      resolvePrice(table, 'gpt-4o-mini', { strict: true });
    } catch (e) {
      thrown = e;
    }
    expect(thrown).toBeInstanceOf(PricingNotConfiguredError);
    expect(isFlujoError(thrown, 'pricing_not_configured')).toBe(true);
    expect((thrown as PricingNotConfiguredError).details).toEqual({
      model: 'gpt-4o-mini',
      setting: 'pricing.models["gpt-4o-mini"]',
    });
    expect((thrown as PricingNotConfiguredError).retryable).toBe(false);
  });

  it('not strict: an unpriced model has no price (costs 0)', () => {
    expect(resolvePrice(table, 'gpt-4o-mini', { strict: false })).toBeNull();
  });
});

describe('costMicroUsd', () => {
  it('is tokens × USD per million, in micro-dollars', () => {
    expect(costMicroUsd(four, { inputTokens: 1_000_000, outputTokens: 1_000_000 })).toBe(
      12_500_000,
    );
    expect(costMicroUsd(four, { inputTokens: 1000, outputTokens: 200 })).toBe(2500 + 2000);
    expect(costMicroUsd(mini, { inputTokens: 0, outputTokens: 0 })).toBe(0);
    expect(
      costMicroUsd(
        { inputPerMillion: 0, outputPerMillion: 0 },
        { inputTokens: 9, outputTokens: 9 },
      ),
    ).toBe(0);
  });

  it('rounds up once per call, not per side', () => {
    // 3 × 0.15 = 0.45 micro-dollars, charged as 1.
    expect(costMicroUsd(mini, { inputTokens: 3, outputTokens: 0 })).toBe(1);
    // 0.45 + 0.6 = 1.05 → 2; rounding each side up would charge 1 + 1.
    expect(costMicroUsd(mini, { inputTokens: 3, outputTokens: 1 })).toBe(2);
    // 10 × 0.15 = 1.5 → 2; 20 × 0.15 = 3 exactly, not rounded further.
    expect(costMicroUsd(mini, { inputTokens: 10, outputTokens: 0 })).toBe(2);
    expect(costMicroUsd(mini, { inputTokens: 20, outputTokens: 0 })).toBe(3);
  });

  it('does not round a whole number up because of float error', () => {
    // In floats 1.1 × 100 is 110.00000000000001, 0.1 × 30 is 3.0000000000000004, and
    // 1.001 × 1e6 is 1000999.9999999999.
    expect(
      costMicroUsd(
        { inputPerMillion: 1.1, outputPerMillion: 0 },
        { inputTokens: 100, outputTokens: 0 },
      ),
    ).toBe(110);
    expect(
      costMicroUsd(
        { inputPerMillion: 0, outputPerMillion: 0.1 },
        { inputTokens: 0, outputTokens: 30 },
      ),
    ).toBe(3);
    expect(
      costMicroUsd(
        { inputPerMillion: 0.07, outputPerMillion: 0.29 },
        { inputTokens: 100, outputTokens: 100 },
      ),
    ).toBe(36);
    expect(
      costMicroUsd(
        { inputPerMillion: 1.001, outputPerMillion: 0 },
        { inputTokens: 1000, outputTokens: 0 },
      ),
    ).toBe(1001);
    // Prices finer than 6 decimals are rounded: 0.0000004 per million is 0.
    expect(
      costMicroUsd(
        { inputPerMillion: 0.0000004, outputPerMillion: 0 },
        { inputTokens: 1_000_000, outputTokens: 0 },
      ),
    ).toBe(0);
  });

  it('stays exact past 2^53 picodollars', () => {
    expect(
      costMicroUsd(
        { inputPerMillion: 150, outputPerMillion: 600 },
        { inputTokens: 2 ** 40, outputTokens: 1 },
      ),
    ).toBe(150 * 2 ** 40 + 600);
  });

  it.each([
    { inputTokens: -1, outputTokens: 0 },
    { inputTokens: 1.5, outputTokens: 0 },
    { inputTokens: 0, outputTokens: Number.NaN },
  ])('refuses a token count that is not a non-negative integer: %j', (usage) => {
    expect(() => costMicroUsd(mini, usage)).toThrow(
      /^INVARIANT: (input|output)Tokens must be a non-negative integer/,
    );
  });

  it('microUsdToUsd divides by a million', () => {
    expect(microUsdToUsd(12_500_000)).toBe(12.5);
    expect(microUsdToUsd(1)).toBe(0.000001);
    expect(microUsdToUsd(0)).toBe(0);
  });
});
