/** `flujo validate <plan.json> [--json]`: checks a plan file; needs no Redis. */
import { readFileSync } from 'node:fs';
import { PlanValidationError } from '../../errors.js';
import { topologicalOrder } from '../../plan/graph.js';
import { parsePlan } from '../../plan/parse-plan.js';
import { stepNeedsApproval, type Plan } from '../../plan/schema.js';
import { ExitCode } from '../exit-codes.js';
import { loadJobModule, runSetup } from '../job-module.js';
import type { Runtime } from '../../runtime.js';

/**
 * `flujo validate <job-module>`: loads and checks the module as run does (exit 2 with the fix).
 * Agents exported as a function are built as run builds them (after the module's setup, whose
 * teardown then runs) and checked: their names, and their tools' inputs, which each model call
 * sends as JSON Schema.
 */
async function validateModule(file: string, cwd: string, json: boolean): Promise<number> {
  const job = await loadJobModule(file, cwd);
  if (job.agentsBuilder !== undefined) {
    const registry = { agent: () => registry } as unknown as Pick<Runtime, 'agent'>;
    const teardown = await runSetup(job, cwd, registry);
    await teardown();
  }
  if (json) console.log(JSON.stringify({ ok: true, plan: job.plan, module: job.path }));
  else {
    const names = Object.keys(job.operators).join(', ') || 'none';
    console.log(
      `job module "${job.path}": plan "${job.plan.name}", ${job.plan.steps.length} steps, valid (operators: ${names})`,
    );
    for (const id of topologicalOrder(job.plan)) console.log(`  ${id}`);
  }
  return ExitCode.ok;
}

export async function cmdValidate(
  file: string | undefined,
  json: boolean,
  cwd: string = process.cwd(),
): Promise<number> {
  if (file === undefined) {
    console.error('flujo validate: name the plan file, e.g. `flujo validate plan.json`.');
    return ExitCode.badInput;
  }
  if (/\.(m?[jt]s)$/.test(file)) return validateModule(file, cwd, json);
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
    const notes = uncheckedEffects(plan);
    if (json) {
      console.log(JSON.stringify({ ok: true, plan, notes }));
      return ExitCode.ok;
    }
    console.log(`plan "${plan.name}": ${plan.steps.length} steps, valid`);
    for (const id of topologicalOrder(plan)) {
      const step = byId.get(id)!;
      const deps = step.dependsOn.length > 0 ? ` after ${step.dependsOn.join(', ')}` : '';
      const gate = stepNeedsApproval(step) ? ' [approval]' : '';
      console.log(`  ${id} (${step.kind})${deps}${gate}`);
    }
    for (const note of notes) console.log(`note: ${note}`);
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

/**
 * What the plan leaves unchecked: operator and agent steps (the ones that call tools) that declare
 * no `effects` may call a tool of any class.
 */
function uncheckedEffects(plan: Plan): string[] {
  const open = plan.steps.filter(
    (s) => (s.kind === 'operator' || s.kind === 'agent') && s.effects.length === 0,
  );
  if (open.length === 0) return [];
  const ids = open.map((s) => s.id).join(', ');
  return [
    `${open.length === 1 ? `step ${ids} declares no effects, so its` : `steps ${ids} declare no effects, so their`} tool calls are not checked against a class; declare e.g. effects: ["read_only", "external"] to refuse any other class before it runs`,
  ];
}
