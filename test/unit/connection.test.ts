import { Cluster, Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import {
  duplicateClient,
  isClusterUrl,
  maskClusterUrl,
  openRedis,
  parseClusterUrl,
} from '../../src/persistence/connection.js';
import { hashTagOf, keySlot } from '../../src/persistence/key-slot.js';
import { createKeys } from '../../src/persistence/keys.js';
import {
  classifyRedisError,
  describeRedisTarget,
  isConnectionError,
} from '../../src/persistence/redis-errors.js';
import { maskRedisUrl } from '../../src/cli/context.js';

describe('the cluster URL form', () => {
  it('parses seed nodes, credentials and TLS', () => {
    expect(isClusterUrl('redis+cluster://127.0.0.1:7000')).toBe(true);
    expect(isClusterUrl('redis://127.0.0.1:7000')).toBe(false);
    expect(parseClusterUrl('redis+cluster://127.0.0.1:7000,127.0.0.1:7001')).toEqual({
      nodes: [
        { host: '127.0.0.1', port: 7000 },
        { host: '127.0.0.1', port: 7001 },
      ],
      username: undefined,
      password: undefined,
      tls: false,
    });
    expect(parseClusterUrl('rediss+cluster://ana:p%40ss@a.example:7000,[::1]:7001,b')).toEqual({
      nodes: [
        { host: 'a.example', port: 7000 },
        { host: '::1', port: 7001 },
        { host: 'b', port: 6379 },
      ],
      username: 'ana',
      password: 'p@ss',
      tls: true,
    });
    expect(parseClusterUrl('redis+cluster://:secret@h:1').password).toBe('secret');
  });

  it('refuses what does not parse, naming the form', () => {
    expect(() => parseClusterUrl('redis+cluster://h:1,:x')).toThrow(/redis\+cluster:\/\//);
    expect(() => parseClusterUrl('redis+cluster://h:99999')).toThrow(/no valid port/);
    expect(() => parseClusterUrl('redis+cluster://h:1/0')).toThrow(/not a cluster URL/);
  });

  it('masks the password', () => {
    expect(maskClusterUrl('redis+cluster://ana:secret@h:1,h:2', '***')).toBe(
      'redis+cluster://ana:***@h:1,h:2',
    );
    expect(maskRedisUrl('rediss+cluster://:secret@h:1')).toBe('rediss+cluster://:***@h:1');
    expect(maskRedisUrl('redis+cluster://h:1,h:2')).toBe('redis+cluster://h:1,h:2');
  });

  it('opens a Cluster for the cluster form and a Redis otherwise; duplicates keep their options', () => {
    const cluster = openRedis('redis+cluster://127.0.0.1:1,127.0.0.1:2', {
      timeoutMs: 500,
      lazyConnect: true,
    }) as unknown as Cluster;
    const single = openRedis('redis://127.0.0.1:1', { timeoutMs: 500, lazyConnect: true });
    try {
      expect(cluster).toBeInstanceOf(Cluster);
      expect(cluster.options.redisOptions?.commandTimeout).toBe(500);
      expect(single).toBeInstanceOf(Redis);
      expect(single.options.commandTimeout).toBe(500);
      const dup = duplicateClient(cluster, {
        maxRetriesPerRequest: null,
        commandTimeout: undefined,
      }) as unknown as Cluster;
      expect(dup).toBeInstanceOf(Cluster);
      expect(dup.options.redisOptions?.maxRetriesPerRequest).toBeNull();
      expect(dup.options.redisOptions?.commandTimeout).toBeUndefined();
      const seeds = (c: Cluster) => (c as unknown as { startupNodes: unknown }).startupNodes;
      expect(seeds(dup)).toEqual(seeds(cluster));
      expect(describeRedisTarget(cluster as unknown as Redis)).toBe(
        'redis+cluster://127.0.0.1:1,127.0.0.1:2',
      );
      dup.disconnect();
    } finally {
      cluster.disconnect();
      single.disconnect();
    }
  });
});

describe('key slots', () => {
  it('hashes the hash tag as Redis does (CLUSTER KEYSLOT)', () => {
    // Values printed by CLUSTER KEYSLOT on Redis 7.
    expect(keySlot('foo')).toBe(12182);
    expect(keySlot('{user1000}.following')).toBe(keySlot('user1000'));
    expect(keySlot('123456789')).toBe(0x31c3 % 16384);
    expect(hashTagOf('a{}b')).toBe('a{}b');
    expect(hashTagOf('a{b}{c}')).toBe('b');
  });

  it('puts every key of a run in one slot', () => {
    const k = createKeys('flujo');
    const run = 'run-1';
    const slot = keySlot(k.snap(run));
    for (const key of [
      k.events(run),
      k.status(run),
      k.outputs(run),
      k.ledger(run, 'acme'),
      k.journal(run),
      k.history(run, 'step-1'),
      k.blob(run, 'a'.repeat(64)),
      k.meta(run),
      k.started(run),
      k.removed(run),
    ]) {
      expect(keySlot(key)).toBe(slot);
    }
    expect(keySlot(k.runIndex())).toBe(keySlot(k.runInfo()));
    expect(keySlot(k.runUsage('acme', run))).toBe(keySlot(k.tenantQuota('acme')));
    // The runs that ended lately sit beside the active runs: one script moves a run between them.
    for (const prefix of ['flujo', 't-1', 'a:b']) {
      const p = createKeys(prefix);
      expect(keySlot(p.endedRuns())).toBe(keySlot(p.activeRuns()));
    }
  });
});

describe('cluster errors', () => {
  it('are retryable connection-level errors', () => {
    for (const message of [
      'MOVED 3999 127.0.0.1:7001',
      'ASK 3999 127.0.0.1:7001',
      'CLUSTERDOWN The cluster is down',
      'CLUSTERDOWN Hash slot not served',
      'TRYAGAIN Multiple keys request during rehashing of slot',
      'Too many Cluster redirections. Last error: Error: CLUSTERDOWN The cluster is down',
      'Failed to refresh slots cache.',
      "Cluster isn't ready and enableOfflineQueue options is false",
    ]) {
      expect(isConnectionError(new Error(message)), message).toBe(true);
    }
    expect(
      isConnectionError(new Error('CROSSSLOT Keys in request do not hash to the same slot')),
    ).toBe(false);
  });

  it('name the cluster and its nodes', () => {
    const cluster = new Cluster([{ host: '127.0.0.1', port: 7000 }], { lazyConnect: true });
    try {
      const error = classifyRedisError(
        new Error('CLUSTERDOWN The cluster is down'),
        cluster,
      ) as Error;
      expect(error.name).toBe('RedisUnavailableError');
      expect(error.message).toContain('redis+cluster://127.0.0.1:7000');
    } finally {
      cluster.disconnect();
    }
  });
});
