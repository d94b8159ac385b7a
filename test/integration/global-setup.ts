import type { TestProject } from 'vitest/node';
import { buildDistIfStale } from '../helpers/build-dist.js';
import {
  findRedisServerBinary,
  startRedisServer,
  type TestRedisServer,
} from '../helpers/redis-server.js';

let server: TestRedisServer | undefined;

/**
 * The integration project's set-up, once per run: rebuilds dist/ when src/ is newer (the `flujo`
 * children and whatever imports 'flujo' run it), then starts the suite's own redis-server on a
 * random port, unless REDIS_URL points the tests at another one.
 */
export async function setup(project: TestProject): Promise<void> {
  const external = process.env['REDIS_URL'];
  const useExternal = external !== undefined && external !== '';
  // Before the build, so that a machine without redis-server learns it at once.
  if (!useExternal) exitOnError(findRedisServerBinary);
  exitOnError(buildDistIfStale);
  if (useExternal) {
    project.provide('redisUrl', external);
    return;
  }
  server = await startRedisServer();
  project.provide('redisUrl', server.url);
}

/**
 * Runs `step`; if it throws, prints its message alone and ends the run (a thrown error would come
 * under vitest's "No test files found" and a stack).
 */
export function exitOnError(step: () => unknown): void {
  try {
    step();
  } catch (error) {
    process.stderr.write(`\n${error instanceof Error ? error.message : String(error)}\n\n`);
    process.exit(1);
  }
}

export async function teardown(): Promise<void> {
  await server?.stop();
  server = undefined;
}

declare module 'vitest' {
  export interface ProvidedContext {
    redisUrl: string;
  }
}
