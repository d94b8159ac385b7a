/**
 * Replay of the durable-job example's run (examples/durable-job): the replay asks the model again
 * and reaches the upload and the e-mail with the same arguments, so both return the original's
 * receipts: the service sees no new request, also when the replay's worker is killed with SIGKILL
 * right after it reused the upload's receipt and another worker finishes the run.
 */
import { describe, expect, it } from 'vitest';
import { input, modelEndpoint, plan } from '../../examples/durable-job/job.ts';
import { runWorkerChild, useDurableJob, WORKER } from '../helpers/durable-job.js';

const example = useDurableJob('flujo-durable-replay-');

/** Chat completions the scripted model answered (a worker child's set-up also probes it). */
const modelCalls = () =>
  modelEndpoint().server!.requests.filter((r) => r.path.endsWith('/chat/completions')).length;

describe('replay of examples/durable-job', () => {
  it('asks the model again and uploads and e-mails nothing new, across a SIGKILL too', async () => {
    example.worker = example.runtime.createWorker(WORKER);
    await example.worker.ready();
    const run = await example.runtime.start(plan, input);
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('succeeded');
    const totals = example.service.stats();
    expect(totals.effects).toEqual({ upload: 1, email: 1 });
    const calls = modelCalls();
    expect(calls).toBe(2);

    const replayed = await example.runtime.replay(run.runId, { mode: 'replay' });
    const again = await (
      await example.runtime.attach(replayed.runId)
    ).settled({ timeoutMs: 20_000 });
    expect(again.status).toBe('succeeded');
    expect(modelCalls()).toBe(calls + 2);
    expect(example.service.stats()).toEqual(totals);
    expect(again.summary.produced['email']).toEqual(done.summary.produced['email']);
    expect(again.summary.produced['upload']).toEqual(done.summary.produced['upload']);

    // A second replay, its worker killed right after it reused the upload's receipt.
    await example.worker.close();
    example.worker = undefined;
    const second = await example.runtime.replay(run.runId, { mode: 'replay' });
    const killed = await runWorkerChild(example, second.runId, 'after-receipt:upload_report');
    expect(killed.signal).toBe('SIGKILL');
    expect((await example.runtime.status(second.runId)).status).toBe('running');
    example.worker = example.runtime.createWorker(WORKER);
    await example.worker.ready();
    const healed = await (
      await example.runtime.attach(second.runId)
    ).settled({ timeoutMs: 20_000 });
    expect(healed.status).toBe('succeeded');
    expect(example.service.stats()).toEqual(totals);
    expect(modelCalls()).toBe(calls + 4);
    const reproduced = await example.runtime.replay(second.runId, { mode: 'reproduce' });
    expect(reproduced.integrity.ok).toBe(true);
  });
});
