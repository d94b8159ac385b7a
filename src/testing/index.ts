/**
 * Test helpers for agents built on flujo, published as `flujo/testing`: an OpenAI-compatible
 * scripted model server for the real `openai` client, and a redis-server run from
 * `redis-memory-server` for tests, examples and local development.
 *
 * @packageDocumentation
 */

export { startScriptedModelServer } from './scripted-model-server.js';
export type {
  RecordedRequest,
  RequestTool,
  ScriptEntry,
  ScriptedModelServer,
  ScriptedModelServerOptions,
  ScriptedReplyFunction,
} from './scripted-model-server.js';
export type {
  ScriptedDelayFault,
  ScriptedDropFault,
  ScriptedFinishReason,
  ScriptedHangFault,
  ScriptedReply,
  ScriptedStatusFault,
  ScriptedTextReply,
  ScriptedToolCall,
  ScriptedToolCallsReply,
  ScriptedUsage,
} from './script.js';
export type { RequestMessage } from './openai-wire.js';

// A real redis-server without installing one: a throwaway server, or the project's (`.flujo/redis`).
export { ensureEmbeddedRedis, startEmbeddedRedis } from '../persistence/embedded-redis.js';
export type {
  DetachedRedis,
  EmbeddedRedis,
  EmbeddedRedisOptions,
} from '../persistence/embedded-redis.js';
