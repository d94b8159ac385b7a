/**
 * Tool definitions: a name, zod schemas for input and output, a side-effect class and an honest
 * statement of whether the tool can be re-run safely. Checked once, at definition time, so a tool
 * that could repeat a side effect is refused before any run uses it.
 */
import type { z } from 'zod';
import { ConfigurationError, InputValidationError, ToolInputError } from '../errors.js';
import { findNonJson, type JsonValue } from '../internal/json.js';
import { zodIssuesToValidationIssues } from '../schemas/issues.js';
import { classifyTool, isToolClass, ToolClass } from './classify.js';

/** A valid tool name: 1 to 128 letters, digits, `_`, `.`, `:` or `-` (`mcp:upload_to_composio`). */
export const TOOL_NAME_PATTERN = /^[A-Za-z0-9_.:-]{1,128}$/;
const NAMESPACE_PATTERN = /^[A-Za-z0-9_.-]{1,64}$/;
const VERSION_PATTERN = /^[^\s@/]{1,64}$/;

/** How much harm a wrong call can do; high and critical calls may wait for approval. */
export type RiskLevel = 'low' | 'medium' | 'high' | 'critical';
const RISK_LEVELS = new Set<unknown>(['low', 'medium', 'high', 'critical']);

/** What a tool receives besides its arguments. */
export interface ToolContext {
  /** The ledger call id: the same on every re-run of this call. Pass it to the API you call. */
  idempotencyKey: string;
  /** Aborted when the run is cancelled, the worker stops, or this worker lost the call's lease. */
  signal: AbortSignal;
  runId: string;
  stepId: string;
  callId: string;
  /** The step's attempt number. */
  attempt: number;
  tenantId: string;
  /**
   * In an agent step, the turn's idempotency key, `sha256(runId:stepId:turn)`: the same for every
   * call of one turn, and the value of the `idempotency_key` argument the runtime fills in.
   */
  turnKey: string | undefined;
}

/** What {@link defineTool} takes. */
export interface ToolSpec<I extends z.ZodType = z.ZodType, O extends z.ZodType = z.ZodType> {
  /** The name the model calls the tool by; see `TOOL_NAME_PATTERN`. */
  name: string;
  /** Where the tool comes from, e.g. `mcp` or `composio`. */
  namespace?: string;
  /**
   * Part of the tool's identity: changing it changes the ledger call ids of new calls.
   * @defaultValue `'1'`
   */
  version?: string;
  description?: string;
  /** Parses the arguments at the edge; failures are a `ToolInputError`. */
  input: I;
  /** Parses what `run` returns before it is stored as the receipt. */
  output?: O;
  /**
   * What the tool's side effects reach.
   * @defaultValue `classifyTool(name, namespace, metadata)`
   */
  class?: ToolClass;
  metadata?: Record<string, unknown>;
  /** Safe to run again with the same idempotency key after an unknown outcome. */
  idempotent?: boolean;
  /** The tool passes `ctx.idempotencyKey` to the system it calls, which honours it. */
  requiresIdempotencyKey?: boolean;
  riskLevel?: RiskLevel;
  /** Performs the call, sync or async. Its result (JSON; `undefined` → `null`) becomes the receipt. */
  run(args: z.output<I>, ctx: ToolContext): unknown;
}

/** A checked, frozen tool definition. */
export interface ToolDefinition<I extends z.ZodType = z.ZodType, O extends z.ZodType = z.ZodType> {
  readonly name: string;
  readonly namespace: string | undefined;
  readonly version: string;
  /** `name@version`, or `namespace/name@version`: what the ledger records. */
  readonly identity: string;
  readonly description: string | undefined;
  readonly input: I;
  readonly output: O | undefined;
  readonly class: ToolClass;
  readonly metadata: Readonly<Record<string, unknown>>;
  readonly idempotent: boolean;
  readonly requiresIdempotencyKey: boolean;
  readonly riskLevel: RiskLevel | undefined;
  /** Performs the call, sync or async. Its result (JSON; `undefined` → `null`) becomes the receipt. */
  run(args: z.output<I>, ctx: ToolContext): unknown;
}

/** The identity the ledger records: `name@version` or `namespace/name@version`. */
export function toolIdentity(name: string, version: string, namespace?: string): string {
  return namespace === undefined ? `${name}@${version}` : `${namespace}/${name}@${version}`;
}

function refuse(field: string, message: string): never {
  throw new ConfigurationError(message, { field });
}

function isSchema(value: unknown): value is z.ZodType {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { safeParseAsync?: unknown }).safeParseAsync === 'function'
  );
}

function optionalBoolean(spec: object, field: 'idempotent' | 'requiresIdempotencyKey'): boolean {
  const value: unknown = (spec as Record<string, unknown>)[field];
  if (value !== undefined && typeof value !== 'boolean') {
    refuse(field, `${field} must be true or false, got ${typeof value}`);
  }
  return value === true;
}

/**
 * Defines a tool. Throws `ConfigurationError` (naming the field and the fix) for an invalid name,
 * schema, class or risk level, and for a tool with side effects that does not say whether it takes
 * an idempotency key.
 *
 * @example
 * ```ts
 * const sendEmail = defineTool({
 *   name: 'GMAIL_SEND_EMAIL',
 *   input: z.object({ to: z.email(), subject: z.string() }),
 *   requiresIdempotencyKey: true,
 *   run: (args, ctx) => gmail.send({ ...args, idempotencyKey: ctx.idempotencyKey }),
 * });
 * ```
 */
