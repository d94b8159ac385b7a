/**
 * The real `flujo` binary (bin/flujo.js → dist, rebuilt when src/ changes) against the suite's
 * Redis, each test on its own key prefix (FLUJO_PREFIX), and against the embedded redis-server.
 */
import type { ChildProcess } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime } from '../../src/index.js';
import { ensureEmbeddedRedis, stopEmbeddedRedis } from '../../src/persistence/embedded-redis.js';
import {
  flujoBin,
  flujoEnv,
  pinnedNode,
  root,
  spawnChild,
  startFlujo,
  type ChildResult,
} from '../helpers/cli.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const GATED = 'test/fixtures/jobs/gated.ts';
const LINE = 'test/fixtures/jobs/line.ts';

interface FlujoOptions {
  prefix?: string;
  cwd?: string;
  /** Without REDIS_URL: the embedded server. */
  embedded?: boolean;
  /** Called with the output so far, whenever more arrives. */
  onOutput?: (out: string, child: ChildProcess) => void;
}

const workers = new Map<string, ChildProcess>();
const workerPid = (prefix: string) => workers.get(prefix);

function flujo(args: string[], options: FlujoOptions = {}): Promise<ChildResult> {
  const running = startFlujo(args, {
    prefix: options.prefix,
    cwd: options.cwd,
    redis: options.embedded === true ? 'none' : 'suite',
    user: 'tester',
    onOutput: options.onOutput,
  });
  if (args[0] === 'worker' && options.prefix !== undefined)
    workers.set(options.prefix, running.child);
  return running.done;
}

const runIdOf = (r: ChildResult): string => /^run (\S+) /.exec(r.lines[0] ?? '')?.[1] ?? '';

/** Every key of a prefix, including its BullMQ queue keys (`{<prefix>:q}…`). */
async function keysOf(redis: Redis, prefix: string): Promise<string[]> {
  const keys: string[] = [];
  for (const pattern of [`${prefix}:*`, `{${prefix}:q}*`]) {
    let cursor = '0';
    do {
      const [next, batch] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 500);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
  }
  return keys.sort();
}

/** Keys in `after` that were not in `before` (BullMQ's own expiring locks may vanish meanwhile). */
const newKeys = (before: string[], after: string[]) => after.filter((k) => !before.includes(k));

let redis: Redis;
const prefixes: string[] = [];
function newPrefix(): string {
  const p = testPrefix();
  prefixes.push(p);
  return p;
}

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  for (const p of prefixes) {
    await deletePrefix(redis, `${p}:`);
    await deletePrefix(redis, `{${p}:q}`);
  }
  redis.disconnect();
});

