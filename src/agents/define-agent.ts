/**
 * Agent definitions: a model at an OpenAI-compatible provider, a system prompt, tools and sampling
 * settings. Checked once, at definition time, with errors that name the field and the fix. The API
 * key is held out of sight: it is not enumerable, so it never reaches JSON, logs or fingerprints.
 */
import { z } from 'zod';
import { ConfigurationError } from '../errors.js';
import { formatPath } from '../internal/json.js';
import { TOOL_NAME_PATTERN, type ToolDefinition } from '../tools/define-tool.js';
import { toolParametersSchema } from './tool-schema.js';

/** An API key, or a function that returns it when a call is made (so it can rotate). */
export type ApiKeySource = string | (() => string);

/** Where the model is served: any OpenAI-compatible endpoint. */
export interface AgentProviderSpec {
  /** The API's base URL, e.g. `https://api.openai.com/v1`. */
  baseURL: string;
  /**
   * The API key; never logged, serialized or fingerprinted.
   * @defaultValue `process.env.OPENAI_API_KEY`, read at call time
   */
  apiKey?: ApiKeySource;
}

/** Sampling settings sent with every call; part of the fingerprint. */
export interface AgentSettings {
  /** 0 to 2. */
  temperature?: number;
  /** Most tokens a reply may have (`max_completion_tokens`). */
  maxTokens?: number;
  /** Asks the provider for reproducible sampling. */
  seed?: number;
  /** Nucleus sampling, above 0 and at most 1. */
  topP?: number;
}

/** What {@link defineAgent} takes. */
export interface AgentSpec {
  /** The name plans refer to the agent by; same rules as a tool name. */
  name: string;
  /** The provider's model name, e.g. `gpt-4o-mini`. */
  model: string;
  provider: AgentProviderSpec;
  systemPrompt: string;
  /**
   * Tools the model may call.
   * @defaultValue `[]`
   */
  tools?: readonly ToolDefinition[];
  /** @defaultValue `{}` (the provider's defaults) */
  settings?: AgentSettings;
  /**
   * How long one model call may take, in milliseconds; for a streaming call, how long it may go
   * without a chunk.
   * @defaultValue `60000`
   */
  timeoutMs?: number;
  /**
   * Streams the reply, delivering text as it arrives.
   * @defaultValue `false`
   */
  stream?: boolean;
}

/** The provider of a checked agent. `apiKey` is present but not enumerable. */
export interface AgentProvider {
  readonly baseURL: string;
  readonly apiKey: ApiKeySource | undefined;
}

/** A checked, frozen agent definition. */
export interface AgentDefinition {
  readonly name: string;
  readonly model: string;
  readonly provider: AgentProvider;
  readonly systemPrompt: string;
  readonly tools: readonly ToolDefinition[];
  readonly settings: Readonly<AgentSettings>;
  readonly timeoutMs: number;
  readonly stream: boolean;
}

/** Default of {@link AgentSpec.timeoutMs}. */
export const DEFAULT_MODEL_TIMEOUT_MS = 60_000;
/** The longest timer Node can set. */
const MAX_TIMEOUT_MS = 2_147_483_647;

const OPTIONS = 'name, model, provider, systemPrompt, tools, settings, timeoutMs, stream';

/** `error` for a field: `missing` when it is absent, `invalid` otherwise. */
function says(
  missing: string,
  invalid: string = missing,
): { error: (iss: { input?: unknown }) => string } {
  return { error: (iss) => (iss.input === undefined ? missing : invalid) };
}

function isToolDefinition(value: unknown): value is ToolDefinition {
  if (typeof value !== 'object' || value === null) return false;
  const v = value as Partial<Record<keyof ToolDefinition, unknown>>;
  return (
    typeof v.name === 'string' &&
    typeof v.identity === 'string' &&
    typeof v.run === 'function' &&
    typeof v.input === 'object' &&
    v.input !== null
  );
}

