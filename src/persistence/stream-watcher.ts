/**
 * Waits for new entries of many streams on one dedicated connection: a single `XREAD BLOCK 0` over
 * every watched stream, restarted with `CLIENT UNBLOCK` (from the shared connection) when the set of
 * streams changes. A waiter costs no command while nothing happens, whatever the number of
 * waiters and however long they wait; each batch of new entries costs one read.
 *
 * Every watched key is read in one command: on Redis Cluster the read would have to be split by
 * slot (keys of different runs live in different slots), which this watcher does not do.
 */
import type { Redis } from 'ioredis';

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

/** Creates a {@link StreamWatcher}; `redis` sends the unblocks, a duplicate of it blocks. */
export function createStreamWatcher(redis: Redis): StreamWatcher {
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
      // Its reads block on purpose: no command timeout (the runtime's clients have one).
      conn = redis.duplicate({
        maxRetriesPerRequest: null,
        enableOfflineQueue: true,
        commandTimeout: undefined,
      });
      conn.on('error', () => {});
      conn.on('close', () => {
        connId = undefined;
      });
    }
    return conn;
  };

  async function loop(): Promise<void> {
    if (looping) return;
    looping = true;
    try {
      while (!closed && watches.size > 0) {
        const c = connection();
        try {
          connId ??= await c.client('ID');
        } catch {
          if (closed) return;
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
          // Connection trouble: ioredis reconnects; try again shortly.
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
    if (reading === null || reading === generation || id === undefined || closed) return;
    redis.client('UNBLOCK', id).then(
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