describe('flujo gates through the CLI', { timeout: 60_000 }, () => {
  it('run waits (exit 3) after printing the run id and the resume command; approve, then resume finishes (exit 0)', async () => {
    const prefix = newPrefix();
    const run = await flujo(['run', GATED], { prefix });
    expect(run.err).toBe('');
    expect(run.code).toBe(3);
    const runId = runIdOf(run);
    expect(run.lines[0]).toBe(`run ${runId} (plan "gated")`);
    expect(run.lines[1]).toBe(`resume: npx flujo resume ${runId} ${GATED}`);
    expect(run.out).toContain('draft: RUNNING → SUCCEEDED');
    expect(run.out).toContain('review: PENDING → WAITING_APPROVAL');
    expect(run.out).toContain(`run ${runId} waiting`);

    const followed = flujo(['events', runId, '--follow', '--json'], { prefix });
    const approve = await flujo(['approve', runId, 'review', '--by', 'ana', '--comment', 'ok'], {
      prefix,
    });
    expect(approve.code).toBe(0);
    expect(approve.out).toContain(`approved step "review" of run ${runId} (by ana)`);

    const resume = await flujo(['resume', runId, GATED], { prefix });
    expect(resume.code).toBe(0);
    expect(resume.out).toContain('send: RUNNING → SUCCEEDED');
    expect(resume.out).toContain(`run ${runId} succeeded`);
    expect(resume.out).toContain('produced: draft, review, send');

    // --follow ends when the run finishes; every line is JSON.
    const events = await followed;
    expect(events.code).toBe(0);
    const parsed = events.lines.map(
      (l) => JSON.parse(l) as { type: string; data: Record<string, unknown> },
    );
    expect(parsed.at(-1)?.type).toBe('run.finished');
    const approved = parsed.find((e) => e.type === 'gate.approved');
    expect(approved?.data).toMatchObject({ stepId: 'review', by: 'ana', comment: 'ok' });

    const status = await flujo(['status', runId, '--json'], { prefix });
    expect(status.code).toBe(0);
    const report = JSON.parse(status.out) as { status: string; summary: { produced: object } };
    expect(report.status).toBe('succeeded');
    expect(Object.keys(report.summary.produced)).toEqual(['draft', 'review', 'send']);

    const ledger = await flujo(['ledger', runId, '--json'], { prefix });
    expect(ledger.code).toBe(0);
    expect(JSON.parse(ledger.out)).toEqual([]);
    const human = await flujo(['events', runId], { prefix });
    expect(human.out).toMatch(/gate\.approved +review by ana: "ok"/);
  });

  it('the reject path: the run fails with approval_rejected (status exits 1)', async () => {
    const prefix = newPrefix();
    const run = await flujo(['run', GATED, '--run-id', 'to-reject'], { prefix });
    expect(run.code).toBe(3);
    const reject = await flujo(
      ['reject', 'to-reject', 'review', '--by', 'bob', '--comment', 'no'],
      {
        prefix,
      },
    );
    expect(reject.code).toBe(0);
    expect(reject.out).toContain('run to-reject is failed (approval_rejected)');
    const status = await flujo(['status', 'to-reject', '--json'], { prefix });
    expect(status.code).toBe(1);
    const report = JSON.parse(status.out) as {
      status: string;
      summary: { reason: string; blockedStep: string };
    };
    expect(report).toMatchObject({
      status: 'failed',
      summary: { reason: 'approval_rejected', blockedStep: 'review' },
    });
    const events = await flujo(['events', 'to-reject', '--json'], { prefix });
    const rejected = events.lines
      .map((l) => JSON.parse(l) as { type: string; data: Record<string, unknown> })
      .find((e) => e.type === 'gate.rejected');
    expect(rejected?.data).toMatchObject({ by: 'bob', comment: 'no' });
  });

  it('cancel: the run is cancelled (status exits 5)', async () => {
    const prefix = newPrefix();
    expect((await flujo(['run', GATED, '--run-id', 'c1'], { prefix })).code).toBe(3);
    const cancel = await flujo(['cancel', 'c1', '--reason', 'wrong input'], { prefix });
    expect(cancel.code).toBe(0);
    expect(cancel.out).toBe('cancelled run c1 (by tester)\n');
    const status = await flujo(['status', 'c1'], { prefix });
    expect(status.code).toBe(5);
    expect(status.out).toContain('run c1  plan "gated"  cancelled');
    const again = await flujo(['resume', 'c1', GATED], { prefix });
    expect(again.code).toBe(5);
  });
});

describe('flujo run', () => {
  it('--json: every line is JSON, the first names the run, the last is the result', async () => {
    const prefix = newPrefix();
    const r = await flujo(['run', LINE, '--json', '--input', '{"slowMs":0}'], { prefix });
    expect(r.code).toBe(0);
    const lines = r.lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines[0]).toMatchObject({ type: 'run', created: true });
    expect(lines[0]!['resume']).toBe(`npx flujo resume ${String(lines[0]!['runId'])} ${LINE}`);
    expect(lines.filter((l) => l['to'] === 'SUCCEEDED').map((l) => l['stepId'])).toEqual([
      'a',
      'b',
      'c',
    ]);
    expect(lines.at(-1)).toMatchObject({ type: 'result', exitCode: 0, status: 'succeeded' });
  });

  it('a budget stops the run: exit 4 and the summary says budget_exceeded', async () => {
    const prefix = newPrefix();
    const r = await flujo(['run', 'test/fixtures/jobs/budget.ts'], { prefix });
    expect(r.code).toBe(4);
    expect(r.out).toContain('reason: budget_exceeded (maxSteps: limit 2, used 3)');
    const status = await flujo(['status', runIdOf(r), '--json'], { prefix });
    expect(status.code).toBe(4);
    expect(JSON.parse(status.out)).toMatchObject({ summary: { reason: 'budget_exceeded' } });
  });

  it('the same request key finds the same run', async () => {
    const prefix = newPrefix();
    const first = await flujo(['run', LINE, '--request-key', 'order-1'], { prefix });
    expect(first.code).toBe(0);
    const second = await flujo(['run', LINE, '--request-key', 'order-1'], { prefix });
    expect(second.code).toBe(0);
    expect(runIdOf(second)).toBe(runIdOf(first));
    expect(second.lines[0]).toContain('existing run of request key "order-1"');
    expect(second.out).toContain(`run ${runIdOf(first)} succeeded`);
  });
});

