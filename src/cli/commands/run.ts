/** `flujo run`, `flujo resume` and `flujo worker`: the commands that execute a job module's runs. */
import { describePlanDifferences, diffPlans } from '../../plan/diff.js';
import type { Plan } from '../../plan/schema.js';
import { preloadTokenizers } from '../../llm/tokens.js';
import { runExists } from '../../persistence/run-lookups.js';
import type { Runtime, RunReport, StartSignal } from '../../runtime.js';
import { checkRunId, connect, recordRunModule, type Connection } from '../connect.js';
import {
  parseConcurrency,
  parseJsonOption,
  repeatFlags,
  hasMaskedPassword,
  MASKED_PASSWORD_HINT,
  whoDecides,
  type Ctx,
} from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';
import { cliWorkerQueues, loadJobModule, runSetup, type JobModule } from '../job-module.js';
import { parseOutageLimit, watchRedis, type RedisWatch } from '../outage.js';
import {
  nextCommands,
  resumeCommand,
  workerStatusJson,
  workerStatusLine,
  type NextCommands,
} from '../render.js';
import type { FlujoWorker } from '../../worker/worker.js';
import { drive, finish, lastEventId } from './drive.js';
import { runtimeCore } from '../../runtime.js';

async function withJob(
  ctx: Ctx,
  job: JobModule,
  long: boolean,
  body: (conn: Connection, runtime: Runtime) => Promise<number>,
  existingRun?: string,
): Promise<number> {
  // A worker builds its agents' tokenizers when it starts; started here, the build also goes on
  // while the command connects and starts the run (agents built by setup are the worker's).
  if (job.agents.length > 0) void preloadTokenizers(job.agents.map((a) => a.model)).catch(() => {});
  const conn = await connect({
    ...ctx.values,
    cwd: ctx.cwd,
    env: ctx.env,
    long,
    ...(existingRun === undefined ? {} : { existingRun }),
  });
  try {
    return await body(conn, conn.runtime(job));
  } finally {
    await conn.close();
  }
}

/** Refuses to drive a run with the operators of another plan's job module. */
function checkSamePlan(report: RunReport, job: JobModule): void {
  if (report.planName !== job.plan.name) {
    badInput(
      `run "${report.runId}" is a run of plan "${report.planName}", but job module "${job.path}" has plan "${job.plan.name}"; pass the job module that started the run`,
    );
  }
}

/**
 * Says which steps and fields of the job module's plan differ from the plan the run was started
 * with: the run goes on with its stored plan (only the module's code is new).
 */
function warnIfPlanChanged(runId: string, stored: Plan, job: JobModule): void {
  const differences = diffPlans(stored, job.plan);
  if (differences.length === 0) return;
  console.error(
    `flujo: warning: the plan of job module "${job.path}" differs from the plan run "${runId}" was started with (${describePlanDifferences(differences)}); the run goes on with its stored plan, with the module's operators, policies, tools and agents`,
  );
}

/**
 * `--signal NAME [--data JSON] [--id ID]` of `flujo run`: the signal the run of the request key
 * takes (start or signal). Needs `--request-key`.
 */
function startSignalOf(v: Ctx['values'], requestKey: string | undefined): StartSignal | undefined {
  const name = v.signal;
  if (name === undefined) {
    if (v.data !== undefined || v.id !== undefined) {
      badInput('--data and --id go with --signal NAME (start or signal); see `flujo --help`');
    }
    return undefined;
  }
  if (requestKey === undefined) {
    badInput(
      '--signal needs --request-key: the run of that key (started now, or found) takes the signal',
    );
  }
  const payload = v.data === undefined ? null : parseJsonOption(v.data, '--data', '{"ok":true}');
  return { name, payload, ...(v.id === undefined ? {} : { id: v.id }) };
}

/** `--priority N`: an integer from -1000 to 1000 (higher goes first). */
function parsePriority(text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!/^-?\d+$/.test(text) || n < -1000 || n > 1000) {
    badInput(
      `--priority "${text}" is not an integer from -1000 to 1000 (higher goes first, 0 by default); pass e.g. --priority 10`,
    );
  }
  return n;
}

/** `--singleton KEY[:skip|cancel_previous]`: the run's singleton key and mode. */
function parseSingleton(
  text: string | undefined,
): { key: string; mode: 'skip' | 'cancel_previous' } | undefined {
  if (text === undefined) return undefined;
  const colon = text.lastIndexOf(':');
  const tail = colon < 0 ? '' : text.slice(colon + 1);
  const moded = tail === 'skip' || tail === 'cancel_previous';
  const key = moded ? text.slice(0, colon) : text;
  if (key === '' || key.length > 512) {
    badInput(
      `--singleton "${text}" needs a key of 1 to 512 characters, then optionally :skip or :cancel_previous; pass e.g. --singleton inbox-42:skip`,
    );
  }
  return { key, mode: moded ? tail : 'skip' };
}

