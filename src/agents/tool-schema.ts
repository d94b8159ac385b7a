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
 * The JSON Schema (draft 2020-12, without `$schema`) of the arguments `tool` accepts. Throws
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
