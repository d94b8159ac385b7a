#!/usr/bin/env node
// Runs the whole suite: typecheck, lint, then vitest; ends with one plain summary line
// ("tests: N passed, N failed, N skipped") that any CI can read.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

function run(cmd, args) {
  const r = spawnSync(cmd, args, { stdio: 'inherit' });
  return r.status ?? 1;
}

if (!process.argv.includes('--no-static')) {
  for (const [cmd, args] of [
    ['tsc', ['--noEmit']],
    // The CLI and job modules run the compiled package (bin/flujo.js → dist): a whole build also
    // checks tsconfig.build.json; the integration tests' global setup then finds dist/ current.
    ['tsc', ['-p', 'tsconfig.build.json']],
    ['eslint', ['.']],
    ['prettier', ['--check', '.']],
  ]) {
    console.log(`\n> ${cmd} ${args.join(' ')}`);
    const code = run(cmd, args);
    if (code !== 0) {
      console.error(`${cmd} failed (exit ${code})`);
      process.exit(code);
    }
  }
}

const dir = mkdtempSync(join(tmpdir(), 'flujo-vitest-'));
const out = join(dir, 'results.json');
const extra = process.argv.slice(2).filter((a) => a !== '--no-static');
const code = run('vitest', [
  'run',
  '--reporter=default',
  '--reporter=json',
  `--outputFile.json=${out}`,
  ...extra,
]);
let summary;
try {
  const r = JSON.parse(readFileSync(out, 'utf8'));
  const skipped = (r.numPendingTests ?? 0) + (r.numTodoTests ?? 0);
  summary = `tests: ${r.numPassedTests} passed, ${r.numFailedTests} failed${skipped > 0 ? `, ${skipped} skipped` : ''}`;
} catch {
  summary = 'tests: 0 passed, 1 failed';
}
rmSync(dir, { recursive: true, force: true });
console.log(summary);
process.exit(code);
