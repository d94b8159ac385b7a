/**
 * The errors reference names every error code the runtime has (read from `ErrorCode`, not from a
 * list kept here), and every reason a step or run can end with (`StepReason`).
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ErrorCode } from '../../src/errors.js';
import { StepReason } from '../../src/index.js';

const page = readFileSync(new URL('../../docs/reference/errors.md', import.meta.url), 'utf8');

describe('docs/reference/errors.md', () => {
  it('describes every error code', () => {
    const codes = Object.values(ErrorCode);
    expect(codes.length).toBeGreaterThan(30);
    // Each code has its own entry: "- **`code`**: …".
    const missing = codes.filter((code) => !page.includes(`- **\`${code}\`**:`));
    expect(missing).toEqual([]);
  });

  it('lists every error code in its table, and every reason', () => {
    const rows = (values: readonly string[]) =>
      values.filter((value) => !new RegExp(`^\\| \`${value}\` +\\|`, 'm').test(page));
    expect(rows(Object.values(ErrorCode))).toEqual([]);
    expect(rows(Object.values(StepReason))).toEqual([]);
  });
});
