/**
 * Waits for new entries of many streams on one dedicated connection: a single `XREAD BLOCK 0` over
 * every watched stream, restarted with `CLIENT UNBLOCK` (from the shared connection) when the set of
 * streams changes. A waiter costs no command while nothing happens, whatever the number of
 * waiters and however long they wait; each batch of new entries costs one read.
 *
 * On Redis Cluster one command may only name keys of one slot (the keys of different runs live in
 * different slots): the watched streams are grouped by slot, and each group has its own `XREAD`
 * on a connection of its own to the master serving that slot (opened while the slot is watched,
 * closed when it is not). After a failover or a moved slot the group reconnects to the slot's
 * master as the cluster client then knows it.
 */
import type { Cluster, Redis } from 'ioredis';
import { isCluster } from './connection.js';
import { keySlot } from './key-slot.js';

/** A raw stream entry: its id and its flat field list. */
export type StreamEntry = [id: string, fields: string[]];

/** Watches streams for entries after a given id. */
export interface StreamWatcher {
  /**
   * Calls `onEntries` with each batch of entries of `key` after `after` (exclusive), in order,
   * until the returned function is called; `onClosed` when the watcher closes first.
   */
  watch(
    key: string,
    after: string,
    onEntries: (entries: StreamEntry[]) => void,
    onClosed?: () => void,
  ): () => void;
  /** Resolves once `key` has an entry after `after`, or when `signal` aborts or the watcher closes. */
  next(key: string, after: string, signal?: AbortSignal): Promise<void>;
  /** Disconnects its connection and tells the watchers left (`onClosed`). */
  close(): void;
}

interface Watch {
  after: string;
  onEntries: (entries: StreamEntry[]) => void;
  onClosed: (() => void) | undefined;
}

/** Orders stream ids `<ms>-<seq>`. */
export function compareStreamIds(a: string, b: string): number {
  const [am = 0, as = 0] = a.split('-').map(Number);
  const [bm = 0, bs = 0] = b.split('-').map(Number);
  return am !== bm ? am - bm : as - bs;
}

/**
 * Creates a {@link StreamWatcher}; `redis` sends the unblocks, a duplicate of it blocks (on a
 * Cluster, one connection per watched slot: see the module comment).
 */
export function createStreamWatcher(redis: Redis): StreamWatcher {
  if (isCluster(redis)) return createClusterWatcher(redis);
  return createGroupWatcher({
    // Its reads block on purpose: no command timeout (the runtime's clients have one). And no
    // reconnecting: ioredis sends a command still pending when its connection drops again on the
    // next one, where a read would block under a client id the watcher does not know (no change
    // of the watched set could unblock it, and a stream watched from then on would wait for an
    // entry of one watched before). A connection that drops fails its read, and the next read
    // goes out on a new connection (`reopen`).
    open: () =>
      redis.duplicate({
        maxRetriesPerRequest: null,
        enableOfflineQueue: true,
        commandTimeout: undefined,
        retryStrategy: () => null,
      }),
    unblock: async (id) => Number(await redis.client('UNBLOCK', id)),
    reopen: () => true,
  });
}

/** How one group of streams (all of them on one server; one slot's on a cluster) is read. */
interface GroupConnection {
  /** Opens the connection the group's reads block on; throws when it cannot be opened now. */
  open(): Redis;
  /** Unblocks the read of the client with id `id` from another connection to the same server. */
  unblock(id: number, conn: Redis): Promise<number>;
  /**
   * After a failed read: true to close the connection and open another for the next try (a
   * cluster's slot may be served elsewhere now); else ioredis reconnects it.
   */
  reopen?(): boolean;
  /** Called when the last watch of the group is removed. */
  idle?(): void;
}

