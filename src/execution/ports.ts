/**
 * What an execution needs from the unit of work that runs it, as small interfaces the unit
 * implements and hands down: the execution calls their methods, and holds no callback of a layer
 * above it. Each names one need: counting tool calls against the budgets, reading a granular
 * step's committed history, feeding watchers (streamed reply text, an operator's progress), and
 * recording the calls the unit's commit carries. The layers below declare what they call in the
 * same way, and the unit's objects implement it: a tool call's `ToolCallObserver`, `ToolRunGuard`
 * and `ResultStore` (a large result stored as a blob; re-exported here) in `tools/call-tool.ts`, a
 * metered model call's `ModelCallObserver` in `usage-meter.ts`, and the agents' `ModelClients` in
 * `model-call.ts`.
 */
import type { JsonValue } from '../internal/json.js';
import type { ChatMessage } from '../llm/messages.js';
import type { ToolCallObservation, ToolCallObserver } from '../tools/call-tool.js';
import type { ModelCallObserver } from './usage-meter.js';
import type { RateLimitObserver } from './rate-limits.js';

export type { ResultStore } from '../tools/call-tool.js';

/** Counts the tool calls that will really run (the run's counters). */
export interface ToolCallCounter {
  /** Counts one call for the run and for its step; returns both counts including this call. */
  countToolCall(runId: string, stepId: string): Promise<{ run: number; step: number }>;
}

/** Reads a granular step's committed history. */
export interface HistoryReader {
  /** Messages `[0, cursor)` of the step's history. */
  read(runId: string, stepId: string, cursor: number): Promise<ChatMessage[]>;
}

/** A piece of an agent's reply as it streams in. */
export interface StreamedText {
  runId: string;
  stepId: string;
  attempt: number;
  /** The turn (0-based) whose reply this is. */
  turn: number;
  /** Position of the piece within the turn's reply, from 0. */
  seq: number;
  text: string;
}

/** What people watching a run are fed live; none of it is part of the run's history. */
export interface LiveFeed {
  /** A piece of an agent step's reply, as it streams in. */
  chunk(chunk: StreamedText): void;
  /** What an operator reports with `ctx.progress` (checked JSON). */
  progress(where: { runId: string; stepId: string; attempt: number }, info: JsonValue): void;
}

/**
 * Records the calls an execution made, for its unit's commit: the observer of its tool calls, of
 * its metered model calls and of their waits for capacity under the model rate limits.
 */
export interface CallRecorder extends ToolCallObserver, ModelCallObserver, RateLimitObserver {
  /** How a tool call went (`turn` in an agent step). */
  toolCalled(call: ToolCallObservation & { turn?: number }): void;
}
