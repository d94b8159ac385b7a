/** `flujo redis stop`: shuts down the embedded redis-server of the working directory. */
import { stopEmbeddedRedis } from '../../persistence/embedded-redis.js';
import { embeddedDataDir } from '../connect.js';
import type { Ctx } from '../context.js';
import { ExitCode, badInput } from '../exit-codes.js';

export async function cmdRedis(ctx: Ctx): Promise<number> {
  const [sub, ...rest] = ctx.args;
  if (sub !== 'stop' || rest.length > 0) {
    badInput('the redis command has one subcommand: `flujo redis stop`');
  }
  const dataDir = embeddedDataDir(ctx.cwd);
  const stopped = await stopEmbeddedRedis(dataDir);
  if (stopped === null) console.log(`no embedded redis-server is running for ${dataDir}`);
  else {
    console.log(
      `stopped the embedded redis-server (pid ${stopped.pid}, port ${stopped.port}); its data stays in ${dataDir}`,
    );
  }
  return ExitCode.ok;
}