/** A watcher whose streams are all read by one `XREAD` on one connection. */
function createGroupWatcher(group: GroupConnection): StreamWatcher {
  const failed = () => {
    if (group.reopen?.() !== true) return;
    conn?.disconnect();
    conn = undefined;
    connId = undefined;
  };
  const watches = new Map<string, Set<Watch>>();
  let conn: Redis | undefined;
  let connId: number | undefined;
  let looping = false;
  let closed = false;
  // Bumped on every change of the watched set: a read of an older generation is out of date.
  let generation = 0;
  let reading: number | null = null;

  const connection = (): Redis => {
    if (conn === undefined) {
      const opened = group.open();
      conn = opened;
      opened.on('error', () => {});
      opened.on('close', () => {
        if (conn === opened) connId = undefined;
      });
    }
    return conn;
  };

  async function loop(): Promise<void> {
    if (looping) return;
    looping = true;
    try {
      while (!closed && watches.size > 0) {
        let c: Redis;
        try {
          c = connection();
          connId ??= await c.client('ID');
        } catch {
          if (closed) return;
          failed();
          await new Promise((ok) => setTimeout(ok, 100));
          continue;
        }
        // Read after the await above: a watch added meanwhile is in this read.
        const gen = generation;
        const keys = [...watches.keys()];
        const ids = keys.map((k) => {
          let min: string | undefined;
          for (const w of watches.get(k) ?? []) {
            if (min === undefined || compareStreamIds(w.after, min) < 0) min = w.after;
          }
          return min ?? '0-0';
        });
        let reply: unknown;
        try {
          connId ??= await c.client('ID');
          reading = gen;
          // The typed method: ioredis's generic `call` reshapes a one-stream reply.
          const xread = c.xread.bind(c) as unknown as (...args: string[]) => Promise<unknown>;
          reply = await xread('BLOCK', '0', 'STREAMS', ...keys, ...ids);
        } catch {
          reading = null;
          if (closed) return;
          // Connection trouble: ioredis reconnects (or the group reopens); try again shortly.
          failed();
          await new Promise((ok) => setTimeout(ok, 100));
          continue;
        }
        reading = null;
        if (reply === null) continue; // unblocked: the watched set changed
        for (const [key, entries] of reply as [string, StreamEntry[]][]) {
          for (const w of [...(watches.get(key) ?? [])]) {
            const fresh = entries.filter(([id]) => compareStreamIds(id, w.after) > 0);
            if (fresh.length === 0) continue;
            w.after = fresh[fresh.length - 1]![0];
            w.onEntries(fresh);
          }
        }
      }
    } finally {
      looping = false;
    }
  }

  /** Restarts a read that is out of date (the unblock may reach Redis before the read: retried). */
  function kick(tries = 0): void {
    const id = connId;
    const c = conn;
    if (reading === null || reading === generation || id === undefined || c === undefined) return;
    if (closed) return;
    group.unblock(id, c).then(
      (n) => {
        if (n === 0 && tries < 100) setTimeout(() => kick(tries + 1), 1);
      },
      () => {},
    );
  }

  function watch(
    key: string,
    after: string,
    onEntries: (entries: StreamEntry[]) => void,
    onClosed?: () => void,
  ): () => void {
    const w: Watch = { after, onEntries, onClosed };
    let set = watches.get(key);
    if (set === undefined) {
      set = new Set();
      watches.set(key, set);
      generation++;
    }
    const isNewLow = [...set].every((o) => compareStreamIds(after, o.after) < 0);
    set.add(w);
    if (isNewLow && set.size > 1) generation++;
    if (looping) kick();
    else void loop();
    return () => {
      const s = watches.get(key);
      if (s === undefined || !s.delete(w)) return;
      if (s.size === 0) watches.delete(key);
      if (watches.size === 0) group.idle?.();
    };
  }

  return {
    watch,
    next(key, after, signal) {
      return new Promise((resolve) => {
        if (signal?.aborted === true) return resolve();
        const done = () => {
          unwatch();
          signal?.removeEventListener('abort', done);
          resolve();
        };
        const unwatch = watch(key, after, done, done);
        signal?.addEventListener('abort', done, { once: true });
      });
    },
    close() {
      closed = true;
      const left = [...watches.values()].flatMap((set) => [...set]);
      watches.clear();
      for (const w of left) w.onClosed?.();
      conn?.disconnect();
      conn = undefined;
    },
  };
}

