import type { RuntimeCore } from '../../src/actors/core.js';

/** An object that throws for a member it was not given. */
function strict(members: Record<string, unknown>, name: string): Record<string, unknown> {
  return new Proxy(members, {
    get(target, property) {
      if (typeof property === 'symbol' || property === 'then') return undefined;
      if (property in target) return target[property];
      throw new Error(`the stub core has no "${name}${property}"`);
    },
  });
}

/** The parts of a core that group members: `stores`, `queues`, `registry`, `meta`. */
const parts = new Set(['stores', 'queues', 'registry', 'meta']);

/**
 * A runtime core for a test of one operation without Redis: the members given (a part such as
 * `stores` given as an object of its own members), and an error for any other one read, so a test
 * also shows that an operation refuses its input before it reads.
 */
export function stubCore(members: Record<string, unknown> = {}): RuntimeCore {
  const given = Object.fromEntries(
    Object.entries(members).map(([name, value]) =>
      parts.has(name)
        ? [name, strict(value as Record<string, unknown>, `${name}.`)]
        : [name, value],
    ),
  );
  return strict(given, '') as unknown as RuntimeCore;
}