describe('flujo worker', () => {
  it('prints a start line, drives runs on its prefix, and stops gracefully on SIGTERM', async () => {
    const prefix = newPrefix();
    expect((await flujo(['run', GATED, '--run-id', 'w1'], { prefix })).code).toBe(3);
    expect((await flujo(['approve', 'w1', 'review', '--by', 'ana'], { prefix })).code).toBe(0);
    let started!: () => void;
    const ready = new Promise<void>((resolve) => (started = resolve));
    const worker = flujo(['worker', GATED, '--concurrency', '2'], {
      prefix,
      onOutput: (out) => {
        if (out.includes('flujo worker: processing runs')) started();
      },
    });
    await ready;
    let status = await flujo(['status', 'w1'], { prefix });
    for (let i = 0; i < 50 && !status.out.includes('succeeded'); i++) {
      await new Promise((r) => setTimeout(r, 100));
      status = await flujo(['status', 'w1'], { prefix });
    }
    expect(status.out).toContain('run w1  plan "gated"  succeeded');
    workerPid(prefix)?.kill('SIGTERM');
    const done = await worker;
    expect(done.code).toBe(0);
    expect(done.lines[0]).toContain(
      `(prefix ${prefix}, concurrency 2) with the operators of ${GATED}`,
    );
    expect(done.out).toContain('flujo worker: stopping');
  });
});

describe('bad input: one line that names the fix, a non-zero exit, nothing written', () => {
  const prefix = testPrefix();
  prefixes.push(prefix);
  let waitingRun = '';
  beforeAll(async () => {
    const run = await flujo(['run', GATED, '--run-id', 'waiting-run'], { prefix });
    expect(run.code).toBe(3);
    waitingRun = runIdOf(run);
  });

  async function refused(args: string[], code: number, message: string | RegExp) {
    const before = await keysOf(redis, prefix);
    const versionBefore = await redis.hget(`${prefix}:{waiting-run}:snap`, 'v');
    const eventsBefore = await redis.xlen(`${prefix}:{waiting-run}:events`);
    const r = await flujo(args, { prefix });
    expect(r.code).toBe(code);
    expect(r.out).toBe('');
    const lines = r.err.trimEnd().split('\n');
    expect(lines).toHaveLength(1);
    if (typeof message === 'string') expect(lines[0]).toContain(message);
    else expect(lines[0]).toMatch(message);
    expect(newKeys(before, await keysOf(redis, prefix))).toEqual([]);
    expect(await redis.hget(`${prefix}:{waiting-run}:snap`, 'v')).toBe(versionBefore);
    expect(await redis.xlen(`${prefix}:{waiting-run}:events`)).toBe(eventsBefore);
    return r;
  }

  it('a missing job module', async () => {
    await refused(
      ['run', 'x.ts'],
      2,
      'flujo run: cannot load job module "x.ts": file not found; pass the path to a module that exports plan',
    );
  });

  it('a module without a plan', async () => {
    await refused(
      ['run', 'test/fixtures/jobs/no-plan.ts'],
      2,
      'job module "test/fixtures/jobs/no-plan.ts" exports no plan; add `export const plan =',
    );
  });

  it('an invalid plan: the first line names the module, then every problem', async () => {
    const before = await keysOf(redis, prefix);
    const r = await flujo(['run', 'test/fixtures/jobs/bad-plan.ts'], { prefix });
    expect(r.code).toBe(2);
    const lines = r.err.trimEnd().split('\n');
    expect(lines[0]).toBe(
      'flujo run: job module "test/fixtures/jobs/bad-plan.ts": Invalid plan (2 problems):',
    );
    expect(r.err).toContain('steps[1].id: duplicate step id "a"');
    expect(r.err).toContain('steps[0].dependsOn[0]: unknown step "missing"');
    expect(newKeys(before, await keysOf(redis, prefix))).toEqual([]);
  });

  it('non-JSON --input', async () => {
    await refused(
      ['run', GATED, '--input', '{url: x}'],
      2,
      /^flujo run: --input is not JSON: .+; pass JSON, e\.g\. --input '\{"url":"…"\}'$/,
    );
  });

  it('an unknown run id', async () => {
    const msg = 'Run "no-such-run" not found. Check the run id (and the Redis URL and key prefix).';
    await refused(['status', 'no-such-run'], 2, `flujo status: ${msg}`);
    await refused(['approve', 'no-such-run', 'review'], 2, msg);
    await refused(['events', 'no-such-run', '--follow'], 2, msg);
    await refused(['resume', 'no-such-run', GATED], 2, msg);
    await refused(['ledger', 'no-such-run'], 2, msg);
  });

  it('approving a step that is not waiting', async () => {
    await refused(
      ['approve', waitingRun, 'draft', '--by', 'ana'],
      2,
      `Step "draft" of run "${waitingRun}" is SUCCEEDED, not waiting for approval`,
    );
    await refused(['reject', waitingRun, 'nope'], 2, `Run "${waitingRun}" has no step "nope".`);
  });

  it('an unreachable Redis URL: exit 6, fast', async () => {
    const started = performance.now();
    const r = await refused(
      ['run', GATED, '--redis', 'redis://127.0.0.1:1'],
      6,
      'flujo run: cannot reach Redis at redis://127.0.0.1:1: connect ECONNREFUSED; start Redis or pass --redis URL',
    );
    expect(r.err).not.toContain('127.0.0.1:1 ');
    expect(performance.now() - started).toBeLessThan(5000);
    await refused(['status', 'x', '--redis', 'not a url'], 2, 'is not a Redis URL');
  });

  it('options that do not apply, and a bad --concurrency', async () => {
    await refused(['status', waitingRun, '--input', '{}'], 2, '--input does not apply');
    await refused(['run', GATED, '--concurrency', '0'], 2, '--concurrency "0" is not a whole');
    await refused(['ledger', 'resolve', waitingRun, 'abc'], 2, 'exactly one of --succeeded');
  });
});

