import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, type PlanInput, type Runtime } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

const ROOT = join(import.meta.dirname, '..', '..');
const NODE = join(ROOT, 'node_modules', '.bin', 'node');
const CHILD = join(ROOT, 'test', 'fixtures', 'replay-child.ts');

interface Child {
  proc: ChildProcess;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** Starts test/fixtures/replay-child.ts and resolves once it prints `ready`. */
async function spawnChild(env: Record<string, string>): Promise<Child> {
  const proc = spawn(NODE, ['--import', 'tsx', CHILD], {
    cwd: ROOT,
    env: { ...process.env, FLUJO_KILL_AT: '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.on('close', (code, signal) => resolve({ code, signal })),
  );
  await new Promise<void>((resolve, reject) => {
    proc.stdout.on('data', (chunk: Buffer) => {
      stdout += chunk.toString();
      if (stdout.includes('ready ')) resolve();
    });
    proc.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    void exited.then((e) =>
      reject(new Error(`child exited before ready (${JSON.stringify(e)}): ${stderr}`)),
    );
  });
  return { proc, exited };
}

const plan: PlanInput = {
  name: 'newsletter',
  steps: [
    { id: 'prepare', kind: 'operator', operator: 'prepare', effects: ['read_only'] },
    {
      id: 'draft',
      kind: 'agent',
      agent: 'drafter',
      mode: 'granular',
      dependsOn: ['prepare'],
      effects: ['read_only'],
    },
    {
      id: 'email',
      kind: 'operator',
      operator: 'email',
      dependsOn: ['draft'],
      effects: ['external'],
    },
    { id: 'audit', kind: 'operator', operator: 'audit', dependsOn: ['prepare'] },
  ],
};

describe('replay across a crash', () => {
  let model: ScriptedModelServer;
  let runtime: Runtime;
  let prefix: string;
  let dir: string;
  const children: Child[] = [];

  beforeAll(async () => {
    model = await startScriptedModelServer();
    prefix = `t-${randomUUID().slice(0, 8)}`;
    dir = mkdtempSync(join(tmpdir(), 'flujo-replay-'));
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
  });
  afterEach(async () => {
    for (const c of children.splice(0)) {
      if (c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill('SIGTERM');
      await c.exited;
    }
  });
  afterAll(async () => {
    await runtime.close();
    await deleteRuntimeKeys(prefix);
    await model.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('a replay killed twice mid-way and resumed sends no e-mail; its events still lead to its snapshot', async () => {
    const effectFile = join(dir, 'effects.log');
    const env = {
      REDIS_URL: redisUrl(),
      FLUJO_PREFIX: prefix,
      MODEL_URL: model.url,
      EFFECT_FILE: effectFile,
    };
    const effects = () =>
      existsSync(effectFile) ? readFileSync(effectFile, 'utf8').trim().split('\n') : [];
    for (let i = 0; i < 4; i++) model.enqueue({ text: 'Draft A' });

    const first = await spawnChild(env);
    children.push(first);
    const run = await runtime.start(plan, null);
    expect((await run.settled({ timeoutMs: 15_000 })).status).toBe('succeeded');
    expect(effects()).toHaveLength(1);
    first.proc.kill('SIGTERM');
    await first.exited;
    expect(model.requestCount).toBe(1);

    // Killed right after the replay's draft turn is committed, before its e-mail step ran.
    const doomed = await spawnChild({ ...env, FLUJO_KILL_AT: 'after-commit:draft:0' });
    children.push(doomed);
    const replayed = await runtime.replay(run.runId, { mode: 'replay' });
    expect(await doomed.exited).toMatchObject({ signal: 'SIGKILL' });
    expect(model.requestCount).toBe(2);
    const mid = await runtime.status(replayed.runId);
    expect(mid.status).toBe('running');
    expect(mid.steps.find((s) => s.stepId === 'email')?.status).not.toBe('SUCCEEDED');

    // Killed again, once the e-mail's receipt (the original's) is in the replay's ledger and
    // before the step's result is committed.
    const again = await spawnChild({ ...env, FLUJO_KILL_AT: 'after-receipt:send_email' });
    children.push(again);
    expect(await again.exited).toMatchObject({ signal: 'SIGKILL' });
    expect((await runtime.ledger(replayed.runId)).map((e) => e.state)).toEqual(['SUCCEEDED']);
    expect((await runtime.status(replayed.runId)).status).toBe('running');

    const healer = await spawnChild(env);
    children.push(healer);
    const done = await (await runtime.attach(replayed.runId)).settled({ timeoutMs: 15_000 });
    expect(done.status).toBe('succeeded');
    expect(effects()).toHaveLength(1);
    expect(effects()[0]).toContain(run.runId);
    // The draft turn was journaled and committed before the kill: the model is not asked again.
    expect(model.requestCount).toBe(2);
    expect(done.summary.produced['email']).toEqual(
      (await runtime.status(run.runId)).summary.produced['email'],
    );

    const reproduced = await runtime.replay(replayed.runId, { mode: 'reproduce' });
    expect(reproduced.integrity).toEqual({ ok: true, problems: [], differences: [] });
  });
});
