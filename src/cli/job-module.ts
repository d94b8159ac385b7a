/**
 * Job modules: an ES module (.js, .mjs or .ts) that exports `plan` (an object, JSON text, or a
 * function returning one, possibly async), `operators`, `policies`, `tools`, `agents`, a default `input` and an optional
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
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, extname, join, relative, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { Operator } from '../execution/execute-step.js';
import { definePolicy, type PolicyExport, type RegisteredPolicy } from '../execution/policies.js';
import { ConfigurationError, InputValidationError, PlanValidationError } from '../errors.js';
import { toolParametersSchema } from '../agents/tool-schema.js';
import { findNonJson, type JsonValue } from '../internal/json.js';
import { parsePlan } from '../plan/parse-plan.js';
import { signalNameSchema, type Plan } from '../plan/schema.js';
import type { SignalSchema } from '../actors/runtime-registry.js';
import type { ToolDefinition } from '../tools/define-tool.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import type { Runtime } from '../runtime.js';
import { createToolRegistry } from '../tools/registry.js';
import { badInput } from './exit-codes.js';
import {
  assertScheduleId,
  checkScheduleOptions,
  type ScheduleOptions,
} from '../worker/schedule-definition.js';
import { projectRoot } from './connect.js';
import { loadPricingFile, parsePricing, type PricingTable } from '../llm/pricing.js';
import { checkRateLimits, type RateLimits } from '../execution/rate-limits.js';
import { DEFAULT_QUEUE_NAME, jobQueueName, QUEUE_NAME_PATTERN } from '../persistence/keys.js';

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
  /** The plans its `run` steps start child runs of, by name (its `plans` export). */
  plans: Record<string, Plan>;
  operators: Record<string, Operator>;
  /** Policies by name: what `policy_check` steps name and what guards tagged steps. */
  policies: Record<string, PolicyExport>;
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
  /** The signals its plan declares: name → zod schema of the payload (empty: any, unchecked). */
  signals: Record<string, SignalSchema>;
  /** The module's `rateLimits`: model rate limits by model or provider (see `RateLimits`). */
  rateLimits: RateLimits | undefined;
  /** The module's `schedules`, by id, each with the module's plan: `flujo worker` defines them. */
  schedules: Record<string, ScheduleOptions>;
  /**
   * The queue of the module's runs: its `queue` export, else {@link jobQueueName} of its plan's
   * name. The runs the CLI starts with the module record it; its workers take units from it.
   */
  queue: string;
}

/**
 * The queues a worker of a job module started by the CLI takes units from: the module's own, and
 * the default queue (`runs`), where runs started by a runtime with no `queueName` (and start jobs
 * of a producer that names no other queue) have their units.
 */
export function cliWorkerQueues(job: Pick<JobModule, 'queue'>): string[] {
  return [...new Set([job.queue, DEFAULT_QUEUE_NAME])];
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
  const mod = await importJobExports(name, file, cwd);
  const plan = await loadPlan(name, mod['plan']);

  const operators = checkOperators(name, mod['operators']);
  const tools = checkTools(name, mod['tools']);
  // A function is called after setup (see runSetup), and its agents are checked then.
  const agentsBuilder =
    typeof mod['agents'] === 'function' ? (mod['agents'] as AgentsBuilder) : undefined;
  const agents = agentsBuilder === undefined ? checkAgents(name, mod['agents']) : [];
  if (agentsBuilder === undefined) {
    checkAgentSteps(name, plan, agents);
    checkAgentTools(name, plan, agents);
  }
  const policies = checkPolicies(name, mod['policies'], plan);
  const plans = await loadPlans(name, mod['plans']);
  for (const p of [plan, ...Object.values(plans)]) {
    checkOperatorSteps(name, p, operators);
    checkRunSteps(name, p, plans);
  }

  const input = checkInput(name, mod['input']);
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
  const signals = checkSignals(name, mod['signals'], plan);
  const queue = checkQueue(name, mod['queue'], plan.name);
  const rateLimits = checkModuleRateLimits(name, mod['rateLimits']);
  return {
    rateLimits,
    queue,
    path,
    file,
    plan,
    plans,
    signals,
    operators,
    policies,
    tools,
    agents,
    agentsBuilder,
    input,
    setup: setup as JobModule['setup'],
    pricing,
    strictPricing: strictPricing === true,
    schedules: checkSchedules(name, mod['schedules'], plan),
  };
}

