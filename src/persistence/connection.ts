/**
 * Opening and duplicating the runtime's Redis clients: a single server (an ioredis `Redis`) or a
 * Redis Cluster (an ioredis `Cluster`), given as a client or as a URL.
 *
 * The cluster URL form names several seed nodes (any of the cluster's nodes; the client learns
 * the rest from them), with optional credentials:
 *
 *     redis+cluster://[user[:password]@]host:port[,host:port…]
 *     rediss+cluster://…      (the same over TLS)
 *
 * Every other URL (`redis://`, `rediss://`) opens a single server, as ioredis reads it.
 */
import {
  Cluster,
  Redis,
  type ChainableCommander,
  type ClusterOptions,
  type RedisOptions,
} from 'ioredis';
import { InputValidationError } from '../errors.js';
import { keySlot } from './key-slot.js';
import { redisClientOptions } from './redis-errors.js';

/** A client the runtime accepts: one server or a cluster. */
export type RedisClient = Redis | Cluster;

/** True when `client` is an ioredis `Cluster`. */
export function isCluster(client: unknown): client is Cluster {
  return (
    typeof client === 'object' &&
    client !== null &&
    (client as { isCluster?: unknown }).isCluster === true
  );
}

/** A parsed cluster URL. */
export interface ClusterUrl {
  nodes: { host: string; port: number }[];
  username: string | undefined;
  password: string | undefined;
  tls: boolean;
}

