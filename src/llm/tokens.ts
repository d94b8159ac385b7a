/**
 * Token estimates for budgets and usage reservations, before a request is sent. Known OpenAI models
 * are counted with the tokenizer ranks bundled in js-tiktoken (never downloaded); any other model
 * gets a character heuristic. Estimates are deterministic: the same text gives the same count in
 * every process. The provider's reported usage stays the truth; these numbers only reserve.
 */
import { Tiktoken } from 'js-tiktoken/lite';
import cl100kBase from 'js-tiktoken/ranks/cl100k_base';
import o200kBase from 'js-tiktoken/ranks/o200k_base';
import type { ChatMessage } from './messages.js';
import { stripProviderPrefix } from './model-name.js';

/** A tokenizer encoding whose ranks ship with the runtime. */
export type TokenEncoding = 'o200k_base' | 'cl100k_base';

/**
 * Which models use which encoding, first match wins (after the provider prefix is stripped). A
 * family matches its own name and names that continue with `-` (snapshots, sizes) or `.` (point
 * releases of `gpt-5`), so `gpt-4o-mini` and `gpt-5.1` match but `gpt-40` and `o1x` do not:
 * - `o200k_base`: `gpt-4o`, `chatgpt-4o`, `gpt-4.1`, `gpt-4.5`, `gpt-5`, `o1`, `o3`, `o4`;
 * - `cl100k_base`: `gpt-4` (so `gpt-4-turbo`, `gpt-4-0613`, but not `gpt-4o` or `gpt-4.1`),
 *   `gpt-3.5-turbo`, `text-embedding-3`, `text-embedding-ada-002`.
 * Names are case-sensitive, as providers spell them.
 */
const ENCODING_RULES: readonly (readonly [RegExp, TokenEncoding])[] = [
  [/^(?:gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|o1|o3|o4)(?:$|[-.])/, 'o200k_base'],
  [/^(?:gpt-4|gpt-3\.5-turbo|text-embedding-3|text-embedding-ada-002)(?:$|-)/, 'cl100k_base'],
];

/** Framing of every message in OpenAI's chat format: `<|start|>`, `<|message|>`, `<|end|>`. */
export const TOKENS_PER_MESSAGE = 3;
/** The reply is primed with `<|start|>assistant<|message|>`. */
export const REPLY_PRIMING_TOKENS = 3;
/** Framing of one tool call in an assistant message; an estimate, providers do not document it. */
export const TOKENS_PER_TOOL_CALL = 3;
/** Characters per token of the heuristic used when no tokenizer is known for the model. */
export const CHARS_PER_TOKEN = 4;
/** Default output buffer of {@link estimateRequest} when the request sets no maximum. */
export const DEFAULT_OUTPUT_TOKENS = 1024;

/** The bundled encoding of a model, or null when the model is unknown. */
export function encodingForModel(model: string): TokenEncoding | null {
  const name = stripProviderPrefix(model);
  for (const [pattern, encoding] of ENCODING_RULES) {
    if (pattern.test(name)) return encoding;
  }
  return null;
}

const RANKS = { o200k_base: o200kBase, cl100k_base: cl100kBase } as const;
// Building an encoder parses ~200k ranks: do it once per encoding, for the whole process.
const encoders = new Map<TokenEncoding, Tiktoken>();

/** The process-wide encoder of an encoding, built on first use. @internal */
export function encoderFor(encoding: TokenEncoding): Tiktoken {
  let encoder = encoders.get(encoding);
  if (encoder === undefined) {
    encoder = new Tiktoken(RANKS[encoding]);
    encoders.set(encoding, encoder);
  }
  return encoder;
}

/** Whether the process-wide encoder of `encoding` is built. */
export function encodingLoaded(encoding: TokenEncoding): boolean {
  return encoders.has(encoding);
}

/** How long one slice of a background build may hold the event loop, in ms. */
const SLICE_MS = 5;
const yieldToLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/**
 * Builds an encoder as `new Tiktoken(ranks)` does, but a slice of its ranks at a time, yielding
 * to the event loop between slices, so that a process goes on serving while it builds (building
 * one at once holds the loop for a second or more). It fills the maps js-tiktoken encodes from;
 * a js-tiktoken without them gets its encoder built at once.
 */
