/**
 * A worker killed (SIGKILL) between a risky tool call's approval and its effect: another worker
 * resumes the step, the approval still covers that call, and the effect happens exactly once.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import { expectIntact } from '../helpers/integrity.js';
import { killChildren, spawnReadyChild } from '../helpers/ready-child.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const QUEUE = 'pay';

let prefix: string;
let dir: string;
let effectFile: string;
let rt: Runtime;
const children = new Set<ChildProcess>();

beforeAll(async () => {
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-pay-'));
  effectFile = join(dir, 'effects.log');
  rt = createRuntime({ redis: redisUrl(), prefix, queueName: QUEUE });
});
afterAll(async () => {
  killChildren(children);
  await rt.close();
  await deleteRuntimeKeys(prefix);
  await rm(dir, { recursive: true, force: true });
});

const spawnWorker = (killAt = '') =>
  spawnReadyChild(
    'driver-child.ts',
    {
      REDIS_URL: redisUrl(),
      FLUJO_PREFIX: prefix,
      QUEUE_NAME: QUEUE,
      EFFECT_FILE: effectFile,
      RECOVERY_MS: '1000',
      FLUJO_KILL_AT: killAt,
    },
    children,
  );

const lines = (file: string) =>
  existsSync(file)
    ? readFileSync(file, 'utf8')
        .split('\n')
        .filter((l) => l !== '')
    : [];

describe('a risky call across a crash', () => {
  it('killed after the approval and before the effect: resumed, the effect happens once', async () => {
    const victim = await spawnWorker('after-call-approved:pay');
    const run = await rt.start({
      name: 'pay-crash',
      steps: [{ id: 'p', kind: 'operator', operator: 'paying', input: { cents: 250 } }],
    });
    const waiting = await run.settled({ timeoutMs: 15_000 });
    expect(waiting.status).toBe('waiting');
    const call = waiting.approvals[0]!.call!;
    expect(call).toMatchObject({ tool: 'pay@1', args: { cents: 250 } });

    await rt.approve(run.runId, 'p', { by: 'ana' });
    // The victim takes the resumed execution, finds the call approved, and dies before running it.
    expect(await victim.exited).toEqual({ code: null, signal: 'SIGKILL' });
    expect(lines(`${effectFile}.pay`)).toEqual([]);
    const ledger = await rt.ledger(run.runId);
    expect(ledger.map((e) => [e.callId, e.state, e.runs])).toEqual([[call.callId, 'PREPARED', 0]]);

    const healer = await spawnWorker();
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('succeeded');
    const paid = lines(`${effectFile}.pay`);
    expect(paid).toHaveLength(1);
    expect(paid[0]).toBe(`${run.runId} ${call.callId} 250 ${healer.pid}`);
    expect((await rt.ledger(run.runId)).map((e) => [e.state, e.runs])).toEqual([['SUCCEEDED', 1]]);
    // One approval asked for and given; the operator ran three times (paused, killed, healed).
    expect(done.steps[0]).toMatchObject({ status: 'SUCCEEDED', attempt: 1, pauses: 1 });
    expect(done.steps[0]!.callDecisions).toHaveLength(1);
    const executions = lines(effectFile).filter((l) => l.startsWith(`${run.runId} p `));
    expect(executions.map((l) => l.split(' ')[2])).toEqual(['1', '1', '1']);
    await expectIntact(rt, run.runId);
  }, 60_000);
});
