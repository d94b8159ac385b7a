/**
 * Preloaded (`node --import`) into the worker processes of `flujo dev`, which set
 * `FLUJO_DEV_IMPORTS`:
 * - records the path of every file the process loads from disk, one per line, in the file that
 *   `FLUJO_DEV_IMPORTS` names, so that `flujo dev` can watch the files a job module imports. Uses
 *   `module.registerHooks` (Node 22.15 and newer); on an older Node it records nothing and
 *   `flujo dev` watches the module file alone;
 * - stops the worker gracefully (as SIGTERM does) when `flujo dev` is gone: its standard input is
 *   a pipe from `flujo dev`, which closes when that process ends, however it ends.
 */
import { appendFileSync } from 'node:fs';
import * as nodeModule from 'node:module';
import { fileURLToPath } from 'node:url';

const out = process.env['FLUJO_DEV_IMPORTS'];
if (out !== undefined && out !== '') {
  const register = (nodeModule as Partial<typeof nodeModule>).registerHooks;
  if (typeof register === 'function') {
    const seen = new Set<string>();
    register({
      resolve(specifier, context, nextResolve) {
        const resolved = nextResolve(specifier, context);
        if (resolved.url.startsWith('file:')) {
          const path = fileURLToPath(resolved.url);
          if (!seen.has(path)) {
            seen.add(path);
            appendFileSync(out, `${path}\n`);
          }
        }
        return resolved;
      },
    });
  }
  process.stdin.on('error', () => {});
  process.stdin.once('close', () => process.kill(process.pid, 'SIGTERM'));
  process.stdin.resume();
  // Reading stdin must not keep a worker alive that ends on its own.
  (process.stdin as { unref?: () => void }).unref?.();
}
