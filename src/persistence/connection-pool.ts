import type { Redis } from 'ioredis';
import { InvariantError } from '../errors.js';

interface Waiter {
  resolve(conn: Redis): void;
  reject(error: unknown): void;
}

/**
 * Dedicated connections for transactions, created lazily up to `size`. A connection is only ever
 * handed back idle (no WATCH active); one whose state is unknown after a failure is discarded.
 */
export class ConnectionPool {
  readonly #source: Redis;
  readonly #size: number;
  readonly #idle: Redis[] = [];
  readonly #all = new Set<Redis>();
  readonly #waiters: Waiter[] = [];
  readonly #lastErrors = new WeakMap<Redis, Error>();
  #closed = false;

  constructor(source: Redis, size: number) {
    this.#source = source;
    this.#size = size;
  }

  /** An idle connection now, or undefined when the caller must wait with {@link acquire}. */
  tryAcquire(): Redis | undefined {
    if (this.#closed) return undefined;
    const idle = this.#idle.pop();
    if (idle !== undefined) return idle;
    return this.#all.size < this.#size ? this.#open() : undefined;
  }

  acquire(): Promise<Redis> {
    if (this.#closed) return Promise.reject(new InvariantError('the snapshot store is closed'));
    const conn = this.tryAcquire();
    if (conn !== undefined) return Promise.resolve(conn);
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }

  release(conn: Redis): void {
    if (!this.#all.has(conn)) return;
    const waiter = this.#waiters.shift();
    if (waiter !== undefined) waiter.resolve(conn);
    else this.#idle.push(conn);
  }

  /** Hands `conn` back once `unwatch` has settled; discards it if UNWATCH failed. */
  releaseAfter(conn: Redis, unwatch: Promise<unknown>): void {
    unwatch.then(
      () => this.release(conn),
      () => this.discard(conn),
    );
  }

  discard(conn: Redis): void {
    if (!this.#all.delete(conn)) return;
    conn.disconnect();
    const waiter = this.#waiters.shift();
    if (waiter !== undefined) {
      const fresh = this.tryAcquire();
      if (fresh === undefined) this.#waiters.unshift(waiter);
      else waiter.resolve(fresh);
    }
  }

  /** The last 'error' event of `conn` (e.g. `connect ECONNREFUSED`), for messages. */
  lastError(conn: Redis): Error | undefined {
    return this.#lastErrors.get(conn);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const w of this.#waiters.splice(0))
      w.reject(new InvariantError('the snapshot store is closed'));
    const conns = [...this.#all];
    this.#all.clear();
    this.#idle.length = 0;
    await Promise.all(
      conns.map(async (conn) => {
        if (conn.status !== 'ready') return conn.disconnect();
        try {
          await conn.quit();
        } catch {
          conn.disconnect();
        }
      }),
    );
  }

  #open(): Redis {
    const conn = this.#source.duplicate();
    // Failures reach the caller through the command that failed; this keeps the cause for the
    // message (and without a listener ioredis would log).
    conn.on('error', (error: Error) => this.#lastErrors.set(conn, error));
    this.#all.add(conn);
    return conn;
  }
}
