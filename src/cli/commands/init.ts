/**
 * `flujo init [dir] [--no-node]`: a project that runs a first durable job. Writes package.json
 * ("type": "module", scripts run, resume, worker, typecheck, and Node 24 as a devDependency), a
 * typed job module (`defineJob`), a tsconfig.json and a README; keeps any file that is already
 * there (an existing package.json only gets "type": "module", the scripts it lacks and the
 * devDependency). Prints the job module's path and the command that runs it.
 *
 * Node: the npm package `node` as a devDependency installs a Node binary into
 * node_modules/.bin, which npm puts first on PATH for `npx` and every npm script, so `npx flujo`
 * and `npm run …` run on it whatever Node the machine has. Its install script fetches the binary
 * for the platform; npm 11 asks for it to be allowed in `allowScripts`, which init sets too.
 * `--no-node` leaves both out.
 */
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { basename, join, relative, resolve } from 'node:path';
import type { Ctx } from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';
import { displayPath, flujoInvocation } from '../render.js';

const JOB = 'jobs/hello.ts';

const JOB_SOURCE = `/**
 * A first durable job: "draft" writes a greeting, "count" counts its words with a tool. Each step
 * is committed to Redis when it ends, so a run killed midway goes on with \`flujo resume\`.
 */
import { defineJob, defineTool } from 'flujo';
import { z } from 'zod';

const countWords = defineTool({
  name: 'count_words',
  input: z.object({ text: z.string() }),
  class: 'read_only',
  run: ({ text }) => ({ words: text.split(/\\s+/).filter((w) => w !== '').length }),
});

export default defineJob({
  plan: {
    name: 'hello',
    steps: [
      { id: 'draft', kind: 'operator', operator: 'draft' },
      { id: 'count', kind: 'operator', operator: 'count', dependsOn: ['draft'] },
    ],
  },
  input: { name: 'world' },
  operators: {
    draft: ({ input }) => ({ text: \`Hello, \${(input as { name: string }).name}!\` }),
    count: ({ deps, tools }) =>
      tools.call('count_words', { text: (deps['draft'] as { text: string }).text }),
  },
  tools: [countWords],
});
`;

const TSCONFIG = `${JSON.stringify(
  {
    compilerOptions: {
      target: 'ES2023',
      module: 'NodeNext',
      moduleResolution: 'NodeNext',
      strict: true,
      noEmit: true,
      allowImportingTsExtensions: true,
      skipLibCheck: true,
    },
    include: ['jobs'],
  },
  null,
  2,
)}\n`;

