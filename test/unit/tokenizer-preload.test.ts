/**
 * The tokenizer built in the background (`preloadTokenizers`): the same encoder `new Tiktoken`
 * builds at once, built a slice at a time so that the event loop goes on meanwhile.
 */
import { Tiktoken } from 'js-tiktoken/lite';
import cl100kBase from 'js-tiktoken/ranks/cl100k_base';
import { describe, expect, it } from 'vitest';
import {
  encoderFor,
  encodingLoaded,
  preloadTokenizers,
  tokenizerReady,
} from '../../src/llm/tokens.js';

/** The longest the event loop went without running a 5 ms timer while `work` ran. */
async function longestStall(work: () => Promise<void>): Promise<number> {
  let last = performance.now();
  let longest = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    longest = Math.max(longest, now - last);
    last = now;
  }, 5);
  try {
    await work();
  } finally {
    clearInterval(timer);
  }
  return longest;
}

describe('preloadTokenizers', () => {
  it('builds the encoder new Tiktoken builds, without holding the event loop', async () => {
    expect(encodingLoaded('cl100k_base')).toBe(false);
    let readyResolved = false;
    const stall = await longestStall(async () => {
      const build = preloadTokenizers(['gpt-4', 'unknown-model']);
      // A count for the model waits for the build under way.
      void tokenizerReady('gpt-4-turbo').then(() => (readyResolved = true));
      expect(encodingLoaded('cl100k_base')).toBe(false);
      await build;
    });
    expect(encodingLoaded('cl100k_base')).toBe(true);
    expect(readyResolved).toBe(true);
    expect(encodingLoaded('o200k_base')).toBe(false);

    const built = encoderFor('cl100k_base') as unknown as {
      rankMap: Map<string, number>;
      textMap: Map<number, Uint8Array>;
    };
    const started = performance.now();
    const reference = new Tiktoken(cl100kBase) as unknown as typeof built;
    const atOnceMs = performance.now() - started;
    // Built at once, the encoder holds the loop for all that time; in slices, for a fraction of it.
    expect(stall).toBeLessThan(atOnceMs / 2);
    expect(built.rankMap.size).toBe(reference.rankMap.size);
    expect(built.textMap.size).toBe(reference.textMap.size);
    let differ = 0;
    for (const [key, rank] of reference.rankMap) if (built.rankMap.get(key) !== rank) differ++;
    for (const [rank, bytes] of reference.textMap) {
      if (built.textMap.get(rank)?.join(',') !== bytes.join(',')) differ++;
    }
    expect(differ).toBe(0);
    const text = 'Durable agents résumé 東京 🚀 <|endoftext|> if (x) { return 42; }';
    expect(encoderFor('cl100k_base').encode(text, [], [])).toEqual(
      new Tiktoken(cl100kBase).encode(text, [], []),
    );
    // Built once: a second preload has nothing to do.
    await preloadTokenizers(['gpt-4']);
    expect(encoderFor('cl100k_base')).toBe(built);
  });
});
