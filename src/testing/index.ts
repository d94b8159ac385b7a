/**
 * Test helpers for agents built on flujo, published as `flujo/testing`: an OpenAI-compatible
 * scripted model server for the real `openai` client.
 *
 * @packageDocumentation
 */

export { startScriptedModelServer } from './scripted-model-server.js';
export type {
  RecordedRequest,
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
