/**
 * `flujo schedule add|list|pause|resume|remove|trigger`: the schedules of a prefix. `add` takes
 * the plan from a job module; the others need none (the plan is stored with the schedule). The
 * workers of the prefix (`flujo worker`) take the fires.
 */
import type { ScheduleInfo } from '../../operations/schedules.js';
import type { OverlapPolicy, ScheduleOptions } from '../../worker/schedule-definition.js';
import type { ScheduleFire } from '../../worker/schedule-store.js';
import { connect } from '../connect.js';
import { parseJsonOption, type Ctx } from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';
import { loadJobModule } from '../job-module.js';

const USAGE =
  'flujo schedule add <id> <job-module> (--cron EXPR [--tz TZ] | --every MS) [--input JSON] [--overlap skip|buffer_one|allow_all] [--catchup-window MS], or flujo schedule list|pause|resume|remove|trigger';

/** A whole number of ms from an option, as typed (the schedule's own check names the field). */
function msOption(text: string | undefined, flag: string): number | undefined {
  if (text === undefined) return undefined;
  if (!/^\d+$/.test(text))
    badInput(`${flag} must be a whole number of milliseconds; got "${text}"`);
  return Number(text);
}

/** The schedule options `add` asks for (the plan comes from the module). */
function addOptions(ctx: Ctx): Omit<ScheduleOptions, 'plan'> {
  const v = ctx.values;
  const everyMs = msOption(v.every, '--every');
  const catchupWindowMs = msOption(v['catchup-window'], '--catchup-window');
  return {
    ...(v.cron === undefined ? {} : { cron: v.cron }),
    ...(everyMs === undefined ? {} : { everyMs }),
    ...(v.tz === undefined ? {} : { tz: v.tz }),
    ...(v.input === undefined
      ? {}
      : { input: parseJsonOption(v.input, '--input', '{"inbox":"support"}') }),
    ...(v.overlap === undefined ? {} : { overlap: v.overlap as OverlapPolicy }),
    ...(catchupWindowMs === undefined ? {} : { catchupWindowMs }),
  };
}

/** When, in words: an ISO time, or `-`. */
const when = (ms: number | null | undefined) =>
  ms === null || ms === undefined ? '-' : new Date(ms).toISOString();

/** One fire, as a short word: `started <run>`, `skipped`, `missed`… */
function fireWord(fire: ScheduleFire): string {
  const at = fire.manual === true ? `${when(fire.at)} (trigger)` : when(fire.at);
  const what = fire.runId === undefined || fire.outcome !== 'started' ? '' : ` ${fire.runId}`;
  const why = fire.reason === undefined ? '' : ` (${fire.reason.split('\n')[0]})`;
  return `${at} ${fire.outcome}${what}${why}`;
}

/** The lines `list` prints for one schedule. */
function scheduleLines(s: ScheduleInfo): string[] {
  const rule =
    s.cron === undefined ? `every ${s.everyMs} ms` : `cron "${s.cron}"${s.tz ? ` ${s.tz}` : ''}`;
  const lines = [
    `${s.id}  ${s.paused ? 'paused' : 'active'}  ${rule}  plan ${s.plan}  overlap ${s.overlap}  catch-up ${s.catchupWindowMs} ms  next ${when(s.nextFireAt)}`,
  ];
  for (const fire of s.fires.slice(0, 5)) lines.push(`  ${fireWord(fire)}`);
  if (s.fires.length > 5) lines.push(`  … ${s.fires.length - 5} older fires (--json lists them)`);
  return lines;
}

/** `flujo schedule <sub-command> …` */
export async function cmdSchedule(ctx: Ctx): Promise<number> {
  const [sub, id, module, ...extra] = ctx.args;
  const addOnly = ['cron', 'every', 'tz', 'input', 'overlap', 'catchup-window'] as const;
  if (sub !== 'add') {
    const misplaced = addOnly.find((k) => ctx.values[k] !== undefined);
    if (misplaced !== undefined) badInput(`--${misplaced} applies to \`flujo schedule add\` only`);
  }
  if (sub === 'list') {
    if (id !== undefined)
      badInput(`unexpected argument "${id}"; usage: flujo schedule list [--json]`);
    return withRuntime(ctx, async (runtime) => {
      const all = await runtime.schedules();
      if (ctx.values.json === true) console.log(JSON.stringify(all));
      else if (all.length === 0) console.log('no schedules');
      else for (const s of all) for (const line of scheduleLines(s)) console.log(line);
      return ExitCode.ok;
    });
  }
  if (sub === undefined || !['add', 'pause', 'resume', 'remove', 'trigger'].includes(sub)) {
    badInput(`unknown schedule command ${JSON.stringify(sub ?? '')}; usage: ${USAGE}`);
  }
  if (id === undefined) badInput(`name the schedule; usage: ${USAGE}`);
  if (sub === 'add') return add(ctx, id, module, extra);
  if (module !== undefined) badInput(`unexpected argument "${module}"; usage: ${USAGE}`);
  return withRuntime(ctx, async (runtime) => {
    const out = (value: unknown, text: string) =>
      console.log(ctx.values.json === true ? JSON.stringify(value) : text);
    if (sub === 'pause') out(await runtime.pauseSchedule(id), `schedule ${id} paused`);
    else if (sub === 'resume') out(await runtime.resumeSchedule(id), `schedule ${id} resumed`);
    else if (sub === 'remove') {
      await runtime.removeSchedule(id);
      out({ id, removed: true }, `schedule ${id} removed`);
    } else {
      const fire = await runtime.triggerSchedule(id);
      out(fire, `schedule ${id}: ${fireWord(fire)}`);
    }
    return ExitCode.ok;
  });
}

/** `flujo schedule add <id> <job-module> …`: every option checked before anything is written. */
async function add(
  ctx: Ctx,
  id: string,
  module: string | undefined,
  extra: string[],
): Promise<number> {
  if (extra.length > 0) badInput(`unexpected argument "${extra[0]}"; usage: ${USAGE}`);
  if (module === undefined) badInput(`name the job module whose plan it starts; usage: ${USAGE}`);
  const options = addOptions(ctx);
  const job = await loadJobModule(module, ctx.cwd);
  return withRuntime(ctx, async (runtime) => {
    const input = options.input ?? job.input;
    const info = await runtime.schedule(id, {
      ...options,
      ...(input === undefined ? {} : { input }),
      plan: job.plan,
    });
    if (ctx.values.json === true) console.log(JSON.stringify(info));
    else for (const line of scheduleLines(info)) console.log(line);
    return ExitCode.ok;
  });
}

/** Runs `body` with a runtime on the command's Redis, closed after. */
async function withRuntime(
  ctx: Ctx,
  body: (runtime: ReturnType<Awaited<ReturnType<typeof connect>>['runtime']>) => Promise<number>,
): Promise<number> {
  const conn = await connect({ ...ctx.values, cwd: ctx.cwd, env: ctx.env });
  try {
    return await body(conn.runtime());
  } finally {
    await conn.close();
  }
}
