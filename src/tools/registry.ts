/**
 * The tools a runtime knows, by the name the model calls them by. Names are unique: the model
 * cannot tell two tools of one name apart, so a second registration is a configuration error.
 */
import { ConfigurationError, UnknownToolError } from '../errors.js';
import type { ToolDefinition } from './define-tool.js';

/** Registered tools by name. */
export interface ToolRegistry {
  /** Adds a tool; throws `ConfigurationError` when its name is taken. */
  register(tool: ToolDefinition): void;
  /** The tool of this name; throws `UnknownToolError` listing the registered names. */
  get(name: string): ToolDefinition;
  /** True when a tool of this name is registered. */
  has(name: string): boolean;
  /** Every registered tool, in registration order. */
  list(): ToolDefinition[];
}

/** Creates a {@link ToolRegistry}, optionally with tools (each checked like `register`). */
export function createToolRegistry(tools: readonly ToolDefinition[] = []): ToolRegistry {
  const byName = new Map<string, ToolDefinition>();

  function register(tool: ToolDefinition): void {
    const existing = byName.get(tool.name);
    if (existing !== undefined) {
      throw new ConfigurationError(
        `tool "${tool.name}" is registered twice (${existing.identity} and ${tool.identity}): tool names must be unique; rename one of them`,
        { field: 'name' },
      );
    }
    byName.set(tool.name, tool);
  }

  for (const tool of tools) register(tool);

  return {
    register,
    get(name) {
      const tool = byName.get(name);
      if (tool === undefined) throw new UnknownToolError(name, [...byName.keys()].sort());
      return tool;
    },
    has: (name) => byName.has(name),
    list: () => [...byName.values()],
  };
}
