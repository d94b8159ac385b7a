/**
 * The spans of a run's work: a step attempt (or one granular turn) under the run, an agent turn
 * of an atomic step, a model call with the GenAI semantic-convention attributes, and a tool call
 * with the ledger's verdict. Each is a thin wrapper of {@link traced}, so a call site stays one
 * line; the ids (run, step, attempt, turn) are inherited from the enclosing span.
 */
import type { Attributes, Span } from '@opentelemetry/api';
import { Attr, markFailed, SpanKind, traced, type SpanIds } from './tracing.js';

/** What an attempt or turn came to, structurally (a step's or a turn's execution result). */
interface ExecutionResult {
  kind: string;
  error?: { code: string; message: string };
}

/**
 * A step attempt (`flujo.step`), or one turn of a granular agent step (`flujo.turn`, when
 * `ids.turn` is set): a child of the run's span, with its outcome (`flujo.outcome`: succeeded,
 * failed, paused, budget, turn) and an error status when it failed.
 */
export function traceAttempt<T extends ExecutionResult>(
  traceparent: string | null,
  ids: Required<Pick<SpanIds, 'runId' | 'stepId' | 'attempt'>> & Pick<SpanIds, 'turn'>,
  stepKind: string,
  fn: () => Promise<T>,
): Promise<T> {
  const name = ids.turn === undefined ? 'flujo.step' : 'flujo.turn';
  return traced(
    name,
    {
      trace: traceparent,
      ids,
      attributes: { 'flujo.step.kind': stepKind },
      end: (result, span) => {
        span.setAttribute(Attr.outcome, result.kind);
        if (result.error !== undefined) {
          span.setAttribute('error.type', result.error.code);
          if (result.kind === 'failed') markFailed(span, result.error.message);
        }
      },
    },
    fn,
  );
}

/** A pause for a person's approval, thrown through the turn and the tool call: not a failure. */
const isPause = (error: unknown): boolean => errorName(error) === 'ApprovalPending';

/** Turn `turn` of an atomic agent step (`flujo.turn`), inside its attempt's span. */
export function traceTurn<T>(turn: number, fn: () => Promise<T>): Promise<T> {
  return traced(
    'flujo.turn',
    {
      ids: { turn },
      error: (error, span) => {
        if (!isPause(error)) return true;
        span.setAttribute(Attr.outcome, 'paused');
        return false;
      },
    },
    fn,
  );
}

/** What a model call's span reads from the reply. */
interface ReplyLike {
  model: string;
  finishReason: string;
  usage: { promptTokens: number; completionTokens: number } | null;
}

/**
 * A chat completion (`chat <model>`, kind CLIENT) with the GenAI semantic-convention attributes:
 * system, operation, requested and answering model, input and output tokens, finish reason.
 */
export function traceModelCall<T extends ReplyLike>(
  request: { model: string; agent: string; serverAddress?: string | undefined },
  fn: () => Promise<T>,
): Promise<T> {
  const attributes: Attributes = {
    'gen_ai.system': 'openai',
    // The newer conventions' name for the same thing.
    'gen_ai.provider.name': 'openai',
    'gen_ai.operation.name': 'chat',
    'gen_ai.request.model': request.model,
    'gen_ai.agent.name': request.agent,
  };
  if (request.serverAddress !== undefined) attributes['server.address'] = request.serverAddress;
  return traced(
    `chat ${request.model}`,
    {
      kind: SpanKind.CLIENT,
      attributes,
      end: (reply, span) => {
        span.setAttribute('gen_ai.response.model', reply.model);
        span.setAttribute('gen_ai.response.finish_reasons', [reply.finishReason]);
        if (reply.usage !== null) {
          span.setAttribute('gen_ai.usage.input_tokens', reply.usage.promptTokens);
          span.setAttribute('gen_ai.usage.output_tokens', reply.usage.completionTokens);
        }
      },
      error: (error, span) => {
        const kind = (error as { kind?: unknown }).kind;
        span.setAttribute('error.type', typeof kind === 'string' ? kind : errorName(error));
      },
    },
    fn,
  );
}