const baseURLSchema = z
  .string(
    says(
      "set provider.baseURL (e.g. https://api.openai.com/v1 or the scripted server's url)",
      'provider.baseURL must be a string URL (e.g. https://api.openai.com/v1)',
    ),
  )
  .superRefine((value, ctx) => {
    let url: URL;
    try {
      url = new URL(value);
    } catch {
      ctx.addIssue({
        code: 'custom',
        message: `provider.baseURL ${JSON.stringify(value)} is not a URL: use e.g. https://api.openai.com/v1`,
      });
      return;
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') {
      ctx.addIssue({
        code: 'custom',
        message: `provider.baseURL must be an http or https URL, got ${url.protocol}`,
      });
    } else if (url.username !== '' || url.password !== '') {
      ctx.addIssue({
        code: 'custom',
        message:
          'provider.baseURL must not carry credentials: pass the key as provider.apiKey (or OPENAI_API_KEY)',
      });
    }
  });

const apiKeySchema = z.union([z.string(), z.custom<() => string>((v) => typeof v === 'function')], {
  // Never echo the value: it is a secret, or a mistake close to one.
  error: () =>
    'provider.apiKey must be a string or a function that returns one (or leave it out to read OPENAI_API_KEY)',
});

const settingsSchema = z.strictObject(
  {
    temperature: z
      .number({ error: 'settings.temperature must be a number from 0 to 2' })
      .min(0, { error: 'settings.temperature must be from 0 to 2' })
      .max(2, { error: 'settings.temperature must be from 0 to 2' })
      .optional(),
    maxTokens: z
      .number({ error: 'settings.maxTokens must be a positive integer (tokens per reply)' })
      .int({ error: 'settings.maxTokens must be a positive integer (tokens per reply)' })
      .positive({ error: 'settings.maxTokens must be a positive integer (tokens per reply)' })
      .optional(),
    seed: z
      .number({ error: 'settings.seed must be an integer' })
      .int({ error: 'settings.seed must be an integer' })
      .optional(),
    topP: z
      .number({ error: 'settings.topP must be a number above 0 and at most 1' })
      .gt(0, { error: 'settings.topP must be a number above 0 and at most 1' })
      .max(1, { error: 'settings.topP must be a number above 0 and at most 1' })
      .optional(),
  },
  { error: 'settings must be an object: { temperature?, maxTokens?, seed?, topP? }' },
);

const agentSpecSchema = z.strictObject(
  {
    name: z
      .string(says('set name: the name plans refer to the agent by (e.g. "researcher")'))
      .regex(TOOL_NAME_PATTERN, {
        error: (iss) =>
          `agent name ${JSON.stringify(iss.input)} is invalid: use 1 to 128 letters, digits, "_", ".", ":" or "-" (e.g. "researcher")`,
      }),
    model: z
      .string(says('set model to the provider\'s model name (e.g. "gpt-4o-mini")'))
      .trim()
      .min(1, { error: 'set model to the provider\'s model name (e.g. "gpt-4o-mini")' }),
    provider: z.strictObject(
      { baseURL: baseURLSchema, apiKey: apiKeySchema.optional() },
      says(
        "set provider: { baseURL, apiKey } (e.g. { baseURL: 'https://api.openai.com/v1', apiKey: process.env.OPENAI_API_KEY })",
        'provider must be an object: { baseURL, apiKey }',
      ),
    ),
    systemPrompt: z.string(
      says(
        "set systemPrompt: the agent's instructions (a string)",
        'systemPrompt must be a string',
      ),
    ),
    tools: z
      .array(
        z.custom<ToolDefinition>(isToolDefinition, {
          error: 'each tool must be the result of defineTool({ name, input, run, ... })',
        }),
        { error: 'tools must be an array of defineTool(...) results' },
      )
      .optional(),
    settings: settingsSchema.optional(),
    timeoutMs: z
      .number({ error: 'timeoutMs must be a positive integer (milliseconds)' })
      .int({ error: 'timeoutMs must be a positive integer (milliseconds)' })
      .positive({ error: 'timeoutMs must be a positive integer (milliseconds)' })
      .max(MAX_TIMEOUT_MS, { error: `timeoutMs must be at most ${MAX_TIMEOUT_MS}` })
      .optional(),
    stream: z.boolean({ error: 'stream must be true or false' }).optional(),
  },
  { error: 'defineAgent needs an object: defineAgent({ name, model, provider, systemPrompt })' },
);

