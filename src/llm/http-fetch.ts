/**
 * A `fetch` over `node:http` / `node:https` for the plain (non-streaming) requests the openai SDK
 * makes. Node's own fetch (undici) spends about 0.1–0.2 ms of CPU per request in its web-streams
 * machinery: measured on a 2-core VM, one openai client call to a local server took 0.38–0.56 ms
 * with Node's fetch and 0.27–0.35 ms with this one. An agent makes a model call on every turn.
 *
 * What it handles itself: a URL (string or `URL`) with protocol `http:` or `https:` and no
 * credentials in it; a body that is absent, null, a string or a `Uint8Array` (a `Buffer`); headers
 * in any form of `HeadersInit`; any method (uppercased, GET by default); `signal`. Other `init`
 * fields (`redirect`, `keepalive`, `cache`, ...) are ignored. It sends the body with its
 * `content-length` (never chunked), a string body without a `content-type` as
 * `text/plain;charset=UTF-8` as fetch does, and adds no `accept-encoding` (a reply compressed
 * anyway with gzip, deflate or br is decompressed; other encodings are left as they are). The reply
 * is read whole before the promise resolves (these are small JSON replies), and redirects are not
 * followed: a 3xx comes back as it is. Connections are kept alive in module-level agents, whose
 * idle sockets do not keep the process alive.
 *
 * What it hands to `globalThis.fetch` (read at each call, unchanged): a `Request` as input, a URL
 * that does not parse, another protocol or credentials in the URL; any other body (a stream, form
 * data, a blob, search params, an `ArrayBuffer`, ...); a body on a GET or HEAD (for fetch's own
 * TypeError); an undici `dispatcher` in `init`; and every request when Node is told to use the
 * proxy environment variables (`NODE_USE_ENV_PROXY` or `--use-env-proxy`), which only Node's fetch
 * honours.
 *
 * Failures have the shape of Node's fetch: an abort rejects with an error named `AbortError` (the
 * signal's reason when it is one, else a `DOMException`), a network failure or a reply cut short
 * with `TypeError('fetch failed')` whose `cause` is the underlying error.
 */
import http from 'node:http';
import https from 'node:https';
import zlib from 'node:zlib';

const httpAgent = new http.Agent({ keepAlive: true });
const httpsAgent = new https.Agent({ keepAlive: true });

/** Proxies from the environment, turned on by a flag: only Node's fetch knows them. */
const proxyFlag = [...process.execArgv, ...(process.env['NODE_OPTIONS'] ?? '').split(/\s+/)].some(
  (arg) => arg === '--use-env-proxy',
);

/** Statuses whose reply has no body. */
const NULL_BODY = new Set([204, 205, 304]);

/**
 * Fetch over `node:http` for string or `Uint8Array` bodies; everything else goes to
 * `globalThis.fetch` (see the module comment).
 */
export const nodeHttpFetch: typeof fetch = (input, init) => {
  const body = init?.body;
  const url = handledURL(input);
  if (
    url === undefined ||
    !(body == null || typeof body === 'string' || body instanceof Uint8Array) ||
    // A body on a GET or HEAD, which fetch refuses with its own TypeError.
    (body != null && /^(?:get|head)$/i.test(init?.method ?? 'GET')) ||
    (init != null && 'dispatcher' in init) ||
    usesEnvProxy()
  ) {
    return globalThis.fetch(input, init);
  }
  return send(url, init, body);
};

/** @internal Whether requests go through the proxy environment variables (Node's fetch only). */
export function usesEnvProxy(): boolean {
  const env = process.env['NODE_USE_ENV_PROXY'];
  return proxyFlag || (env !== undefined && env !== '');
}