/**
 * The module's `schedules` export: `{ <id>: { cron | everyMs, tz?, input?, overlap?,
 * catchupWindowMs?, plan? } }`, each checked as `runtime.schedule` checks it. `plan`, if given,
 * names the module's plan; each schedule starts runs of that plan.
 */
function checkSchedules(
  name: string,
  exported: unknown,
  plan: Plan,
): Record<string, ScheduleOptions> {
  if (exported === undefined) return {};
  const example = "e.g. `export const schedules = { nightly: { cron: '0 2 * * *' } }`";
  if (!isRecord(exported)) badInput(`job module ${name}: schedules must be an object, ${example}`);
  const out: Record<string, ScheduleOptions> = {};
  for (const [id, entry] of Object.entries(exported)) {
    if (!isRecord(entry))
      badInput(`job module ${name}: schedules.${id} must be an object, ${example}`);
    const { plan: named, ...rest } = entry;
    if (named !== undefined && named !== plan.name) {
      badInput(
        `job module ${name}: schedules.${id}.plan names plan ${JSON.stringify(named)}, but the module's plan is "${plan.name}"; name it or leave plan out`,
      );
    }
    const options = { ...rest, plan };
    try {
      assertScheduleId(id);
      checkScheduleOptions(options);
    } catch (error) {
      badInput(`job module ${name}: schedules.${id}: ${firstLine(error)} ${issuesText(error)}`);
    }
    out[id] = options;
  }
  return out;
}

/** The issues of an `InputValidationError`, on one line. */
function issuesText(error: unknown): string {
  if (!(error instanceof InputValidationError)) return '';
  return error.issues.map((i) => `${i.path}: ${i.message}`).join('; ');
}

/**
 * Imports the module at `file` and returns the exports that make the job: a default export with a
 * plan (or any default object when there is no named `plan`), else the named exports. Each way it
 * can fail (no such file, a directory, a module that does not load, a misspelt export) becomes a
 * bad-input error that says how to fix it.
 */
async function importJobExports(
  name: string,
  file: string,
  cwd: string,
): Promise<Record<string, unknown>> {
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
    badInput(loadFailure(name, file, cwd, error));
  }
  // `export default defineJob({ plan, … })` (or `{ plan, operators }`) is the job, also beside a
  // named `plan` the module exports for its own starters; else the named exports are.
  const fallback = loaded['default'];
  const mod =
    isRecord(fallback) && (fallback['plan'] !== undefined || loaded['plan'] === undefined)
      ? fallback
      : loaded;
  checkExportNames(name, mod);
  return mod;
}

/**
 * The module's `plan` export as a checked plan. The export may be the plan itself, JSON text, or
 * a function returning either (possibly async): it is called here, once, so a builder that throws
 * is reported as the module's fault rather than as a crash.
 */
async function loadPlan(name: string, exported: unknown): Promise<Plan> {
  let source = exported;
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
  try {
    return parsePlan(source);
  } catch (error) {
    if (error instanceof PlanValidationError) badInput(`job module ${name}: ${error.message}`);
    throw error;
  }
}

/**
 * Refuses an operator step whose operator the module does not define: caught here, before a run
 * starts, rather than when a worker reaches the step.
 */
function checkOperatorSteps(name: string, plan: Plan, operators: Record<string, Operator>): void {
  for (const step of plan.steps) {
    const runs = step.kind === 'map' ? step.item : step;
    const needed = runs.kind === 'operator' ? runs.operator : null;
    if (needed !== null && operators[needed] === undefined) {
      const known = Object.keys(operators).join(', ') || 'none';
      badInput(
        `job module ${name}: step "${step.id}" uses operator "${needed}", which the module's operators do not define (it defines: ${known}); add it to \`export const operators\``,
      );
    }
  }
}

