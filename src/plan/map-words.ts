/** How a map step's progress is said, with no import: the CLI's renderers load it cheaply. */
/**
 * A map step's progress in words: `<done>/<total> done, <failed> failed, <running> running` (here,
 * with no I/O, so that the CLI's renderers load no runtime to print it).
 */
export function mapText(m: {
  done: number;
  total: number;
  failed: number;
  running: number;
}): string {
  return `${m.done}/${m.total} done, ${m.failed} failed, ${m.running} running`;
}