/** The URL of an input handled here, or undefined when it goes to `globalThis.fetch`. */
function handledURL(input: string | URL | Request): URL | undefined {
  let url: URL;
  if (typeof input === 'string') {
    const parsed = URL.parse(input);
    if (parsed === null) return undefined;
    url = parsed;
  } else if (input instanceof URL) {
    url = input;
  } else {
    return undefined;
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return undefined;
  if (url.username !== '' || url.password !== '') return undefined;
  return url;
}

/** @internal The headers of a request as a plain object with lowercase names. */
export function plainHeaders(headers: RequestInit['headers']): Record<string, string> {
  const out: Record<string, string> = {};
  if (headers == null) return out;
  const add = (name: string, value: string): void => {
    const key = name.toLowerCase();
    const prior = out[key];
    out[key] = prior === undefined ? value : `${prior}, ${value}`;
  };
  if (headers instanceof Headers) {
    headers.forEach((value, name) => add(name, value));
  } else if (Symbol.iterator in headers) {
    for (const pair of headers as Iterable<readonly [string, string]>) {
      const [name, value] = pair;
      add(String(name), String(value));
    }
  } else {
    for (const name of Object.keys(headers)) add(name, String(headers[name]));
  }
  return out;
}

/** @internal The error an aborted request rejects with: always named `AbortError`. */
export function abortReason(signal: AbortSignal): Error {
  const reason: unknown = signal.reason;
  return reason instanceof Error && reason.name === 'AbortError'
    ? reason
    : new DOMException('This operation was aborted', 'AbortError');
}

/** A network failure as Node's fetch reports it. */
function fetchFailed(cause: unknown): TypeError {
  return new TypeError('fetch failed', { cause });
}

function send(
  url: URL,
  init: RequestInit | undefined,
  body: string | Uint8Array | null | undefined,
): Promise<Response> {
  const signal = init?.signal ?? undefined;
  if (signal?.aborted === true) return Promise.reject(abortReason(signal));
  const method = (init?.method ?? 'GET').toUpperCase();
  const headers = plainHeaders(init?.headers);
  let payload: Buffer | undefined;
  if (typeof body === 'string') {
    payload = Buffer.from(body, 'utf8');
    headers['content-type'] ??= 'text/plain;charset=UTF-8';
  } else if (body != null) {
    payload = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  }
  if (payload !== undefined) headers['content-length'] ??= String(payload.byteLength);

  return new Promise<Response>((resolve, reject) => {
    let settled = false;
    let req: http.ClientRequest | undefined;
    let res: http.IncomingMessage | undefined;
    const onAbort = (): void => {
      fail(abortReason(signal!));
      res?.destroy();
      req?.destroy();
    };
    const done = (): boolean => {
      if (settled) return false;
      settled = true;
      signal?.removeEventListener('abort', onAbort);
      return true;
    };
    const fail = (error: Error): void => {
      if (done()) reject(error);
    };
    const succeed = (response: Response): void => {
      if (done()) resolve(response);
    };
    signal?.addEventListener('abort', onAbort, { once: true });

    const isHttps = url.protocol === 'https:';
    try {
      req = (isHttps ? https : http).request(url, {
        method,
        headers,
        agent: isHttps ? httpsAgent : httpAgent,
      });
    } catch (error) {
      // An invalid header name or value, refused before anything is sent.
      fail(fetchFailed(error));
      return;
    }
    // The listeners stay for the request's whole life: an error after it settled (the socket
    // destroyed by an abort, say) is dropped here instead of being thrown as unhandled.
    req.on('error', (error) => fail(fetchFailed(error)));
    req.on('response', (reply: http.IncomingMessage) => {
      res = reply;
      const chunks: Buffer[] = [];
      reply.on('data', (chunk: Buffer) => chunks.push(chunk));
      reply.on('error', (error) => fail(fetchFailed(error)));
      reply.on('close', () => {
        if (!reply.complete)
          fail(fetchFailed(new Error('the connection closed before the reply was complete')));
      });
      reply.on('end', () => {
        if (settled) return;
        const raw = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
        decode(raw, reply.headers['content-encoding']).then(
          (bytes) => {
            if (settled) return;
            try {
              succeed(toResponse(reply, method, bytes, url));
            } catch (error) {
              fail(fetchFailed(error));
            }
          },
          (error: unknown) => fail(fetchFailed(error)),
        );
      });
    });
    req.end(payload);
  });
}

function toResponse(
  reply: http.IncomingMessage,
  method: string,
  bytes: Buffer,
  url: URL,
): Response {
  const status = reply.statusCode ?? 0;
  const headers = new Headers();
  const raw = reply.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) headers.append(raw[i]!, raw[i + 1]!);
  // Response throws a RangeError for a status outside 200–599: the caller gets a fetch failure.
  const response = new Response(method === 'HEAD' || NULL_BODY.has(status) ? null : bytes, {
    status,
    statusText: reply.statusMessage ?? '',
    headers,
  });
  Object.defineProperty(response, 'url', { value: url.href });
  return response;
}

/** The body with the content codings a server applied undone, when all of them are known. */
async function decode(bytes: Buffer, encoding: string | undefined): Promise<Buffer> {
  if (encoding === undefined || bytes.byteLength === 0) return bytes;
  const codings = encoding
    .toLowerCase()
    .split(',')
    .map((coding) => coding.trim())
    .filter((coding) => coding !== '' && coding !== 'identity');
  if (!codings.every((coding) => DECODERS.has(coding))) return bytes;
  let out = bytes;
  for (const coding of codings.reverse()) out = await DECODERS.get(coding)!(out);
  return out;
}

// Lenient like Node's fetch: a stream that ends without its final block still yields its data.
const ZLIB_LENIENT = {
  flush: zlib.constants.Z_SYNC_FLUSH,
  finishFlush: zlib.constants.Z_SYNC_FLUSH,
};
const BROTLI_LENIENT = {
  flush: zlib.constants.BROTLI_OPERATION_FLUSH,
  finishFlush: zlib.constants.BROTLI_OPERATION_FLUSH,
};

function zlibCall(
  run: (bytes: Buffer, callback: (error: Error | null, out: Buffer) => void) => void,
): (bytes: Buffer) => Promise<Buffer> {
  return (bytes) =>
    new Promise((resolve, reject) =>
      run(bytes, (error, out) => (error === null ? resolve(out) : reject(error))),
    );
}

const gunzip = zlibCall((bytes, callback) => zlib.gunzip(bytes, ZLIB_LENIENT, callback));
const DECODERS = new Map<string, (bytes: Buffer) => Promise<Buffer>>([
  ['gzip', gunzip],
  ['x-gzip', gunzip],
  // `deflate` is meant to be zlib-wrapped, but some servers send raw deflate: the first byte tells.
  [
    'deflate',
    zlibCall((bytes, callback) =>
      (bytes[0]! & 0x0f) === 0x08
        ? zlib.inflate(bytes, ZLIB_LENIENT, callback)
        : zlib.inflateRaw(bytes, ZLIB_LENIENT, callback),
    ),
  ],
  ['br', zlibCall((bytes, callback) => zlib.brotliDecompress(bytes, BROTLI_LENIENT, callback))],
]);