/** The module's `plans` export: `{ <name>: plan }`, each checked as its `plan` is. */
async function loadPlans(name: string, exported: unknown): Promise<Record<string, Plan>> {
  if (exported === undefined) return {};
  if (!isRecord(exported)) {
    badInput(
      `job module ${name}: plans must be an object of plans by name, e.g. \`export const plans = { research: { name: 'research', steps: [...] } }\``,
    );
  }
  const out: Record<string, Plan> = {};
  for (const [planName, value] of Object.entries(exported)) {
    out[planName] = await loadPlan(`${name} (plans.${planName})`, value);
  }
  return out;
}

/**
 * Refuses a run step (or a map's `run` item) naming a plan the module's `plans` do not hold: its child could never start.
 * Nothing is written (the module is checked before anything connects).
 */
function checkRunSteps(name: string, plan: Plan, plans: Record<string, Plan>): void {
  plan.steps.forEach((step, i) => {
    const runs = step.kind === 'map' ? step.item : step;
    if (runs.kind !== 'run' || plans[runs.plan] !== undefined) return;
    const known = Object.keys(plans).join(', ') || 'none';
    const where = step.kind === 'map' ? `steps[${i}].item.plan` : `steps[${i}].plan`;
    const what = step.kind === 'map' ? `map step "${step.id}"` : `run step "${step.id}"`;
    badInput(
      `job module ${name}: plan "${plan.name}" ${where} names plan "${runs.plan}" (${what}), which the module's plans do not hold (it holds: ${known}); add it to \`export const plans = { "${runs.plan}": … }\``,
    );
  });
}

/** The module's default run input, refused unless it is plain JSON (a run's input is stored). */
function checkInput(name: string, input: unknown): JsonValue | undefined {
  if (input !== undefined) {
    const problems = findNonJson(input, 'input');
    if (problems.length > 0) {
      const p = problems[0]!;
      badInput(`job module ${name}: its input is not plain JSON (${p.path}: ${p.message})`);
    }
  }
  return input as JsonValue | undefined;
}

/** What a job module may export. */
export const JOB_EXPORTS = [
  'plan',
  'operators',
  'tools',
  'agents',
  'policies',
  'input',
  'setup',
  'pricing',
  'strictPricing',
  'signals',
  'schedules',
  'queue',
  'rateLimits',
  'plans',
] as const;

/** The module's `rateLimits`, checked as `createRuntime` checks them. */
function checkModuleRateLimits(name: string, value: unknown): RateLimits | undefined {
  if (value === undefined) return undefined;
  try {
    return checkRateLimits(value);
  } catch (error) {
    const issues = error instanceof InputValidationError ? error.issues : [];
    badInput(
      `job module ${name}: ${issues.length === 0 ? firstLine(error) : issues.map((i) => `${i.path} ${i.message}`).join('; ')}`,
    );
  }
}

/** The module's `queue`: a valid queue name, or by default the one its plan's name gives. */
function checkQueue(name: string, value: unknown, planName: string): string {
  if (value === undefined) return jobQueueName(planName);
  if (typeof value !== 'string' || !QUEUE_NAME_PATTERN.test(value)) {
    badInput(
      `job module ${name}: queue must be a string of 1 to 200 characters without ":", e.g. \`export const queue = 'newsletter'\``,
    );
  }
  return value;
}

/**
 * The module's `signals`: each a valid signal name with a zod schema; when it declares any, every
 * wait step of its plan must wait for one of them.
 */
