/**
 * Deterministic ids of tool calls: the ledger call id (also the idempotency key a tool receives)
 * and the args hash, both SHA-256 of canonical JSON (RFC 8785), so key order never matters.
 */
import { canonicalHash as sha256Canonical } from '../internal/canonical-hash.js';
import { assertPlainJson, type JsonValue } from '../internal/json.js';

/** SHA-256 (hex) of the canonical JSON of `args`: key order does not matter. */
export function argsHash(args: JsonValue): string {
  assertPlainJson(args, 'tool call arguments', 'args');
  return sha256Canonical(args, 'tool call arguments');
}

/** What identifies a tool call for {@link ledgerCallId}. */
export interface LedgerCallIdInput {
  tenantId: string;
  runId: string;
  /** Part of the id when given, so equal calls in two steps are two calls. */
  stepId?: string;
  /** The tool identity, `name@version`. */
  tool: string;
  /** The normalized (schema-parsed) arguments, so key order and defaults do not matter. */
  args: JsonValue;
}

/** The deterministic call id (and idempotency key) of a tool call: SHA-256 hex of its canonical JSON. */
export function ledgerCallId(input: LedgerCallIdInput): string {
  const { tenantId, runId, stepId, tool, args } = input;
  assertPlainJson(args, 'tool call arguments', 'args');
  const identity = { tenant: tenantId, run: runId, tool, args };
  return sha256Canonical(
    stepId === undefined ? identity : { ...identity, step: stepId },
    'tool call identity',
  );
}
