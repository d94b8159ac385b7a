import { expect } from 'vitest';
import type { Runtime } from '../../src/runtime.js';

/**
 * Checks the integrity of a stored run with `reproduce`: its stored events, folded again by the
 * machines, lead to its stored snapshot exactly (no refused event, no difference).
 */
export async function expectIntact(runtime: Runtime, runId: string): Promise<void> {
  const reproduced = await runtime.replay(runId, { mode: 'reproduce' });
  expect(reproduced.integrity, `integrity of run ${runId}`).toEqual({
    ok: true,
    problems: [],
    differences: [],
  });
}