function checkSignals(name: string, signals: unknown, plan: Plan): Record<string, SignalSchema> {
  if (signals === undefined) return {};
  if (!isRecord(signals)) {
    badInput(
      `job module ${name}: signals must be an object of zod schemas, e.g. \`export const signals = { approve: z.object({ by: z.string() }) }\``,
    );
  }
  for (const [signal, schema] of Object.entries(signals)) {
    if (!signalNameSchema.safeParse(signal).success) {
      badInput(
        `job module ${name}: signals.${signal} is not a signal name: use 1 to 128 letters, digits, "_", "." or "-"`,
      );
    }
    if (!isRecord(schema) || typeof schema['safeParse'] !== 'function') {
      badInput(`job module ${name}: signals.${signal} must be a zod schema, e.g. z.object({ … })`);
    }
  }
  const declared = Object.keys(signals);
  for (const step of plan.steps) {
    const wanted =
      step.kind === 'wait' ? step.for.signal : step.kind === 'agent' ? step.inbox : undefined;
    if (wanted === undefined || declared.length === 0 || declared.includes(wanted)) continue;
    const field = step.kind === 'wait' ? 'for.signal' : 'inbox';
    badInput(
      `job module ${name}: step "${step.id}" waits for signal "${wanted}", which signals does not declare (it declares: ${declared.join(', ')}); declare it, or fix the step's ${field}`,
    );
  }
  return signals as Record<string, SignalSchema>;
}

/** Edit distance of two short names (case-insensitive). */
function distance(a: string, b: string): number {
  const x = a.toLowerCase();
  const y = b.toLowerCase();
  let prev = Array.from({ length: y.length + 1 }, (_, j) => j);
  for (let i = 1; i <= x.length; i++) {
    const row = [i];
    for (let j = 1; j <= y.length; j++) {
      row[j] = Math.min(
        prev[j]! + 1,
        row[j - 1]! + 1,
        prev[j - 1]! + (x[i - 1] === y[j - 1] ? 0 : 1),
      );
    }
    prev = row;
  }
  return prev[y.length]!;
}

/** The job export `name` looks like a misspelling of, if any. */
export function closestExport(name: string): string | undefined {
  if ((JOB_EXPORTS as readonly string[]).includes(name)) return undefined;
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const known of JOB_EXPORTS) {
    const d = distance(name, known);
    const limit = known.length <= 5 ? 1 : 2;
    if (d <= limit && d < bestDistance) {
      best = known;
      bestDistance = d;
    }
  }
  return best;
}

/**
 * Refuses an export that looks like a misspelt job export (`tool` for `tools`), which would
 * otherwise be ignored; other exports (helpers of the module's own) are left alone.
 */
function checkExportNames(name: string, mod: Record<string, unknown>): void {
  for (const key of Object.keys(mod)) {
    const meant = closestExport(key);
    if (meant !== undefined && mod[meant] === undefined) {
      badInput(
        `job module ${name} exports "${key}", which flujo does not read; did you mean "${meant}"? Rename it: \`export const ${meant} = …\``,
      );
    }
  }
}

/** The nearest package.json above `file`, with its "type", or null at the root. */
function nearestPackage(file: string): { path: string; type: unknown } | null {
  for (let dir = dirname(file); ; dir = dirname(dir)) {
    const candidate = join(dir, 'package.json');
    if (existsSync(candidate)) {
      try {
        const pkg = JSON.parse(readFileSync(candidate, 'utf8')) as { type?: unknown };
        return { path: candidate, type: pkg.type };
      } catch {
        return { path: candidate, type: undefined };
      }
    }
    if (dirname(dir) === dir) return null;
  }
}

/** `file:line:column` of a syntax error, from its stack or from `node --check`. */
function syntaxLocation(file: string, error: Error): string | null {
  const located = (text: string): string | null => {
    const lines = text.split('\n');
    const at = /^(.*):(\d+)$/.exec(lines[0] ?? '');
    if (at === null) return null;
    const caret = lines.findIndex((l) => /^\s*\^+\s*$/.test(l));
    const column = caret > 0 ? lines[caret]!.indexOf('^') + 1 : null;
    return `${at[1]}:${at[2]}${column === null ? '' : `:${column}`}`;
  };
  const fromStack = located(error.stack ?? '');
  if (fromStack !== null) return fromStack;
  // The ES module loader does not say where; the syntax check of the same file does.
  const check = spawnSync(process.execPath, ['--check', file], {
    encoding: 'utf8',
    timeout: 10_000,
  });
  return located(check.stderr ?? '');
}

