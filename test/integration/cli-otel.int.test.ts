/**
 * OpenTelemetry from the CLI (the built binary, dist), configured by the standard
 * variables, against an OTLP/HTTP receiver on loopback (a node:http server that keeps the JSON the
 * exporter posts to /v1/traces): `flujo run` of a gated job whose first step fails once, `flujo
 * approve` and `flujo resume` export one trace with the run's span over the whole run, the retry's
 * backoff and the gate's wait; `flujo worker` flushes its spans when SIGTERM stops it; a variable
 * flujo cannot honour is refused before anything is written.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createRuntime, type PlanInput } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { runFlujo, startFlujo, type FlujoOptions } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const GATED = 'test/fixtures/jobs/gated-retry.ts';
const LINE = 'test/fixtures/jobs/line.ts';
const IMPORT_LOG = join(import.meta.dirname, '..', 'fixtures', 'log-imports.mjs');

/** A span as OTLP/JSON carries it, with its resource's attributes. */
interface OtlpSpan {
  name: string;
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes: { key: string; value: Record<string, unknown> }[];
  resource: Record<string, unknown>;
}

let receiver: Server;
let endpoint: string;
let posts: { path: string; contentType: string }[];
let received: OtlpSpan[];
let prefix: string;
let dir: string;

const valueOf = (v: Record<string, unknown>): unknown => {
  const [kind, value] = Object.entries(v)[0] ?? [];
  return kind === 'intValue' ? Number(value) : value;
};
const attrs = (list: OtlpSpan['attributes']): Record<string, unknown> =>
  Object.fromEntries(list.map((a) => [a.key, valueOf(a.value)]));
const ms = (nanos: string): number => Number(BigInt(nanos) / 1000n) / 1000;
const sleep = (n: number) => new Promise((r) => setTimeout(r, n));

function otelEnv(more: Record<string, string> = {}): FlujoOptions {
  return {
    prefix,
    env: {
      OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
      OTEL_SERVICE_NAME: 'mail-service',
      OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment=test',
      ...more,
    },
  };
}

const spansOf = (runId: string) =>
  received.filter((s) => attrs(s.attributes)['flujo.run_id'] === runId);

