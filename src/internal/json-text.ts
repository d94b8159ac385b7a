/**
 * The JSON text of a value, for measuring and storing step outputs. Not cached: a run held in
 * memory keeps its outputs, and a cached text would keep a second copy of each beside it.
 */
export function jsonText(value: unknown): string {
  return JSON.stringify(value) ?? 'null';
}
