import { spawn } from 'node:child_process';
import { getEventListeners } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import zlib from 'node:zlib';
import { afterEach, describe, expect, it } from 'vitest';
import { nodeHttpFetch, plainHeaders } from '../../src/llm/http-fetch.js';

const ROOT = join(import.meta.dirname, '..', '..');
const NODE = join(ROOT, 'node_modules', '.bin', 'node');

/** What a test server received. */
interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

interface TestServer {
  url: string;
  /** Each request, once its body was read. */
  seen: Seen[];
  /** TCP connections accepted. */
  connections: () => number;
  close: () => Promise<void>;
}

const servers: TestServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((server) => server.close()));
});

/** A loopback server that reads each request whole, then hands it to `reply`. */
async function serve(
  reply: (res: http.ServerResponse, seen: Seen, req: http.IncomingMessage) => void,
): Promise<TestServer> {
  const seen: Seen[] = [];
  let connections = 0;
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const entry: Seen = {
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        body: Buffer.concat(chunks),
      };
      seen.push(entry);
      reply(res, entry, req);
    });
  });
  server.keepAliveTimeout = 60_000;
  server.on('connection', (socket: Socket) => {
    connections++;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const test: TestServer = {
    url: `http://127.0.0.1:${port}`,
    seen,
    connections: () => connections,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
  servers.push(test);
  return test;
}

const ok = (res: http.ServerResponse): void => {
  res.end('ok');
};

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    expect(error).toBeInstanceOf(Error);
    return error as Error;
  }
  throw new Error('expected the request to fail');
}

/** Resolves when `condition` holds, polling every few milliseconds. */
async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 2));
}

/** Resolves when the server side of the request's socket has closed. */
function closed(req: http.IncomingMessage): Promise<void> {
  return new Promise((resolve) => {
    if (req.socket.destroyed) resolve();
    else req.socket.once('close', () => resolve());
  });
}

/**
 * Aborts `controller` and expects `pending` to reject with an AbortError within 100 ms, and the
 * server side of `held`'s connection to close.
 */
async function abortsPromptly(
  controller: AbortController,
  pending: Promise<unknown>,
  held: http.IncomingMessage,
): Promise<void> {
  const started = performance.now();
  controller.abort();
  const error = await rejection(pending);
  expect(performance.now() - started).toBeLessThan(100);
  expect(error.name).toBe('AbortError');
  await closed(held);
}

