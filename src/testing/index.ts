/**
 * Test helpers for agents built on flujo, published as `flujo/testing`: an OpenAI-compatible
 * scripted model server for the real `openai` client, a redis-server run from
 * `redis-memory-server` for tests, examples and local development, and readable transition traces
 * of a plan for snapshot tests.
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

// Snapshot tests of how a plan moves: the pure kernel, one stable line per transition.
export { runEvents, traceTransitions, transitionLine, TRACE_T0 } from './transitions.js';
export type { TraceTransitionsOptions, TransitionTrace } from './transitions.js';
