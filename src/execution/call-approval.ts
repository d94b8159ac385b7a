/**
 * Approval of single tool calls (tools with risk level high or critical). A call is identified by
 * its ledger call id, which an execution that resumes reaches again: a granular turn replays its
 * journaled reply (same tool calls, same ids), an operator makes the same call (same arguments,
 * same id), and an atomic agent replays the model replies its paused execution journaled. A
 * person's decision is recorded in the step's snapshot for that call id and that attempt only,
 * so an approval covers exactly that call, in that attempt: a retried attempt, or another call,
 * asks again. The ledger keeps the call to one effect once it has run.
 */
import { ToolCallRejectedError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import type { StepState } from '../machines/kernel.js';

/** A call that waits for a person: what `tool.approvalRequested` records. */
export interface CallToApprove {
  callId: string;
  /** The tool's identity (`name@version`). */
  tool: string;
  args: JsonValue;
  /** In an agent step: the model's tool call id and the turn (granular steps). */
  toolCallId?: string;
  turn?: number;
}

/**
 * Thrown by the approval check of a call that has no decision yet: the execution stops where it
 * is, nothing of the call ran, and the worker commits the wait. Not an error of the step.
 */
export class ApprovalPending extends Error {
  override name = 'ApprovalPending';
  constructor(readonly call: CallToApprove) {
    super(`tool call ${call.callId} (${call.tool}) waits for approval`);
  }
}

/** The approval check of one execution, and the call it stopped at. */
export interface CallGate {
  /**
   * Returns when `call` was approved in this attempt; throws `ToolCallRejectedError` when it was
   * rejected, `ApprovalPending` when it has no decision.
   */
  check(call: CallToApprove): void;
  /** The first call this execution stopped at, or null. */
  readonly pending: CallToApprove | null;
}

/** The approval check of an execution of `state`'s current attempt. */
export function callGate(state: Pick<StepState, 'attempt' | 'callDecisions'>): CallGate {
  let pending: CallToApprove | null = null;
  return {
    check(call) {
      const decision = (state.callDecisions ?? []).find(
        (d) => d.callId === call.callId && d.attempt === state.attempt,
      );
      if (decision === undefined) {
        // An operator that catches the signal and goes on still pauses: the first call stands.
        pending ??= call;
        throw new ApprovalPending(call);
      }
      if (!decision.approved) {
        throw new ToolCallRejectedError(call.tool, call.callId, decision.by, decision.comment);
      }
    },
    get pending() {
      return pending;
    },
  };
}

/** What the model is told about a rejected call, as the tool's result. */
export function rejectionMessage(error: ToolCallRejectedError): string {
  return `error: rejected by ${error.by}${error.comment === null ? '' : `: ${error.comment}`}`;
}