async function buildInSlices(encoding: TokenEncoding): Promise<Tiktoken> {
  const ranks = RANKS[encoding];
  const encoder = new Tiktoken({ ...ranks, bpe_ranks: '' });
  const { rankMap, textMap } = encoder as unknown as { rankMap?: unknown; textMap?: unknown };
  if (!(rankMap instanceof Map) || !(textMap instanceof Map)) return new Tiktoken(ranks);
  let since = performance.now();
  for (const line of ranks.bpe_ranks.split('\n')) {
    if (line === '') continue;
    const [, offsetText, ...tokens] = line.split(' ');
    const offset = Number.parseInt(offsetText ?? '', 10);
    for (let i = 0; i < tokens.length; i++) {
      const bytes = new Uint8Array(Buffer.from(tokens[i]!, 'base64'));
      rankMap.set(bytes.join(','), offset + i);
      textMap.set(offset + i, bytes);
      if ((i & 1023) === 1023 && performance.now() - since > SLICE_MS) {
        await yieldToLoop();
        since = performance.now();
      }
    }
  }
  return encoder;
}

const building = new Map<TokenEncoding, Promise<void>>();

/**
 * Builds the encoders the models use, in the background (see {@link buildInSlices}); resolves
 * when they are built. A count asked for meanwhile builds its encoder at once, as without it.
 */
export function preloadTokenizers(models: Iterable<string>): Promise<void> {
  const pending: Promise<void>[] = [];
  for (const model of models) {
    const encoding = encodingForModel(model);
    if (encoding === null || encoders.has(encoding)) continue;
    let build = building.get(encoding);
    if (build === undefined) {
      build = buildInSlices(encoding)
        .then((encoder) => {
          if (!encoders.has(encoding)) encoders.set(encoding, encoder);
        })
        .finally(() => building.delete(encoding));
      building.set(encoding, build);
    }
    pending.push(build);
  }
  return Promise.all(pending).then(() => {});
}

/** Resolves when the background build of `model`'s encoder, if one is under way, has ended. */
export function tokenizerReady(model: string): Promise<void> {
  const encoding = encodingForModel(model);
  const build = encoding === null ? undefined : building.get(encoding);
  return build === undefined ? Promise.resolve() : build.catch(() => {});
}

/**
 * Pieces (the encoding's pre-split of a text) longer than this many UTF-16 code units are counted
 * in slices of this length. js-tiktoken merges a piece in quadratic time: 2,000 CJK characters
 * without punctuation take seconds as one piece, milliseconds in slices. Each cut may shift the
 * count by about one token; text without such pieces is counted exactly.
 */
export const LONG_PIECE_CHARS = 64;

function exactCounter(encoding: TokenEncoding): (text: string) => number {
  const encoder = encoderFor(encoding);
  // No special tokens: text that spells `<|endoftext|>` is counted as text, never refused.
  const encode = (text: string): number => encoder.encode(text, [], []).length;
  const pieces = new RegExp(RANKS[encoding].pat_str, 'gu');
  return (text) => {
    let tokens = 0;
    let start = 0;
    for (const match of text.matchAll(pieces)) {
      const piece = match[0];
      if (piece.length <= LONG_PIECE_CHARS) continue;
      // Text before the piece ends on a piece boundary, so it encodes as it would in place.
      if (match.index > start) tokens += encode(text.slice(start, match.index));
      for (const slice of slices(piece, LONG_PIECE_CHARS)) tokens += encode(slice);
      start = match.index + piece.length;
    }
    if (start < text.length) tokens += encode(text.slice(start));
    return tokens;
  };
}

/** Cuts `text` into slices of at most `size` code units, never inside a surrogate pair. */
function slices(text: string, size: number): string[] {
  const out: string[] = [];
  let at = 0;
  while (at < text.length) {
    let end = Math.min(at + size, text.length);
    const last = text.charCodeAt(end - 1);
    if (end < text.length && last >= 0xd800 && last <= 0xdbff) end -= 1;
    out.push(text.slice(at, end));
    at = end;
  }
  return out;
}

/** Why a counter estimates by characters; passed to {@link TokenCounterOptions.onHeuristic}. */
export interface HeuristicInfo {
  model: string;
  reason: string;
}

