/** The `flujo` command: argument parsing, dispatch, and the one place errors become exit codes. */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { findCause, isFlujoError, RedisUnavailableError } from '../errors.js';
import { isConnectionError } from '../persistence/redis-errors.js';
import { redisTarget, redisTimeout, unreachable } from './connect.js';
import type { Ctx, Values } from './context.js';
import { CliError, ExitCode } from './exit-codes.js';

export { ExitCode } from './exit-codes.js';

const HELP = `flujo: durable execution runtime for AI agents and multi-step jobs

Usage:
  flujo run <job-module> [--input JSON] [--run-id ID] [--request-key K] [--concurrency N] [--json]
           [--quiet] [--signal NAME [--data JSON] [--id ID]] [--priority N] [--singleton KEY[:MODE]]
      Start a run (with --request-key: find that key's run), print its id and the exact resume
      command first, then execute it with an in-process worker, one line per step state change,
      until it ends or waits (for approval, a signal or a timer); then print its summary.
      Operators' ctx.progress and agents' streamed text show live (--quiet hides the text); due
      work that no worker takes for 5 s is reported. With --request-key K --signal NAME: start or signal, the run of K
      (started now, or found) gets signal NAME with --data as its payload. --priority N (-1000 to
      1000, default 0): the run's units go before those of lower priority in its queue.
      --singleton KEY[:skip|cancel_previous]: while a run of KEY is live, skip (the default:
      nothing is started, that run is followed) or cancel it and start this one.
  flujo resume <runId> <job-module> [--concurrency N] [--by NAME] [--json] [--quiet]
      Go on with a run: a failed run is resumed, a running one continued (e.g. after its command
      was killed), a waiting one driven on when a signal is queued for it or its timer is due;
      an ended run, or one waiting for anything else, is only reported.
  flujo worker <job-module> [--concurrency N] [--status-every MS]
      a long-running worker; Ctrl-C stops it gracefully. It takes units from the module's queue
      (its queue export, else plan.<plan name>) and from the default queue runs, --concurrency
      units at once from each; a unit whose operator or agent it does not know goes back to its
      queue untried (status says so). Its status (the units it runs: run,
      step, attempt, turn, since; units done, failed and busy since it started) goes to stderr:
      on a terminal a line whenever it changes; with --status-every MS a JSON line
      {"type":"worker.status",...} every MS; on SIGUSR2 (kill -USR2 <pid>) a JSON line at once
  flujo schedule add <id> <job-module> (--cron EXPR [--tz TZ] | --every MS) [--input JSON]
           [--overlap skip|buffer_one|allow_all] [--catchup-window MS] [--json]
      define (or update) a schedule: each fire starts one run of the module's plan (run id
      schedule:<id>:<fire ms>), taken by the prefix's workers; --input defaults to the module's
      input; --overlap (default skip) says what a fire does while the previous run still goes:
      skip it, buffer_one (start it when that run ends; one waits at most), allow_all; a fire
      more than --catchup-window MS late (default 60000) is recorded missed
  flujo schedule list [--json]                    every schedule: rule, state, next fire, and
      its newest fires with their outcome (started run, skipped, buffered, missed, failed)
  flujo schedule pause|resume|remove|trigger <id> [--json]
      pause (no fires), resume (fires from now on), remove (its runs go on), or fire now
  flujo dev <job-module> [--port P] [--host H] [--concurrency N]
      for development, in one command: Redis (as run uses it; its URL is printed, for other
      commands' --redis), the web view (as ui, its URL printed) and a worker for the module that
      is replaced when the module or a project file it imports is saved (the old worker finishes
      its running units first; a module that does not load prints its error and the old worker
      keeps running); Ctrl-C stops everything
  flujo status <runId> [--full] [--verbose] [--json]
      the run and its steps, each attempt of a step that ran more than once with its error;
      exits with the run's code. Errors are whole (every line, causes); --verbose: with their
      stack traces; --full: payloads and call ids uncut
  flujo workers [--json]
      the live workers of the prefix (a heartbeat within the last 15 s): host/pid, queues,
      operators, agents, units in flight, last beat
  flujo list [--status S] [--plan P] [--tenant T] [--since T] [--until T] [--limit N] [--json]
      runs newest first: plan, tenant, status, start, duration, the step that waits, or a failed
      run's blocked step and reason; T is an ISO time or an age like 30m, 6h, 2d
      (--status: running|waiting|succeeded|failed|cancelled)
  flujo events <runId> [--follow] [--full] [--verbose] [--json]
      one line per event, in the order they happened (--json: in commit order); --follow until
      the run ends; errors whole (--verbose: with stacks); --full: payloads and call ids uncut.
      Besides step and run changes: tool.called (executed, receipt replayed or held, duration),
      model.called (tokens, cost, duration), model.rate_limited (a wait for the model rate
      limits), step.ran / turn.ran (worker host and pid, duration),
      step.takenOver / turn.takenOver (run again after its worker stopped)
  flujo approve <runId> <stepId> [--call ID] [--by NAME] [--comment TEXT] [--json]
  flujo reject <runId> <stepId> [--call ID] [--by NAME] [--comment TEXT] [--json]
      decide on what the step waits for: its gate, or the tool call status shows; --call ID
      (the id status prints, or its start) decides only if the step still waits on that call;
      a gate with approvers refuses anyone else (exit 2). --by is who claims to decide: a
      service that takes decisions from people must check it (createRuntime({ authorizeDecision }))
  flujo skip <runId> <stepId> --reason TEXT [--by NAME] [--json]
      a step that has not succeeded becomes SKIPPED; its dependents run with its output null
      (those its failure had cancelled run again)
  flujo cancel <runId> [--by NAME] [--reason TEXT] [--json]
  flujo signal <runId> <name> [--data JSON] [--id ID] [--json]
      send signal <name> to the run, with --data as its payload (JSON; default null): appended to
      the run's inbox in send order and taken by the first wait step for <name> that has not
      taken one. --id makes a send again a no-op (the same id with another payload: exit 2).
      When the run records its job module and the module exports signals (zod schemas), the
      name must be one of them and the payload must pass its schema (exit 2 otherwise). An
      unknown run, or one that succeeded or was cancelled: exit 2. Nothing is written when refused
  flujo trace <runId> [--out FILE] [--html]       the run's trace as JSON (every step, attempt,
      agent turn, model call, tool call and approval wait, with times); --html: a self-contained
      page that draws it as a timeline (open it in a browser, offline); --out: into FILE
  flujo inspect <runId> [--follow] [--url URL] [--json]
      the run in the Stately inspector: its events as xstate inspection events (the run machine
      and one child actor per step) sent to a WebSocket inspector (default ws://localhost:8080,
      the relay of @statelyai/inspect, started with
      node -e "import('@statelyai/inspect/server').then((m) => m.createInspectorServer())"
      which opens https://stately.ai/inspect); --follow: then live until the run ends;
      --json: print them as JSON lines instead
  flujo ledger <runId> [--json]                   the run's tool calls
  flujo ledger resolve <runId> <callId> --succeeded '<json>' | --retry [--by NAME]
      settle an in-doubt tool call: its effect happened (with its receipt), or call it again
  flujo usage <runId> [--json]                    model usage per step and turn: reserved, spent
      (tokens and USD) and how each reservation was reconciled; the run's totals
  flujo ui [--port P] [--host H]                 a local web view of the runs: the list with
      filters, a live page per run (steps, attempts, timeline, tool calls, usage), approve /
      reject forms, the schedules (/schedules) and the live workers (/workers); on 127.0.0.1:7400 unless told otherwise (--port 0: any free port); runs
      until Ctrl-C
  flujo replay <runId> --mode reproduce|replay|regenerate [--from STEP] [--allow-effects] [--json]
      reproduce: the run's stored outcomes, events and model replies, and a check that its events
      lead to its stored snapshot (exit 1 if not); writes nothing. replay / regenerate: a new run
      of the same plan and input (printed with its relation to the original) whose tool calls
      with effects return the original's receipts; a call the original did not make waits for
      approval unless --allow-effects; regenerate gives agent steps new keys, in a new lineage.
      --from STEP reuses the outputs of the steps that do not depend on STEP
  flujo validate <plan.json | job-module> [--json]
      check a plan, or a job module (its exports, that its steps' operators, agents and policies
      exist, and that its agents' tools can be shown to a model; agents exported as a function
      are built after setup); print the steps in dependency order
  flujo init [dir] [--no-node]                    scaffold a project with a typed job module
      (package.json with "type": "module" and scripts, jobs/hello.ts, tsconfig.json, README.md);
      package.json also gets Node 24 as a devDependency ("node": "^24", allowed in allowScripts),
      so that after npm install, npx flujo and the npm scripts run on it; --no-node leaves it out
  flujo redis stop                                stop the embedded redis-server of this project
  flujo --version | --help

Job module (run, resume, worker): an ES module (.js, .mjs or .ts; it imports the package as
'flujo') exporting
  plan        a plan object, JSON text, or a function returning one (may be async)
  operators   { name: async (ctx) => json }: every operator its steps name
  tools       [defineTool({ ... })] (optional)
  agents      [defineAgent({ ... })], or ({ dataDir }) => [...] called after setup, e.g. when
              setup starts the model's endpoint (optional): every agent its steps name
  input       the default run input; --input overrides it (optional)
  setup       async ({ dataDir }) => teardown? (optional): called once before run, resume and
              worker, e.g. to start a local service; the function it returns is called on exit
  pricing     { models: { "<model>": { inputPerMillion, outputPerMillion } } } in USD, or the
              path of such a JSON file beside the module (optional)
  strictPricing  true: a model without a price fails its step before any request (optional)
  rateLimits  { "<model or provider>": { requestsPerMinute?, tokensPerMinute? } } (optional):
              model calls wait for capacity, shared by every worker of the prefix
  signals     { name: zodSchema }: the signals its runs take (optional); flujo signal checks a
              payload against them when the run records this module
  schedules   { id: { cron | everyMs, tz?, input?, overlap?, catchupWindowMs? } } (optional):
              flujo worker defines (or updates) each when it starts, with the module's plan
  queue       the queue of its runs (optional; default plan.<plan name>): the runs run and
              worker start record it, and flujo worker takes units from it
The other commands need no job module: the plan is stored with the run.

Redis: --redis URL, else REDIS_URL, else an embedded redis-server with AOF, its data in
.flujo/redis of the project (the nearest folder up with .flujo/, else with package.json, else the
working directory). The embedded server is started detached and KEEPS RUNNING
after the command, so the next command (and a resume after a crash) reuses it; stop it with
\`flujo redis stop\`. --prefix P (or FLUJO_PREFIX) sets the key prefix (default flujo); each job
module's runs go to its own queue, so several modules share a prefix. --by defaults to $USER, else "cli".
A password in --redis is printed as *** in the commands flujo prints: set REDIS_URL instead.
--replicas N (--replicas-timeout MS, default 1000): every write the runtime acts on is first
acknowledged by N replicas (Redis WAIT); see docs/guides/redis-cluster.md.

Exit codes:
  0    the run succeeded, or the command did what it was asked
  1    the run failed
  2    bad input: the message names the fix, and nothing was written
  3    the run waits (for approval, a signal or a timer)
  4    the run exceeded a budget (it failed with reason budget_exceeded)
  5    the run was cancelled
  6    Redis unavailable
  130  interrupted (the run goes on with flujo resume)`;

