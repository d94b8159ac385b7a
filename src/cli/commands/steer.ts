/** `flujo approve|reject|cancel` and `flujo ledger resolve`: steering a run (no job module needed). */
import type { JsonValue } from '../../internal/json.js';
import { checkRunId } from '../connect.js';
import { parseJsonOption, whoDecides, type Ctx } from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';
import { nextCommands } from '../render.js';
import { runModule, type Connection } from '../connect.js';
import { repeatFlags } from '../context.js';
import { withRun } from './read.js';

/**
 * How to go on with a run: its resume command, or a worker, with the job module that started it
 * when the run records it (else a placeholder, said to be one).
 */
async function continueHint(conn: Connection, runId: string, ctx: Ctx): Promise<string> {
  const next = nextCommands(runId, await runModule(conn, runId), repeatFlags(ctx.values));
  return `continue it with \`${next.resume}\` (or a running \`${next.worker}\`)${next.note}`;
}

/**
 * The full id of the tool call `given` names (the id `flujo status` prints is its start), which
 * step `stepId` of the run must wait on now; else a bad-input exit that says what it waits on.
 */
async function pendingCallId(
  conn: Connection,
  runId: string,
  stepId: string,
  given: string,
): Promise<string> {
  const report = await conn.runtime().status(runId);
  const call = report.approvals.find((a) => a.stepId === stepId)?.call ?? null;
  if (call === null) {
    badInput(`step "${stepId}" of run ${runId} waits on no tool call; leave --call out`);
  }
  if (given === '' || !call.callId.startsWith(given)) {
    badInput(
      `step "${stepId}" of run ${runId} waits on tool call ${call.callId.slice(0, 12)} (${call.tool}), not ${given}; see \`flujo status ${runId}\``,
    );
  }
  return call.callId;
}

/** `flujo approve|reject <runId> <stepId> [--call ID] [--by NAME] [--comment TEXT] [--json]` */
export async function cmdDecide(ctx: Ctx, decision: 'approve' | 'reject'): Promise<number> {
  const runId = checkRunId(ctx.args[0], `flujo ${decision} <runId> <stepId>`);
  const stepId = ctx.args[1];
  if (stepId === undefined || stepId === '') {
    badInput(
      `name the step: \`flujo ${decision} ${runId} <stepId>\` (see \`flujo status ${runId}\`)`,
    );
  }
  if (ctx.args.length > 2) badInput(`unexpected argument "${ctx.args[2]}"; see \`flujo --help\``);
  const by = whoDecides(ctx.values, ctx.env);
  const comment = ctx.values.comment;
  return withRun(ctx, runId, async (conn) => {
    const runtime = conn.runtime();
    const given = ctx.values.call;
    // The runtime decides only while the step still waits on exactly this call.
    const callId =
      given === undefined ? undefined : await pendingCallId(conn, runId, stepId, given);
    const input = {
      by,
      ...(comment === undefined ? {} : { comment }),
      ...(callId === undefined ? {} : { callId }),
    };
    const report =
      decision === 'approve'
        ? await runtime.approve(runId, stepId, input)
        : await runtime.reject(runId, stepId, input);
    if (ctx.values.json === true) {
      console.log(JSON.stringify(report));
      return ExitCode.ok;
    }
    const done = decision === 'approve' ? 'approved' : 'rejected';
    const what = callId === undefined ? '' : ` (tool call ${callId.slice(0, 12)})`;
    console.log(`${done} step "${stepId}"${what} of run ${runId} (by ${by})`);
    if (report.status === 'running') {
      console.log(`run ${runId} is running; ${await continueHint(conn, runId, ctx)}`);
    } else {
      const why = report.summary.reason === null ? '' : ` (${report.summary.reason})`;
      console.log(`run ${runId} is ${report.status}${why}`);
    }
    return ExitCode.ok;
  });
}