beforeAll(async () => {
  receiver = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      posts.push({ path: req.url ?? '', contentType: req.headers['content-type'] ?? '' });
      const parsed = JSON.parse(body) as {
        resourceSpans: {
          resource: { attributes: OtlpSpan['attributes'] };
          scopeSpans: { spans: Omit<OtlpSpan, 'resource'>[] }[];
        }[];
      };
      for (const rs of parsed.resourceSpans) {
        const resource = attrs(rs.resource.attributes);
        for (const ss of rs.scopeSpans) for (const s of ss.spans) received.push({ ...s, resource });
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{}');
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  endpoint = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((resolve) => receiver.close(resolve));
});
beforeEach(() => {
  posts = [];
  received = [];
  prefix = testPrefix();
  dir = mkdtempSync(join(tmpdir(), 'flujo-cli-otel-'));
});
afterEach(async () => {
  await deleteRuntimeKeys(prefix);
  rmSync(dir, { recursive: true, force: true });
});

describe('flujo run, approve and resume with OTEL_EXPORTER_OTLP_ENDPOINT', () => {
  it('export one trace: the run over its whole life, the retry backoff, the gate wait', async () => {
    const run = await runFlujo(['run', GATED, '--run-id', 'otel-1'], otelEnv());
    expect(run.code, run.err).toBe(3);
    await sleep(500);
    const approve = await runFlujo(['approve', 'otel-1', 'review', '--by', 'ana'], otelEnv());
    expect(approve.code, approve.err).toBe(0);
    const resume = await runFlujo(['resume', 'otel-1', GATED], otelEnv());
    expect(resume.code, resume.err).toBe(0);

    expect(posts.length).toBeGreaterThan(0);
    expect(new Set(posts.map((p) => p.path))).toEqual(new Set(['/v1/traces']));
    expect(new Set(posts.map((p) => p.contentType))).toEqual(new Set(['application/json']));
    const spans = spansOf('otel-1');
    for (const s of spans) {
      expect(s.resource).toMatchObject({
        'service.name': 'mail-service',
        'deployment.environment': 'test',
      });
    }
    // One trace, one run span, every step and wait its child.
    const runs = spans.filter((s) => s.name === 'flujo.run');
    expect(runs).toHaveLength(1);
    const root = runs[0]!;
    expect(new Set(spans.map((s) => s.traceId))).toEqual(new Set([root.traceId]));
    expect(root.parentSpanId ?? '').toBe('');
    expect(attrs(root.attributes)).toMatchObject({
      'flujo.plan': 'gated-retry',
      'flujo.run.status': 'succeeded',
    });
    const others = spans.filter((s) => s !== root);
    for (const s of others) expect(s.parentSpanId).toBe(root.spanId);
    const steps = others.filter((s) => s.name === 'flujo.step');
    expect(
      steps.map((s) => [
        attrs(s.attributes)['flujo.step_id'],
        attrs(s.attributes)['flujo.attempt'],
      ]),
    ).toEqual([
      ['draft', 1],
      ['draft', 2],
      ['review', 1],
      ['send', 1],
    ]);
    expect(ms(root.startTimeUnixNano)).toBeLessThanOrEqual(
      Math.min(...steps.map((s) => ms(s.startTimeUnixNano))),
    );
    expect(ms(root.endTimeUnixNano)).toBeGreaterThanOrEqual(
      Math.max(...steps.map((s) => ms(s.endTimeUnixNano))),
    );
    const duration = (s: OtlpSpan) => ms(s.endTimeUnixNano) - ms(s.startTimeUnixNano);
    // The backoff of draft's failed attempt: 400 ms at least, until its second attempt.
    const retries = others.filter((s) => s.name === 'flujo.wait.retry');
    expect(retries.map((s) => attrs(s.attributes))).toEqual([
      expect.objectContaining({
        'flujo.step_id': 'draft',
        'flujo.attempt': 1,
        'flujo.retry.delay_ms': 400,
      }),
    ]);
    expect(duration(retries[0]!)).toBeGreaterThanOrEqual(400);
    expect(duration(retries[0]!)).toBeLessThan(3000);
    // The gate waited from draft's end until ana's approval: the 500 ms pause, and a command's start.
    const gates = others.filter((s) => s.name === 'flujo.wait.approval');
    expect(gates.map((s) => attrs(s.attributes))).toEqual([
      expect.objectContaining({
        'flujo.step_id': 'review',
        'flujo.wait.decision': 'approved',
        'flujo.wait.by': 'ana',
      }),
    ]);
    expect(duration(gates[0]!)).toBeGreaterThanOrEqual(500);
    expect(duration(gates[0]!)).toBeLessThan(10_000);
    const draftEnd = ms(steps[1]!.endTimeUnixNano);
    expect(Math.abs(ms(gates[0]!.startTimeUnixNano) - draftEnd)).toBeLessThan(50);
  }, 60_000);
});

describe('flujo worker', () => {
  it('exports its spans when SIGTERM stops it', async () => {
    let started!: () => void;
    const ready = new Promise<void>((resolve) => (started = resolve));
    const worker = startFlujo(['worker', LINE], {
      ...otelEnv(),
      onOutput: (out) => {
        if (out.includes('flujo worker: processing runs')) started();
      },
    });
    await ready;
    const runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
    try {
      const plan: PlanInput = {
        name: 'line',
        steps: [
          { id: 'a', kind: 'operator', operator: 'a' },
          { id: 'b', kind: 'operator', operator: 'b', dependsOn: ['a'] },
          { id: 'c', kind: 'operator', operator: 'c', dependsOn: ['b'] },
        ],
      };
      const run = await runtime.start(plan, { n: 1 }, { runId: 'otel-worker' });
      expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    } finally {
      await runtime.close();
    }
    // The batch would wait 5 s: nothing is exported yet.
    expect(spansOf('otel-worker')).toEqual([]);
    worker.child.kill('SIGTERM');
    const done = await worker.done;
    expect(done.code, done.err).toBe(0);
    const spans = spansOf('otel-worker');
    expect(spans.map((s) => s.name).sort()).toEqual([
      'flujo.run',
      'flujo.step',
      'flujo.step',
      'flujo.step',
    ]);
    expect(new Set(spans.map((s) => s.traceId)).size).toBe(1);
  });
});

describe('an unreachable collector', () => {
  it('the command says it waits for the export, then ends as the run did', async () => {
    const r = await runFlujo(
      ['run', LINE, '--run-id', 'otel-down'],
      otelEnv({
        OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:9',
        OTEL_EXPORTER_OTLP_TIMEOUT: '3000',
      }),
    );
    expect(r.code, r.err).toBe(0);
    expect(r.out).toContain('run otel-down succeeded');
    expect(r.err).toContain(
      'flujo: still exporting spans to the OpenTelemetry collector; waiting for it at most 3000 ms',
    );
  });
});

describe('variables flujo cannot honour', () => {
  it.each([
    [{ OTEL_TRACES_EXPORTER: 'zipkin' }, 'OTEL_TRACES_EXPORTER="zipkin" names "zipkin"'],
    [{ OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' }, 'set OTEL_EXPORTER_OTLP_PROTOCOL=http/json'],
  ])('%j: exit 2 naming the variable, no run written', async (vars, message) => {
    const r = await runFlujo(['run', GATED, '--run-id', 'otel-bad'], otelEnv(vars));
    expect(r.code).toBe(2);
    expect(r.err).toContain(message);
    const redis = connect();
    try {
      expect(await redis.keys(`${prefix}:*`)).toEqual([]);
    } finally {
      redis.disconnect();
    }
  });

  it('the SDK is loaded only when a variable asks for traces', async () => {
    // The packages of the SDK a child loaded (the API is loaded by every command).
    const sdkLoaded = async (env: Record<string, string>) => {
      const log = join(dir, `imports-${randomUUID()}.log`);
      const r = await runFlujo(['run', LINE], {
        prefix,
        nodeArgs: [`--import=${IMPORT_LOG}`],
        env: { IMPORT_LOG: log, ...env },
      });
      expect(r.code, r.err).toBe(0);
      const urls = readFileSync(log, 'utf8').split('\n');
      return urls.some((u) => /\/@opentelemetry\/sdk-trace-node\//.test(u));
    };
    // A service name alone asks for nothing.
    expect(await sdkLoaded({ OTEL_SERVICE_NAME: 'mail-service' })).toBe(false);
    expect(posts).toEqual([]);
    expect(await sdkLoaded({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${endpoint}/v1/traces` })).toBe(
      true,
    );
    expect(posts.length).toBeGreaterThan(0);
  }, 60_000);
});