const CLUSTER_URL = /^(rediss?)\+cluster:\/\/(?:([^@/?#]*)@)?([^/?#]+)\/?$/i;

/** True when `url` uses the cluster form (`redis+cluster://…` or `rediss+cluster://…`). */
export function isClusterUrl(url: string): boolean {
  return /^rediss?\+cluster:\/\//i.test(url);
}

function badClusterUrl(message: string): never {
  throw new InputValidationError('Redis URL', [
    {
      path: 'redis',
      message: `${message}; a cluster URL looks like redis+cluster://user:password@127.0.0.1:7000,127.0.0.1:7001 (rediss+cluster:// for TLS)`,
    },
  ]);
}

/** Parses a cluster URL (see the module comment); throws `InputValidationError` naming what is wrong. */
export function parseClusterUrl(url: string): ClusterUrl {
  const m = CLUSTER_URL.exec(url);
  if (m === null) return badClusterUrl('not a cluster URL');
  const scheme = m[1]!;
  const userinfo = m[2];
  const hostList = m[3]!;
  let username: string | undefined;
  let password: string | undefined;
  if (userinfo !== undefined && userinfo !== '') {
    const colon = userinfo.indexOf(':');
    const user = colon < 0 ? userinfo : userinfo.slice(0, colon);
    const pass = colon < 0 ? undefined : userinfo.slice(colon + 1);
    try {
      username = user === '' ? undefined : decodeURIComponent(user);
      password = pass === undefined || pass === '' ? undefined : decodeURIComponent(pass);
    } catch {
      return badClusterUrl('the credentials are not URL-encoded');
    }
  }
  const nodes = hostList.split(',').map((part) => {
    const hp = /^(\[[0-9a-fA-F:.]+\]|[^:[\]]+)(?::(\d{1,5}))?$/.exec(part);
    if (hp === null) return badClusterUrl(`"${part}" is not a host:port`);
    const port = hp[2] === undefined ? 6379 : Number(hp[2]);
    if (port < 1 || port > 65535) return badClusterUrl(`"${part}" has no valid port`);
    return { host: hp[1]!.replace(/^\[|\]$/g, ''), port };
  });
  return { nodes, username, password, tls: scheme.toLowerCase() === 'rediss' };
}

/** `url` with its password replaced by `mask` (a cluster URL as well as a single server's). */
export function maskClusterUrl(url: string, mask: string): string {
  const m = CLUSTER_URL.exec(url);
  if (m === null || m[2] === undefined || !m[2].includes(':')) return url;
  const user = m[2].slice(0, m[2].indexOf(':'));
  return `${m[1]}+cluster://${user}:${mask}@${m[3]}`;
}

/** What a client the runtime opens needs (see `redisClientOptions`). */
export interface OpenOptions {
  /** How long a call may go unanswered, in ms. */
  timeoutMs: number;
  /** Clients that ride out an outage reconnect forever; short commands give up. @defaultValue 'forever' */
  reconnect?: 'forever' | 'briefly';
  /** Connect on the first command rather than at once. @defaultValue false */
  lazyConnect?: boolean;
  /** Commands given while not connected fail at once instead of waiting. @defaultValue queued */
  enableOfflineQueue?: boolean;
}

/**
 * The options of a Cluster opened from a cluster URL: each node's connection gets the bounded
 * options of a single server's client, and the cluster as a whole retries redirections and a
 * cluster that is down or failing over for about the timeout before a command fails.
 */
function openCluster(parsed: ClusterUrl, o: OpenOptions): Cluster {
  const { retryStrategy, ...perNode } = redisClientOptions(o.timeoutMs, {
    reconnect: o.reconnect ?? 'forever',
  });
  return new Cluster(parsed.nodes, {
    redisOptions: {
      ...perNode,
      ...(parsed.username === undefined ? {} : { username: parsed.username }),
      ...(parsed.password === undefined ? {} : { password: parsed.password }),
      ...(parsed.tls ? { tls: {} } : {}),
    },
    clusterRetryStrategy: retryStrategy,
    slotsRefreshTimeout: Math.max(1000, o.timeoutMs),
    retryDelayOnFailover: 100,
    retryDelayOnClusterDown: 100,
    retryDelayOnTryAgain: 100,
    ...(o.lazyConnect === undefined ? {} : { lazyConnect: o.lazyConnect }),
    ...(o.enableOfflineQueue === undefined ? {} : { enableOfflineQueue: o.enableOfflineQueue }),
  });
}

/**
 * Opens a client for `url`: a `Cluster` for the cluster URL form, else a `Redis`. It is typed
 * `Redis` for the runtime's stores, which use only the commands, scripts, pipelines and
 * transactions both clients share; what differs (duplicating, the socket, describing the target)
 * goes through this module. Throws `InputValidationError` for a cluster URL that does not parse.
 */
export function openRedis(url: string, o: OpenOptions): Redis {
  if (isClusterUrl(url)) {
    const parsed = parseClusterUrl(url);
    return asCommandClient(openCluster(parsed, o));
  }
  return new Redis(url, {
    ...redisClientOptions(o.timeoutMs, { reconnect: o.reconnect ?? 'forever' }),
    ...(o.lazyConnect === undefined ? {} : { lazyConnect: o.lazyConnect }),
    ...(o.enableOfflineQueue === undefined ? {} : { enableOfflineQueue: o.enableOfflineQueue }),
  });
}

/**
 * A client as the runtime's stores take it (see {@link openRedis}): a `Cluster` is used through
 * the command interface it shares with `Redis`.
 */
export function asCommandClient(client: RedisClient): Redis {
  return client as Redis;
}

/**
 * A new client to the same server or cluster with `overrides` on every connection. `Redis`'s own
 * `duplicate(options)` does this for a single server; a `Cluster`'s `duplicate()` takes startup
 * nodes first and cluster options second, so options given as for a single server would be
 * dropped: here they go into its `redisOptions` (what each node's connection is opened with).
 * BullMQ needs `maxRetriesPerRequest: null` on its connections: the runtime passes it here.
 */
export function duplicateClient(client: RedisClient, overrides: RedisOptions = {}): Redis {
  if (isCluster(client)) {
    const { enableOfflineQueue, ...perNode } = overrides;
    const options: ClusterOptions = {
      redisOptions: { ...client.options.redisOptions, ...perNode },
      ...(enableOfflineQueue === undefined ? {} : { enableOfflineQueue }),
    };
    // ioredis types the options of `duplicate()` more narrowly than those of a Cluster it makes.
    const cluster = client.duplicate([], options as Parameters<Cluster['duplicate']>[1]);
    return asCommandClient(cluster);
  }
  return client.duplicate(overrides);
}

/**
 * Sends one command per key (`add` queues it on the pipeline it is given) in as few round trips
 * as the client allows: one pipeline on a single server; on a Cluster one pipeline per slot, sent
 * at once (a Cluster pipeline may only hold keys of slots one node serves, and which node serves
 * which slot changes with a failover). Like a pipeline's `exec()`, it rejects when a pipeline
 * could not be sent, not for the error reply of one of its commands.
 */
export async function pipelineByKey(
  redis: Redis,
  keys: readonly string[],
  add: (pipeline: ChainableCommander, key: string) => void,
): Promise<void> {
  if (keys.length === 0) return;
  const groups = new Map<number, string[]>();
  if (isCluster(redis)) {
    for (const key of keys) {
      const slot = keySlot(key);
      const group = groups.get(slot);
      if (group === undefined) groups.set(slot, [key]);
      else group.push(key);
    }
  } else {
    groups.set(0, [...keys]);
  }
  await Promise.all(
    [...groups.values()].map((group) => {
      const pipeline = redis.pipeline();
      for (const key of group) add(pipeline, key);
      return pipeline.exec();
    }),
  );
}
