/**
 * Model prices and the cost of a call. Prices are configured per model in USD per million input and
 * output tokens; costs are computed in integer micro-dollars so that sums over many calls stay
 * exact. Nothing here guesses a price: a model missing from the table has none.
 */
import { readFile } from 'node:fs/promises';
import { z } from 'zod';
import { ConfigurationError, InvariantError, PricingNotConfiguredError } from '../errors.js';
import { formatPath } from '../internal/json.js';
import { stripProviderPrefix } from './model-name.js';

/** The price of one model, in USD per million tokens. */
export interface ModelPrice {
  readonly inputPerMillion: number;
  readonly outputPerMillion: number;
}

/** Prices by model name. */
export interface PricingTable {
  readonly models: Readonly<Record<string, ModelPrice>>;
}

/** Tokens of one call. */
export interface TokenUsage {
  inputTokens: number;
  outputTokens: number;
}

const HOW = '{ inputPerMillion, outputPerMillion }';

/** `error` for a field: `missing` when it is absent, `invalid` otherwise. */
function says(
  missing: string,
  invalid: string = missing,
): { error: (iss: { input?: unknown }) => string } {
  return { error: (iss) => (iss.input === undefined ? missing : invalid) };
}

function perMillion(which: 'input' | 'output'): z.ZodNumber {
  const fix = `the price in USD per million ${which} tokens, e.g. 2.5`;
  return z
    .number(says(`missing: set it to ${fix}`, `must be a number ≥ 0: ${fix}`))
    .min(0, { error: `must be a number ≥ 0: ${fix}` });
}

const modelPriceSchema = z.strictObject(
  { inputPerMillion: perMillion('input'), outputPerMillion: perMillion('output') },
  { error: `must be an object ${HOW}` },
);

/** A pricing table: `{ models: { [model]: { inputPerMillion, outputPerMillion } } }`, strict. */
export const pricingTableSchema = z.strictObject(
  {
    models: z.record(
      z.string().min(1, { error: 'a model name must not be empty' }),
      modelPriceSchema,
      says(
        `missing: set models to an object of model name → ${HOW}`,
        `must be an object of model name → ${HOW}`,
      ),
    ),
  },
  { error: `the pricing table must be an object { models: { "<model>": ${HOW} } }` },
);

function issueText(issue: z.core.$ZodIssue): string {
  const where = formatPath('', issue.path);
  const prefix = where === '' ? '' : `${where}: `;
  if (issue.code === 'unrecognized_keys') {
    const known = issue.path.length === 0 ? 'models' : 'inputPerMillion, outputPerMillion';
    const keys = issue.keys.map((k) => JSON.stringify(k)).join(', ');
    return `${prefix}unknown field${issue.keys.length === 1 ? '' : 's'} ${keys}: use ${known}`;
  }
  if (issue.code === 'invalid_key') {
    const inner = issue.issues[0]?.message ?? 'invalid model name';
    return `${prefix}${inner}`;
  }
  return `${prefix}${issue.message}`;
}

/**
 * Checks a pricing table, or throws `ConfigurationError` naming `source` (where the table came
 * from, e.g. `createRuntime({ pricing })`), each bad field and its fix.
 */
export function parsePricing(value: unknown, source: string): PricingTable {
  const parsed = pricingTableSchema.safeParse(value);
  if (parsed.success) return parsed.data;
  const { issues } = parsed.error;
  const first = issues[0];
  const field = first === undefined ? '' : formatPath('', first.path);
  throw new ConfigurationError(
    `Invalid pricing in ${source}: ${issues.map(issueText).join('; ')}`,
    field === '' ? {} : { field },
  );
}

/**
 * Reads a pricing table from a JSON file. A missing, unreadable or non-JSON file, or an invalid
 * table, throws `ConfigurationError` naming the path and what to do.
 */