describe('nodeHttpFetch: requests', () => {
  it('a GET sends the headers given, no body and no content-length', async () => {
    const server = await serve((res) => {
      res.setHeader('content-type', 'application/json');
      res.end('{"a":1}');
    });
    const response = await nodeHttpFetch(`${server.url}/v1/things?x=1`, {
      headers: { 'X-Test': 'yes', Accept: 'application/json' },
    });
    expect(response.status).toBe(200);
    expect(response.ok).toBe(true);
    expect(response.url).toBe(`${server.url}/v1/things?x=1`);
    expect(await response.json()).toEqual({ a: 1 });
    const [seen] = server.seen;
    expect(seen?.method).toBe('GET');
    expect(seen?.url).toBe('/v1/things?x=1');
    expect(seen?.headers['x-test']).toBe('yes');
    expect(seen?.headers['accept']).toBe('application/json');
    expect(seen?.headers['content-length']).toBeUndefined();
    expect(seen?.headers['transfer-encoding']).toBeUndefined();
    expect(seen?.headers['accept-encoding']).toBeUndefined();
    expect(seen?.body.byteLength).toBe(0);
  });

  it.each([
    ['a record', { 'Content-Type': 'application/json', 'X-Id': '7' }],
    [
      'an array of pairs',
      [
        ['Content-Type', 'application/json'],
        ['X-Id', '7'],
      ],
    ],
    ['Headers', new Headers({ 'Content-Type': 'application/json', 'X-Id': '7' })],
  ] as [string, NonNullable<RequestInit['headers']>][])(
    'a POST with a string body and headers as %s: the exact bytes, with their length',
    async (_form, headers) => {
      const server = await serve(ok);
      const body = JSON.stringify({ q: '東京 😀', n: 1 });
      const response = await nodeHttpFetch(new URL('/post', server.url), {
        method: 'post',
        headers,
        body,
      });
      expect(await response.text()).toBe('ok');
      const [seen] = server.seen;
      expect(seen?.method).toBe('POST');
      expect(seen?.body.equals(Buffer.from(body, 'utf8'))).toBe(true);
      expect(seen?.headers['content-length']).toBe(String(Buffer.byteLength(body)));
      expect(seen?.headers['transfer-encoding']).toBeUndefined();
      expect(seen?.headers['content-type']).toBe('application/json');
      expect(seen?.headers['x-id']).toBe('7');
    },
  );

  it('a string body without a content-type is sent as text/plain, as fetch does', async () => {
    const server = await serve(ok);
    await nodeHttpFetch(server.url, { method: 'POST', body: 'plain' });
    expect(server.seen[0]?.headers['content-type']).toBe('text/plain;charset=UTF-8');
  });

  it('a Buffer body (a view into a larger buffer) is sent byte for byte', async () => {
    const server = await serve(ok);
    const whole = Buffer.from([0, 1, 2, 3, 255, 254, 10, 13, 0, 9, 8, 7]);
    const body = whole.subarray(2, 10);
    await nodeHttpFetch(server.url, {
      method: 'PUT',
      headers: { 'content-type': 'application/octet-stream' },
      body,
    });
    const [seen] = server.seen;
    expect(seen?.method).toBe('PUT');
    expect([...(seen?.body ?? [])]).toEqual([...body]);
    expect(seen?.headers['content-length']).toBe('8');
    expect(seen?.headers['transfer-encoding']).toBeUndefined();
  });

  it('a Uint8Array body and a content-length the caller gave', async () => {
    const server = await serve(ok);
    const body = new TextEncoder().encode('abc');
    await nodeHttpFetch(server.url, { method: 'PATCH', headers: [['Content-Length', '3']], body });
    expect(server.seen[0]?.method).toBe('PATCH');
    expect(server.seen[0]?.body.toString()).toBe('abc');
    expect(server.seen[0]?.headers['content-length']).toBe('3');
  });

  it('headers in every form become one plain object, repeated names joined', () => {
    expect(plainHeaders(undefined)).toEqual({});
    expect(
      plainHeaders([
        ['X-A', '1'],
        ['x-a', '2'],
      ]),
    ).toEqual({ 'x-a': '1, 2' });
    const headers = new Headers();
    headers.append('X-A', '1');
    headers.append('X-A', '2');
    expect(plainHeaders(headers)).toEqual({ 'x-a': '1, 2' });
    expect(plainHeaders({ Authorization: 'Bearer k' })).toEqual({ authorization: 'Bearer k' });
  });
});

