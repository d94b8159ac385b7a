/**
 * Job modules: an ES module (.js, .mjs or .ts) that exports `plan` (an object, JSON text, or a
 * function returning one, possibly async), `operators`, `tools`, `agents`, a default `input` and an optional
 * `setup` hook. Everything is checked here, before the CLI connects to Redis or writes anything,
 * but agents exported as a function: those are built and checked by {@link runSetup}, after `setup`
 * and still before the command writes anything.
 *
 * Why agents may be a function: an agent names its model's endpoint when it is defined, and a job
 * may only know that endpoint once `setup` has started it (a local model server on a free port,
 * a tunnel). So `agents` may be `({ dataDir }) => AgentDefinition[]` (or a promise of one): it is
 * called once, after `setup`, with the same context, and reads whatever `setup` established (the
 * module keeps it, as it keeps any other state of its own):
 *
 *   let url: string | undefined;
 *   export async function setup({ dataDir }) { url = await startModel(dataDir); }
 *   export const agents = () => [defineAgent({ name: 'writer', provider: { baseURL: url! }, … })];
 */
import { mkdirSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { Operator } from '../actors/execute-step.js';
import { PlanValidationError } from '../errors.js';
import { findNonJson, type JsonValue } from '../internal/json.js';
import { parsePlan } from '../plan/parse-plan.js';
import type { Plan } from '../plan/schema.js';
import type { ToolDefinition } from '../tools/define-tool.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import type { Runtime } from '../runtime.js';
import { createToolRegistry } from '../tools/registry.js';
import { badInput } from './exit-codes.js';
import { loadPricingFile, parsePricing, type PricingTable } from '../llm/pricing.js';

/** What `setup` receives. */
export interface SetupContext {
  /** A directory the job may keep files in: `.flujo/data` of the working directory. */
  dataDir: string;
}

/** A cleanup returned by `setup`, called when the command exits. */
export type Teardown = () => Promise<void> | void;

/** `agents` exported as a function: called once after `setup`, with the same context. */
export type AgentsBuilder = (ctx: SetupContext) => unknown;

/** A loaded, checked job module. */
export interface JobModule {
  /** The path as given on the command line. */
  path: string;
  /** Its absolute path. */
  file: string;
  plan: Plan;
  operators: Record<string, Operator>;
  tools: ToolDefinition[];
  /**
   * The module's agents. When the module exports `agents` as a function, this is empty until
   * {@link runSetup} has called it.
   */
  agents: AgentDefinition[];
  /** `agents` as exported, when it is a function: called by {@link runSetup} after `setup`. */
  agentsBuilder: AgentsBuilder | undefined;
  /** The module's default run input, if it exports one. */
  input: JsonValue | undefined;
  setup: ((ctx: SetupContext) => Promise<void | Teardown> | void | Teardown) | undefined;
  /** Prices per model: the module's `pricing` (a table, or a JSON file beside it). */
  pricing: PricingTable | undefined;
  /** The module's `strictPricing`: a model without a price is refused before any request. */
  strictPricing: boolean;
}

const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

const firstLine = (error: unknown): string =>
  (error instanceof Error ? error.message : String(error)).split('\n')[0] ?? '';

/** Loads and checks the job module at `path` (resolved against `cwd`). Throws a bad-input CliError. */
export async function loadJobModule(path: string | undefined, cwd: string): Promise<JobModule> {
  if (path === undefined || path === '') {
    badInput('name the job module, e.g. `flujo run jobs/newsletter.ts`; see `flujo --help`');
  }
  const file = resolve(cwd, path);
  const name = JSON.stringify(path);
  let isFile: boolean;
  try {
    isFile = statSync(file).isFile();
  } catch {
    badInput(
      `cannot load job module ${name}: file not found; pass the path to a module that exports plan`,
    );
  }
  if (!isFile) {
    badInput(
      `cannot load job module ${name}: it is not a file; pass the path to a module (.js, .mjs or .ts) that exports plan`,
    );
  }
  let loaded: Record<string, unknown>;
  try {
    loaded = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (error) {
    badInput(
      `cannot load job module ${name}: ${firstLine(error)}; fix the module (an ES module that exports plan, importing the package as 'flujo')`,
    );
  }
  // `export default { plan, operators }` works too.
  const mod =
    loaded['plan'] === undefined && isRecord(loaded['default']) ? loaded['default'] : loaded;

  let source: unknown = mod['plan'];
  if (source === undefined) {
    badInput(
      `job module ${name} exports no plan; add \`export const plan = { name: '…', steps: [...] }\` (or a function returning one)`,
    );
  }
  if (typeof source === 'function') {
    try {
      source = await (source as () => unknown)();
    } catch (error) {
      badInput(`job module ${name}: its plan() threw: ${firstLine(error)}; fix the plan builder`);
    }
  }
  let plan: Plan;
  try {
    plan = parsePlan(source);
  } catch (error) {
    if (error instanceof PlanValidationError) badInput(`job module ${name}: ${error.message}`);
    throw error;
  }

  const operators = checkOperators(name, mod['operators']);
  const tools = checkTools(name, mod['tools']);
  // A function is called after setup (see runSetup), and its agents are checked then.
  const agentsBuilder =
    typeof mod['agents'] === 'function' ? (mod['agents'] as AgentsBuilder) : undefined;
  const agents = agentsBuilder === undefined ? checkAgents(name, mod['agents']) : [];
  if (agentsBuilder === undefined) checkAgentSteps(name, plan, agents);
  for (const step of plan.steps) {
    const needed =
      step.kind === 'operator' ? step.operator : step.kind === 'policy_check' ? step.policy : null;
    if (needed !== null && operators[needed] === undefined) {
      const known = Object.keys(operators).join(', ') || 'none';
      badInput(
        `job module ${name}: step "${step.id}" uses operator "${needed}", which the module's operators do not define (it defines: ${known}); add it to \`export const operators\``,
      );
    }
  }

  const input = mod['input'];
  if (input !== undefined) {
    const problems = findNonJson(input, 'input');
    if (problems.length > 0) {
      const p = problems[0]!;
      badInput(`job module ${name}: its input is not plain JSON (${p.path}: ${p.message})`);
    }
  }
  const setup = mod['setup'];
  if (setup !== undefined && typeof setup !== 'function') {
    badInput(
      `job module ${name}: setup must be a function, e.g. \`export async function setup({ dataDir }) { … }\``,
    );
  }
  const pricing = await checkPricing(name, file, mod['pricing']);
  const strictPricing = mod['strictPricing'];
  if (strictPricing !== undefined && typeof strictPricing !== 'boolean') {
    badInput(`job module ${name}: strictPricing must be true or false`);
  }
  return {
    path,
    file,
    plan,
    operators,
    tools,
    agents,
    agentsBuilder,
    input: input as JsonValue | undefined,
    setup: setup as JobModule['setup'],
    pricing,
    strictPricing: strictPricing === true,
  };
}

/** The module's `pricing`: a table, or the path of a JSON file relative to the module. */
async function checkPricing(
  name: string,
  file: string,
  value: unknown,
): Promise<PricingTable | undefined> {
  if (value === undefined) return undefined;
  try {
    if (typeof value === 'string') return await loadPricingFile(resolve(dirname(file), value));
    return parsePricing(value, `job module ${name}: pricing`);
  } catch (error) {
    return badInput(firstLine(error));
  }
}

function checkOperators(name: string, value: unknown): Record<string, Operator> {
  if (value === undefined) return {};
  if (!isRecord(value)) {
    badInput(
      `job module ${name}: operators must be an object of functions, e.g. \`export const operators = { draft: async (ctx) => ({ text: '…' }) }\``,
    );
  }
  for (const [key, fn] of Object.entries(value)) {
    if (typeof fn !== 'function') {
      badInput(
        `job module ${name}: operators.${key} is not a function; export operators as { ${key}: async (ctx) => result }`,
      );
    }
  }
  return value as Record<string, Operator>;
}

function checkTools(name: string, value: unknown): ToolDefinition[] {
  if (value === undefined) return [];
  const fix = 'export tools as an array of defineTool({ … }) definitions';
  if (!Array.isArray(value)) badInput(`job module ${name}: tools is not an array; ${fix}`);
  const tools = value as unknown[];
  tools.forEach((tool, i) => {
    if (!isRecord(tool) || typeof tool['name'] !== 'string' || typeof tool['run'] !== 'function') {
      badInput(`job module ${name}: tools[${i}] is not a tool definition; ${fix}`);
    }
  });
  try {
    createToolRegistry(tools as ToolDefinition[]);
  } catch (error) {
    badInput(`job module ${name}: ${firstLine(error)}`);
  }
  return tools as ToolDefinition[];
}

/**
 * Runs the module's `setup` hook, if any, then, when the module exports `agents` as a function,
 * calls it with the same context, checks its agents as {@link loadJobModule} checks an array
 * (a bad one is a bad-input CliError, thrown after the teardown ran) and registers them with
 * `runtime`. Returns the teardown (a no-op when there is none). Call it before the command
 * writes anything, so that a bad agent leaves nothing behind.
 */
export async function runSetup(
  job: JobModule,
  cwd: string,
  runtime: Pick<Runtime, 'agent'>,
): Promise<Teardown> {
  const ctx: SetupContext = { dataDir: join(cwd, '.flujo', 'data') };
  let teardown: Teardown = () => {};
  if (job.setup !== undefined) {
    mkdirSync(ctx.dataDir, { recursive: true });
    const returned = await job.setup(ctx);
    if (typeof returned === 'function') teardown = returned;
  }
  if (job.agentsBuilder === undefined) return teardown;
  try {
    job.agents = await buildAgents(job, ctx);
    for (const agent of job.agents) runtime.agent(agent);
  } catch (error) {
    await teardown();
    throw error;
  }
  return teardown;
}

/** Calls the module's agents function and checks what it returns. */
async function buildAgents(job: JobModule, ctx: SetupContext): Promise<AgentDefinition[]> {
  const name = JSON.stringify(job.path);
  let value: unknown;
  try {
    value = await job.agentsBuilder!(ctx);
  } catch (error) {
    badInput(
      `job module ${name}: its agents() threw: ${firstLine(error)}; fix the agents builder (it runs after setup)`,
    );
  }
  const agents = checkAgents(name, value, true);
  checkAgentSteps(name, job.plan, agents, true);
  return agents;
}

const subjectOf = (built: boolean) => (built ? 'agents()' : 'agents');

/**
 * Checks a module's agents: an array of agent definitions with distinct names, exported as such
 * or (`built`) returned by its agents function.
 */
function checkAgents(name: string, value: unknown, built = false): AgentDefinition[] {
  if (value === undefined && !built) return [];
  const subject = subjectOf(built);
  const fix = `${built ? 'return' : 'export agents as'} an array of defineAgent({ … }) definitions`;
  if (!Array.isArray(value)) {
    const or = built ? '' : ' (or a function returning one, called after setup)';
    badInput(`job module ${name}: ${subject} is not an array; ${fix}${or}`);
  }
  const agents = value as unknown[];
  const seen = new Map<string, number>();
  agents.forEach((agent, i) => {
    const named = agent as { name?: unknown; model?: unknown } | null;
    if (typeof named?.name !== 'string' || typeof named.model !== 'string') {
      badInput(`job module ${name}: ${subject}[${i}] is not an agent definition; ${fix}`);
    }
    const first = seen.get(named.name);
    if (first !== undefined) {
      badInput(
        `job module ${name}: ${subject}[${i}] and ${subject}[${first}] are both named "${named.name}"; give each agent its own name`,
      );
    }
    seen.set(named.name, i);
  });
  return agents as AgentDefinition[];
}

/** Every agent step must name one of the module's agents (`built`: those its agents() returned). */
function checkAgentSteps(
  name: string,
  plan: Plan,
  agents: readonly AgentDefinition[],
  built = false,
): void {
  for (const step of plan.steps) {
    if (step.kind === 'agent' && !agents.some((a) => a.name === step.agent)) {
      const known = agents.map((a) => a.name).join(', ') || 'none';
      const where = built ? 'the array agents() returns' : '`export const agents`';
      badInput(
        `job module ${name}: step "${step.id}" uses agent "${step.agent}", which the module's ${subjectOf(built)} do not define (it defines: ${known}); add defineAgent({ name: "${step.agent}", … }) to ${where}`,
      );
    }
  }
}