/** How long a cluster watcher keeps the connection of a slot nobody watches any more, in ms. */
const IDLE_CLOSE_MS = 1000;

/** A watcher over a Redis Cluster: one {@link createGroupWatcher} per watched slot. */
function createClusterWatcher(cluster: Cluster): StreamWatcher {
  const groups = new Map<number, StreamWatcher>();
  /** Watches per slot: a slot watched again soon (the next wait of a run) keeps its connection. */
  const counts = new Map<number, number>();
  let closed = false;
  /** `host:port` of the master serving `slot`, as the cluster client knows it now. */
  const masterOf = (slot: number): string => {
    const node = cluster.slots[slot]?.[0];
    if (node === undefined) {
      if (cluster.status === 'wait') cluster.connect().catch(() => {});
      else cluster.refreshSlotsCache();
      throw new Error(`no node known for slot ${slot} yet`);
    }
    return node;
  };
  const nodeConnection = (address: string): Redis | undefined =>
    cluster.nodes('all').find((n) => `${n.options.host}:${n.options.port}` === address);
  const groupOf = (slot: number): StreamWatcher => {
    let group = groups.get(slot);
    if (group !== undefined) return group;
    let address = '';
    group = createGroupWatcher({
      open: () => {
        address = masterOf(slot);
        const node = nodeConnection(address);
        if (node === undefined) {
          cluster.refreshSlotsCache();
          throw new Error(`no connection to ${address} yet`);
        }
        // A copy of the cluster's own connection to that master (its address as mapped, its
        // credentials and TLS), for reads that block on purpose: no command timeout, and no
        // reconnecting to a node that may be gone (the next try asks where the slot is now).
        return node.duplicate({
          maxRetriesPerRequest: null,
          enableOfflineQueue: true,
          commandTimeout: undefined,
          retryStrategy: () => null,
          readOnly: false,
          lazyConnect: false,
        });
      },
      async unblock(id, conn) {
        const node = nodeConnection(address);
        if (node !== undefined) return Number(await node.client('UNBLOCK', id));
        // No connection of the cluster's to that node: a new connection ends the read as well.
        conn.disconnect(true);
        return 1;
      },
      reopen: () => {
        cluster.refreshSlotsCache();
        return true;
      },
      idle: () => {
        // Closed a second after its last watch went, unless watched again meanwhile.
        setTimeout(() => {
          if (groups.get(slot) !== group || (counts.get(slot) ?? 0) > 0) return;
          groups.delete(slot);
          group?.close();
        }, IDLE_CLOSE_MS).unref();
      },
    });
    groups.set(slot, group);
    return group;
  };
  return {
    watch(key, after, onEntries, onClosed) {
      if (closed) {
        onClosed?.();
        return () => {};
      }
      const slot = keySlot(key);
      counts.set(slot, (counts.get(slot) ?? 0) + 1);
      let counted = true;
      const uncount = () => {
        if (!counted) return;
        counted = false;
        const n = (counts.get(slot) ?? 1) - 1;
        if (n > 0) counts.set(slot, n);
        else counts.delete(slot);
      };
      const unwatch = groupOf(slot).watch(key, after, onEntries, () => {
        uncount();
        onClosed?.();
      });
      return () => {
        uncount();
        unwatch();
      };
    },
    next(key, after, signal) {
      if (closed) return Promise.resolve();
      return new Promise((resolve) => {
        if (signal?.aborted === true) return resolve();
        const done = () => {
          unwatch();
          signal?.removeEventListener('abort', done);
          resolve();
        };
        const unwatch = this.watch(key, after, done, done);
        signal?.addEventListener('abort', done, { once: true });
      });
    },
    close() {
      closed = true;
      const all = [...groups.values()];
      groups.clear();
      for (const g of all) g.close();
    },
  };
}