/** Options of {@link createTokenCounter}. */
export interface TokenCounterOptions {
  /** Called once, when the counter is created, if the model has no bundled tokenizer. */
  onHeuristic?: (info: HeuristicInfo) => void;
}

/** Counts tokens for one model. Its functions need no `this`: pass them around as they are. */
export interface TokenCounter {
  /** The model as given. */
  readonly model: string;
  /** The bundled encoding used, or null for the character heuristic. */
  readonly encoding: TokenEncoding | null;
  /** True when counts come from the model's tokenizer, false for the heuristic. */
  readonly exact: boolean;
  /** Tokens of a text. */
  readonly countText: (text: string) => number;
  /** Tokens of one message in the chat format, framing included. */
  readonly countMessage: (message: ChatMessage) => number;
  /** Tokens of a conversation, plus the reply priming. */
  readonly countMessages: (messages: readonly ChatMessage[]) => number;
}

/**
 * A token counter for a model. Per message: {@link TOKENS_PER_MESSAGE} + the role + the content;
 * an assistant's tool calls add {@link TOKENS_PER_TOOL_CALL} + name + arguments each (tool call ids
 * are not counted). A conversation adds {@link REPLY_PRIMING_TOKENS}. Unknown models count
 * `ceil(length / 4)` per text (UTF-16 code units) and report it once through `onHeuristic`.
 */
export function createTokenCounter(model: string, options: TokenCounterOptions = {}): TokenCounter {
  const encoding = encodingForModel(model);
  if (encoding === null) {
    options.onHeuristic?.({
      model,
      reason: `no bundled tokenizer for model ${JSON.stringify(model)}: tokens are estimated as ceil(characters / ${CHARS_PER_TOKEN})`,
    });
  }
  const countText =
    encoding === null
      ? (text: string): number => Math.ceil(text.length / CHARS_PER_TOKEN)
      : exactCounter(encoding);
  const countMessage = (message: ChatMessage): number => {
    let tokens = TOKENS_PER_MESSAGE + countText(message.role);
    if (message.content !== null) tokens += countText(message.content);
    if (message.role === 'assistant') {
      for (const call of message.tool_calls ?? []) {
        tokens += TOKENS_PER_TOOL_CALL + countText(call.name) + countText(call.arguments);
      }
    }
    return tokens;
  };
  return {
    model,
    encoding,
    exact: encoding !== null,
    countText,
    countMessage,
    countMessages: (messages) =>
      messages.reduce((sum, m) => sum + countMessage(m), REPLY_PRIMING_TOKENS),
  };
}

/** What {@link estimateRequest} takes. */
export interface RequestEstimateInput {
  counter: TokenCounter;
  /** The agent's system prompt, sent first; not counted when empty. */
  systemPrompt: string;
  /** The conversation after the system prompt. */
  messages: readonly ChatMessage[];
  /** The tools' JSON schemas as sent, serialized; counted as plain text. */
  toolsJson?: string;
  /** The request's maximum reply tokens, when it sets one. */
  maxOutputTokens?: number;
  /** The output buffer when `maxOutputTokens` is not set. @defaultValue `1024` */
  defaultOutputTokens?: number;
}

/** Estimated tokens of one model request. */
export interface RequestEstimate {
  inputTokens: number;
  outputTokens: number;
}

/**
 * Estimates a request before it is sent: input = the system prompt as a message (when not empty)
 * + the messages with reply priming + the tools' JSON text; output = `maxOutputTokens` when set,
 * else `defaultOutputTokens` (1024), the most the reply is expected to use.
 */
export function estimateRequest(input: RequestEstimateInput): RequestEstimate {
  const { counter, systemPrompt, messages, toolsJson } = input;
  let inputTokens = counter.countMessages(messages);
  if (systemPrompt !== '') {
    inputTokens += counter.countMessage({ role: 'system', content: systemPrompt });
  }
  if (toolsJson !== undefined) inputTokens += counter.countText(toolsJson);
  return {
    inputTokens,
    outputTokens: input.maxOutputTokens ?? input.defaultOutputTokens ?? DEFAULT_OUTPUT_TOKENS,
  };
}