function issueText(issue: z.core.$ZodIssue): string {
  if (issue.code === 'unrecognized_keys') {
    const where = issue.path.length === 0 ? '' : ` in ${formatPath('', issue.path)}`;
    const known =
      issue.path.length === 0
        ? OPTIONS
        : issue.path[0] === 'provider'
          ? 'baseURL, apiKey'
          : 'temperature, maxTokens, seed, topP';
    const keys = issue.keys.map((k) => JSON.stringify(k)).join(', ');
    return `unknown option${issue.keys.length === 1 ? '' : 's'} ${keys}${where}: use ${known}`;
  }
  return issue.message;
}

function refuse(name: unknown, issues: readonly z.core.$ZodIssue[]): never {
  const who = typeof name === 'string' && name !== '' ? `agent "${name}"` : 'agent';
  const first = issues[0];
  const field = first === undefined ? 'spec' : formatPath('', first.path) || 'spec';
  throw new ConfigurationError(`Invalid ${who}: ${issues.map(issueText).join('; ')}`, { field });
}

/**
 * Defines an agent. Throws `ConfigurationError` naming the field and the fix for a missing or
 * invalid option, an unknown option, a tool whose input a model cannot be shown, or two tools with
 * one name.
 *
 * @example
 * ```ts
 * const researcher = defineAgent({
 *   name: 'researcher',
 *   model: 'gpt-4o-mini',
 *   provider: { baseURL: 'https://api.openai.com/v1', apiKey: () => process.env.OPENAI_API_KEY! },
 *   systemPrompt: 'You research a topic with the search tool and answer in three sentences.',
 *   tools: [search],
 *   settings: { temperature: 0 },
 * });
 * ```
 */
export function defineAgent(spec: AgentSpec): AgentDefinition {
  const parsed = agentSpecSchema.safeParse(spec);
  const name: unknown = (spec as Partial<AgentSpec> | null | undefined)?.name;
  if (!parsed.success) refuse(name, parsed.error.issues);
  const { data } = parsed;
  const tools = data.tools ?? [];
  const seen = new Set<string>();
  for (const [i, tool] of tools.entries()) {
    if (seen.has(tool.name)) {
      throw new ConfigurationError(
        `Invalid agent "${data.name}": two tools are named "${tool.name}" (tools[${i}]): the model calls tools by name, so each needs its own`,
        { field: `tools[${i}].name` },
      );
    }
    seen.add(tool.name);
    try {
      toolParametersSchema(tool);
    } catch (error) {
      if (!(error instanceof ConfigurationError)) throw error;
      throw new ConfigurationError(`Invalid agent "${data.name}": ${error.message}`, {
        field: `tools[${i}].input`,
        cause: error,
      });
    }
  }
  const settings: AgentSettings = {};
  const s = data.settings ?? {};
  if (s.temperature !== undefined) settings.temperature = s.temperature;
  if (s.maxTokens !== undefined) settings.maxTokens = s.maxTokens;
  if (s.seed !== undefined) settings.seed = s.seed;
  if (s.topP !== undefined) settings.topP = s.topP;

  const provider = { baseURL: data.provider.baseURL.replace(/\/+$/, '') } as AgentProvider;
  // Out of JSON.stringify, console.log and spreads: the key is read, never carried along.
  Object.defineProperty(provider, 'apiKey', { value: data.provider.apiKey, enumerable: false });
  return Object.freeze({
    name: data.name,
    model: data.model,
    provider: Object.freeze(provider),
    systemPrompt: data.systemPrompt,
    tools: Object.freeze([...tools]),
    settings: Object.freeze(settings),
    timeoutMs: data.timeoutMs ?? DEFAULT_MODEL_TIMEOUT_MS,
    stream: data.stream ?? false,
  });
}