/** `flujo skip <runId> <stepId> --reason TEXT [--by NAME] [--json]` */
export async function cmdSkip(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], 'flujo skip <runId> <stepId>');
  const stepId = ctx.args[1];
  if (stepId === undefined || stepId === '') {
    badInput(`name the step: \`flujo skip ${runId} <stepId> --reason TEXT\``);
  }
  if (ctx.args.length > 2) badInput(`unexpected argument "${ctx.args[2]}"; see \`flujo --help\``);
  const reason = ctx.values.reason;
  if (reason === undefined || reason.trim() === '') {
    badInput('say why the step is skipped, e.g. --reason "done by hand"');
  }
  const by = whoDecides(ctx.values, ctx.env);
  return withRun(ctx, runId, async (conn) => {
    const report = await conn.runtime().skip(runId, stepId, { by, reason });
    if (ctx.values.json === true) {
      console.log(JSON.stringify(report));
      return ExitCode.ok;
    }
    console.log(`skipped step "${stepId}" of run ${runId} (by ${by}): ${reason}`);
    if (report.status === 'running') {
      console.log(`run ${runId} is running; ${await continueHint(conn, runId, ctx)}`);
    } else console.log(`run ${runId} is ${report.status}`);
    return ExitCode.ok;
  });
}

/** `flujo cancel <runId> [--by NAME] [--reason TEXT] [--json]` */
export async function cmdCancel(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], 'flujo cancel <runId>');
  if (ctx.args.length > 1) badInput(`unexpected argument "${ctx.args[1]}"; see \`flujo --help\``);
  const by = whoDecides(ctx.values, ctx.env);
  const reason = ctx.values.reason;
  if (reason !== undefined && reason.trim() === '') {
    badInput('--reason is empty; say why, e.g. --reason "wrong input"');
  }
  return withRun(ctx, runId, async (conn) => {
    const runtime = conn.runtime();
    const before = await runtime.status(runId);
    const ended = ['succeeded', 'failed', 'cancelled'].includes(before.status);
    const report = ended
      ? before
      : await runtime.cancel(runId, { by, ...(reason === undefined ? {} : { reason }) });
    if (ctx.values.json === true) console.log(JSON.stringify(report));
    else if (ended) console.log(`run ${runId} is already ${before.status}; nothing to cancel`);
    else console.log(`cancelled run ${runId} (by ${by})`);
    return ExitCode.ok;
  });
}

/** `flujo ledger resolve <runId> <callId> --succeeded '<json>' | --retry [--by NAME]` */
export async function cmdLedgerResolve(ctx: Ctx): Promise<number> {
  const usage = "flujo ledger resolve <runId> <callId> --succeeded '<json>' | --retry";
  const runId = checkRunId(ctx.args[0], usage);
  const callId = ctx.args[1];
  if (callId === undefined || callId === '') {
    badInput(`name the tool call: \`${usage}\` (see \`flujo ledger ${runId}\`)`);
  }
  if (ctx.args.length > 2) badInput(`unexpected argument "${ctx.args[2]}"; see \`flujo --help\``);
  const { succeeded, retry } = ctx.values;
  if ((succeeded === undefined) === (retry !== true)) {
    badInput(
      `say how to resolve the call, with exactly one of --succeeded '<receipt json>' (its effect happened) or --retry (call it again)`,
    );
  }
  const resolution: { succeeded: JsonValue } | { retry: true } =
    succeeded === undefined
      ? { retry: true }
      : { succeeded: parseJsonOption(succeeded, '--succeeded', '{"id":"…"}') };
  const by = whoDecides(ctx.values, ctx.env);
  return withRun(ctx, runId, async (conn) => {
    const runtime = conn.runtime();
    const entries = await runtime.ledger(runId);
    const matches = entries.filter((e) => e.callId === callId || e.callId.startsWith(callId));
    const exact = matches.find((e) => e.callId === callId);
    const entry = exact ?? (matches.length === 1 ? matches[0] : undefined);
    if (entry === undefined) {
      badInput(
        matches.length === 0
          ? `run ${runId} has no tool call "${callId}"; see \`flujo ledger ${runId}\``
          : `"${callId}" matches ${matches.length} tool calls of run ${runId}; pass more of the call id`,
      );
    }
    const resolved = await runtime.resolveToolCall(runId, entry.callId, resolution, by);
    if (ctx.values.json === true) console.log(JSON.stringify(resolved));
    else {
      const how = 'retry' in resolution ? 'to be called again' : 'as succeeded';
      console.log(`resolved tool call ${entry.callId} (${entry.tool}) ${how} (by ${by})`);
      console.log(`then ${await continueHint(conn, runId, ctx)}`);
    }
    return ExitCode.ok;
  });
}
