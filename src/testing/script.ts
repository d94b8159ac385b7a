/**
 * What a scripted model server plays: replies, tool calls and faults, as plain data checked with
 * zod when they are queued, so a mistake in a test's script fails where it is written.
 */
import { z } from 'zod';
import { ConfigurationError } from '../errors.js';
import { zodIssuesToValidationIssues } from '../schemas/issues.js';

/** Token figures a reply reports. Without them the server reports deterministic estimates. */
export interface ScriptedUsage {
  prompt_tokens: number;
  completion_tokens: number;
}

/** Why the reply ended, as OpenAI reports it. */
export type ScriptedFinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter';

/** Fields shared by the replies that answer with a message. */
interface MessageReplyBase {
  /** Reported token figures. @defaultValue estimates: characters / 4, rounded up (not real tokens) */
  usage?: ScriptedUsage;
  /** @defaultValue `'tool_calls'` when the reply has tool calls, else `'stop'` */
  finishReason?: ScriptedFinishReason;
  /** When streaming, the pause between two SSE chunks, so a test can watch them arrive. @defaultValue 0 */
  chunkDelayMs?: number;
}

/** A final answer: an assistant message with text and no tool calls. */
export interface ScriptedTextReply extends MessageReplyBase {
  text: string;
}

/** One function call the model asks for. */
export interface ScriptedToolCall {
  /** @defaultValue `call_<n>`, n counting the server's tool calls from 1 (reset by `reset()`) */
  id?: string;
  name: string;
  /** An object (sent as its JSON) or a raw string, sent as is: it may be malformed on purpose. */
  arguments: Record<string, unknown> | string;
}

/** An assistant message with one or more (parallel) tool calls, and optionally some text. */
export interface ScriptedToolCallsReply extends MessageReplyBase {
  toolCalls: ScriptedToolCall[];
  text?: string;
}

/** Waits `ms`, then plays `then`. */
export interface ScriptedDelayFault {
  fault: 'delay';
  ms: number;
  then: ScriptedReply;
}

/** Answers with an HTTP error in OpenAI's shape `{ error: { message, type, param, code } }`. */
export interface ScriptedStatusFault {
  fault: 'status';
  /** 400–599, e.g. 429, 500, 401, 400. */
  status: number;
  /** Seconds, sent as the `retry-after` header. */
  retryAfter?: number;
  /** @defaultValue a message naming the status */
  message?: string;
  /** The error's `type`. @defaultValue OpenAI's type for the status, e.g. `'server_error'` */
  type?: string;
  /** The error's `code`. @defaultValue OpenAI's code for the status, e.g. `'rate_limit_exceeded'`, or null */
  code?: string | null;
  /** Extra response headers, e.g. `{ 'x-should-retry': 'false' }` or `{ 'retry-after-ms': '20' }`. */
  headers?: Record<string, string>;
}

/**
 * Destroys the connection. Streaming: after `afterChunks` SSE chunks of `partial` (never reaching
 * `[DONE]`, so the client always sees a broken stream). Otherwise before any byte is written.
 */
export interface ScriptedDropFault {
  fault: 'drop';
  /** @defaultValue 2 (the role chunk and the first content delta) */
  afterChunks?: number;
  /** What is streamed before the drop. @defaultValue a text reply */
  partial?: ScriptedTextReply | ScriptedToolCallsReply;
}

/** Never answers: the request stays open until the client gives up or the server closes. */
export interface ScriptedHangFault {
  fault: 'hang';
}

/** One scripted answer. */
export type ScriptedReply =
  | ScriptedTextReply
  | ScriptedToolCallsReply
  | ScriptedDelayFault
  | ScriptedStatusFault
  | ScriptedDropFault
  | ScriptedHangFault;

// --- validation --------------------------------------------------------------------------------

const usageSchema = z.strictObject({
  prompt_tokens: z.int().nonnegative(),
  completion_tokens: z.int().nonnegative(),
});

const replyBase = {
  usage: usageSchema.optional(),
  finishReason: z.enum(['stop', 'length', 'tool_calls', 'content_filter']).optional(),
  chunkDelayMs: z.number().nonnegative().optional(),
};

const textReplySchema = z.strictObject({ text: z.string(), ...replyBase });

const toolCallSchema = z.strictObject({
  id: z.string().min(1).optional(),
  name: z.string().min(1),
  arguments: z.union([z.record(z.string(), z.unknown()), z.string()], {
    error: 'expected an object or a string',
  }),
});

