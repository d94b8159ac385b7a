import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigurationError, ToolInputError, UnknownToolError } from '../../src/errors.js';
import {
  defineTool,
  parseToolArgs,
  parseToolOutput,
  type ToolSpec,
} from '../../src/tools/define-tool.js';
import { createToolRegistry } from '../../src/tools/registry.js';

const input = z.object({ to: z.email(), subject: z.string().default('(none)') });
const base = { name: 'send_email', input, requiresIdempotencyKey: true, run: () => ({ ok: true }) };

function refusal(spec: unknown): ConfigurationError {
  try {
    defineTool(spec as ToolSpec);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigurationError);
    return e as ConfigurationError;
  }
  throw new Error('expected a ConfigurationError');
}

describe('defineTool', () => {
  it('builds a frozen definition with identity, class and defaults', () => {
    const tool = defineTool(base);
    expect(tool).toMatchObject({
      name: 'send_email',
      version: '1',
      identity: 'send_email@1',
      class: 'external',
      idempotent: false,
      requiresIdempotencyKey: true,
      namespace: undefined,
    });
    expect(Object.isFrozen(tool)).toBe(true);
    const mcp = defineTool({ ...base, name: 'upload_to_composio', namespace: 'mcp', version: '2' });
    expect(mcp.identity).toBe('mcp/upload_to_composio@2');
    expect(defineTool({ ...base, name: 'mcp:upload_to_composio' }).identity).toBe(
      'mcp:upload_to_composio@1',
    );
  });

  it('refuses a side-effecting tool that does not say whether it takes an idempotency key', () => {
    const { requiresIdempotencyKey: _, ...silent } = base;
    const e = refusal(silent);
    expect(e.message).toBe(
      'tool "send_email" has side effects (class external) but does not say whether it accepts an idempotency key: set requiresIdempotencyKey: true (it honours ctx.idempotencyKey) or idempotent: false explicitly',
    );
    expect(e.field).toBe('requiresIdempotencyKey');
    expect(refusal({ ...silent, name: 'write_local_file' }).message).toContain('(class local)');
    expect(refusal({ ...silent, name: 'COMPOSIO_SEARCH_WEB', class: 'memory' }).message).toContain(
      '(class memory)',
    );
    // Present and false is an answer; read-only tools need none.
    expect(defineTool({ ...silent, idempotent: false }).idempotent).toBe(false);
    expect(defineTool({ ...silent, requiresIdempotencyKey: false }).requiresIdempotencyKey).toBe(
      false,
    );
    expect(defineTool({ ...silent, name: 'COMPOSIO_SEARCH_WEB' }).class).toBe('read_only');
    expect(defineTool({ ...silent, metadata: { annotations: { readOnlyHint: true } } }).class).toBe(
      'read_only',
    );
  });

  it('refuses bad fields, naming the field and the fix', () => {
    expect(refusal({ ...base, name: 'has space' }).message).toBe(
      'tool name "has space" is invalid: use 1 to 128 letters, digits, "_", ".", ":" or "-" (e.g. "send_email" or "mcp:upload_to_composio")',
    );
    expect(refusal({ ...base, name: 'x'.repeat(129) }).field).toBe('name');
    expect(refusal({ ...base, namespace: 'a b' }).field).toBe('namespace');
    expect(refusal({ ...base, version: 'v@2' }).message).toBe(
      'tool "send_email" has an invalid version "v@2": use 1 to 64 characters without spaces, "@" or "/" (e.g. "2")',
    );
    expect(refusal({ ...base, input: { type: 'object' } }).message).toBe(
      'tool "send_email" needs a zod schema as input, e.g. input: z.object({ ... })',
    );
    expect(refusal({ ...base, output: 42 }).field).toBe('output');
    expect(refusal({ ...base, run: undefined }).field).toBe('run');
    expect(refusal({ ...base, class: 'network' }).message).toBe(
      'tool "send_email" has an invalid class "network": use one of read_only, local, memory, external',
    );
    expect(refusal({ ...base, riskLevel: 'extreme' }).field).toBe('riskLevel');
    expect(refusal({ ...base, idempotent: 'yes' }).message).toBe(
      'idempotent must be true or false, got string',
    );
    expect(refusal({ ...base, metadata: [] }).field).toBe('metadata');
    expect(refusal(null).field).toBe('spec');
  });

  it('parses arguments with paths like args.to and applies defaults', async () => {
    const tool = defineTool(base);
    await expect(parseToolArgs(tool, { to: 'a@b.co' })).resolves.toEqual({
      to: 'a@b.co',
      subject: '(none)',
    });
    const e = await parseToolArgs(tool, { to: 'nope' }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ToolInputError);
    expect((e as ToolInputError).issues).toEqual([
      { path: 'args.to', message: 'Invalid email address' },
    ]);
    expect((e as ToolInputError).message).toBe(
      'Invalid arguments for tool "send_email@1" (1 problem):\n  - args.to: Invalid email address',
    );
    const dated = defineTool({ ...base, input: z.object({ at: z.coerce.date() }) });
    await expect(parseToolArgs(dated, { at: '2020-01-01' })).rejects.toThrow(
      /args\.at: Date is not JSON/,
    );
  });

  it('parses output into a JSON receipt', async () => {
    const tool = defineTool({ ...base, output: z.object({ id: z.string() }) });
    await expect(parseToolOutput(tool, { id: 'm1', extra: 1 })).resolves.toEqual({ id: 'm1' });
    await expect(parseToolOutput(tool, { id: 1 })).rejects.toThrow(/output\.id/);
    await expect(parseToolOutput(defineTool(base), undefined)).resolves.toBeNull();
    await expect(parseToolOutput(defineTool(base), new Map())).rejects.toThrow(/Map is not JSON/);
  });
});

describe('tool registry', () => {
  const a = defineTool({ ...base, name: 'a' });
  const b = defineTool({ ...base, name: 'b' });

  it('registers, lists in order and gets by name', () => {
    const registry = createToolRegistry([b]);
    registry.register(a);
    expect(registry.list().map((t) => t.name)).toEqual(['b', 'a']);
    expect(registry.get('a')).toBe(a);
    expect(registry.has('a')).toBe(true);
    expect(registry.has('c')).toBe(false);
  });

  it('refuses a duplicate name', () => {
    const registry = createToolRegistry([a]);
    expect(() => registry.register(defineTool({ ...base, name: 'a', version: '2' }))).toThrow(
      'tool "a" is registered twice (a@1 and a@2): tool names must be unique; rename one of them',
    );
    expect(() => createToolRegistry([a, a])).toThrow(ConfigurationError);
  });

  it('names an unknown tool and lists the registered ones', () => {
    const registry = createToolRegistry([b, a]);
    expect(() => registry.get('c')).toThrow(UnknownToolError);
    expect(() => registry.get('c')).toThrow(
      `Unknown tool "c". Registered tools: a, b. Fix the name, or add defineTool({ name: "c", ... }) to the job module's \`export const tools\` (or runtime.tool(...)).`,
    );
    expect(() => createToolRegistry().get('c')).toThrow(
      `Unknown tool "c": no tools are registered. Add defineTool({ name: "c", ... }) to the job module's \`export const tools\` (or runtime.tool(...)).`,
    );
  });
});
