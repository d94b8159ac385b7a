import { defineConfig } from 'vitest/config';

/** The integration files that run on a Redis Cluster as well as on one redis-server. */
const CLUSTER_SUITES = [
  'driver',
  'ledger',
  'agent-granular',
  'replay',
  'driver-crash',
  'agent-crash',
  'replay-crash',
  'call-tool-crash',
];

// Three projects. `unit` needs nothing but Node: no Redis, no build. `integration` starts its own
// redis-server on a random port and rebuilds dist/ when src/ is newer, once per run, in its global
// setup (test/integration/global-setup.ts); it runs only when one of its files is selected.
// `cluster` runs some of the same files again on a Redis Cluster (3 masters, 3 replicas) that its
// global setup starts (test/integration/cluster-global-setup.ts).
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
      {
        extends: true,
        test: {
          name: 'cluster',
          include: CLUSTER_SUITES.map((name) => `test/integration/${name}.int.test.ts`),
          globalSetup: ['test/integration/cluster-global-setup.ts'],
        },
      },
    ],
  },
});
