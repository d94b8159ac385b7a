import type { TestProject } from 'vitest/node';
import { startRedisServer, type TestRedisServer } from './helpers/redis-server.js';

let server: TestRedisServer | undefined;

/** Starts the suite's own redis-server unless REDIS_URL points the tests at another one. */
export async function setup(project: TestProject): Promise<void> {
  const external = process.env['REDIS_URL'];
  if (external !== undefined && external !== '') {
    project.provide('redisUrl', external);
    return;
  }
  server = await startRedisServer();
  project.provide('redisUrl', server.url);
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
