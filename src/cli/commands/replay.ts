/** `flujo replay`: reproduce a run as stored, or start its replay, regeneration or fork. */
import type { ReplayOptions, ReproducedRun, ReplayedRun } from '../../worker/replay.js';
import { checkRunId, runModule } from '../connect.js';
import { repeatFlags, type Ctx } from '../context.js';
import { badInput, ExitCode } from '../exit-codes.js';
import { flujoInvocation, nextCommands, shellQuote } from '../render.js';
import { withRun } from './read.js';

const USAGE = 'flujo replay <runId> --mode reproduce|replay|regenerate';

function preview(value: unknown, max = 72): string {
  const text = JSON.stringify(value) ?? 'null';
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** What `flujo replay --mode reproduce` prints. */
export function reproducedLines(r: ReproducedRun): string[] {
  const lines = [
    `run ${r.runId} as stored: ${r.status} (version ${r.version}), ${r.events.length} events, ${r.outcomes.length} outcomes, ${r.modelReplies.length} journaled model replies; nothing recomputed`,
  ];
  for (const o of r.outcomes) {
    const where = 'stepId' in o && o.stepId !== undefined ? ` ${o.stepId}` : '';
    const what =
      o.type === 'success'
        ? preview(o.output)
        : o.type === 'failure'
          ? `${o.error.code}: ${o.error.message}`
          : o.type === 'aborted'
            ? o.reason
            : o.type === 'paused'
              ? o.message
              : '';
    lines.push(`  ${o.type.padEnd(8)}${where}  ${what}`.trimEnd());
  }
  for (const m of r.modelReplies) {
    const at =
      m.turn !== null
        ? `turn ${m.turn}`
        : m.call === null
          ? `attempt ${m.attempt}`
          : `attempt ${m.attempt} call ${m.call}`;
    const last = m.replies[m.replies.length - 1];
    lines.push(`  reply    ${m.stepId} ${at}  ${preview(last?.message.content ?? null)}`);
  }
  const { integrity } = r;
  if (integrity.ok) {
    lines.push('integrity: ok (the stored events lead to the stored snapshot)');
  } else {
    lines.push(
      `integrity: DIFFERS (${integrity.differences.length} difference(s), ${integrity.problems.length} problem(s)): the stored snapshot is not what its events lead to`,
    );
    for (const p of integrity.problems) lines.push(`  ${p}`);
    for (const d of integrity.differences) {
      lines.push(
        `  ${d.path}: stored ${preview(d.stored, 40)}, events give ${preview(d.derived, 40)}`,
      );
    }
  }
  return lines;
}

/** What `flujo replay --mode replay|regenerate` prints. */
export function replayedLines(
  r: ReplayedRun,
  flags: readonly string[],
  modulePath: string | null = null,
): string[] {
  const lines = [
    `run ${r.runId} ${r.mode === 'replay' ? 'replays' : 'regenerates'} ${r.replayOf} (lineage ${r.lineage}${r.allowEffects ? ', effects allowed' : ''})`,
  ];
  if (r.fromStep !== null) {
    lines.push(
      `  forked from step ${r.fromStep}; reused: ${r.reusedSteps.length === 0 ? 'none' : r.reusedSteps.join(', ')}`,
    );
  }
  const next = nextCommands(r.runId, modulePath, flags);
  lines.push(
    `  a worker runs it (${next.worker}, or ${next.resume}); see ${[flujoInvocation(), ...['status', r.runId, ...flags].map(shellQuote)].join(' ')}${next.note}`,
  );
  return lines;
}

/** `flujo replay <runId> --mode M [--from STEP] [--allow-effects] [--json]`. */
export async function cmdReplay(ctx: Ctx): Promise<number> {
  const runId = checkRunId(ctx.args[0], USAGE);
  if (ctx.args.length > 1) badInput(`unexpected argument "${ctx.args[1]}"; see \`flujo --help\``);
  const { mode, from } = ctx.values;
  if (mode === undefined) {
    badInput(`--mode is required: ${USAGE}`);
  }
  if (mode !== 'reproduce' && mode !== 'replay' && mode !== 'regenerate') {
    badInput(`--mode "${mode}" is not a mode; pass --mode reproduce, replay or regenerate`);
  }
  const options = {
    mode,
    ...(from === undefined ? {} : { fromStep: from }),
    ...(ctx.values['allow-effects'] === true ? { allowEffects: true } : {}),
  } as ReplayOptions;
  return withRun(ctx, runId, async (conn) => {
    const result = await conn.runtime().replay(runId, options);
    if (result.mode === 'reproduce') {
      if (ctx.values.json === true) console.log(JSON.stringify(result));
      else for (const line of reproducedLines(result)) console.log(line);
      return result.integrity.ok ? ExitCode.ok : ExitCode.failed;
    }
    if (ctx.values.json === true) console.log(JSON.stringify(result));
    else {
      // The replay runs the plan of the original: the job module that started it knows its steps.
      const module = await runModule(conn, runId);
      for (const line of replayedLines(result, repeatFlags(ctx.values), module)) console.log(line);
    }
    return ExitCode.ok;
  });
}
