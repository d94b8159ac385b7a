/** `flujo validate <plan.json> [--json]`: checks a plan file; needs no Redis. */
import { readFileSync } from 'node:fs';
import { PlanValidationError } from '../../errors.js';
import { topologicalOrder } from '../../plan/graph.js';
import { parsePlan } from '../../plan/parse-plan.js';
import { stepNeedsApproval } from '../../plan/schema.js';
import { ExitCode } from '../exit-codes.js';

export function cmdValidate(file: string | undefined, json: boolean): number {
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
