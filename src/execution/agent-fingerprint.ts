/**
 * The fingerprint an agent step runs under (what shapes its model calls: the agent, the step's
 * settings, its input, the price, the runtime's `policyVersion`), computed once per step and
 * input in a process, and claimed for the step before it persists anything.
 */
import { ResumeError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import {
  agentFingerprint,
  compareFingerprints,
  type AgentFingerprint,
} from '../agents/fingerprint.js';
import type { AgentStep } from '../plan/schema.js';
import type { FingerprintStore } from '../persistence/fingerprint-store.js';
import type { ModelPrice } from '../llm/pricing.js';

/** What shapes an agent step's model calls beyond its agent and step: the runtime's settings. */
export interface FingerprintSettings {
  /** The price the agent's model is charged at (null: none configured). */
  price?: ModelPrice | null;
  /** The runtime's `policyVersion`. */
  policyVersion?: string | undefined;
}

/** The fingerprint an agent step's turns (granular) or attempts (atomic) run under. */
export function stepFingerprint(
  agent: AgentDefinition,
  step: AgentStep,
  input: JsonValue,
  settings: FingerprintSettings = {},
): AgentFingerprint {
  const price = settings.price ?? null;
  const policyVersion = settings.policyVersion;
  let known = fingerprints.get(step);
  const hit = known?.find(
    (k) =>
      k.agent === agent &&
      k.input === input &&
      k.price === price &&
      k.policyVersion === policyVersion,
  );
  if (hit !== undefined) return hit.fp;
  const fp = computeFingerprint(agent, step, input, price, policyVersion);
  if (known === undefined) fingerprints.set(step, (known = []));
  // A handful per step at most (runs of one plan share its parsed steps); keep the newest.
  if (known.length >= 64) known.shift();
  known.push({ agent, input, price, policyVersion, fp });
  return fp;
}

// The fingerprint of a step is asked for on every turn; within a process an agent definition and
// a price are frozen, and a run's step and input are the same objects from turn to turn.
const fingerprints = new WeakMap<
  AgentStep,
  {
    agent: AgentDefinition;
    input: JsonValue;
    price: ModelPrice | null;
    policyVersion: string | undefined;
    fp: AgentFingerprint;
  }[]
>();

function computeFingerprint(
  agent: AgentDefinition,
  step: AgentStep,
  input: JsonValue,
  price: ModelPrice | null,
  policyVersion: string | undefined,
): AgentFingerprint {
  return agentFingerprint({
    input,
    systemPrompt: agent.systemPrompt,
    model: agent.model,
    provider: agent.provider,
    tools: agent.tools,
    settings: agent.settings,
    // The price the agent's calls are charged at: a change would charge a run's turns unevenly.
    pricingPlan:
      price === null
        ? null
        : { inputPerMillion: price.inputPerMillion, outputPerMillion: price.outputPerMillion },
    ...(policyVersion === undefined ? {} : { policyVersion }),
    toggles: {
      enforceIdempotency: step.enforceIdempotency,
      blobThresholdBytes: step.blobThresholdBytes,
      historyMaxTokens: step.historyMaxTokens,
    },
    mode: step.mode,
  });
}

/**
 * Claims the step's fingerprint (see `FingerprintStore.claim`): records `current` unless the step
 * has one, and throws the irrecoverable `ResumeError` naming the first changed field when the one
 * recorded first differs. Called before the step persists anything, so that from its first
 * reservation, journal entry or held tool call on, an execution under another configuration
 * (system prompt, model, tools, settings, input, price, `policyVersion`, …) runs nothing.
 */
export async function claimFingerprint(
  store: FingerprintStore,
  runId: string,
  stepId: string,
  current: AgentFingerprint,
  fallback = false,
): Promise<void> {
  const stored = await store.claim(runId, stepId, current, fallback);
  if (stored.hash === current.hash) return;
  const changed = compareFingerprints(stored, current);
  throw changed === null
    ? new ResumeError(
        `Cannot resume step "${stepId}" of run "${runId}": its fingerprint changed since the step started (what changed is not on record); start a new run, or restore the agent and step as they were.`,
        { recoverable: false, runId, stepId },
      )
    : ResumeError.fingerprintMismatch(changed.field, { runId, stepId });
}
