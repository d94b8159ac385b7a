/**
 * The failure taxonomy of user code (operators and tools): what they throw is classified once,
 * where it is caught, into a runtime error whose code and retryability decide what follows.
 */
import { ErrorCode, findCause, FlujoError, ServiceError, toFlujoError } from '../errors.js';

/** Network error codes of a transient failure: a reset, refused or timed-out connection. */
const TRANSIENT_NETWORK_CODES: ReadonlySet<string> = new Set([
  'ECONNRESET',
  'ECONNREFUSED',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'ESOCKETTIMEDOUT',
  'EAI_AGAIN',
  'ENETUNREACH',
  'ENETDOWN',
  'EHOSTUNREACH',
  'UND_ERR_SOCKET',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
]);

const asRecord = (value: unknown): Record<string, unknown> | undefined =>
  typeof value === 'object' && value !== null ? (value as Record<string, unknown>) : undefined;

/** The HTTP status an error carries: `status`, `statusCode` or `response.status`. */
function statusOf(error: Record<string, unknown>): number | undefined {
  for (const value of [
    error['status'],
    error['statusCode'],
    asRecord(error['response'])?.['status'],
  ]) {
    const n = typeof value === 'string' && /^\d{3}$/.test(value) ? Number(value) : value;
    if (typeof n === 'number' && Number.isInteger(n) && n >= 100 && n <= 599) return n;
  }
  return undefined;
}

/** A header (lower-case `name`) of the error or its response: a plain object or a `Headers`. */
function headerOf(error: Record<string, unknown>, name: string): string | undefined {
  for (const holder of [error, asRecord(error['response'])]) {
    const headers = holder?.['headers'];
    if (headers === undefined || headers === null) continue;
    const get = (headers as { get?: unknown }).get;
    const value =
      typeof get === 'function'
        ? (get as (n: string) => unknown).call(headers, name)
        : Object.entries(asRecord(headers) ?? {}).find(([k]) => k.toLowerCase() === name)?.[1];
    if (typeof value === 'string' && value !== '') return value;
    if (typeof value === 'number') return String(value);
  }
  return undefined;
}

/** `retry-after-ms`, or `retry-after` in seconds or as an HTTP date, in ms from now. */
function retryAfterOf(error: Record<string, unknown>): number | undefined {
  const ms = Number(headerOf(error, 'retry-after-ms'));
  if (Number.isFinite(ms) && ms >= 0) return Math.round(ms);
  const raw = headerOf(error, 'retry-after');
  if (raw === undefined) return undefined;
  const seconds = Number(raw);
  if (Number.isFinite(seconds) && seconds >= 0) return Math.round(seconds * 1000);
  const at = Date.parse(raw);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** A transient network code on the error or its causes (e.g. fetch's `TypeError` → `ECONNRESET`). */
function networkCodeOf(error: unknown): string | undefined {
  const found = findCause(error, (e) => {
    const code = asRecord(e)?.['code'];
    return typeof code === 'string' && TRANSIENT_NETWORK_CODES.has(code);
  });
  return found === undefined ? undefined : String(asRecord(found)?.['code']);
}

/**
 * Classifies what user code (an operator, a tool) threw, once, where it is caught. A runtime error
 * stays as it is. An error carrying an HTTP status (`status`, `statusCode`, `response.status`) or
 * a network error code becomes a {@link ServiceError}: 400 and 422 `invalid_input`, 401 and 403
 * `auth_forbidden`, 404 `not_found` (final); 408, 429 and 5xx, resets, refused connections and
 * timeouts `service_unavailable` (retryable; `retry-after` / `retry-after-ms` set
 * `retryAfterMs`). A boolean `retryable` on the error overrides the classification's. Anything
 * else is an `UnknownError`, retryable unless it says `retryable: false`.
 */
export function classifyFailure(thrown: unknown): FlujoError {
  if (thrown instanceof FlujoError) return thrown;
  const error = asRecord(thrown);
  const flag = error?.['retryable'];
  const explicit = typeof flag === 'boolean' ? flag : undefined;
  const message = error?.['message'];
  const text =
    typeof message === 'string' ? message : typeof thrown === 'string' ? thrown : 'failed';
  const status = error === undefined ? undefined : statusOf(error);
  if (status !== undefined) {
    const final = (code: ErrorCode, what: string) =>
      new ServiceError(
        `${text} (HTTP ${status}: ${what}; retrying will not help)`,
        { code, retryable: explicit ?? false, status },
        { cause: thrown },
      );
    if (status === 400 || status === 422)
      return final(ErrorCode.InvalidInput, 'the input was refused; fix it');
    if (status === 401 || status === 403) {
      return final(
        ErrorCode.AuthForbidden,
        'access refused; check the credentials and permissions',
      );
    }
    if (status === 404) return final(ErrorCode.NotFound, 'not found; check what is asked for');
    if (status === 408 || status === 429 || status >= 500) {
      const retryAfterMs = retryAfterOf(error!);
      return new ServiceError(
        `${text} (HTTP ${status}: transient; retried as the step's retry policy allows)`,
        { code: ErrorCode.ServiceUnavailable, retryable: explicit ?? true, status },
        { cause: thrown, ...(retryAfterMs === undefined ? {} : { retryAfterMs }) },
      );
    }
  }
  const networkCode = networkCodeOf(thrown);
  const timedOut = thrown instanceof Error && thrown.name === 'TimeoutError';
  if (networkCode !== undefined || timedOut) {
    return new ServiceError(
      `${text} (${networkCode ?? 'timeout'}: transient; retried as the step's retry policy allows)`,
      {
        code: ErrorCode.ServiceUnavailable,
        retryable: explicit ?? true,
        ...(networkCode === undefined ? {} : { networkCode }),
      },
      { cause: thrown },
    );
  }
  return toFlujoError(thrown, true);
}
