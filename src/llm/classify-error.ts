/**
 * Where openai SDK errors enter the runtime: each becomes a {@link ModelError} once, with its kind,
 * retryability and retry delay decided here (`retry-after-ms` → `retry-after` → `x-should-retry`
 * → status) and nowhere else. Aborts are control flow, not failures: they pass through unchanged.
 */
import { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError } from 'openai';
import { FlujoError, ModelError, type ModelErrorInfo, type ModelErrorKind } from '../errors.js';

/** What the classifier needs to say what to fix. */
export interface ModelCallContext {
  /** The model the call asked for. */
  model: string;
  /** Where the call went; credentials in it are never shown. */
  baseURL: string;
  /** Strings that must not appear in any message (the API key): replaced by `***`. */
  secrets?: readonly string[];
  /** The clock for `retry-after` given as an HTTP date. @defaultValue `Date.now` */
  now?: () => number;
}

/** What an HTTP status says went wrong; `x-should-retry` may still overrule its retryability. */
function kindOfStatus(status: number): ModelErrorKind {
  if (status === 401 || status === 403) return 'auth';
  if (status === 404) return 'not_found';
  if (status === 408) return 'timeout';
  if (status === 409) return 'conflict';
  if (status === 429) return 'rate_limit';
  if (status >= 500) return 'server';
  return 'bad_request';
}

/** Milliseconds to wait before retrying, from `retry-after-ms`, then `retry-after`; else undefined. */
export function parseRetryAfter(
  headers: Headers | undefined,
  now: () => number = Date.now,
): number | undefined {
  if (headers === undefined) return undefined;
  const ms = headers.get('retry-after-ms');
  if (ms !== null && ms.trim() !== '') {
    const value = Number(ms);
    if (Number.isFinite(value) && value >= 0) return Math.ceil(value);
  }
  const after = headers.get('retry-after');
  if (after !== null && after.trim() !== '') {
    const seconds = Number(after);
    if (Number.isFinite(seconds)) return seconds >= 0 ? Math.ceil(seconds * 1000) : undefined;
    const date = Date.parse(after);
    if (!Number.isNaN(date)) return Math.max(0, date - now());
  }
  return undefined;
}

/** `x-should-retry: true|false`, the provider's own verdict; undefined when absent. */
function shouldRetryHeader(headers: Headers | undefined): boolean | undefined {
  const value = headers?.get('x-should-retry')?.trim().toLowerCase();
  return value === 'true' ? true : value === 'false' ? false : undefined;
}

/** The URL to show: no user, password, query or fragment. */
export function displayURL(baseURL: string): string {
  try {
    const url = new URL(baseURL);
    url.username = '';
    url.password = '';
    url.search = '';
    url.hash = '';
    return url.toString().replace(/\/+$/, '');
  } catch {
    return baseURL;
  }
}

function redact(text: string, secrets: readonly string[] | undefined): string {
  let out = text;
  for (const secret of secrets ?? []) {
    if (secret.length >= 4) out = out.split(secret).join('***');
  }
  return out;
}

/** `message: cause message: …`, without repeats: undici hides the reason (ECONNREFUSED) in causes. */
function describeChain(error: Error): string {
  const parts: string[] = [];
  let current: unknown = error;
  for (let depth = 0; depth < 5 && current instanceof Error; depth++) {
    const text = current.message.replace(/\.$/, '');
    if (text !== '' && !parts.includes(text)) parts.push(text);
    current = current.cause;
  }
  return parts.join(': ');
}

/** The provider's own message, without the SDK's `"<status> "` prefix. */
function providerMessage(error: APIError): string | undefined {
  const body = error.error as { message?: unknown } | undefined;
  if (typeof body?.message === 'string' && body.message !== '') return body.message;
  const message = error.message.replace(/^\d{3} /, '');
  return message === '' || /status code \(no body\)$/.test(message) ? undefined : message;
}

/**
 * Turns an openai SDK error into a {@link ModelError}; returns anything else unchanged, including
 * `APIUserAbortError` (an abort is control flow) and runtime errors already classified.
 */
export function classifyModelError(thrown: unknown, context: ModelCallContext): unknown {
  if (thrown instanceof FlujoError || !(thrown instanceof APIError)) return thrown;
  if (thrown instanceof APIUserAbortError) return thrown;
  const error = thrown as APIError;
  const base = { model: context.model, baseURL: displayURL(context.baseURL) };
  const clean = (text: string | undefined): string | undefined =>
    text === undefined ? undefined : redact(text, context.secrets);

  if (error instanceof APIConnectionError) {
    const timeout = error instanceof APIConnectionTimeoutError;
    const said = timeout ? undefined : clean(describeChain(error));
    const info: ModelErrorInfo = { ...base, kind: timeout ? 'timeout' : 'connection' };
    if (said !== undefined) info.providerMessage = said;
    return new ModelError(info, { cause: error });
  }

  const headers = error.headers;
  const status = error.status;
  // No status: an error event inside a stream; the provider failed after it started answering.
  const kind: ModelErrorKind = status === undefined ? 'server' : kindOfStatus(status);
  const info: ModelErrorInfo = { ...base, kind };
  if (status !== undefined) info.status = status;
  if (error.requestID !== null && error.requestID !== undefined) info.requestId = error.requestID;
  const said = clean(providerMessage(error));
  if (said !== undefined && kind !== 'auth') info.providerMessage = said;

  let retryable: boolean | undefined;
  // A 429 for an exhausted quota does not pass with time: it needs billing, not a retry.
  if (kind === 'rate_limit' && error.code === 'insufficient_quota') {
    retryable = false;
    info.providerMessage = `${said ?? 'insufficient quota'}; check the account's plan and billing`;
  }
  const verdict = shouldRetryHeader(headers);
  if (verdict !== undefined) retryable = verdict;

  const options: { cause: unknown; retryable?: boolean; retryAfterMs?: number } = { cause: error };
  if (retryable !== undefined) options.retryable = retryable;
  const retryAfterMs = parseRetryAfter(headers, context.now);
  if (retryAfterMs !== undefined) options.retryAfterMs = retryAfterMs;
  return new ModelError(info, options);
}

/** True for a model call aborted through its signal: control flow, not a model failure. */
export function isAbortError(error: unknown): boolean {
  return (
    error instanceof APIUserAbortError ||
    (typeof error === 'object' &&
      error !== null &&
      (error as { name?: unknown }).name === 'AbortError')
  );
}
