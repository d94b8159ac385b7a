/**
 * SHA-256 of canonical JSON (RFC 8785): the one way the runtime derives ids and fingerprints from
 * values (ledger call ids, idempotency keys, agent fingerprints), so key order never matters.
 */
import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { InputValidationError } from '../errors.js';

/** SHA-256 (hex) of the canonical JSON of `value`; `what` names it if it has no JSON form. */
export function canonicalHash(value: unknown, what: string): string {
  const text = canonicalize(value);
  if (text === undefined) {
    throw new InputValidationError(what, [{ path: '', message: 'has no JSON form' }]);
  }
  return createHash('sha256').update(text, 'utf8').digest('hex');
}