/**
 * A model call's wait for capacity under the runtime's rate limits (`flujo.model.rate_limited`),
 * before its `chat` span: the model, the limits it is under, and how the wait ended
 * (`flujo.rate_limit.outcome`: sent, gave_up, aborted) after how long.
 */
export function traceRateLimitWait<T extends { waitedMs: number; outcome: string }>(
  request: { model: string; limits: readonly string[] },
  fn: () => Promise<T>,
): Promise<T> {
  return traced(
    'flujo.model.rate_limited',
    {
      attributes: {
        'gen_ai.request.model': request.model,
        'flujo.rate_limit.names': [...request.limits],
      },
      end: (wait, span) => {
        span.setAttribute('flujo.rate_limit.waited_ms', wait.waitedMs);
        span.setAttribute('flujo.rate_limit.outcome', wait.outcome);
      },
      error: (error, span) => {
        span.setAttribute('flujo.rate_limit.outcome', isAbort(error) ? 'aborted' : 'gave_up');
        return !isAbort(error);
      },
    },
    fn,
  );
}

const isAbort = (error: unknown): boolean => errorName(error) === 'AbortError';

/** The ledger's verdict on a tool call, as the `flujo.tool.verdict` attribute says it. */
export const ToolVerdict = {
  /** The tool ran in this call. */
  executed: 'executed',
  /** The ledger held the call's receipt: returned without running the tool. */
  replayed: 'receipt_replayed',
  /** A worker died while the call ran and the tool cannot be re-run safely: a person decides. */
  inDoubt: 'in_doubt',
  /** Another worker holds the call's lease. */
  busy: 'busy',
  /** The call waits for a person's approval. */
  awaitingApproval: 'awaiting_approval',
  /** The tool (or a recorded final error) failed the call. */
  failed: 'failed',
} as const;
export type ToolVerdict = (typeof ToolVerdict)[keyof typeof ToolVerdict];

function errorName(error: unknown): string {
  return error instanceof Error ? error.name : typeof error;
}

/** The verdict a thrown error stands for. */
function verdictOfError(error: unknown): ToolVerdict {
  const code = (error as { code?: unknown }).code;
  if (code === 'tool_outcome_unknown') return ToolVerdict.inDoubt;
  if (code === 'tool_call_busy') return ToolVerdict.busy;
  if (isPause(error)) return ToolVerdict.awaitingApproval;
  return ToolVerdict.failed;
}

/** What a tool call's span reads from its result. */
interface ToolResultLike {
  replayed: boolean;
  entry: { callId: string; runs: number; state: string };
}

/**
 * A tool call (`execute_tool <name>`) with the ledger's verdict (`flujo.tool.verdict`), the ledger
 * call id and how many times the call has run. An awaited approval is not an error of the span.
 */
export function traceToolCall<T extends ToolResultLike>(
  tool: { name: string; identity: string; class: string },
  ids: SpanIds,
  fn: () => Promise<T>,
): Promise<T> {
  return traced(
    `execute_tool ${tool.name}`,
    {
      ids,
      attributes: {
        'gen_ai.operation.name': 'execute_tool',
        'gen_ai.tool.name': tool.name,
        'flujo.tool': tool.identity,
        'flujo.tool.class': tool.class,
      },
      end: (result, span) => {
        span.setAttribute(
          Attr.toolVerdict,
          result.replayed ? ToolVerdict.replayed : ToolVerdict.executed,
        );
        span.setAttribute('flujo.tool.call_id', result.entry.callId);
        span.setAttribute('flujo.tool.runs', result.entry.runs);
      },
      error: (error, span: Span) => {
        span.setAttribute(Attr.toolVerdict, verdictOfError(error));
        const e = error as { callId?: unknown; call?: { callId?: unknown } };
        const callId = e.callId ?? e.call?.callId;
        if (typeof callId === 'string') span.setAttribute('flujo.tool.call_id', callId);
        if (isPause(error)) return false;
        span.setAttribute('error.type', errorName(error));
        return true;
      },
    },
    fn,
  );
}
