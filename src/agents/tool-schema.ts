/**
 * The JSON Schema of a tool's arguments: what the model is shown as the function's `parameters`,
 * and what the fingerprint hashes. Computed once per zod schema.
 */
import { z } from 'zod';
import { ConfigurationError } from '../errors.js';
import type { JsonObject } from '../internal/json.js';
import type { ToolDefinition } from '../tools/define-tool.js';

const cache = new WeakMap<object, JsonObject>();

/**
 * The argument in which a tool that must take an agent turn's idempotency key receives it. The
 * runtime fills it in, so the model is not shown it.
 */
export const IDEMPOTENCY_KEY_ARG = 'idempotency_key';

/**
 * The JSON Schema (draft 2020-12, without `$schema`) of the arguments `tool` accepts, less the
 * `idempotency_key` the runtime fills in. Throws
 * `ConfigurationError` when the input is not an object schema or cannot be expressed in JSON Schema
 * (a model can only send JSON objects as arguments).
 */
export function toolParametersSchema(tool: Pick<ToolDefinition, 'name' | 'input'>): JsonObject {
  const cached = cache.get(tool.input);
  if (cached !== undefined) return cached;
  let schema: Record<string, unknown>;
  try {
    schema = z.toJSONSchema(tool.input, { io: 'input' });
  } catch (error) {
    throw new ConfigurationError(
      `tool "${tool.name}" has an input schema a model cannot be shown (${error instanceof Error ? error.message : String(error)}): use JSON types only (strings for dates, arrays for sets)`,
      { field: 'tools', cause: error },
    );
  }
  const type = schema['type'];
  if (type !== 'object') {
    throw new ConfigurationError(
      `tool "${tool.name}" takes ${typeof type === 'string' ? `a ${type}` : 'a value'} but models call tools with an object of arguments: make its input a z.object({ ... })`,
      { field: 'tools' },
    );
  }
  const { $schema: _ignored, ...rest } = schema;
  const properties = rest['properties'];
  if (typeof properties === 'object' && properties !== null && IDEMPOTENCY_KEY_ARG in properties) {
    const { [IDEMPOTENCY_KEY_ARG]: _key, ...shown } = properties as Record<string, unknown>;
    rest['properties'] = shown;
    if (Array.isArray(rest['required'])) {
      rest['required'] = (rest['required'] as unknown[]).filter((r) => r !== IDEMPOTENCY_KEY_ARG);
    }
  }
  // Shared between every agent and request that uses the tool: nobody may change it.
  const parameters = deepFreeze(rest) as JsonObject;
  cache.set(tool.input, parameters);
  return parameters;
}

function deepFreeze<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value)) {
    for (const child of Object.values(value)) deepFreeze(child);
    Object.freeze(value);
  }
  return value;
}
