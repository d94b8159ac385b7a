/**
 * Action keys across a SIGKILL: a worker dies after the charge and before its receipt. The call is
 * in doubt in the tenant's action ledger; the tool honours its key, so the next worker runs it
 * again with the same key (the service sees one key), and a later run with the same key values
 * gets the receipt and no effect at all.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import { expectIntact } from '../helpers/integrity.js';
import { killChildren, spawnReadyChild } from '../helpers/ready-child.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const prefix = testPrefix();
let dir: string;
let effectFile: string;
let runtime: Runtime;
const children = new Set<ChildProcess>();

const spawnWorker = (killAt = '') =>
  spawnReadyChild(
    'action-child.ts',
    { REDIS_URL: redisUrl(), FLUJO_PREFIX: prefix, EFFECT_FILE: effectFile, FLUJO_KILL_AT: killAt },
    children,
  );

/** The effects at the service: `[runId, key, cents]`. */
const effects = (): string[][] =>
  existsSync(effectFile)
    ? readFileSync(effectFile, 'utf8')
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => l.split(' ').slice(0, 3))
    : [];

const plan: PlanInput = {
  name: 'pay-once',
  steps: [
    {
      id: 'pay',
      kind: 'operator',
      operator: 'pay',
      effects: ['external'],
      idempotency: { keyInputs: ['order.id'] },
    },
  ],
};

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'flujo-action-crash-'));
  effectFile = join(dir, 'effects.log');
  // A producer only: the children are the workers.
  runtime = createRuntime({ redis: redisUrl(), prefix });
});
afterAll(async () => {
  killChildren(children);
  await runtime.close();
  await deleteRuntimeKeys(prefix);
  rmSync(dir, { recursive: true, force: true });
});

describe('action keys across a SIGKILL', { timeout: 60_000 }, () => {
  it('killed after the effect, before the receipt: one key at the service, and a second run with the same key values adds no effect', async () => {
    const victim = await spawnWorker('after-tool-effect');
    const first = await runtime.start(plan, { order: { id: 'o-1', cents: 250 } });
    expect(await victim.exited).toMatchObject({ signal: 'SIGKILL' });
    expect(effects()).toHaveLength(1);

    const healer = await spawnWorker();
    const report = await first.settled({ timeoutMs: 30_000 });
    expect(report.status).toBe('succeeded');
    expect(report.summary.produced['pay']).toEqual({ charged: 250 });
    // The call in doubt ran once more, with the same key (a service that honours it acts once);
    // its receipt is now in the action ledger.
    expect(effects()).toHaveLength(2);
    expect(new Set(effects().map((e) => e[1])).size).toBe(1);
    const before = effects().length;

    const second = await runtime.start(plan, { order: { id: 'o-1', cents: 250 } });
    const again = await second.settled({ timeoutMs: 30_000 });
    expect(again.status).toBe('succeeded');
    expect(again.summary.produced['pay']).toEqual({ charged: 250 });
    expect(effects()).toHaveLength(before);
    const ledger = await runtime.ledger(second.runId);
    expect(ledger.map((e) => e.state)).toEqual(['SUCCEEDED']);
    healer.proc.kill('SIGTERM');
    await healer.exited;
    await expectIntact(runtime, first.runId);
  });
});
