// @ts-check
import js from '@eslint/js';
import { createNodeResolver, importX } from 'eslint-plugin-import-x';
import tseslint from 'typescript-eslint';

const ioLibraries = ['ioredis', 'bullmq', 'openai', 'js-tiktoken', 'redis-memory-server'];
const nodeIo = ['node:*', 'fs', 'net', 'http', 'https', 'child_process', 'crypto', 'os'];

/**
 * The layers of `src/`, lowest first (docs/architecture.md explains each). A module imports from
 * its own layer and the layers below it, never from a layer above: type-only imports count too. Two
 * entries of one layer are peers that do not import each other. The order is the one the code has:
 * - errors: the error classes, a leaf.
 * - internal: plain JSON, canonical hashing, backoff, seeded randomness.
 * - schemas: zod schemas of events, outcomes, errors and chat messages.
 * - plan: plans as data, their builders and graph.
 * - machines: the run and step machines and the kernel (the last layer of the pure core).
 * - logging: the pino logger, a leaf of the shell.
 * - persistence: the Redis stores (snapshots, ledger, journal, history, quotas, blobs, keys, and
 *   the side stores of runs: active runs, counters, request keys, channels, lookups, unit notes).
 * - observability: spans, the run trace, and runs as xstate inspection events.
 * - tools: tool definitions and the ledger-guarded call.
 * - agents: agent definitions (which name tools) and their fingerprint.
 * - llm: the model client (which sends an agent's tools), token counts, prices.
 * - execution: what a unit of work calls to execute: an operator's context, a step's execution
 *   and fallback, the agent loop's pieces (asking the model, the atomic loop, the fingerprint),
 *   an agent's tool calls, the step cache, policies, call approval, replay of calls, action keys,
 *   the model context, the usage meter, the history cache. It knows no unit, job or run host.
 * - actors: the actors: one file per kind of unit (a step attempt, an agent turn) holding its
 *   whole life from admission to commit, the phases they share, the run host, the runtime core
 *   (the composition root, `core.ts`) and its parts by role (`runtime-stores.ts`,
 *   `runtime-queues.ts`, `runtime-registry.ts`, `runtime-meta.ts`), and the job specs.
 * - worker: the BullMQ shell over the units and its status registry, the start path
 *   (`runtime.start` and the `start` job), event streams, the run list, replay, schedules' fires
 *   (their definitions, their store, what a fire does).
 * - operations: the runtime's operations by concern (starting runs, decisions, reading runs,
 *   replay, registration, schedules), plain functions of the runtime core that `createRuntime`
 *   wires.
 * - runtime.ts, define-job.ts: the runtime a user creates (its types and `createRuntime`); job
 *   modules.
 * - ui: the web view of runs.
 * - cli, testing: the command line; the test helpers published as `flujo/testing`.
 * - index.ts: the public API.
 */
const layers = [
  ['errors.ts'],
  ['internal'],
  ['schemas'],
  ['plan'],
  ['machines'],
  ['logging.ts'],
  ['persistence'],
  ['observability'],
  ['tools'],
  ['agents'],
  ['llm'],
  ['execution'],
  ['actors'],
  ['worker'],
  ['operations'],
  ['runtime.ts', 'define-job.ts'],
  ['ui'],
  ['cli', 'testing'],
  ['index.ts'],
].map((layer) => layer.map((entry) => `./src/${entry}`));

/** One `import-x/no-restricted-paths` zone per layer entry: everything above it, and its peers. */
const layerZones = layers.flatMap((layer, index) => {
  const below = layers.slice(0, index).flat();
  const above = layers.slice(index + 1).flat();
  return layer
    .map((target) => ({
      target,
      from: [...above, ...layer.filter((peer) => peer !== target)],
      message: `Layers: ${target} may import only from ${below.length === 0 ? 'nothing in src/' : below.join(', ')}. Move what both need down a layer (docs/architecture.md).`,
    }))
    .filter((zone) => zone.from.length > 0);
});

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', '.flujo/**', 'coverage/**', '.*/**', '.*'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      eqeqeq: ['error', 'always', { null: 'ignore' }],
      'no-console': 'error',
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-deprecated': 'error',
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_' },
      ],
    },
  },
  {
    // Layering and cycles, for src/ only: tests, benches and examples may reach any layer.
    files: ['src/**/*.ts'],
    plugins: { 'import-x': importX },
    settings: {
      // Without these the plugin does not read .ts files, and no-cycle sees no module graph.
      'import-x/extensions': ['.ts', '.js'],
      'import-x/parsers': { '@typescript-eslint/parser': ['.ts'] },
      'import-x/resolver-next': [
        createNodeResolver({
          extensions: ['.ts', '.js'],
          extensionAlias: { '.js': ['.ts', '.js'] },
        }),
      ],
    },
    rules: {
      'import-x/no-restricted-paths': [
        'error',
        {
          zones: [
            ...layerZones,
            {
              // Above the pure core in the order, yet it only stores: it needs no plan or machine.
              target: './src/persistence',
              from: ['./src/plan', './src/machines'],
              message:
                'Persistence stores; it does not decide. Move what it needs to src/internal or src/schemas.',
            },
          ],
        },
      ],
      'import-x/no-cycle': 'error',
    },
  },
  {
    // The pure core: no I/O, no clock, no randomness. Time and ids arrive in events.
    files: ['src/machines/**', 'src/schemas/**', 'src/plan/**', 'src/internal/**', 'src/errors.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            // The shell's modules are above the pure core: the layer zones refuse them.
            { group: [...ioLibraries, ...nodeIo], message: 'The pure core does no I/O.' },
          ],
        },
      ],
      'no-restricted-properties': [
        'error',
        { object: 'Date', property: 'now', message: 'Time arrives in events.' },
        { object: 'Math', property: 'random', message: 'Randomness arrives in events (a seed).' },
      ],
      'no-restricted-syntax': [
        'error',
        {
          selector: "NewExpression[callee.name='Date'][arguments.length=0]",
          message: 'Time arrives in events.',
        },
      ],
    },
  },
  {
    // Hashing is deterministic: the one pure-core file allowed node:crypto (for createHash only).
    files: ['src/internal/canonical-hash.ts'],
    rules: { 'no-restricted-imports': 'off' },
  },
  {
    files: ['src/persistence/**'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            // Its place among the layers is checked by the zones above.
            { group: ['bullmq', 'openai'], message: 'Persistence stores; it does not decide.' },
          ],
        },
      ],
    },
  },
  {
    files: ['src/cli/**', 'bench/**', 'examples/**', 'bin/**', 'scripts/**'],
    rules: { 'no-console': 'off' },
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    ...tseslint.configs.disableTypeChecked,
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    languageOptions: { globals: { process: 'readonly', console: 'readonly', URL: 'readonly' } },
  },
);
