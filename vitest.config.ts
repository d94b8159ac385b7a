import { defineConfig } from 'vitest/config';

// Two projects. `unit` needs nothing but Node: no Redis, no build. `integration` starts its own
// redis-server on a random port and rebuilds dist/ when src/ is newer, once per run, in its global
// setup (test/integration/global-setup.ts); it runs only when one of its files is selected.
export default defineConfig({
  test: {
    testTimeout: 30_000,
    hookTimeout: 30_000,
    projects: [
      {
        extends: true,
        test: { name: 'unit', include: ['test/unit/**/*.test.ts', 'examples/**/*.test.ts'] },
      },
      {
        extends: true,
        test: {
          name: 'integration',
          include: ['test/integration/**/*.int.test.ts'],
          globalSetup: ['test/integration/global-setup.ts'],
        },
      },
    ],
  },
});