export async function loadPricingFile(path: string): Promise<PricingTable> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    throw new ConfigurationError(
      code === 'ENOENT'
        ? `Pricing file ${path} not found: create it with {"models": {"<model>": {"inputPerMillion": 2.5, "outputPerMillion": 10}}}, or fix the path`
        : `Pricing file ${path} could not be read (${typeof code === 'string' ? code : 'error'}): check that it is a readable file`,
      { cause: error },
    );
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new ConfigurationError(
      `Pricing file ${path} is not JSON (${(error as Error).message}): write it as {"models": {"<model>": {"inputPerMillion": 2.5, "outputPerMillion": 10}}}`,
      { cause: error },
    );
  }
  return parsePricing(value, `pricing file ${path}`);
}

/** One table of all prices; for a model priced in several tables, the later table wins. */
export function mergePricing(...tables: readonly PricingTable[]): PricingTable {
  const models: Record<string, ModelPrice> = {};
  for (const table of tables) Object.assign(models, table.models);
  return { models };
}

// A dated snapshot: -2024-07-18 (OpenAI), -20241022 (Anthropic), -0613 (older OpenAI, MMDD).
const SNAPSHOT = /^(.+)-(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{4})$/;

function lookup(models: PricingTable['models'], name: string): ModelPrice | null {
  if (Object.hasOwn(models, name)) return models[name] ?? null;
  const base = SNAPSHOT.exec(name)?.[1];
  return base !== undefined && Object.hasOwn(models, base) ? (models[base] ?? null) : null;
}

/**
 * The price of a model, or null when the table has none. Tried in order: the name exactly; the
 * name without a dated snapshot suffix (`gpt-4o-mini-2024-07-18` → `gpt-4o-mini`); then both
 * again without the provider prefix (`openai/gpt-4o` → `gpt-4o`). Only a date is dropped, never a
 * variant: `gpt-4o` does not price `gpt-4o-mini`, whose price differs. A snapshot priced apart
 * from its family is configured under its full name, which wins.
 */
export function priceFor(table: PricingTable, model: string): ModelPrice | null {
  const price = lookup(table.models, model);
  if (price !== null) return price;
  const bare = stripProviderPrefix(model);
  return bare === model ? null : lookup(table.models, bare);
}

/**
 * The price of a model under the pricing mode: with `strict`, a model without a price throws
 * `PricingNotConfiguredError`; without it, the price is null and the call costs 0.
 */
export function resolvePrice(
  table: PricingTable,
  model: string,
  options: { strict: boolean },
): ModelPrice | null {
  const price = priceFor(table, model);
  if (price === null && options.strict) throw new PricingNotConfiguredError(model);
  return price;
}

const PICO_PER_MICRO = 1_000_000n;

/** USD per million tokens as integer picodollars per token: prices are kept to 6 decimals. */
function picoPerToken(perMillion: number): bigint {
  // Rounded: 1.001 * 1e6 is 1000999.9999999999 in floats.
  return BigInt(Math.round(perMillion * 1e6));
}

function tokenCount(name: string, n: number): bigint {
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new InvariantError(`${name} must be a non-negative integer, got ${n}`);
  }
  return BigInt(n);
}

/**
 * The cost of one call in micro-dollars (1e-6 USD): tokens × USD per million tokens is the cost in
 * micro-dollars, computed exactly (prices to 6 decimals) and rounded up once per call, never
 * down: 3 input tokens at 0.15 per million cost 0.45 micro-dollars, charged as 1.
 */
export function costMicroUsd(price: ModelPrice, usage: TokenUsage): number {
  const pico =
    tokenCount('inputTokens', usage.inputTokens) * picoPerToken(price.inputPerMillion) +
    tokenCount('outputTokens', usage.outputTokens) * picoPerToken(price.outputPerMillion);
  return Number((pico + PICO_PER_MICRO - 1n) / PICO_PER_MICRO);
}

/** Micro-dollars to dollars, for display. */
export function microUsdToUsd(microUsd: number): number {
  return microUsd / 1_000_000;
}
