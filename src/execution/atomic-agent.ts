/**
 * The atomic agent loop: a whole agent step in one unit of work, its model calls journaled by
 * attempt so an execution of the attempt that runs again takes the replies it was given.
 */
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import { toolCallsOf, type ChatMessage, type ModelReply } from '../llm/messages.js';
import type { JournaledCall, RecordedReply } from '../persistence/model-journal.js';
import { MaxTurnsExceededError } from '../errors.js';
import { runToolCalls } from './agent-tools.js';
import { traceTurn } from '../observability/spans.js';
import {
  add,
  askModel,
  requestDigest,
  shaped,
  toolContext,
  userMessage,
  type AgentLoopDeps,
  type AgentResult,
  type AgentStepArgs,
} from './model-call.js';

/**
 * Atomic mode: the whole agent loop in one unit of work; the step's commit at the end is its only
 * commit. The loop ends only on a final answer (a reply without tool calls); `maxTurns` ends it
 * with `MaxTurnsExceededError`. Every tool call goes through the ledger keyed by run, step, tool
 * and normalized arguments, so a restarted step (a crash, a retry) gets the recorded receipt
 * instead of repeating an identical effect. A model error aborts the loop and changes nothing
 * committed; its retryability decides whether the step is retried.
 *
 * With a `callJournal`, each reply is journaled (call index = turn: one call per turn) before its
 * tool calls run, and the attempt run again takes a journaled reply in place of a model call
 * when the request it would send is the one the reply answered (see {@link takeJournaled}).
 */
export async function runAtomicAgent(
  deps: AgentLoopDeps,
  args: AgentStepArgs,
): Promise<AgentResult> {
  const { step, agent } = args;
  const messages: ChatMessage[] = [userMessage(args.input)];
  if (args.feedback !== undefined) messages.push({ role: 'user', content: args.feedback });
  const usage = { promptTokens: 0, completionTokens: 0 };
  const journal = deps.callJournal;
  let toolCalls = 0;
  for (let turn = 0; turn < step.maxTurns; turn++) {
    const answer = await traceTurn(turn, async () => {
      const sent = await shaped(deps, args, messages);
      let reply: ModelReply;
      if (journal === undefined) reply = await askModel(deps, args, turn, sent);
      else {
        const request = requestDigest(agent, sent);
        const taken = takeJournaled(await journal.get(turn), request);
        if (taken !== null) {
          reply = taken;
          journal.onReused?.(turn, taken);
        } else {
          let recording: Promise<RecordedReply> | undefined;
          const record = (r: ModelReply) => {
            recording = journal.record(turn, request, r);
            recording.catch(() => {}); // met below
          };
          // A metered call journals its reply beside its reconcile, in the same round trip.
          const fresh = await askModel(deps, args, turn, sent, record);
          if (recording === undefined) record(fresh);
          // A racing execution of the attempt that recorded first: its reply stands (it asked
          // the same request), so both make the same tool calls.
          reply = (await recording!).reply;
          debugPoint(DebugPoint.afterJournal, `${step.id}:${turn}`);
        }
      }
      add(usage, reply.usage);
      messages.push(reply.message);
      const calls = toolCallsOf(reply.message);
      if (calls.length === 0) return { answer: reply.message.content };
      const results = await runToolCalls(deps, toolContext(args, turn, 'atomic'), calls);
      debugPoint(DebugPoint.afterTools, `${step.id}:${turn}`);
      toolCalls += calls.length;
      messages.push(...results);
      return null;
    });
    if (answer !== null) return { answer: answer.answer, turns: turn + 1, toolCalls, usage };
  }
  throw new MaxTurnsExceededError(step.id, step.maxTurns);
}

/**
 * The journaled reply an execution of an atomic attempt takes in place of asking the model for
 * call `i`, or null when it must ask. Taken only when the request this execution would send now
 * is the very request the reply answered (same digest: same agent settings, same system prompt,
 * same prior messages as sent). That is safe: the attempt's earlier execution sent that request
 * and got this reply, its usage was charged to that call's reservation, and a model call has no
 * other effect, so taking it is indistinguishable from the model answering the same again, except
 * that no second request is sent or paid for, and the execution makes the same tool calls, whose
 * receipts the ledger holds. With other prior messages (a read-only tool that ran again and
 * answered otherwise, a tool result shaped differently) the request is another one: its reply is
 * not known, and the model is asked. A reply recorded at a pause by an earlier release carries no
 * digest: it is taken as that release took it (the paused execution's reply to the same turn).
 */
export function takeJournaled(recorded: JournaledCall | null, request: string): ModelReply | null {
  if (recorded === null) return null;
  return recorded.request === null || recorded.request === request ? recorded.reply : null;
}
