/** The `flujo` command: argument parsing, dispatch, and the one place errors become exit codes. */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { findCause, isFlujoError, RedisUnavailableError } from '../errors.js';
import { isConnectionError } from '../persistence/redis-errors.js';
import { cmdDecide, cmdCancel, cmdLedgerResolve } from './commands/steer.js';
import { cmdEvents, cmdLedgerList, cmdStatus, cmdUsage } from './commands/read.js';
import { cmdRedis } from './commands/redis.js';
import { cmdResume, cmdRun, cmdWorker } from './commands/run.js';
import { cmdValidate } from './commands/validate.js';
import { redisTarget, unreachable } from './connect.js';
import type { Ctx, Values } from './context.js';
import { CliError, ExitCode } from './exit-codes.js';

export { ExitCode } from './exit-codes.js';

const HELP = `flujo: durable execution runtime for AI agents and multi-step jobs

Usage:
  flujo run <job-module> [--input JSON] [--run-id ID] [--request-key K] [--concurrency N] [--json]
      Start a run (with --request-key: find that key's run), print its id and the exact resume
      command first, then execute it with an in-process worker, one line per step state change,
      until it ends or waits for approval; then print its summary.
  flujo resume <runId> <job-module> [--concurrency N] [--by NAME] [--json]
      Go on with a run: a failed run is resumed, a running one continued (e.g. after its command
      was killed); an ended or waiting run is only reported.
  flujo worker <job-module> [--concurrency N]      a long-running worker; Ctrl-C stops it gracefully
  flujo status <runId> [--json]                   the run and its steps; exits with the run's code
  flujo events <runId> [--follow] [--json]        one line per event; --follow until the run ends
  flujo approve <runId> <stepId> [--by NAME] [--comment TEXT] [--json]
  flujo reject <runId> <stepId> [--by NAME] [--comment TEXT] [--json]
  flujo cancel <runId> [--by NAME] [--reason TEXT] [--json]
  flujo ledger <runId> [--json]                   the run's tool calls
  flujo ledger resolve <runId> <callId> --succeeded '<json>' | --retry [--by NAME]
      settle an in-doubt tool call: its effect happened (with its receipt), or call it again
  flujo usage <runId> [--json]                    model usage per step and turn: reserved, spent
      (tokens and USD) and how each reservation was reconciled; the run's totals
  flujo validate <plan.json> [--json]             check a plan; print its steps in dependency order
  flujo redis stop                                stop the embedded redis-server of this directory
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
The other commands need no job module: the plan is stored with the run.

Redis: --redis URL, else REDIS_URL, else an embedded redis-server with AOF, its data in
.flujo/redis of the working directory. The embedded server is started detached and KEEPS RUNNING
after the command, so the next command (and a resume after a crash) reuses it; stop it with
\`flujo redis stop\`. --prefix P (or FLUJO_PREFIX) sets the key prefix (default flujo); every
worker on a prefix must know the operators of the runs on it. --by defaults to $USER, else "cli".

Exit codes:
  0    the run succeeded, or the command did what it was asked
  1    the run failed
  2    bad input: the message names the fix, and nothing was written
  3    the run waits for approval
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
  concurrency: { type: 'string' },
  follow: { type: 'boolean' },
  by: { type: 'string' },
  comment: { type: 'string' },
  reason: { type: 'string' },
  succeeded: { type: 'string' },
  retry: { type: 'boolean' },
  redis: { type: 'string' },
  prefix: { type: 'string' },
} as const;

const CONNECTS = ['redis', 'prefix'];
const DECIDE = ['by', 'comment', 'json', ...CONNECTS];
/** The options each command takes. */
const ALLOWED: Record<string, readonly string[]> = {
  run: ['input', 'run-id', 'request-key', 'concurrency', 'json', ...CONNECTS],
  resume: ['concurrency', 'json', 'by', ...CONNECTS],
  worker: ['concurrency', ...CONNECTS],
  status: ['json', ...CONNECTS],
  events: ['follow', 'json', ...CONNECTS],
  approve: DECIDE,
  reject: DECIDE,
  cancel: ['by', 'reason', 'json', ...CONNECTS],
  ledger: ['json', 'succeeded', 'retry', 'by', ...CONNECTS],
  usage: ['json', ...CONNECTS],
  validate: ['json'],
  redis: [],
};

function readVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
    version: string;
  };
  return pkg.version;
}

async function dispatch(command: string, ctx: Ctx): Promise<number> {
  switch (command) {
    case 'run':
      return cmdRun(ctx);
    case 'resume':
      return cmdResume(ctx);
    case 'worker':
      return cmdWorker(ctx);
    case 'status':
      return cmdStatus(ctx);
    case 'events':
      return cmdEvents(ctx);
    case 'approve':
    case 'reject':
      return cmdDecide(ctx, command);
    case 'cancel':
      return cmdCancel(ctx);
    case 'ledger':
      if (ctx.args[0] === 'resolve') return cmdLedgerResolve({ ...ctx, args: ctx.args.slice(1) });
      return cmdLedgerList(ctx);
    case 'usage':
      return cmdUsage(ctx);
    case 'redis':
      return cmdRedis(ctx);
    default:
      return cmdValidate(ctx.args[0], ctx.values.json === true);
  }
}

/** Turns any error into its one-line message and exit code. */
function report(command: string, error: unknown): number {
  const say = (message: string) => console.error(`flujo ${command}: ${message}`);
  if (error instanceof CliError) {
    say(error.message);
    return error.exitCode;
  }
  const lost = findCause(error, isConnectionError);
  if (lost !== undefined) {
    say(unreachable(redisTarget(), lost).message);
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
      case 'run_not_resumable':
      case 'input_invalid':
      case 'plan_invalid':
      case 'ledger_state_invalid':
      case 'configuration_invalid':
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
  try {
    return await dispatch(command, { args, values, cwd, env });
  } catch (error) {
    return report(command, error);
  }
}