const toolCallsReplySchema = z.strictObject({
  toolCalls: z.array(toolCallSchema).min(1),
  text: z.string().optional(),
  ...replyBase,
});

const messageReplySchema = z.union([textReplySchema, toolCallsReplySchema]);

const faultSchema = z.discriminatedUnion(
  'fault',
  [
    // `then` is checked by a recursive call, so its issues carry their full path.
    z.strictObject({ fault: z.literal('delay'), ms: z.number().nonnegative(), then: z.unknown() }),
    z.strictObject({
      fault: z.literal('status'),
      status: z.int().min(400).max(599),
      retryAfter: z.number().nonnegative().optional(),
      message: z.string().optional(),
      type: z.string().optional(),
      code: z.string().nullable().optional(),
      headers: z.record(z.string(), z.string()).optional(),
    }),
    z.strictObject({
      fault: z.literal('drop'),
      afterChunks: z.int().nonnegative().optional(),
      partial: z.unknown().optional(),
    }),
    z.strictObject({ fault: z.literal('hang') }),
  ],
  { error: "expected fault to be one of 'delay', 'status', 'drop', 'hang'" },
);

/** A checked text or tool-call reply (not exported from `flujo/testing`; the wire module uses it). */
export type MessageReply = z.output<typeof messageReplySchema>;
/** A checked reply, with `then` and `partial` checked too. @internal */
export type CheckedReply =
  | MessageReply
  | { fault: 'delay'; ms: number; then: CheckedReply }
  | Extract<z.output<typeof faultSchema>, { fault: 'status' }>
  | { fault: 'drop'; afterChunks?: number | undefined; partial?: MessageReply | undefined }
  | { fault: 'hang' };

type Issue = { path: string; message: string };

function issuesOf(schema: z.ZodType, value: unknown, root: string): Issue[] {
  const result = schema.safeParse(value);
  return result.success ? [] : zodIssuesToValidationIssues(result.error.issues, root);
}

function check(value: unknown, root: string, issues: Issue[]): CheckedReply | undefined {
  const isObject = typeof value === 'object' && value !== null && !Array.isArray(value);
  if (!isObject) {
    issues.push({ path: root, message: 'expected a reply object' });
    return undefined;
  }
  const at = (key: string): string => (root === '' ? key : `${root}.${key}`);
  if ('fault' in value) {
    const found = issuesOf(faultSchema, value, root);
    if (found.length > 0) {
      issues.push(...found);
      return undefined;
    }
    const fault = faultSchema.parse(value);
    if (fault.fault === 'delay') {
      const then = check(fault.then, at('then'), issues);
      return then === undefined ? undefined : { fault: 'delay', ms: fault.ms, then };
    }
    if (fault.fault === 'drop') {
      if (fault.partial === undefined) return { fault: 'drop', afterChunks: fault.afterChunks };
      const partial = checkMessage(fault.partial, at('partial'), issues);
      return partial === undefined
        ? undefined
        : { fault: 'drop', afterChunks: fault.afterChunks, partial };
    }
    return fault;
  }
  return checkMessage(value, root, issues);
}

function checkMessage(value: unknown, root: string, issues: Issue[]): MessageReply | undefined {
  const found = messageIssues(value, root);
  if (found.length > 0) {
    issues.push(...found);
    return undefined;
  }
  return messageReplySchema.parse(value);
}

/** Issues of a text or tool-call reply, from the schema its keys point at (clearer than a union's). */
function messageIssues(value: unknown, root: string): Issue[] {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    return [{ path: root, message: 'expected a reply object' }];
  const hasToolCalls = 'toolCalls' in value;
  if (!hasToolCalls && !('text' in value))
    return [{ path: root, message: 'expected `text`, `toolCalls` or `fault`' }];
  return issuesOf(hasToolCalls ? toolCallsReplySchema : textReplySchema, value, root);
}

/**
 * Checks one reply, or throws a {@link ConfigurationError} listing every problem with its path.
 * `what` names the reply in the message, e.g. `scripted reply #3`.
 * @internal
 */
export function parseScriptedReply(value: unknown, what: string): CheckedReply {
  const issues: Issue[] = [];
  const reply = check(value, '', issues);
  if (reply === undefined || issues.length > 0) {
    const lines = issues.map((i) => `  - ${i.path === '' ? '(root)' : i.path}: ${i.message}`);
    throw new ConfigurationError(`scripted model server: invalid ${what}:\n${lines.join('\n')}`, {
      field: what,
    });
  }
  return reply;
}