/** `flujo run <job-module> [--input JSON] [--run-id ID] [--request-key K [--signal NAME [--data JSON] [--id ID]]] [--priority N] [--singleton KEY[:MODE]] [--concurrency N] [--json]` */
export async function cmdRun(ctx: Ctx): Promise<number> {
  const v = ctx.values;
  if (ctx.args.length > 1) badInput(`unexpected argument "${ctx.args[1]}"; see \`flujo --help\``);
  // Everything is checked before connecting: a bad input writes nothing.
  const input =
    v.input === undefined ? undefined : parseJsonOption(v.input, '--input', '{"url":"…"}');
  const concurrency = parseConcurrency(v.concurrency);
  const outageLimitMs = parseOutageLimit(v['redis-outage-limit'], badInput);
  const runId =
    v['run-id'] === undefined ? undefined : checkRunId(v['run-id'], 'flujo run <job> --run-id ID');
  const requestKey = v['request-key'];
  if (requestKey !== undefined && (requestKey === '' || requestKey.length > 512)) {
    badInput('--request-key must be 1 to 512 characters; pass e.g. --request-key order-1234');
  }
  const signal = startSignalOf(v, requestKey);
  const priority = parsePriority(v.priority);
  const singleton = parseSingleton(v.singleton);
  const job = await loadJobModule(ctx.args[0], ctx.cwd);
  const json = v.json === true;

  return withJob(ctx, job, true, async (conn, runtime) => {
    if (runId !== undefined && (await runExists(conn.redis, conn.keys, runId))) {
      badInput(
        `run "${runId}" already exists; continue it with \`${resumeCommand(runId, job.file, repeatFlags(v))}\`, or pass another --run-id`,
      );
    }
    // Before the run is created: agents exported as a function are built and checked after
    // setup, and a bad one must leave nothing written.
    const teardown = await runSetup(job, ctx.cwd, runtime);
    try {
      const handle = await runtime.start(job.plan, input ?? job.input ?? null, {
        ...(runId === undefined ? {} : { runId }),
        ...(requestKey === undefined ? {} : { requestKey }),
        ...(signal === undefined ? {} : { signal }),
        ...(priority === undefined ? {} : { priority }),
        ...(singleton === undefined ? {} : { singleton }),
      });
      if (handle.created) await recordRunModule(conn, handle.runId, job.file);
      const flags = repeatFlags(v);
      const resume = resumeCommand(handle.runId, job.file, flags);
      const note = hasMaskedPassword(flags) ? MASKED_PASSWORD_HINT : undefined;
      // First: the run id and how to resume it, so a killed command loses nothing.
      if (json) {
        console.log(
          JSON.stringify({
            type: 'run',
            runId: handle.runId,
            created: handle.created,
            ...(handle.signal === undefined ? {} : { signal: handle.signal }),
            ...(handle.skipped === true ? { skipped: true } : {}),
            ...(handle.cancelled === undefined ? {} : { cancelled: handle.cancelled }),
            resume,
            ...(note === undefined ? {} : { note }),
          }),
        );
      } else {
        const how = handle.created
          ? `plan "${job.plan.name}"`
          : handle.skipped === true
            ? `live run of singleton key "${singleton?.key}": nothing started`
            : `existing run of request key "${requestKey}"`;
        console.log(`run ${handle.runId} (${how})`);
        if (handle.cancelled !== undefined) {
          console.log(`cancelled run ${handle.cancelled} (singleton key "${singleton?.key}")`);
        }
        if (handle.signal !== undefined) {
          console.log(
            `signal "${handle.signal.name}" #${handle.signal.index + 1} of its name sent to it${handle.signal.duplicate ? ' (sent before with this id)' : ''}`,
          );
        }
        console.log(`resume: ${resume}`);
        if (note !== undefined) console.log(`note: ${note}`);
      }
      if (!handle.created) {
        checkSamePlan(await handle.status(), job);
        warnIfPlanChanged(
          handle.runId,
          (await runtimeCore(runtime).meta.read(handle.runId)).plan,
          job,
        );
      }
      const next = nextCommands(handle.runId, job.file, repeatFlags(v));
      if (handle.created)
        return await drive(runtime, handle.runId, {
          after: undefined,
          json,
          concurrency,
          resume,
          next,
          quiet: v.quiet === true,
          conn,
          outageLimitMs,
        });
      return await proceed(conn, runtime, handle.runId, {
        json,
        concurrency,
        outageLimitMs,
        resume,
        next,
        resumeFailed: false,
        by: '',
        quiet: v.quiet === true,
      });
    } finally {
      await teardown();
    }
  });
}

