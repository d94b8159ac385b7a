/**
 * A worker builds its agents' tokenizers when it starts, in the background: the encoding of an
 * agent's model is loaded after `createWorker` without any run (so the first agent step does not
 * build it), the worker is ready before it is built, and a worker without agents loads none.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { createRuntime, defineAgent, type FlujoWorker, type Runtime } from '../../src/index.js';
import { encodingLoaded } from '../../src/llm/tokens.js';
import { silentLogger } from '../../src/logging.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

let runtime: Runtime | undefined;
let worker: FlujoWorker | undefined;
let prefix: string;

afterEach(async () => {
  await worker?.close();
  await runtime?.close();
  await deleteRuntimeKeys(prefix);
});

const sleep = (n: number) => new Promise((r) => setTimeout(r, n));

describe('the worker preloads the tokenizers of its agents', () => {
  it('a worker without agents loads none', async () => {
    prefix = testPrefix();
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
    worker = runtime.createWorker();
    await worker.ready();
    await sleep(300);
    expect(encodingLoaded('o200k_base')).toBe(false);
    expect(encodingLoaded('cl100k_base')).toBe(false);
  });

  it("a worker with an agent loads its model's encoding, in the background, before any step", async () => {
    prefix = testPrefix();
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger }).agent(
      defineAgent({
        name: 'helper',
        model: 'gpt-4o-mini',
        provider: { baseURL: 'http://127.0.0.1:9/v1', apiKey: 'test' },
        systemPrompt: 'Answer in one line.',
      }),
    );
    expect(encodingLoaded('o200k_base')).toBe(false);
    worker = runtime.createWorker();
    await worker.ready();
    // Ready while the encoder is still being built: the build does not hold readiness up.
    expect(encodingLoaded('o200k_base')).toBe(false);
    for (let i = 0; i < 600 && !encodingLoaded('o200k_base'); i++) await sleep(50);
    expect(encodingLoaded('o200k_base')).toBe(true);
    expect(encodingLoaded('cl100k_base')).toBe(false);
    expect(worker.status().running).toEqual([]);
    expect(worker.status().counters.done).toBe(0);
  });
});
