/**
 * Deterministic draws from a seed. Randomness never originates in the core: a seed is drawn at the
 * edge, carried in an event and stored with it, so replaying the event draws the same number.
 */

/** A number in [0, 1) derived from a 32-bit seed (one round of mulberry32). */
export function unitFromSeed(seed: number): number {
  let t = (seed >>> 0) + 0x6d2b79f5;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}

/** True when `value` is usable as a seed: an integer in [0, 2^32). */
export function isSeed(value: number): boolean {
  return Number.isInteger(value) && value >= 0 && value <= 0xffffffff;
}