export function defineTool<I extends z.ZodType, O extends z.ZodType = z.ZodType>(
  spec: ToolSpec<I, O>,
): ToolDefinition<I, O> {
  if (typeof spec !== 'object' || spec === null) {
    refuse('spec', 'defineTool needs an object: defineTool({ name, input, run, ... })');
  }
  const { name, namespace, version = '1', metadata = {} } = spec;
  if (typeof name !== 'string' || !TOOL_NAME_PATTERN.test(name)) {
    refuse(
      'name',
      `tool name ${JSON.stringify(name)} is invalid: use 1 to 128 letters, digits, "_", ".", ":" or "-" (e.g. "send_email" or "mcp:upload_to_composio")`,
    );
  }
  if (
    namespace !== undefined &&
    (typeof namespace !== 'string' || !NAMESPACE_PATTERN.test(namespace))
  ) {
    refuse(
      'namespace',
      `tool "${name}" has an invalid namespace ${JSON.stringify(namespace)}: use 1 to 64 letters, digits, "_", "." or "-" (e.g. "mcp")`,
    );
  }
  if (typeof version !== 'string' || !VERSION_PATTERN.test(version)) {
    refuse(
      'version',
      `tool "${name}" has an invalid version ${JSON.stringify(version)}: use 1 to 64 characters without spaces, "@" or "/" (e.g. "2")`,
    );
  }
  if (!isSchema(spec.input)) {
    refuse('input', `tool "${name}" needs a zod schema as input, e.g. input: z.object({ ... })`);
  }
  if (spec.output !== undefined && !isSchema(spec.output)) {
    refuse(
      'output',
      `tool "${name}" has an output that is not a zod schema; pass one or leave it out`,
    );
  }
  if (typeof spec.run !== 'function') {
    refuse('run', `tool "${name}" needs a run(args, ctx) function`);
  }
  if (typeof metadata !== 'object' || metadata === null || Array.isArray(metadata)) {
    refuse('metadata', `tool "${name}" has metadata that is not an object`);
  }
  if (spec.class !== undefined && !isToolClass(spec.class)) {
    refuse(
      'class',
      `tool "${name}" has an invalid class ${JSON.stringify(spec.class)}: use one of ${Object.values(ToolClass).join(', ')}`,
    );
  }
  if (spec.riskLevel !== undefined && !RISK_LEVELS.has(spec.riskLevel)) {
    refuse(
      'riskLevel',
      `tool "${name}" has an invalid riskLevel ${JSON.stringify(spec.riskLevel)}: use low, medium, high or critical`,
    );
  }
  const idempotent = optionalBoolean(spec, 'idempotent');
  const requiresIdempotencyKey = optionalBoolean(spec, 'requiresIdempotencyKey');
  const toolClass = spec.class ?? classifyTool(name, namespace, metadata);
  // Silence is not an answer: a side-effecting tool must state how a re-run would behave.
  if (
    toolClass !== ToolClass.ReadOnly &&
    spec.idempotent === undefined &&
    spec.requiresIdempotencyKey === undefined
  ) {
    refuse(
      'requiresIdempotencyKey',
      `tool "${name}" has side effects (class ${toolClass}) but does not say whether it accepts an idempotency key: set requiresIdempotencyKey: true (it honours ctx.idempotencyKey) or idempotent: false explicitly`,
    );
  }
  return Object.freeze({
    name,
    namespace,
    version,
    identity: toolIdentity(name, version, namespace),
    description: spec.description,
    input: spec.input,
    output: spec.output,
    class: toolClass,
    metadata: Object.freeze({ ...metadata }),
    idempotent,
    requiresIdempotencyKey,
    riskLevel: spec.riskLevel,
    run: spec.run.bind(spec),
  });
}

/** True when an in-doubt call of `tool` may be re-run with the same idempotency key. */
export function canRerunInDoubt(
  tool: Pick<ToolDefinition, 'idempotent' | 'requiresIdempotencyKey'>,
): boolean {
  return tool.idempotent || tool.requiresIdempotencyKey;
}

/** Parses arguments with the tool's input schema; throws `ToolInputError` with paths like `args.to`. */
export async function parseToolArgs(tool: ToolDefinition, args: unknown): Promise<JsonValue> {
  const result = await tool.input.safeParseAsync(args);
  if (!result.success) {
    throw new ToolInputError(
      tool.identity,
      zodIssuesToValidationIssues(result.error.issues, 'args'),
    );
  }
  // The ledger stores and hashes the parsed arguments, so they must be plain JSON.
  const nonJson = findNonJson(result.data, 'args');
  if (nonJson.length > 0) throw new ToolInputError(tool.identity, nonJson);
  return result.data as JsonValue;
}

/** Parses a tool's result into its receipt (`undefined` → `null`); throws `InputValidationError`. */
export async function parseToolOutput(tool: ToolDefinition, value: unknown): Promise<JsonValue> {
  let out: unknown = value === undefined ? null : value;
  if (tool.output !== undefined) {
    const result = await tool.output.safeParseAsync(out);
    if (!result.success) {
      throw new InputValidationError(
        `output of tool "${tool.identity}"`,
        zodIssuesToValidationIssues(result.error.issues, 'output'),
      );
    }
    out = result.data === undefined ? null : result.data;
  }
  const nonJson = findNonJson(out, 'output');
  if (nonJson.length > 0)
    throw new InputValidationError(`output of tool "${tool.identity}"`, nonJson);
  return out as JsonValue;
}
