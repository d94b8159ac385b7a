import type { TestProject } from 'vitest/node';
import { buildDistIfStale } from '../helpers/build-dist.js';
import { startRedisCluster, type TestRedisCluster } from '../helpers/redis-cluster.js';
import { findRedisServerBinary } from '../helpers/redis-server.js';
import { exitOnError } from './global-setup.js';

let cluster: TestRedisCluster | undefined;

/**
 * The cluster project's set-up, once per run: rebuilds dist/ when src/ is newer (as the
 * integration project's does), then starts one Redis Cluster of 3 masters and 3 replicas on
 * loopback ports for every file of the project, and gives its `redis+cluster://…` URL as
 * `redisUrl`; unless REDIS_CLUSTER_URL names another cluster (a `redis+cluster://…` URL).
 */
export async function setup(project: TestProject): Promise<void> {
  const external = process.env['REDIS_CLUSTER_URL'];
  const useExternal = external !== undefined && external !== '';
  if (!useExternal) exitOnError(findRedisServerBinary);
  exitOnError(buildDistIfStale);
  if (useExternal) {
    project.provide('redisUrl', external);
    return;
  }
  const started = performance.now();
  cluster = await startRedisCluster();
  const ports = cluster.nodes.map((n) => `${n.port} (${n.role})`).join(', ');
  const seconds = ((performance.now() - started) / 1000).toFixed(1);
  process.stdout.write(`test cluster on 127.0.0.1 ports ${ports}, started in ${seconds} s\n`);
  project.provide('redisUrl', cluster.url);
}

export async function teardown(): Promise<void> {
  await cluster?.stop();
  cluster = undefined;
}
