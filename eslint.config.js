// @ts-check
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

const ioLibraries = ['ioredis', 'bullmq', 'openai', 'js-tiktoken', 'redis-memory-server'];
const nodeIo = ['node:*', 'fs', 'net', 'http', 'https', 'child_process', 'crypto', 'os'];

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
    // The pure core: no I/O, no clock, no randomness. Time and ids arrive in events.
    files: ['src/machines/**', 'src/schemas/**', 'src/plan/**', 'src/internal/**', 'src/errors.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            { group: [...ioLibraries, ...nodeIo], message: 'The pure core does no I/O.' },
            {
              group: ['**/persistence/**', '**/actors/**', '**/cli/**'],
              message: 'The pure core imports no shell.',
            },
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
            {
              group: ['**/machines/**', '**/actors/**', '**/cli/**', 'bullmq', 'openai'],
              message: 'Persistence stores; it does not decide.',
            },
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
