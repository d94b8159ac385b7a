import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { isFlujoError, PlanValidationError } from '../errors.js';
import { parsePlan } from '../plan/parse-plan.js';
import { stepNeedsApproval } from '../plan/schema.js';
import { topologicalOrder } from '../plan/graph.js';

/** Exit codes of the `flujo` command. */
export const ExitCode = {
  ok: 0,
  failed: 1,
  badInput: 2,
} as const;

const HELP = `flujo: durable execution runtime for AI agents and multi-step jobs

Usage:
  flujo validate <plan.json> [--json]   check a plan; print its steps in dependency order
  flujo --version
  flujo --help

Exit codes: 0 ok, 1 failed, 2 bad input (the message names the field and the fix).`;

function readVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
    version: string;
  };
  return pkg.version;
}

function validate(file: string | undefined, json: boolean): number {
  if (file === undefined) {
    console.error('flujo validate: name the plan file, e.g. `flujo validate plan.json`.');
    return ExitCode.badInput;
  }
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    console.error(`flujo validate: cannot read "${file}": ${(err as Error).message}`);
    return ExitCode.badInput;
  }
  try {
    const plan = parsePlan(text);
    const byId = new Map(plan.steps.map((s) => [s.id, s]));
    if (json) {
      console.log(JSON.stringify({ ok: true, plan }));
      return ExitCode.ok;
    }
    console.log(`plan "${plan.name}": ${plan.steps.length} steps, valid`);
    for (const id of topologicalOrder(plan)) {
      const step = byId.get(id)!;
      const deps = step.dependsOn.length > 0 ? ` after ${step.dependsOn.join(', ')}` : '';
      const gate = stepNeedsApproval(step) ? ' [approval]' : '';
      console.log(`  ${id} (${step.kind})${deps}${gate}`);
    }
    return ExitCode.ok;
  } catch (err) {
    if (err instanceof PlanValidationError) {
      if (json) console.log(JSON.stringify({ ok: false, error: err.toJSON() }));
      else console.error(`${file}: ${err.message}`);
      return ExitCode.badInput;
    }
    throw err;
  }
}

/** Runs the CLI with `argv` (without the node and script paths); returns the exit code. */
export function main(argv: readonly string[]): number {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...argv],
      allowPositionals: true,
      options: {
        json: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
        version: { type: 'boolean', short: 'v', default: false },
      },
    });
  } catch (err) {
    console.error(`flujo: ${(err as Error).message}. See \`flujo --help\`.`);
    return ExitCode.badInput;
  }
  const { values, positionals } = parsed;
  if (values.version) {
    console.log(readVersion());
    return ExitCode.ok;
  }
  const [command, ...rest] = positionals;
  if (values.help || command === undefined || command === 'help') {
    console.log(HELP);
    return ExitCode.ok;
  }
  try {
    switch (command) {
      case 'validate':
        return validate(rest[0], values.json);
      default:
        console.error(`flujo: unknown command "${command}". See \`flujo --help\`.`);
        return ExitCode.badInput;
    }
  } catch (err) {
    console.error(`flujo: ${isFlujoError(err) ? `${err.name}: ${err.message}` : String(err)}`);
    return ExitCode.failed;
  }
}
