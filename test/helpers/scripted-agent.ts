/**
 * Agents on the project's scripted model server: the server's lifecycle for a test file or a
 * describe block, an agent whose provider is that server, and the plan of one granular agent step.
 */
import { afterAll, beforeAll, beforeEach } from 'vitest';
import {
  defineAgent,
  type AgentDefinition,
  type AgentSpec,
  type PlanInput,
} from '../../src/index.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';

/**
 * The scripted model server of the block this is called in: started before its tests, reset
 * (and its default reply removed) before each (before the block's own `beforeEach` hooks registered after this call), closed after
 * all. The handle may be kept in a `const` at once; it reaches the server only once it runs.
 */
export function useScriptedModel(): ScriptedModelServer {
  let server: ScriptedModelServer | undefined;
  const live = (): ScriptedModelServer => {
    if (server === undefined) {
      throw new Error('the scripted model server starts in beforeAll: use it in a hook or a test');
    }
    return server;
  };
  beforeAll(async () => {
    server = await startScriptedModelServer();
  });
  afterAll(async () => {
    await server?.close();
  });
  beforeEach(() => {
    live().reset();
    live().setDefaultReply(undefined);
  });
  return {
    get url() {
      return live().url;
    },
    get port() {
      return live().port;
    },
    enqueue: (...replies) => live().enqueue(...replies),
    script: (replies) => live().script(replies),
    setDefaultReply: (reply) => live().setDefaultReply(reply),
    get requests() {
      return live().requests;
    },
    get requestCount() {
      return live().requestCount;
    },
    get remaining() {
      return live().remaining;
    },
    reset: () => live().reset(),
    close: () => live().close(),
  };
}

/** What {@link scriptedAgent} needs beyond its defaults. */
export type ScriptedAgentSpec = Omit<AgentSpec, 'model' | 'provider'> & Partial<AgentSpec>;

/**
 * An agent whose provider is `model` (with a test key), on model `gpt-test` and with a 2 s timeout
 * per model call unless `spec` says otherwise.
 */
export function scriptedAgent(
  model: ScriptedModelServer,
  spec: ScriptedAgentSpec,
): AgentDefinition {
  return defineAgent({
    model: 'gpt-test',
    provider: { baseURL: model.url, apiKey: 'test-key' },
    timeoutMs: 2000,
    ...spec,
  });
}

/** Three attempts, 20 to 100 ms apart, without jitter: a retried step does not slow a test down. */
export const QUICK_RETRY = { maxAttempts: 3, initialDelayMs: 20, maxDelayMs: 100, jitter: 0 };

/**
 * A plan named `name` of one granular agent step, `research`, of the agent `researcher`, with
 * {@link QUICK_RETRY}. `step` adds to or replaces the step's fields, `plan` the plan's.
 */
export function granularPlan(
  name: string,
  step: Record<string, unknown> = {},
  plan: Record<string, unknown> = {},
): PlanInput {
  return {
    name,
    ...plan,
    steps: [
      {
        id: 'research',
        kind: 'agent',
        agent: 'researcher',
        mode: 'granular',
        retry: QUICK_RETRY,
        ...step,
      },
    ],
  };
}