describe('nodeHttpFetch: replies', () => {
  it('repeated response headers are all kept', async () => {
    const server = await serve((res) => {
      res.setHeader('x-dup', ['a', 'b']);
      res.setHeader('set-cookie', ['c=1', 'd=2']);
      res.end();
    });
    const response = await nodeHttpFetch(server.url);
    expect(response.headers.get('x-dup')).toBe('a, b');
    expect(response.headers.getSetCookie()).toEqual(['c=1', 'd=2']);
  });

  it('a 204 and a HEAD reply have a null body', async () => {
    const server = await serve((res, seen) => {
      if (seen.method === 'HEAD') {
        res.setHeader('content-length', '42');
        res.end();
      } else {
        res.statusCode = 204;
        res.end();
      }
    });
    const empty = await nodeHttpFetch(server.url, { method: 'DELETE' });
    expect(empty.status).toBe(204);
    expect(empty.body).toBeNull();
    const head = await nodeHttpFetch(server.url, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(head.body).toBeNull();
    expect(head.headers.get('content-length')).toBe('42');
  });

  it('a 500 is a Response, not a rejection', async () => {
    const server = await serve((res) => {
      res.statusCode = 500;
      res.statusMessage = 'Internal Server Error';
      res.setHeader('content-type', 'application/json');
      res.end('{"error":{"message":"boom"}}');
    });
    const response = await nodeHttpFetch(server.url, { method: 'POST', body: '{}' });
    expect([response.status, response.statusText, response.ok]).toEqual([
      500,
      'Internal Server Error',
      false,
    ]);
    expect(await response.json()).toEqual({ error: { message: 'boom' } });
  });

  it('a redirect is returned as it is, not followed', async () => {
    const server = await serve((res) => {
      res.writeHead(302, { location: '/elsewhere' });
      res.end();
    });
    const response = await nodeHttpFetch(server.url);
    expect(response.status).toBe(302);
    expect(response.headers.get('location')).toBe('/elsewhere');
    expect(server.seen).toHaveLength(1);
  });

  it('a status Response refuses (outside 200–599) → TypeError fetch failed', async () => {
    const server = await serve((res) => {
      res.statusCode = 600;
      res.end();
    });
    const error = await rejection(nodeHttpFetch(server.url));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toBe('fetch failed');
    expect(error.cause).toBeInstanceOf(RangeError);
  });

  const json = JSON.stringify({ text: 'compressed '.repeat(50), emoji: '😀' });
  it.each([
    ['gzip', zlib.gzipSync],
    ['x-gzip', zlib.gzipSync],
    ['br', zlib.brotliCompressSync],
    ['deflate', zlib.deflateSync],
    ['deflate', zlib.deflateRawSync],
  ] as const)('a %s reply is decompressed', async (encoding, compress) => {
    const server = await serve((res) => {
      res.setHeader('content-encoding', encoding);
      res.setHeader('content-type', 'application/json');
      res.end(compress(Buffer.from(json)));
    });
    const response = await nodeHttpFetch(server.url);
    expect(await response.text()).toBe(json);
    expect(server.seen[0]?.headers['accept-encoding']).toBeUndefined();
  });

  it('two codings are undone in reverse order; an unknown one is left as it is', async () => {
    const server = await serve((res, seen) => {
      if (seen.url === '/both') {
        res.setHeader('content-encoding', 'deflate, gzip');
        res.end(zlib.gzipSync(zlib.deflateSync(json)));
      } else {
        res.setHeader('content-encoding', 'zstd-unknown');
        res.end('raw bytes');
      }
    });
    expect(await (await nodeHttpFetch(`${server.url}/both`)).text()).toBe(json);
    expect(await (await nodeHttpFetch(`${server.url}/other`)).text()).toBe('raw bytes');
  });

  it('a reply that does not decompress → TypeError fetch failed', async () => {
    const server = await serve((res) => {
      res.setHeader('content-encoding', 'br');
      res.end('not brotli at all, not at all');
    });
    const error = await rejection(nodeHttpFetch(server.url));
    expect([error.name, error.message]).toEqual(['TypeError', 'fetch failed']);
  });
});

describe('nodeHttpFetch: aborts', () => {
  it('an aborted signal rejects at once, and nothing is sent', async () => {
    const server = await serve(ok);
    const controller = new AbortController();
    controller.abort();
    const error = await rejection(nodeHttpFetch(server.url, { signal: controller.signal }));
    expect(error.name).toBe('AbortError');
    expect(error).toBe(controller.signal.reason);
    expect(server.connections()).toBe(0);
  });

  it('the reason is kept when it is an AbortError, else an AbortError DOMException', async () => {
    const server = await serve(ok);
    const own = Object.assign(new Error('stopped by the caller'), { name: 'AbortError' });
    const first = await rejection(nodeHttpFetch(server.url, { signal: AbortSignal.abort(own) }));
    expect(first).toBe(own);
    const other = await rejection(
      nodeHttpFetch(server.url, { signal: AbortSignal.abort(new Error('not an abort')) }),
    );
    expect(other).toBeInstanceOf(DOMException);
    expect(other.name).toBe('AbortError');
    const text = await rejection(
      nodeHttpFetch(server.url, { signal: AbortSignal.abort('a string') }),
    );
    expect(text.name).toBe('AbortError');
  });

  it('an abort while the server holds the reply rejects within 100 ms and closes the connection', async () => {
    let held: http.IncomingMessage | undefined;
    const server = await serve((_res, _seen, req) => {
      held = req;
    });
    const controller = new AbortController();
    const pending = nodeHttpFetch(server.url, {
      method: 'POST',
      body: '{}',
      signal: controller.signal,
    });
    await until(() => held !== undefined);
    await abortsPromptly(controller, pending, held!);
  });

  it('an abort while the body is streaming in rejects and closes the connection', async () => {
    let held: http.IncomingMessage | undefined;
    const server = await serve((res, _seen, req) => {
      res.writeHead(200, { 'content-length': '100' });
      res.write('x'.repeat(10), () => {
        held = req;
      });
    });
    const controller = new AbortController();
    const pending = nodeHttpFetch(server.url, { signal: controller.signal });
    await until(() => held !== undefined);
    // The head and the first bytes are on the wire: let them arrive before the abort.
    await new Promise((resolve) => setTimeout(resolve, 50));
    await abortsPromptly(controller, pending, held!);
  });

  it('leaves no listener on a signal shared by many requests, whatever their end', async () => {
    const server = await serve((res, seen) => {
      res.statusCode = seen.url === '/fail' ? 500 : 200;
      res.end('x');
    });
    const refused = await serve(ok);
    const gone = refused.url;
    await refused.close();
    const { signal } = new AbortController();
    for (let i = 0; i < 300; i++) {
      await nodeHttpFetch(`${server.url}/${i % 2 === 0 ? 'ok' : 'fail'}`, { signal });
    }
    await rejection(nodeHttpFetch(gone, { signal }));
    expect(getEventListeners(signal, 'abort')).toHaveLength(0);
  });
});

describe('nodeHttpFetch: network failures', () => {
  it('a refused connection → TypeError fetch failed, cause ECONNREFUSED', async () => {
    const server = await serve(ok);
    const url = server.url;
    await server.close();
    const error = await rejection(nodeHttpFetch(url, { method: 'POST', body: '{}' }));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toBe('fetch failed');
    expect((error.cause as NodeJS.ErrnoException).code).toBe('ECONNREFUSED');
  });

  it('a socket destroyed in the middle of the body → TypeError fetch failed', async () => {
    const server = await serve((res, _seen, req) => {
      res.writeHead(200, { 'content-length': '100' });
      res.write('x'.repeat(10), () => setTimeout(() => req.socket.destroy(), 20));
    });
    const error = await rejection(nodeHttpFetch(server.url));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toBe('fetch failed');
    expect(error.cause).toBeInstanceOf(Error);
  });

  it('a socket destroyed before any reply → TypeError fetch failed', async () => {
    const server = await serve((_res, _seen, req) => req.socket.destroy());
    const error = await rejection(nodeHttpFetch(server.url));
    expect([error.name, error.message]).toEqual(['TypeError', 'fetch failed']);
  });

  it('an unknown host → TypeError fetch failed', async () => {
    const error = await rejection(nodeHttpFetch('http://no-such-host.invalid/'));
    expect([error.name, error.message]).toEqual(['TypeError', 'fetch failed']);
    expect((error.cause as NodeJS.ErrnoException).code).toMatch(/ENOTFOUND|EAI_AGAIN/);
  });
});

describe('nodeHttpFetch: connections', () => {
  it('50 sequential requests share one kept-alive TCP connection', async () => {
    const server = await serve((res, seen) => res.end(seen.body));
    for (let i = 0; i < 50; i++) {
      const response = await nodeHttpFetch(server.url, { method: 'POST', body: `n=${i}` });
      expect(await response.text()).toBe(`n=${i}`);
    }
    expect(server.seen).toHaveLength(50);
    expect(server.connections()).toBe(1);
  });

  it('a process that made a request exits on its own: idle sockets do not hold it', async () => {
    const server = await serve(ok);
    const dir = mkdtempSync(join(tmpdir(), 'flujo-http-fetch-'));
    try {
      const script = join(dir, 'one-request.mjs');
      const module = pathToFileURL(join(ROOT, 'src', 'llm', 'http-fetch.ts')).href;
      writeFileSync(
        script,
        [
          `import { nodeHttpFetch } from ${JSON.stringify(module)};`,
          `const response = await nodeHttpFetch(process.argv[2]);`,
          `process.stdout.write(\`done \${response.status} \${await response.text()}\\n\`);`,
        ].join('\n'),
      );
      const child = spawn(NODE, ['--import', 'tsx', script, server.url], {
        cwd: ROOT,
        env: { ...process.env, NODE_USE_ENV_PROXY: '' },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      let stderr = '';
      let doneAt: number | undefined;
      child.stdout.on('data', (chunk: Buffer) => {
        stdout += chunk.toString();
        if (doneAt === undefined && stdout.includes('done ')) doneAt = performance.now();
      });
      child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
      const exit = await new Promise<{ code: number | null; at: number }>((resolve) => {
        const kill = setTimeout(() => child.kill('SIGKILL'), 10_000);
        child.on('close', (code) => {
          clearTimeout(kill);
          resolve({ code, at: performance.now() });
        });
      });
      expect(stderr).toBe('');
      expect(stdout).toBe('done 200 ok\n');
      expect(exit.code).toBe(0);
      expect(exit.at - doneAt!).toBeLessThan(2000);
      // The connection was kept alive, not closed by the child before it exited.
      expect(server.seen[0]?.headers['connection']).toBe('keep-alive');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('nodeHttpFetch: what goes to globalThis.fetch', () => {
  const realFetch = globalThis.fetch;
  const proxyEnv = process.env['NODE_USE_ENV_PROXY'];
  afterEach(() => {
    globalThis.fetch = realFetch;
    if (proxyEnv === undefined) delete process.env['NODE_USE_ENV_PROXY'];
    else process.env['NODE_USE_ENV_PROXY'] = proxyEnv;
  });

  /** Replaces globalThis.fetch with one that records its arguments and answers `delegated`. */
  function stubFetch(): Parameters<typeof fetch>[] {
    const calls: Parameters<typeof fetch>[] = [];
    globalThis.fetch = (input, init) => {
      calls.push([input, init]);
      return Promise.resolve(new Response('delegated'));
    };
    return calls;
  }

  it('a Request as input', async () => {
    const server = await serve(ok);
    const calls = stubFetch();
    const request = new Request(server.url, { method: 'POST', body: 'x' });
    const response = await nodeHttpFetch(request);
    expect(await response.text()).toBe('delegated');
    expect(calls).toEqual([[request, undefined]]);
    expect(server.seen).toHaveLength(0);
  });

  it('a ReadableStream, URLSearchParams, Blob or FormData body', async () => {
    const server = await serve(ok);
    const calls = stubFetch();
    const bodies: NonNullable<RequestInit['body']>[] = [
      new ReadableStream({
        start(controller) {
          controller.enqueue(new TextEncoder().encode('streamed'));
          controller.close();
        },
      }),
      new URLSearchParams({ a: '1' }),
      new Blob(['blob']),
      new FormData(),
    ];
    for (const body of bodies) {
      const init: RequestInit = { method: 'POST', body, duplex: 'half' };
      expect(await (await nodeHttpFetch(server.url, init)).text()).toBe('delegated');
      expect(calls.at(-1)).toEqual([server.url, init]);
    }
    expect(calls).toHaveLength(bodies.length);
    expect(server.seen).toHaveLength(0);
  });

  it('another protocol, credentials in the URL, a dispatcher, or a GET with a body', async () => {
    const server = await serve(ok);
    const calls = stubFetch();
    await nodeHttpFetch('data:text/plain,hello');
    await nodeHttpFetch(new URL('file:///etc/hostname'));
    await nodeHttpFetch(server.url.replace('http://', 'http://user:pass@'));
    await nodeHttpFetch(server.url, { dispatcher: {} } as RequestInit);
    await nodeHttpFetch(server.url, { method: 'get', body: 'a GET with a body' });
    expect(calls).toHaveLength(5);
    expect(server.seen).toHaveLength(0);
  });

  it('every request when NODE_USE_ENV_PROXY is set', async () => {
    const server = await serve(ok);
    const calls = stubFetch();
    process.env['NODE_USE_ENV_PROXY'] = '1';
    await nodeHttpFetch(server.url, { method: 'POST', body: '{}' });
    expect(calls).toHaveLength(1);
    expect(server.seen).toHaveLength(0);
  });

  it('reads globalThis.fetch at the call, not at load', async () => {
    const first = stubFetch();
    await nodeHttpFetch('data:,a');
    const second = stubFetch();
    await nodeHttpFetch('data:,b');
    expect([first.length, second.length]).toEqual([1, 1]);
  });
});
