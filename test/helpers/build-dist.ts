/**
 * Keeps dist/ current for the integration tests. The `flujo` children they spawn run
 * bin/flujo.js → dist, and 'flujo' imported from the test process (the examples' job modules, test
 * helpers) or from a job module a `flujo` child loads (test/fixtures/jobs) resolves to the package,
 * that is dist. (Children started with `node --import tsx` resolve it to src/ by tsconfig.json's
 * paths.) So before the integration tests run, dist/ is rebuilt when a source is newer than its
 * output.
 *
 * Why build rather than run src/ through tsx: measured on one machine, a `flujo` command on tsx
 * took about 0.7 s more than the built one (`flujo status` with Redis refused: 1.3 s against
 * 0.6 s), and CLI test files spawn dozens (cli-startup: 10.2 s against 6.5 s; cli-policy: 47 s
 * against 27 s). A rebuild costs about 12 s of CPU once per edit (tsc checks the edited file
 * against everything it imports); when nothing changed, the check here is a walk of src/ and tsc
 * does not run. The tests also keep running what a user runs: bin/flujo.js and the compiled
 * package. `--incremental` emits only the files that changed, and costs about 3 s when sources
 * were touched but not changed (a branch switched back and forth).
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, rmSync, statSync, utimesSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));
const src = join(root, 'src');
const dist = join(root, 'dist');
const configs = [join(root, 'tsconfig.json'), join(root, 'tsconfig.build.json')];
/** tsc's record of the last incremental build: git-ignored, outside dist/ so npm pack leaves it out. */
const buildInfo = join(root, '.cache', 'tsconfig.build.tsbuildinfo');

/** Each source file of src/ with the file tsc compiles it to. */
function sources(dir = src): { file: string; out: string }[] {
  const found: { file: string; out: string }[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const file = join(dir, entry.name);
    if (entry.isDirectory()) found.push(...sources(file));
    else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) {
      found.push({ file, out: join(dist, relative(src, file)).replace(/\.ts$/, '.js') });
    }
  }
  return found;
}

const mtime = (file: string): number | undefined =>
  existsSync(file) ? statSync(file).mtimeMs : undefined;
const configTime = (): number => Math.max(...configs.map((c) => mtime(c) ?? 0));

/** Why dist/ is stale (a missing or older output, or a newer tsconfig), or undefined when current. */
export function staleReason(): string | undefined {
  const config = configTime();
  for (const { file, out } of sources()) {
    const built = mtime(out);
    if (built === undefined) return `${relative(root, out)} is missing`;
    if (built < mtime(file)!) return `${relative(root, file)} is newer than its output`;
    if (built < config) return 'a tsconfig is newer than the build';
  }
  return undefined;
}

/**
 * Rebuilds dist/ (`tsc -p tsconfig.build.json --incremental`) when {@link staleReason} finds it
 * stale, saying so and how long it took; throws with tsc's output when the build fails.
 */
export function buildDistIfStale(
  log: (line: string) => void = (line) => process.stdout.write(`${line}\n`),
): void {
  const reason = staleReason();
  if (reason === undefined) return;
  // tsc trusts its record, not dist/: with outputs gone, build them all again.
  if (reason.endsWith('is missing')) rmSync(buildInfo, { force: true });
  mkdirSync(dirname(buildInfo), { recursive: true });
  log(`dist/ is stale (${reason}): building it (tsc -p tsconfig.build.json --incremental)`);
  const started = performance.now();
  const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
  // --noEmitOnError: a source that does not compile leaves dist/ stale, so the next run says so again.
  const args = ['-p', 'tsconfig.build.json', '--incremental', '--noEmitOnError'];
  args.push('--tsBuildInfoFile', buildInfo);
  const r = spawnSync(process.execPath, [tsc, ...args], { cwd: root, encoding: 'utf8' });
  if (r.status !== 0) {
    throw new Error(
      `building dist/ failed (tsc exit ${String(r.status)}): the integration tests run dist/, so fix these first:\n${r.stdout}${r.stderr}`,
    );
  }
  // tsc leaves an output whose text did not change as it was: mark every output current.
  const now = new Date();
  const config = configTime();
  for (const { file, out } of sources()) {
    if (mtime(out)! < Math.max(mtime(file)!, config)) utimesSync(out, now, now);
  }
  log(`built dist/ in ${((performance.now() - started) / 1000).toFixed(1)} s`);
}