const OPTIONS = {
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
  version: { type: 'boolean', short: 'v' },
  input: { type: 'string' },
  'run-id': { type: 'string' },
  'request-key': { type: 'string' },
  data: { type: 'string' },
  id: { type: 'string' },
  signal: { type: 'string' },
  concurrency: { type: 'string' },
  follow: { type: 'boolean' },
  out: { type: 'string' },
  html: { type: 'boolean' },
  by: { type: 'string' },
  comment: { type: 'string' },
  call: { type: 'string' },
  reason: { type: 'string' },
  succeeded: { type: 'string' },
  retry: { type: 'boolean' },
  redis: { type: 'string' },
  prefix: { type: 'string' },
  mode: { type: 'string' },
  from: { type: 'string' },
  'allow-effects': { type: 'boolean' },
  status: { type: 'string' },
  plan: { type: 'string' },
  tenant: { type: 'string' },
  since: { type: 'string' },
  until: { type: 'string' },
  limit: { type: 'string' },
  quiet: { type: 'boolean', short: 'q' },
  'redis-timeout': { type: 'string' },
  replicas: { type: 'string' },
  'replicas-timeout': { type: 'string' },
  'redis-outage-limit': { type: 'string' },
  port: { type: 'string' },
  host: { type: 'string' },
  url: { type: 'string' },
  'status-every': { type: 'string' },
  full: { type: 'boolean' },
  verbose: { type: 'boolean' },
  'no-node': { type: 'boolean' },
  cron: { type: 'string' },
  every: { type: 'string' },
  tz: { type: 'string' },
  overlap: { type: 'string' },
  'catchup-window': { type: 'string' },
  priority: { type: 'string' },
  singleton: { type: 'string' },
} as const;