const readme = (name: string, node: boolean) => `# ${name}

A durable job with [flujo](https://www.npmjs.com/package/flujo).

\`\`\`sh
npm run run                      # runs jobs/hello.ts; prints the run id and how to resume it
npm run resume -- <runId> ${JOB}  # goes on with a run that was stopped
npm run worker                   # a long-running worker for the job's runs
npm run typecheck                # a step naming an operator the job lacks is a type error
\`\`\`

${
  node
    ? `Node: package.json has the npm package \`node\` (Node 24) as a devDependency; \`npm install\`
puts it in node_modules/.bin, where \`npx flujo\` and the npm scripts find it first.

`
    : ''
}Redis: the commands start an embedded redis-server (its data in \`.flujo/redis\`, used from any
folder of the project) unless \`REDIS_URL\` or \`--redis URL\` names one. \`npx flujo redis stop\`
stops it.
`;

/** The Node the project gets as a devDependency (the npm package `node`). */
export const NODE_RANGE = '^24';

const SCRIPTS: Record<string, string> = {
  run: `flujo run ${JOB}`,
  resume: 'flujo resume',
  worker: `flujo worker ${JOB}`,
  typecheck: 'tsc --noEmit',
};

/** `flujo init [dir]` */
export function cmdInit(ctx: Ctx): number {
  if (ctx.args.length > 1) badInput(`unexpected argument "${ctx.args[1]}"; see \`flujo --help\``);
  const dir = resolve(ctx.cwd, ctx.args[0] ?? '.');
  if (existsSync(dir) && !existsSync(join(dir, '.'))) badInput(`${dir} is not a folder`);
  const pkgPath = join(dir, 'package.json');
  let pkg: Record<string, unknown> = {};
  if (existsSync(pkgPath)) {
    try {
      pkg = JSON.parse(readFileSync(pkgPath, 'utf8')) as Record<string, unknown>;
    } catch (error) {
      badInput(`${pkgPath} is not JSON (${(error as Error).message}); fix it, then run init again`);
    }
    // `npm init -y` writes "type": "commonjs": with no .js file of its own yet, nothing depends
    // on it, and the project becomes an ES module project.
    const fresh =
      pkg['type'] === 'commonjs' && !readdirSync(dir).some((f) => /\.(c?js|jsx)$/.test(f));
    if (fresh) {
      console.log(`flujo init: package.json said "type": "commonjs"; it now says "type": "module"`);
    } else if (pkg['type'] !== undefined && pkg['type'] !== 'module') {
      badInput(
        `${pkgPath} says "type": ${JSON.stringify(pkg['type'])}; job modules are ES modules: set "type": "module" (or init another folder)`,
      );
    }
  }
  mkdirSync(join(dir, 'jobs'), { recursive: true });
  const written: string[] = [];
  const write = (name: string, text: string) => {
    const file = join(dir, name);
    if (existsSync(file)) return;
    writeFileSync(file, text);
    written.push(name);
  };
  const scripts = { ...(pkg['scripts'] as Record<string, string> | undefined) };
  for (const [k, v] of Object.entries(SCRIPTS)) scripts[k] ??= v;
  const name =
    basename(dir)
      .toLowerCase()
      .replace(/[^a-z0-9-_.]/g, '-') || 'flujo-jobs';
  const next: Record<string, unknown> = { name, private: true, ...pkg, type: 'module', scripts };
  // Node as a devDependency, unless told not to or the project already names a `node` package.
  const named = (field: string) =>
    (pkg[field] as Record<string, unknown> | undefined)?.['node'] !== undefined;
  const addNode =
    ctx.values['no-node'] !== true && !named('dependencies') && !named('devDependencies');
  if (addNode) {
    next['devDependencies'] = {
      ...(pkg['devDependencies'] as Record<string, string> | undefined),
      node: NODE_RANGE,
    };
    next['allowScripts'] = {
      ...(pkg['allowScripts'] as Record<string, unknown> | undefined),
      node: true,
    };
  }
  writeFileSync(pkgPath, `${JSON.stringify(next, null, 2)}\n`);
  written.push('package.json');
  write(JOB, JOB_SOURCE);
  write('tsconfig.json', TSCONFIG);
  write('README.md', readme(name, addNode));

  const job = displayPath(join(dir, JOB), ctx.cwd);
  const inside = relative(ctx.cwd, dir) || '.';
  console.log(`flujo init: wrote ${written.join(', ')} in ${inside}`);
  console.log(`job module: ${job}`);
  console.log(`run it:     ${flujoInvocation()} run ${job}`);
  if (addNode) {
    console.log(
      `node:       Node ${NODE_RANGE} as a devDependency ("node": "${NODE_RANGE}", and "allowScripts": { "node": true } for its install script): after \`npm install\`, npx flujo and the npm scripts run on it, whatever node is on PATH (flujo init --no-node leaves it out)`,
    );
  }
  const deps = { ...(pkg['dependencies'] as Record<string, string> | undefined) };
  if (deps['flujo'] === undefined) {
    console.log(
      `(first install the package in ${inside}: npm install flujo, or the tarball or folder you have it as)`,
    );
  }
  if (addNode) console.log(`then:       npm install (in ${inside}), to install that Node`);
  return ExitCode.ok;
}