describe('the embedded redis-server', { timeout: 60_000 }, () => {
  const cwd = mkdtempSync(join(tmpdir(), 'flujo-cli-'));
  const dataDir = join(cwd, '.flujo', 'redis');
  const line = join(root, LINE);
  const serverInfo = () =>
    JSON.parse(readFileSync(join(dataDir, 'server.json'), 'utf8')) as { pid: number; port: number };
  const pids = new Set<number>();

  afterAll(() => {
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already stopped
      }
    }
    rmSync(cwd, { recursive: true, force: true });
  });

  it('starts in .flujo/redis with no set-up, is reused, survives a SIGKILLed run, and stops', async () => {
    const run = await flujo(['run', line, '--run-id', 'e1'], { cwd, embedded: true });
    expect(run.code).toBe(0);
    expect(run.lines[0]).toBe('run e1 (plan "line")');
    expect(run.err).toContain('started the embedded redis-server');
    const first = serverInfo();
    pids.add(first.pid);

    // The second command reuses it.
    const status = await flujo(['status', 'e1', '--json'], { cwd, embedded: true });
    expect(status.code).toBe(0);
    expect(status.err).toBe('');
    expect(serverInfo()).toEqual(first);

    // Kill a run with SIGKILL once its first step succeeded; resume it later with no set-up.
    const killed = flujo(['run', line, '--run-id', 'k1', '--input', '{"slowMs":500}'], {
      cwd,
      embedded: true,
      onOutput: (out, child) => {
        if (out.includes('a: RUNNING → SUCCEEDED')) child.kill('SIGKILL');
      },
    });
    const k = await killed;
    expect(k.code).toBeNull();
    expect(k.out).not.toContain('c: RUNNING → SUCCEEDED');
    const resume = await flujo(['resume', 'k1', line], { cwd, embedded: true });
    expect(resume.code).toBe(0);
    expect(resume.out).toContain('run k1 succeeded');
    expect(resume.out).toContain('produced: a, b, c');
    expect(serverInfo()).toEqual(first);

    const stop = await flujo(['redis', 'stop'], { cwd, embedded: true });
    expect(stop.code).toBe(0);
    expect(stop.out).toContain(`stopped the embedded redis-server (pid ${first.pid}`);
    expect(existsSync(join(dataDir, 'server.json'))).toBe(false);

    // A new server replays the append-only file: the runs are still there.
    const after = await flujo(['status', 'k1'], { cwd, embedded: true });
    expect(after.code).toBe(0);
    expect(after.out).toContain('run k1  plan "line"  succeeded');
    pids.add(serverInfo().pid);
    expect((await flujo(['redis', 'stop'], { cwd, embedded: true })).code).toBe(0);
  });

  it("calls the job module's setup once before the run, and its teardown on exit", async () => {
    const job = join(root, 'test/fixtures/jobs/with-setup.ts');
    const r = await flujo(['run', job], { cwd, embedded: true });
    expect(r.code).toBe(0);
    expect(readFileSync(join(cwd, '.flujo', 'data', 'setup.log'), 'utf8')).toBe(
      'setup\nteardown\n',
    );
    pids.add(serverInfo().pid);
    expect((await flujo(['redis', 'stop'], { cwd, embedded: true })).code).toBe(0);
  });

  it('a command about a run in a directory without an embedded Redis starts nothing', async () => {
    const empty = mkdtempSync(join(tmpdir(), 'flujo-cli-empty-'));
    const r = await flujo(['status', 'e1'], { cwd: empty, embedded: true });
    expect(r.code).toBe(2);
    expect(r.err).toContain('Run "e1" not found: there is no embedded Redis in');
    expect(existsSync(join(empty, '.flujo'))).toBe(false);
    rmSync(empty, { recursive: true, force: true });
  });
});

