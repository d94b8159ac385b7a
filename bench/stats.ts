/** The figures every bench prints: the median of repeated measurements and their spread. */

/** The median of `xs` (the upper one of an even count). */
export const median = (xs: number[]): number =>
  [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** `min–max` of `xs`, each with `digits` decimals. */
export const spread = (xs: number[], digits = 2): string =>
  `${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)}`;