const CONNECTS = ['redis', 'prefix', 'redis-timeout', 'replicas', 'replicas-timeout'];
const DECIDE = ['by', 'comment', 'call', 'json', ...CONNECTS];
/** The options each command takes. */
const ALLOWED: Record<string, readonly string[]> = {
  run: [
    'input',
    'run-id',
    'request-key',
    'signal',
    'data',
    'id',
    'concurrency',
    'json',
    'quiet',
    'redis-outage-limit',
    'priority',
    'singleton',
    ...CONNECTS,
  ],
  resume: ['concurrency', 'json', 'by', 'quiet', 'redis-outage-limit', ...CONNECTS],
  worker: ['concurrency', 'status-every', ...CONNECTS],
  dev: ['port', 'host', 'concurrency', ...CONNECTS],
  status: ['json', 'full', 'verbose', ...CONNECTS],
  list: ['status', 'plan', 'tenant', 'since', 'until', 'limit', 'json', ...CONNECTS],
  workers: ['json', ...CONNECTS],
  events: ['follow', 'full', 'verbose', 'json', ...CONNECTS],
  trace: ['out', 'html', ...CONNECTS],
  inspect: ['follow', 'url', 'json', ...CONNECTS],
  approve: DECIDE,
  reject: DECIDE,
  skip: ['by', 'reason', 'json', ...CONNECTS],
  cancel: ['by', 'reason', 'json', ...CONNECTS],
  signal: ['data', 'id', 'json', ...CONNECTS],
  ledger: ['json', 'succeeded', 'retry', 'by', ...CONNECTS],
  usage: ['json', ...CONNECTS],
  replay: ['mode', 'from', 'allow-effects', 'json', ...CONNECTS],
  validate: ['json'],
  ui: ['port', 'host', ...CONNECTS],
  redis: [],
  init: ['no-node'],
  schedule: ['cron', 'every', 'tz', 'input', 'overlap', 'catchup-window', 'json', ...CONNECTS],
};

function readVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
    version: string;
  };
  return pkg.version;
}

// Commands load what they need when they run: `--help`, a bad argument and an unreachable Redis
// answer without loading the queue and model client libraries first.
async function dispatch(command: string, ctx: Ctx): Promise<number> {
  switch (command) {
    case 'run':
      return (await import('./commands/run.js')).cmdRun(ctx);
    case 'resume':
      return (await import('./commands/run.js')).cmdResume(ctx);
    case 'worker':
      return (await import('./commands/run.js')).cmdWorker(ctx);
    case 'dev':
      return (await import('./commands/dev.js')).cmdDev(ctx);
    case 'status':
      return (await import('./commands/read.js')).cmdStatus(ctx);
    case 'workers':
      return (await import('./commands/list.js')).cmdWorkers(ctx);
    case 'list':
      return (await import('./commands/list.js')).cmdList(ctx);
    case 'events':
      return (await import('./commands/read.js')).cmdEvents(ctx);
    case 'trace':
      return (await import('./commands/trace.js')).cmdTrace(ctx);
    case 'inspect':
      return (await import('./commands/inspect.js')).cmdInspect(ctx);
    case 'approve':
    case 'reject':
      return (await import('./commands/steer.js')).cmdDecide(ctx, command);
    case 'cancel':
      return (await import('./commands/steer.js')).cmdCancel(ctx);
    case 'signal':
      return (await import('./commands/signal.js')).cmdSignal(ctx);
    case 'skip':
      return (await import('./commands/steer.js')).cmdSkip(ctx);
    case 'ledger': {
      const read = await import('./commands/read.js');
      const steer = await import('./commands/steer.js');
      if (ctx.args[0] === 'resolve')
        return steer.cmdLedgerResolve({ ...ctx, args: ctx.args.slice(1) });
      return read.cmdLedgerList(ctx);
    }
    case 'usage':
      return (await import('./commands/read.js')).cmdUsage(ctx);
    case 'redis':
      return (await import('./commands/redis.js')).cmdRedis(ctx);
    case 'replay':
      return (await import('./commands/replay.js')).cmdReplay(ctx);
    case 'init':
      return (await import('./commands/init.js')).cmdInit(ctx);
    case 'ui':
      return (await import('./commands/ui.js')).cmdUi(ctx);
    case 'schedule':
      return (await import('./commands/schedule.js')).cmdSchedule(ctx);
    default:
      return (await import('./commands/validate.js')).cmdValidate(
        ctx.args[0],
        ctx.values.json === true,
        ctx.cwd,
      );
  }
}