// Concurrent: most of each test is waiting for work to be idle for 5 s.
describe('printed commands run as printed', { timeout: 60_000, concurrent: true }, () => {
  const PAIR = 'test/fixtures/jobs/pair.ts';
  // A folder with a `flujo` that is this very bin (a link, as npm installs bins), and the pinned
  // Node, which the bin's `#!/usr/bin/env node` finds.
  const shims = mkdtempSync(join(tmpdir(), 'flujo-path-'));
  symlinkSync(flujoBin, join(shims, 'flujo'));
  const nodeBin = join(root, 'node_modules', '.bin');

  afterAll(() => rmSync(shims, { recursive: true, force: true }));

  /**
   * `flujo <args>` as a shell runs it, outside npm (no npm_command): with this `flujo` first on
   * PATH (`onPath`), or with no `flujo` on PATH at all.
   */
  function shell(args: string[], prefix: string, onPath: boolean): Promise<ChildResult> {
    const env = flujoEnv({ prefix, user: 'tester' });
    delete env['npm_command'];
    const path = (env['PATH'] ?? '').split(delimiter).filter((dir) => {
      return !existsSync(join(dir, 'flujo'));
    });
    env['PATH'] = [...(onPath ? [shims] : []), nodeBin, ...path].join(delimiter);
    return spawnChild(pinnedNode, [flujoBin, ...args], { env }).done;
  }

  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

  for (const [branch, onPath, flujoCmd] of [
    ['flujo on PATH', true, 'flujo'],
    ['no flujo on PATH', false, 'npx flujo'],
  ] as const) {
    it(`${branch}: run, approve and status print \`${flujoCmd} …\` with the job module's path`, async () => {
      const prefix = newPrefix();
      const run = await shell(['run', GATED], prefix, onPath);
      expect(run.code, run.err).toBe(3);
      const runId = runIdOf(run);
      expect(run.lines[1]).toBe(`resume: ${flujoCmd} resume ${runId} ${GATED}`);
      expect(run.out).toContain(
        `waiting for approval: review (${flujoCmd} approve ${runId} review`,
      );

      // Approved, `review` is due and no worker runs: the hint names the module, then status does.
      const approve = await shell(['approve', runId, 'review'], prefix, onPath);
      expect(approve.code, approve.err).toBe(0);
      expect(approve.out).toContain(
        `run ${runId} is running; continue it with \`${flujoCmd} resume ${runId} ${GATED}\` (or a running \`${flujoCmd} worker ${GATED}\`)\n`,
      );
      await sleep(5200);
      const status = await shell(['status', runId], prefix, onPath);
      expect(status.code, status.err).toBe(0);
      expect(status.out).toMatch(
        new RegExp(
          `\\n {2}no worker has taken step review for \\d+\\.\\d s: start one with \`${flujoCmd} worker ${GATED}\`, or continue it with \`${flujoCmd} resume ${runId} ${GATED}\`\\n`,
        ),
      );
      if (!onPath) return;
      // Run exactly as printed, by a shell: it finishes the run.
      const printed = /continue it with `([^`]+)`/.exec(status.out)![1]!;
      const env = flujoEnv({ prefix, user: 'tester' });
      delete env['npm_command'];
      env['PATH'] = [shims, nodeBin, env['PATH'] ?? ''].join(delimiter);
      const resumed = await spawnChild('/bin/sh', ['-c', printed], { env }).done;
      expect(resumed.code, resumed.err).toBe(0);
      expect(resumed.out).toContain(`run ${runId} succeeded`);
    });
  }

  it('flujo run: due work no worker takes is reported with the worker and resume commands of the module', async () => {
    const prefix = newPrefix();
    const run = await flujo(['run', PAIR, '--concurrency', '1'], { prefix });
    expect(run.code, run.err).toBe(0);
    const runId = runIdOf(run);
    const notice = run.lines.filter((l) => l.includes('no worker has taken'));
    expect(notice).toHaveLength(1);
    expect(notice[0]).toMatch(
      new RegExp(
        `^ {2}no worker has taken step [ab] for \\d+\\.\\d s: start one with \`npx flujo worker ${PAIR}\`, or continue it with \`npx flujo resume ${runId} ${PAIR}\`$`,
      ),
    );
  });

  it('flujo run --json: due work no worker takes is a JSON line with the worker and resume commands', async () => {
    const prefix = newPrefix();
    const run = await flujo(['run', PAIR, '--concurrency', '1', '--json'], { prefix });
    expect(run.code, run.err).toBe(0);
    const events = run.lines
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const idle = events.filter((e) => e['type'] === 'idle');
    expect(idle).toHaveLength(1);
    const runId = events.find((e) => e['type'] === 'run')?.['runId'] as string;
    expect(runId).toEqual(expect.any(String));
    expect(idle[0]).toMatchObject({
      stepId: expect.stringMatching(/^[ab]$/) as unknown,
      idleMs: expect.any(Number) as unknown,
      commands: {
        worker: `npx flujo worker ${PAIR}`,
        resume: `npx flujo resume ${runId} ${PAIR}`,
      },
    });
  });

  it('flujo status of a run that does not record its module: the placeholder says it is one', async () => {
    const prefix = newPrefix();
    const runtime = createRuntime({ redis: redisUrl(), prefix }).operator('a', () => null);
    try {
      const { runId } = await runtime.start({
        name: 'p',
        steps: [{ id: 'a', kind: 'operator', operator: 'a' }],
      });
      await sleep(5200);
      const status = await flujo(['status', runId], { prefix });
      expect(status.code, status.err).toBe(0);
      expect(status.out).toContain(`no worker has taken step a for `);
      expect(status.out).toContain(
        `start one with \`npx flujo worker <job-module>\`, or continue it with \`npx flujo resume ${runId} <job-module>\` (<job-module> is a placeholder for the path of the job module that started the run, which the run does not record)`,
      );
      await runtime.cancel(runId, { by: 'tester' });
    } finally {
      await runtime.close();
    }
  });
});

