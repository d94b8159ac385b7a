/**
 * What an agent's model is sent: the conversation, truncated middle-out to the step's
 * `historyMaxTokens` (the system prompt included), with the tool results that were offloaded to
 * blobs put back. The stored history is never changed: this only shapes one request.
 *
 * Token counts are kept per message (a history is append-only, so a message is counted once), and
 * a message holding a blob reference is counted from the reference's size, so truncation is
 * deterministic whether or not a blob is still there, and only the blobs of the messages that are
 * sent are read (through a small cache of recent blobs).
 */
import { BlobMissingError } from '../errors.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { truncateMiddleOut } from '../agents/truncate.js';
import type { Logger } from '../logging.js';
import type { ChatMessage } from '../llm/messages.js';
import { CHARS_PER_TOKEN, REPLY_PRIMING_TOKENS, type TokenCounter } from '../llm/tokens.js';
import type { AgentStep } from '../plan/schema.js';
import {
  BLOB_REF_PATTERN,
  missingBlobMarker,
  parseBlobRefs,
  type BlobStore,
} from '../persistence/blob-store.js';
import { canRerunInDoubt } from '../tools/define-tool.js';

/** Options of {@link createModelContext}. */
export interface ModelContextOptions {
  counterFor: (model: string) => TokenCounter;
  /** Where offloaded tool results are read back from (granular steps). */
  blobs?: BlobStore;
  log: Logger;
  /** Bytes of blob content kept in memory between turns. @defaultValue 32 MiB */
  blobCacheBytes?: number;
}

/** Builds the messages of one model request. */
export interface ModelContext {
  /** The messages to send after the system prompt, for `step` of `runId`. */
  prepare(args: {
    agent: AgentDefinition;
    step: AgentStep;
    runId: string;
    messages: readonly ChatMessage[];
  }): Promise<ChatMessage[]>;
}

const REF_MARK = '<<FL_BLOB_REF:';

/** Creates a {@link ModelContext}. */
export function createModelContext(options: ModelContextOptions): ModelContext {
  const { counterFor, blobs, log } = options;
  const counts = new WeakMap<ChatMessage, number>();
  const cache = new BlobCache(options.blobCacheBytes ?? 32 * 1024 * 1024);

  const count = (counter: TokenCounter, message: ChatMessage): number => {
    let n = counts.get(message);
    if (n === undefined) {
      const content = message.content;
      if (content !== null && content.includes(REF_MARK)) {
        // The reference's size stands in for the blob: deterministic, and nothing to read.
        const refs = parseBlobRefs(content);
        const rest = content.replace(BLOB_REF_PATTERN, '');
        n = counter.countMessage({ ...message, content: rest });
        for (const ref of refs) n += Math.ceil(ref.size / CHARS_PER_TOKEN);
      } else {
        n = counter.countMessage(message);
      }
      counts.set(message, n);
    }
    return n;
  };

  async function rehydrate(
    message: ChatMessage,
    where: {
      runId: string;
      step: AgentStep;
      agent: AgentDefinition;
      toolOf: (id: string) => string | null;
    },
  ): Promise<ChatMessage> {
    const content = message.content;
    if (content === null || !content.includes(REF_MARK)) return message;
    let text = '';
    let from = 0;
    for (const ref of parseBlobRefs(content)) {
      text += content.slice(from, ref.index);
      from = ref.index + ref.ref.length;
      let blob = cache.get(ref.id);
      if (blob === undefined && blobs !== undefined) {
        blob = (await blobs.get(where.runId, ref.id)) ?? undefined;
        if (blob !== undefined) cache.put(ref.id, blob);
      }
      if (blob === undefined) {
        const tool = message.role === 'tool' ? where.toolOf(message.tool_call_id) : null;
        const definition = where.agent.tools.find((t) => t.name === tool);
        if (
          !where.step.degradedReplay ||
          definition === undefined ||
          !canRerunInDoubt(definition)
        ) {
          throw new BlobMissingError(where.runId, where.step.id, ref.id);
        }
        log.warn(
          { runId: where.runId, stepId: where.step.id, blobId: ref.id, tool, size: ref.size },
          'a blob of the history is missing: replaying with a marker in its place (degraded replay)',
        );
        blob = missingBlobMarker(ref.id, ref.size);
      }
      text += blob;
    }
    text += content.slice(from);
    return { ...message, content: text };
  }

  return {
    async prepare({ agent, step, runId, messages }) {
      const counter = counterFor(agent.model);
      const system =
        agent.systemPrompt === ''
          ? 0
          : counter.countMessage({ role: 'system', content: agent.systemPrompt });
      const budget = Math.max(1, step.historyMaxTokens - system - REPLY_PRIMING_TOKENS);
      const { messages: kept, omitted } = truncateMiddleOut(messages, {
        maxTokens: budget,
        count: (m) => count(counter, m),
      });
      if (omitted > 0) {
        log.debug(
          { runId, stepId: step.id, omitted, kept: kept.length },
          'history truncated middle-out for the model',
        );
      }
      const toolOf = (id: string): string | null => {
        for (const m of messages) {
          if (m.role !== 'assistant') continue;
          const call = m.tool_calls?.find((c) => c.id === id);
          if (call !== undefined) return call.name;
        }
        return null;
      };
      const out: ChatMessage[] = [];
      for (const m of kept) {
        // Most messages hold no blob reference: taken as they are, without a turn of the loop.
        out.push(
          m.content === null || !m.content.includes(REF_MARK)
            ? m
            : await rehydrate(m, { runId, step, agent, toolOf }),
        );
      }
      return out;
    },
  };
}

/** Recently read blob contents, least recently used out first, within a byte budget. */
class BlobCache {
  readonly #max: number;
  readonly #entries = new Map<string, string>();
  #bytes = 0;

  constructor(max: number) {
    this.#max = max;
  }

  get(id: string): string | undefined {
    const value = this.#entries.get(id);
    if (value !== undefined) {
      this.#entries.delete(id);
      this.#entries.set(id, value);
    }
    return value;
  }

  put(id: string, value: string): void {
    if (value.length > this.#max || this.#entries.has(id)) return;
    this.#entries.set(id, value);
    this.#bytes += value.length;
    while (this.#bytes > this.#max) {
      const [oldest, content] = this.#entries.entries().next().value as [string, string];
      this.#entries.delete(oldest);
      this.#bytes -= content.length;
    }
  }
}
