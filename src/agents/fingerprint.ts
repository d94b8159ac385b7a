/**
 * The fingerprint of an agent step: SHA-256 of the RFC 8785 canonical JSON of what
 * shapes its turns. Stored on the first turn and recomputed on every turn; a mismatch means the
 * code or the input changed under a running step, and the step must not go on. Each field is also
 * hashed on its own, so a mismatch names what changed. The API key is never part of it.
 */
import { canonicalHash } from '../internal/canonical-hash.js';
import { ResumeError, type FingerprintField } from '../errors.js';
import { assertPlainJson, type JsonObject, type JsonValue } from '../internal/json.js';
import type { ToolDefinition } from '../tools/define-tool.js';
import type { AgentSettings } from './define-agent.js';
import { toolParametersSchema } from './tool-schema.js';

export type { FingerprintField } from '../errors.js';

/** The fields of a fingerprint, in the order a mismatch is looked for (the first changed is named). */
export const FINGERPRINT_FIELDS: readonly FingerprintField[] = Object.freeze([
  'input',
  'systemPrompt',
  'model',
  'provider',
  'pricing',
  'tools',
  'settings',
  'policyVersion',
  'toggles',
  'mode',
]);

/** The run-shaping options of an agent step. */
export interface FingerprintToggles {
  enforceIdempotency: boolean;
  blobThresholdBytes: number;
  historyMaxTokens: number;
}

/** What {@link agentFingerprint} hashes. */
export interface FingerprintParts {
  /** The step's input: plain JSON, or the fingerprint is refused. */
  input: unknown;
  systemPrompt: string;
  model: string;
  /** Only `baseURL` counts; an `apiKey` here is ignored. */
  provider: { readonly baseURL: string };
  /** The pricing plan usage is charged by, when there is one (plain JSON). */
  pricingPlan?: unknown;
  tools: readonly Pick<ToolDefinition, 'name' | 'identity' | 'input'>[];
  settings: Readonly<AgentSettings>;
  policyVersion?: string;
  toggles: FingerprintToggles;
  mode: 'atomic' | 'granular';
}

/** A fingerprint: the overall hash and one hash per field (hex SHA-256 each). JSON-safe. */
export interface AgentFingerprint {
  hash: string;
  parts: Record<FingerprintField, string>;
}

function hashJson(value: JsonValue): string {
  return canonicalHash(value, 'fingerprint part');
}

const schemaHashes = new WeakMap<object, string>();

function schemaHash(schema: JsonObject): string {
  let hash = schemaHashes.get(schema);
  if (hash === undefined) {
    hash = hashJson(schema);
    schemaHashes.set(schema, hash);
  }
  return hash;
}

/** Each tool as name, fully qualified identity and the hash of its argument schema; sorted by name. */
function toolsPart(tools: FingerprintParts['tools']): JsonValue {
  return tools
    .map((tool) => ({
      name: tool.name,
      identity: tool.identity,
      schema: schemaHash(toolParametersSchema(tool)),
    }))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

function settingsPart(settings: Readonly<AgentSettings>): JsonValue {
  const out: Record<string, JsonValue> = {};
  // Only the known settings, so an unrelated property cannot change (or break) the fingerprint.
  for (const key of ['temperature', 'maxTokens', 'seed', 'topP'] as const) {
    const value = settings[key];
    if (value !== undefined) out[key] = value;
  }
  return out;
}

/**
 * Computes the fingerprint of an agent step. Throws `InputValidationError` (naming each place)
 * when the input or the pricing plan is not plain JSON.
 */
export function agentFingerprint(parts: FingerprintParts): AgentFingerprint {
  assertPlainJson(
    parts.input,
    'agent step input (it must be plain JSON to be fingerprinted)',
    'input',
  );
  if (parts.pricingPlan !== undefined) {
    assertPlainJson(parts.pricingPlan, 'pricing plan', 'pricingPlan');
  }
  const { enforceIdempotency, blobThresholdBytes, historyMaxTokens } = parts.toggles;
  const values: Record<FingerprintField, JsonValue> = {
    input: parts.input,
    systemPrompt: parts.systemPrompt,
    model: parts.model,
    provider: { baseURL: parts.provider.baseURL },
    pricing: parts.pricingPlan === undefined ? null : parts.pricingPlan,
    tools: toolsPart(parts.tools),
    settings: settingsPart(parts.settings),
    policyVersion: parts.policyVersion ?? null,
    toggles: { enforceIdempotency, blobThresholdBytes, historyMaxTokens },
    mode: parts.mode,
  };
  // The input was checked above; this catches a NaN setting or toggle.
  assertPlainJson({ ...values, input: null }, 'agent fingerprint');
  const hashes = {} as Record<FingerprintField, string>;
  for (const field of FINGERPRINT_FIELDS) hashes[field] = hashJson(values[field]);
  return { hash: hashJson(hashes), parts: hashes };
}

/** The first field (in {@link FINGERPRINT_FIELDS} order) whose hash differs, or null when equal. */
export function compareFingerprints(
  stored: AgentFingerprint,
  current: AgentFingerprint,
): { field: FingerprintField } | null {
  if (stored.hash === current.hash) return null;
  // The parts decide: the overall hash is derived from them.
  for (const field of FINGERPRINT_FIELDS) {
    if (stored.parts[field] !== current.parts[field]) return { field };
  }
  return null;
}

/**
 * Throws the irrecoverable `ResumeError` naming the first changed field when the fingerprints
 * differ; nothing of the step may run after it.
 */
export function assertSameFingerprint(
  stored: AgentFingerprint,
  current: AgentFingerprint,
  where: { runId?: string; stepId?: string } = {},
): void {
  const mismatch = compareFingerprints(stored, current);
  if (mismatch !== null) throw ResumeError.fingerprintMismatch(mismatch.field, where);
}
