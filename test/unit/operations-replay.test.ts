import { describe, expect, it } from 'vitest';
import { InputValidationError } from '../../src/errors.js';
import { replayRun } from '../../src/operations/replay.js';
import type { ReplayOptions } from '../../src/worker/replay.js';
import { caught } from '../helpers/caught.js';
import { stubCore } from '../helpers/core-stub.js';

describe('replayRun', () => {
  it('refuses options it cannot take before it reads the run', async () => {
    const cases: [unknown, string][] = [
      [{}, 'mode'],
      [{ mode: 'rerun' }, 'mode'],
      [{ mode: 'reproduce', fromStep: 'a' }, 'fromStep'],
      [{ mode: 'reproduce', allowEffects: true }, 'allowEffects'],
      [{ mode: 'replay', allowEffects: 'yes' }, 'allowEffects'],
    ];
    for (const [options, path] of cases) {
      const error = await caught(replayRun(stubCore(), 'r1', options as ReplayOptions));
      expect(error).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues.map((i) => i.path)).toContain(path);
    }
  });
});
