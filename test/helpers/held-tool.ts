import { z } from 'zod';
import { defineTool, type ToolDefinition } from '../../src/index.js';

/** A read-only tool with no arguments whose calls wait until `release()`, then return `'ok'`. */
export function heldTool(name: string): { tool: ToolDefinition; release: () => void } {
  let release!: () => void;
  const held = new Promise<void>((ok) => (release = ok));
  const tool = defineTool({
    name,
    input: z.object({}),
    class: 'read_only',
    run: async () => {
      await held;
      return 'ok';
    },
  });
  return { tool, release };
}
