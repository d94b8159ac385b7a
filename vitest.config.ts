import { defineConfig } from 'vitest/config';

/**
 * The integration files that run on a Redis Cluster as well as on one redis-server (the `cluster`
 * project): the driver, the ledger, agents, replay and the crash tests first, then the stores and
 * features whose keys live outside a run's hash tag (request keys, the run list, tenants' usage,
 * quotas and step cache, action keys, the queue, retention's expiries, schedules). Left out to keep the
 * project near four minutes on two cores: the files about one server (a server stopped or
 * restarted, write coalescing, MONITOR), the CLI, examples and web view files, and slow files
 * that place no keys of their own (usage-conservation, atomic-journal, step-timeout,
 * timeout-crash, tracing-crash). The runs that ended lately (ended-runs) are checked on a cluster
 * by cluster-runtime, whose cluster the file's key copies need no care for.
 */
const CLUSTER_SUITES = [
  'driver',
  'ledger',
  'agent-granular',
  'replay',
  'driver-crash',
  'map',
  'map-crash',
  'map-runs',
  'conditions',
  'conditions-crash',
  'child-runs',
  'agent-crash',
  'replay-crash',
  'call-tool-crash',
  'action-keys-crash',
  'atomic-usage-crash',
  'call-approval-crash',
  'action-keys',
  'agent-atomic',
  'agent-usage',
  'blob-store',
  'call-approval',
  'call-tool',
  'cas-race',
  'declared-effects',
  'failure-taxonomy',
  'fallback',
  'gates',
  'golden-snapshots',
  'history',
  'in-doubt',
  'model-journal',
  'one-execution',
  'policies',
  'quota-store',
  'receipt-retry',
  'retention',
  'run-actor-restore',
  'run-events',
  'run-end',
  'followers',
  'run-list',
  'run-stores',
  'runtime',
  'snapshot-store',
  'start-job',
  'start-refusals',
  'start-round-trips',
  'step-budgets',
  'step-cache',
  'undriven-starts',
  'unit',
  'usage-ahead',
  'worker-sweep',
  'signals',
  'schedules',
  'model-rate-limits',
  'concurrency',
  'priority',
  'singleton-debounce',
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
