import type { RuntimeCore } from '../../src/actors/core.js';

/**
 * A runtime core for a test of one operation without Redis: the members given, and an error for
 * any other one read, so a test also shows that an operation refuses its input before it reads.
 */
export function stubCore(members: Record<string, unknown> = {}): RuntimeCore {
  return new Proxy(members, {
    get(target, property) {
      if (typeof property === 'symbol' || property === 'then') return undefined;
      if (property in target) return target[property];
      throw new Error(`the stub core has no "${property}"`);
    },
  }) as unknown as RuntimeCore;
}