/** `flujo resume <runId> <job-module> [--concurrency N] [--json]` */
export async function cmdResume(ctx: Ctx): Promise<number> {
  const v = ctx.values;
  const runId = checkRunId(ctx.args[0], 'flujo resume <runId> <job-module>');
  if (ctx.args[1] === undefined) {
    badInput(
      `name the job module that started the run: \`flujo resume ${runId} <job-module>\` (operators are code)`,
    );
  }
  if (ctx.args.length > 2) badInput(`unexpected argument "${ctx.args[2]}"; see \`flujo --help\``);
  const concurrency = parseConcurrency(v.concurrency);
  const outageLimitMs = parseOutageLimit(v['redis-outage-limit'], badInput);
  const by = whoDecides(v, ctx.env);
  const job = await loadJobModule(ctx.args[1], ctx.cwd);
  const json = v.json === true;
  return withJob(
    ctx,
    job,
    true,
    async (conn, runtime) => {
      await conn.requireRun(runId);
      checkSamePlan(await runtime.status(runId), job);
      warnIfPlanChanged(runId, (await runtimeCore(runtime).meta.read(runId)).plan, job);
      const next = nextCommands(runId, job.file, repeatFlags(v));
      const resume = next.resume;
      const teardown = await runSetup(job, ctx.cwd, runtime);
      try {
        return await proceed(conn, runtime, runId, {
          json,
          concurrency,
          outageLimitMs,
          resume,
          next,
          resumeFailed: true,
          by,
          quiet: v.quiet === true,
        });
      } finally {
        await teardown();
      }
    },
    runId,
  );
}

/**
 * Continues an existing run: a running one is driven on, a failed one is resumed first (when
 * asked), a waiting one with a signal queued or a timer due is driven on, and one that ended or
 * waits for something else is only reported.
 */
async function proceed(
  conn: Connection,
  runtime: Runtime,
  runId: string,
  o: {
    json: boolean;
    concurrency: number;
    outageLimitMs: number;
    resume: string;
    next: NextCommands;
    resumeFailed: boolean;
    by: string;
    quiet: boolean;
  },
): Promise<number> {
  const after = await lastEventId(conn, runId);
  const report = await runtime.status(runId);
  if (report.status === 'failed' && o.resumeFailed) {
    await runtime.resume(runId, { by: o.by });
  } else if (report.status === 'waiting' && wakeable(report, Date.now())) {
    await enqueueWakes(runtime, runId);
  } else if (report.status !== 'running') {
    return finish(report, o.json, o.resume);
  }
  return drive(runtime, runId, {
    after,
    json: o.json,
    concurrency: o.concurrency,
    resume: o.resume,
    next: o.next,
    quiet: o.quiet,
    conn,
    outageLimitMs: o.outageLimitMs,
  });
}

/**
 * Whether a waiting run has something to go on with now: a signal queued for one of its waits, or
 * a timer (or a signal wait's timeout) whose time came. Its command drives it then, rather than
 * only reporting it: no `flujo worker` may be running to take the wake-up.
 */
function wakeable(report: RunReport, now: number): boolean {
  return report.waits.some((w) => w.queued > 0 || (w.dueAt !== null && w.dueAt <= now));
}

/** Adds the run's due jobs again, its wake-ups among them (ids make repeats harmless). */
async function enqueueWakes(runtime: Runtime, runId: string): Promise<void> {
  const core = runtimeCore(runtime);
  const env = await core.stores.store.tryLoad(runId, { outputs: false });
  if (env === null) return;
  await core.stores.acknowledgeRead(runId);
  await core.queues.enqueueDue(runId, env);
}

/** `flujo worker <job-module> [--concurrency N]`: runs until SIGINT or SIGTERM. */
/** `--status-every MS`: a whole number of milliseconds from 100 to 3600000, or undefined. */
export function parseStatusEvery(text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const ms = Number(text);
  if (!/^\d+$/.test(text) || ms < 100 || ms > 3_600_000) {
    badInput(
      `--status-every "${text}" is not a whole number of milliseconds from 100 to 3600000; pass e.g. --status-every 5000`,
    );
  }
  return ms;
}

