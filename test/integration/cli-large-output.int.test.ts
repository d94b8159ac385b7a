/**
 * A large report written to a pipe arrives whole: `flujo status --json` of a run whose step
 * produced 24 MB ends only once its output is flushed (the command's exit timer starts after).
 */
import { afterAll, describe, expect, it } from 'vitest';
import { createRuntime } from '../../src/runtime.js';
import { runFlujo } from '../helpers/cli.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const prefix = testPrefix();
afterAll(() => deleteRuntimeKeys(prefix));

describe('a large --json report through a pipe', { timeout: 90_000 }, () => {
  it('is written whole before the command exits', async () => {
    const rt = createRuntime({ redis: redisUrl(), prefix });
    rt.operator('big', () => ({ pad: 'x'.repeat(24_000_000) }));
    const worker = rt.createWorker({ concurrency: 1 });
    try {
      await worker.ready();
      const run = await rt.start({
        name: 'big',
        steps: [{ id: 'a', kind: 'operator', operator: 'big' }],
      });
      expect((await run.settled({ timeoutMs: 60_000 })).status).toBe('succeeded');
      const r = await runFlujo(['status', run.runId, '--json'], { prefix });
      expect(r.code, r.err).toBe(0);
      const report = JSON.parse(r.out) as { steps: { output: { pad: string } }[] };
      expect(report.steps[0]!.output.pad.length).toBe(24_000_000);
    } finally {
      await worker.close();
      await rt.close();
    }
  });
});