describe('one embedded Redis per project', { timeout: 60_000 }, () => {
  const project = mkdtempSync(join(tmpdir(), 'flujo-project-'));
  const deep = join(project, 'src', 'jobs');
  const dataDir = join(project, '.flujo', 'redis');
  writeFileSync(join(project, 'package.json'), '{ "type": "module" }\n');
  mkdirSync(deep, { recursive: true });

  afterAll(async () => {
    await stopEmbeddedRedis(dataDir);
    rmSync(project, { recursive: true, force: true });
  });

  it('ensureEmbeddedRedis() from a subfolder starts the server of the project, which flujo and every subfolder reuse', async () => {
    // A process in a subfolder, with the default options: the project's .flujo/redis.
    const script =
      'const m = await import(process.argv[1]); const r = await m.ensureEmbeddedRedis(); console.log(JSON.stringify(r));';
    const child = await spawnChild(
      pinnedNode,
      ['--input-type=module', '-e', script, join(root, 'dist', 'testing', 'index.js')],
      { cwd: deep },
    ).done;
    expect(child.code, child.err).toBe(0);
    const first = JSON.parse(child.out) as { port: number; dataDir: string; started: boolean };
    expect(first).toMatchObject({ started: true, dataDir: realpathSync(dataDir) });
    expect(existsSync(join(deep, '.flujo'))).toBe(false);

    // The flujo command, from the project's root and from the subfolder, uses that one.
    for (const cwd of [project, deep]) {
      const list = await flujo(['list'], { cwd, embedded: true });
      expect(list.code, list.err).toBe(0);
      expect(list.err).toBe('');
    }
    // In this process, from the subfolder (the cwd option), too.
    const again = await ensureEmbeddedRedis({ cwd: deep });
    expect(again).toMatchObject({ started: false, port: first.port });
    expect(realpathSync(again.dataDir)).toBe(realpathSync(dataDir));

    const stop = await flujo(['redis', 'stop'], { cwd: deep, embedded: true });
    expect(stop.code, stop.err).toBe(0);
    expect(stop.out).toContain(`(pid `);
    expect(stop.out).toContain(`port ${first.port}`);
  });
});