/**
 * Shows a worker's status on stderr until the returned function is called: a JSON line every
 * `every` ms when given; else, when stderr is a terminal, a line for a person whenever the
 * status changes. SIGUSR2 prints a JSON line at any time.
 */
function showStatus(worker: FlujoWorker, every: number | undefined): () => void {
  const json = () => process.stderr.write(`${workerStatusJson(worker.status(), Date.now())}\n`);
  process.on('SIGUSR2', json);
  let timer: NodeJS.Timeout | undefined;
  if (every !== undefined) {
    timer = setInterval(json, every);
  } else if (process.stderr.isTTY) {
    let last = '';
    timer = setInterval(() => {
      const line = workerStatusLine(worker.status());
      if (line === last) return;
      last = line;
      process.stderr.write(`${line}\n`);
    }, 250);
  }
  return () => {
    clearInterval(timer);
    process.off('SIGUSR2', json);
  };
}

/** Resolves once Redis has not answered for `ms` in a row (as the watch's PINGs see it). */
function redisGoneFor(watch: RedisWatch, ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    let downSince: number | null = null;
    const timer = setInterval(() => {
      if (signal.aborted) return clearInterval(timer);
      if (watch.up) downSince = null;
      else downSince ??= Date.now();
      if (downSince !== null && Date.now() - downSince >= ms) {
        clearInterval(timer);
        resolve();
      }
    }, 100);
  });
}

/**
 * Stops a worker on SIGINT or SIGTERM: its running units finish and commit first. It does not
 * wait for what cannot come: when Redis has not answered for the connection's timeout, no unit
 * can commit, so the worker stops without them; a second signal stops it at once. Either way a
 * unit that did not commit is not lost: its job is redelivered to a worker once its lock expires
 * (and Redis answers), and its guard and the ledger keep its effects from running twice.
 */
async function stopWorker(worker: FlujoWorker, watch: RedisWatch, conn: Connection) {
  console.log('flujo worker: stopping (running units finish first; a second Ctrl-C stops at once)');
  const done = new AbortController();
  const again = new Promise<'again'>((resolve) => {
    const stop = () => resolve('again');
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
    done.signal.addEventListener('abort', () => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
    });
  });
  const how = await Promise.race([
    worker.close().then(() => 'closed' as const),
    again,
    redisGoneFor(watch, conn.timeoutMs, done.signal).then(() => 'gone' as const),
  ]);
  done.abort();
  watch.stop();
  if (how === 'again') {
    console.log(
      'flujo worker: stopped at once; a unit that was running runs again on a worker once its job lock expires',
    );
  } else if (how === 'gone') {
    console.error(
      `flujo worker: Redis at ${conn.target} does not answer; stopped without waiting for the running units (each runs again on a worker once Redis is back)`,
    );
    return ExitCode.redisUnavailable;
  }
  return ExitCode.ok;
}

export async function cmdWorker(ctx: Ctx): Promise<number> {
  if (ctx.args.length > 1) badInput(`unexpected argument "${ctx.args[1]}"; see \`flujo --help\``);
  const concurrency = parseConcurrency(ctx.values.concurrency);
  const statusEvery = parseStatusEvery(ctx.values['status-every']);
  const job = await loadJobModule(ctx.args[0], ctx.cwd);
  return withJob(ctx, job, true, async (conn, runtime) => {
    const teardown = await runSetup(job, ctx.cwd, runtime);
    try {
      // The module's schedules are defined (or updated) before the worker takes their fires.
      for (const [id, options] of Object.entries(job.schedules))
        await runtime.schedule(id, options);
      const queues = cliWorkerQueues(job);
      const worker = runtime.createWorker({ concurrency, queues });
      const watch = watchRedis({
        url: conn.url,
        target: conn.target,
        timeoutMs: conn.timeoutMs,
        limitMs: Infinity,
      });
      const stopped = new Promise<void>((resolve) => {
        process.once('SIGINT', () => resolve());
        process.once('SIGTERM', () => resolve());
      });
      await worker.ready();
      console.log(
        `flujo worker: processing runs on ${conn.target} (prefix ${conn.prefix}, concurrency ${concurrency}) with the operators of ${job.path}, from queues ${queues.join(', ')}; Ctrl-C stops it`,
      );
      const hideStatus = showStatus(worker, statusEvery);
      await stopped;
      const code = await stopWorker(worker, watch, conn);
      hideStatus();
      return code;
    } finally {
      await teardown();
    }
  });
}
