/** The types of `function-lengths.mjs`, for the test that runs the same check. */

/** One function and the lines of its own (its body's, less those of functions nested in it). */
export interface FunctionLength {
  /** The file, relative to the repository, with `/` separators. */
  file: string;
  /** The line the function starts on (1-based). */
  line: number;
  /** Its name, or what holds it (`<arrow passed to f in X>`). */
  name: string;
  ownLines: number;
}

/** The limit the check applies unless told otherwise. */
export const DEFAULT_LIMIT: number;

/** Every function in one source text with the lines of its own. */
export function measureSource(file: string, text: string): FunctionLength[];

/** Every function in every `.ts` file under `src/` (or `dir`), longest first. */
export function measureFunctions(options?: { root?: string; dir?: string }): FunctionLength[];

/** One report line: `file:line name ownLines`. */
export function formatFunction(fn: FunctionLength): string;
