import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ToolOutcomeUnknownError } from '../../src/errors.js';
import { DebugPoint } from '../../src/internal/debug-points.js';
import { createLedger, type Ledger } from '../../src/persistence/ledger.js';
import { callTool } from '../../src/tools/call-tool.js';
import {
  crashCtx,
  effectLines,
  fileEffectTool,
  type CrashToolMode,
} from '../fixtures/crash-tools.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const CHILD = join(import.meta.dirname, '..', 'fixtures', 'call-tool-child.ts');
const LEASE_MS = 300;

let redis: Redis;
let prefix: string;
let dir: string;
let file: string;
let ledger: Ledger;

interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stderr: string;
}

/**
 * Runs the child in its own process with the tsx loader (`node --import tsx`, not the tsx CLI: the
 * CLI runs the script in a grandchild and turns its SIGKILL into exit code 137).
 */
function runChild(mode: CrashToolMode, killAt: DebugPoint): Promise<Exit> {
  const child = spawn(process.execPath, ['--import', 'tsx', CHILD], {
    env: {
      ...process.env,
      REDIS_URL: redisUrl(),
      FLUJO_PREFIX: prefix,
      EFFECT_FILE: file,
      TOOL_MODE: mode,
      LEASE_MS: String(LEASE_MS),
      FLUJO_KILL_AT: killAt,
    },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code, signal) => resolve({ code, signal, stderr }));
  });
}

const resume = (mode: CrashToolMode) =>
  callTool({
    ledger,
    tool: fileEffectTool(mode, file),
    args: { text: 'hello' },
    ctx: crashCtx,
    leaseMs: LEASE_MS,
  });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  await redis.quit();
});
beforeEach(async () => {
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-crash-'));
  file = join(dir, 'effects.log');
  ledger = createLedger({ redis, prefix });
});
afterEach(async () => {
  await deletePrefix(redis, prefix);
  await rm(dir, { recursive: true, force: true });
});

describe('callTool across a crash (SIGKILL in a child process)', () => {
  it('killed after the effect, a non-idempotent call is in doubt and is not run again', async () => {
    const exit = await runChild('plain', DebugPoint.afterToolEffect);
    expect(exit).toMatchObject({ signal: 'SIGKILL', code: null });
    expect(effectLines(file)).toHaveLength(1);
    await sleep(LEASE_MS + 50);
    const e = await resume('plain').catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ToolOutcomeUnknownError);
    expect((e as Error).message).toContain('flujo ledger resolve crash-run ');
    expect(effectLines(file)).toHaveLength(1);
    const [entry] = await ledger.list(crashCtx.runId, crashCtx.tenantId);
    expect(entry).toMatchObject({ state: 'IN_DOUBT', runs: 1, receipt: null });
  });

  it('killed after the effect, an idempotent call re-runs with the same key and the effect stays single', async () => {
    const exit = await runChild('keyed', DebugPoint.afterToolEffect);
    expect(exit).toMatchObject({ signal: 'SIGKILL' });
    const [line] = effectLines(file);
    await sleep(LEASE_MS + 50);
    const result = await resume('keyed');
    expect(result).toMatchObject({
      replayed: false,
      receipt: { appended: 'hello', deduped: true },
      entry: { state: 'SUCCEEDED', runs: 2 },
    });
    expect(line).toBe(`${result.entry.callId} hello`);
    expect(effectLines(file)).toEqual([line]);
  });

  it.each<CrashToolMode>(['plain', 'keyed'])(
    'killed after the receipt (%s), the next call returns the receipt and the effect count stays 1',
    async (mode) => {
      const exit = await runChild(mode, DebugPoint.afterReceipt);
      expect(exit).toMatchObject({ signal: 'SIGKILL' });
      const result = await resume(mode);
      expect(result).toMatchObject({
        replayed: true,
        receipt: { appended: 'hello', deduped: false },
        entry: { state: 'SUCCEEDED', runs: 1 },
      });
      expect(effectLines(file)).toHaveLength(1);
    },
  );
});
