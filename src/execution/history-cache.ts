import type { ChatMessage } from '../llm/messages.js';
import type { HistoryStore } from '../persistence/history.js';

/**
 * The committed histories of granular agent steps a worker is driving, so a turn reads only the
 * messages committed since its last read. A history is append-only, so any prefix of it read once
 * stays true; entries are dropped least recently used first.
 */
export class HistoryCache {
  readonly #history: Pick<HistoryStore, 'read'>;
  readonly #max: number;
  readonly #entries = new Map<string, ChatMessage[]>();

  constructor(history: Pick<HistoryStore, 'read'>, max: number) {
    this.#history = history;
    this.#max = max;
  }

  /** Messages `[0, cursor)` of the step's history. */
  async read(runId: string, stepId: string, cursor: number): Promise<ChatMessage[]> {
    const key = `${runId}\n${stepId}`;
    let cached = this.#entries.get(key);
    this.#entries.delete(key);
    if (cached === undefined || cached.length > cursor) cached = [];
    if (cached.length < cursor) {
      const more = await this.#history.read(runId, stepId, {
        from: cached.length,
        to: cursor,
      });
      cached = [...cached, ...more];
    }
    this.#put(key, cached);
    return cached.slice();
  }

  /** Records messages a commit appended after `cursor`. */
  committed(runId: string, stepId: string, cursor: number, messages: readonly ChatMessage[]): void {
    const key = `${runId}\n${stepId}`;
    // A history committed from its start is known whole without a read.
    const cached = this.#entries.get(key) ?? (cursor === 0 ? [] : undefined);
    if (cached === undefined || cached.length !== cursor) return;
    this.#entries.delete(key);
    this.#put(key, [...cached, ...messages]);
  }

  #put(key: string, messages: ChatMessage[]): void {
    this.#entries.set(key, messages);
    if (this.#entries.size > this.#max) {
      const oldest = this.#entries.keys().next().value as string;
      this.#entries.delete(oldest);
    }
  }
}
