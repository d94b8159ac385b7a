/** `flujo list`: the runs of a prefix, newest first (no job module needed). */
import type { WorkerInfo } from '../../worker/heartbeat.js';
import type { RunListFilter } from '../../worker/run-list.js';
import { RunStatus } from '../../machines/types.js';
import { connect } from '../connect.js';
import type { Ctx } from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';
import { listLines } from '../render.js';

const AGE = /^(\d+(?:\.\d+)?)(s|m|h|d)$/;
const UNIT_MS: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** `--since` / `--until`: an ISO time, or an age such as `30m`, `6h`, `2d` (that long ago). */
export function parseTimeOption(value: string, flag: string, now: number): number {
  const age = AGE.exec(value);
  if (age !== null) return now - Number(age[1]) * UNIT_MS[age[2]!]!;
  const ms = Date.parse(value);
  if (Number.isNaN(ms)) {
    badInput(
      `${flag} must be an ISO time (e.g. 2026-11-26T09:00:00Z) or an age (e.g. 30m, 6h, 2d); got "${value}"`,
    );
  }
  return ms;
}

/** The filter the options ask for, checked before connecting. */
export function listFilterOf(ctx: Ctx, now: number): RunListFilter {
  const v = ctx.values;
  if (ctx.args.length > 0) badInput(`unexpected argument "${ctx.args[0]}"; see \`flujo --help\``);
  const statuses = Object.values(RunStatus) as string[];
  const status = v.status?.split(',');
  const bad = status?.find((s) => !statuses.includes(s));
  if (bad !== undefined) {
    badInput(
      `--status must be one or more of ${statuses.join(', ')} (comma-separated); got "${bad}"`,
    );
  }
  let limit: number | undefined;
  if (v.limit !== undefined) {
    limit = Number(v.limit);
    if (!/^\d+$/.test(v.limit) || limit < 1 || limit > 1000) {
      badInput(`--limit must be an integer from 1 to 1000; got "${v.limit}"`);
    }
  }
  for (const flag of ['plan', 'tenant'] as const) {
    if (v[flag] === '') badInput(`--${flag} must not be empty`);
  }
  return {
    ...(status === undefined ? {} : { status: status as RunStatus[] }),
    ...(v.plan === undefined ? {} : { plan: v.plan }),
    ...(v.tenant === undefined ? {} : { tenantId: v.tenant }),
    ...(v.since === undefined ? {} : { since: parseTimeOption(v.since, '--since', now) }),
    ...(v.until === undefined ? {} : { until: parseTimeOption(v.until, '--until', now) }),
    ...(limit === undefined ? {} : { limit }),
  };
}

/** `flujo list [--status S] [--plan P] [--tenant T] [--since T] [--until T] [--limit N] [--json]` */
export async function cmdList(ctx: Ctx): Promise<number> {
  const now = Date.now();
  const filter = listFilterOf(ctx, now);
  const conn = await connect({ ...ctx.values, cwd: ctx.cwd, env: ctx.env });
  try {
    const runs = await conn.runtime().list(filter);
    if (ctx.values.json === true) console.log(JSON.stringify(runs));
    else for (const line of listLines(runs, now)) console.log(line);
    return ExitCode.ok;
  } finally {
    await conn.close();
  }
}

/** `flujo workers [--json]`: the live workers of the prefix, one line each (JSON: an array). */
export async function cmdWorkers(ctx: Ctx): Promise<number> {
  if (ctx.args.length > 0) badInput(`unexpected argument "${ctx.args[0]}"; see \`flujo --help\``);
  const conn = await connect({ ...ctx.values, cwd: ctx.cwd, env: ctx.env });
  try {
    const workers = await conn.runtime().workers();
    if (ctx.values.json === true) console.log(JSON.stringify(workers));
    else for (const line of workerLines(workers, Date.now())) console.log(line);
    return ExitCode.ok;
  } finally {
    await conn.close();
  }
}

/** One line per live worker: host/pid, queues, operators, agents, units in flight, last beat. */
export function workerLines(workers: readonly WorkerInfo[], now: number): string[] {
  if (workers.length === 0) return ['no live worker on this prefix'];
  const list = (names: readonly string[]) => (names.length === 0 ? '-' : names.join(','));
  const rows = [
    ['WORKER', 'QUEUES', 'OPERATORS', 'AGENTS', 'IN FLIGHT', 'LAST BEAT'],
    ...workers.map((w) => [
      `${w.host}/${w.pid}`,
      list(w.queues),
      list(w.operators),
      list(w.agents),
      String(w.inFlight),
      `${Math.max(0, Math.round((now - w.beatAt) / 1000))}s ago`,
    ]),
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) =>
    r
      .map((c, i) => c.padEnd(widths[i]!))
      .join('  ')
      .trimEnd(),
  );
}