/** The commands that change runs: they record spans when the OpenTelemetry variables ask. */
const TRACED = new Set([
  'run',
  'resume',
  'worker',
  'approve',
  'reject',
  'skip',
  'cancel',
  'signal',
  'ledger',
  'replay',
  'ui',
  // Its web view commits decisions; its workers are `flujo worker` processes, traced themselves.
  'dev',
]);

/** Turns any error into its one-line message and exit code. */
function report(command: string, error: unknown): number {
  const say = (message: string) => console.error(`flujo ${command}: ${message}`);
  if (error instanceof CliError) {
    say(error.message);
    return error.exitCode;
  }
  const lost = findCause(error, isConnectionError);
  if (lost !== undefined) {
    say(unreachable(redisTarget(), lost, redisTimeout()).message);
    return ExitCode.redisUnavailable;
  }
  const unavailable = findCause(error, (e) => e instanceof RedisUnavailableError);
  if (unavailable instanceof RedisUnavailableError) {
    say(unavailable.message);
    return ExitCode.redisUnavailable;
  }
  if (isFlujoError(error)) {
    const oneLine = error.message
      .split('\n')
      .map((l) => l.trim())
      .join(' ');
    switch (error.code) {
      case 'run_not_found':
      case 'step_not_waiting':
      case 'step_not_skippable':
      case 'approval_not_allowed':
      case 'run_not_resumable':
      case 'input_invalid':
      case 'plan_invalid':
      case 'ledger_state_invalid':
      case 'configuration_invalid':
      case 'run_ended':
      case 'signal_id_conflict':
        say(oneLine);
        return ExitCode.badInput;
      default:
        say(`${error.name}: ${oneLine}`);
        return ExitCode.failed;
    }
  }
  say(error instanceof Error ? `${error.name}: ${error.message}` : String(error));
  return ExitCode.failed;
}

/** Runs the CLI with `argv` (without the node and script paths); resolves to the exit code. */
export async function main(
  argv: readonly string[],
  cwd: string = process.cwd(),
  env: NodeJS.ProcessEnv = process.env,
): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({ args: [...argv], allowPositionals: true, options: OPTIONS });
  } catch (err) {
    console.error(`flujo: ${(err as Error).message}. See \`flujo --help\`.`);
    return ExitCode.badInput;
  }
  const values = parsed.values as Values & { help?: boolean; version?: boolean };
  const { positionals } = parsed;
  if (values.version === true) {
    console.log(readVersion());
    return ExitCode.ok;
  }
  const [command, ...args] = positionals;
  if (values.help === true || command === undefined || command === 'help') {
    console.log(HELP);
    return ExitCode.ok;
  }
  const allowed = ALLOWED[command];
  if (allowed === undefined) {
    console.error(`flujo: unknown command "${command}". See \`flujo --help\`.`);
    return ExitCode.badInput;
  }
  const misplaced = Object.keys(values).filter((k) => !allowed.includes(k));
  if (misplaced.length > 0) {
    console.error(
      `flujo ${command}: --${misplaced[0]} does not apply to this command. See \`flujo --help\`.`,
    );
    return ExitCode.badInput;
  }
  let telemetry;
  try {
    if (TRACED.has(command)) telemetry = await (await import('./telemetry.js')).startTelemetry(env);
    return await dispatch(command, { args, values, cwd, env });
  } catch (error) {
    return report(command, error);
  } finally {
    await telemetry?.shutdown().catch(() => {});
  }
}