/** Why a job module could not be loaded, in the user's terms, with the fix. */
function loadFailure(name: string, file: string, cwd: string, error: unknown): string {
  const message = firstLine(error);
  const esmSyntax =
    message.includes('Cannot use import statement outside a module') ||
    message.includes("Unexpected token 'export'");
  const ext = extname(file);
  if (esmSyntax && (ext === '.js' || ext === '.ts')) {
    const pkg = nearestPackage(file);
    if (pkg === null || pkg.type !== 'module') {
      const where =
        pkg === null
          ? 'no package.json above it says "type": "module"'
          : `its package.json (${relative(cwd, pkg.path) || pkg.path}) ${pkg.type === undefined ? 'has no "type"' : `says "type": ${JSON.stringify(pkg.type)}`}`;
      return `cannot load job module ${name}: it is ES module code (import/export), but ${where}, so Node loads it as CommonJS; add "type": "module" to ${pkg === null ? 'a package.json in the project' : 'that package.json'}, or rename the module to ${ext === '.ts' ? '.mts' : '.mjs'}`;
    }
  }
  if (error instanceof SyntaxError) {
    const at = syntaxLocation(file, error);
    const shown =
      at === null ? name : JSON.stringify(relative(cwd, at.replace(/^file:\/\//, '')) || at);
    return `cannot load job module ${name}: syntax error at ${shown}: ${message}; fix the module`;
  }
  const missing = /Cannot find (?:package|module) '([^']+)'/.exec(message);
  if (missing !== null) {
    const pkgName = missing[1]!;
    const hint =
      pkgName === 'flujo'
        ? "install it in the job module's project: npm install flujo (or the tarball or folder you got it from)"
        : `install it in the job module's project: npm install ${pkgName.startsWith('.') || pkgName.startsWith('/') ? '(check the import path)' : pkgName}`;
    return `cannot load job module ${name}: it imports '${pkgName}', which is not installed where the module is; ${hint}`;
  }
  if (message.includes('Unknown file extension') && extname(file) === '.ts') {
    return `cannot load job module ${name}: this Node (${process.version}) cannot load .ts files; use Node 22.18 or newer (node --version), or compile the module to .js`;
  }
  return `cannot load job module ${name}: ${message}; fix the module (an ES module that exports plan, importing the package as 'flujo')`;
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

/**
 * The module's `policies`: `{ name: fn }` or `{ name: { check: fn, appliesTo: { tags } } }`. Every
 * policy a `policy_check` step names must be there, and every policy tag of a step must have a
 * policy that applies to it.
 */
function checkPolicies(name: string, value: unknown, plan: Plan): Record<string, PolicyExport> {
  const fix =
    'export policies as { name: (ctx) => ({ allow: true }) } or { name: { check, appliesTo: { tags: ["…"] } } }';
  if (value !== undefined && !isRecord(value)) {
    badInput(`job module ${name}: policies must be an object; ${fix}`);
  }
  const exported = value ?? {};
  const checked: RegisteredPolicy[] = [];
  for (const [key, entry] of Object.entries(exported)) {
    try {
      checked.push(
        typeof entry === 'function'
          ? definePolicy(key, entry)
          : definePolicy(key, (entry as { check?: unknown } | null)?.check, entry),
      );
    } catch (error) {
      const issue = error instanceof InputValidationError ? error.issues[0] : undefined;
      badInput(
        `job module ${name}: ${issue === undefined ? firstLine(error) : `policies.${key}.${issue.path}: ${issue.message}`}; ${fix}`,
      );
    }
  }
  const known = Object.keys(exported).join(', ') || 'none';
  for (const step of plan.steps) {
    if (step.kind === 'policy_check' && exported[step.policy] === undefined) {
      badInput(
        `job module ${name}: step "${step.id}" uses policy "${step.policy}", which the module's policies do not define (it defines: ${known}); add it to \`export const policies\``,
      );
    }
    for (const tag of step.policyTags) {
      if (!checked.some((p) => p.tags.includes(tag))) {
        badInput(
          `job module ${name}: step "${step.id}" carries policy tag "${tag}", which none of the module's policies applies to; add one with appliesTo: { tags: ["${tag}"] } to \`export const policies\`, or remove the tag`,
        );
      }
    }
  }
  return exported as Record<string, PolicyExport>;
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
  const ctx: SetupContext = { dataDir: join(projectRoot(cwd), '.flujo', 'data') };
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
    const tool = refusedTool(error);
    if (tool !== null) badInput(toolRefusal(name, job.plan, tool.agent, tool.tool, tool.why));
    badInput(
      `job module ${name}: its agents() threw: ${firstLine(error)}; fix the agents builder (it runs after setup)`,
    );
  }
  const agents = checkAgents(name, value, true);
  checkAgentSteps(name, job.plan, agents, true);
  checkAgentTools(name, job.plan, agents);
  return agents;
}

/** The agent and tool `defineAgent` refused for a tool input a model cannot be shown, if it did. */
function refusedTool(error: unknown): { agent: string; tool: string; why: string } | null {
  if (!(error instanceof ConfigurationError) || !/^tools\[\d+\]\.input$/.test(error.field ?? '')) {
    return null;
  }
  const m = /^Invalid agent "([^"]*)": tool "([^"]*)" (.*)$/s.exec(error.message);
  return m === null ? null : { agent: m[1]!, tool: m[2]!, why: m[3]! };
}

/**
 * What is said of a tool whose input schema a model cannot be shown: the tool, the agent, the
 * steps that use the agent (with their mode) and the fix.
 */
function toolRefusal(name: string, plan: Plan, agent: string, tool: string, why: string): string {
  const steps = plan.steps.flatMap((s) =>
    s.kind === 'agent' && s.agent === agent ? [`"${s.id}" (${s.mode})`] : [],
  );
  const usedBy =
    steps.length === 0
      ? 'which no step uses'
      : `used by step${steps.length === 1 ? '' : 's'} ${steps.join(', ')}`;
  return `job module ${name}: agent "${agent}" (${usedBy}) has tool "${tool}", which ${why}; each model call sends a tool's input schema as JSON Schema, so fix the input of tool "${tool}" (a z.object({ … }) of JSON types: no z.custom, z.date or z.transform)`;
}

/**
 * Each tool of an agent that an agent step uses must have an input a model can be shown: its
 * JSON Schema is what each model call sends as the function's parameters (in a granular step,
 * once per turn). `defineAgent` checks this too; an agent made another way is checked here.
 */
function checkAgentTools(name: string, plan: Plan, agents: readonly AgentDefinition[]): void {
  for (const step of plan.steps) {
    if (step.kind !== 'agent') continue;
    const agent = agents.find((a) => a.name === step.agent);
    for (const tool of agent?.tools ?? []) {
      try {
        toolParametersSchema(tool);
      } catch (error) {
        if (!(error instanceof ConfigurationError)) throw error;
        const why = error.message.replace(/^tool "[^"]*" /, '');
        badInput(toolRefusal(name, plan, step.agent, tool.name, why));
      }
    }
  }
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
    const runs = step.kind === 'map' ? step.item : step;
    if (runs.kind === 'agent' && !agents.some((a) => a.name === runs.agent)) {
      const known = agents.map((a) => a.name).join(', ') || 'none';
      const where = built ? 'the array agents() returns' : '`export const agents`';
      badInput(
        `job module ${name}: step "${step.id}" uses agent "${runs.agent}", which the module's ${subjectOf(built)} do not define (it defines: ${known}); add defineAgent({ name: "${runs.agent}", … }) to ${where}`,
      );
    }
  }
}
