import { describe, expect, it } from 'vitest';
import {
  advanceRun,
  openRun,
  runStatus,
  runSteps,
  startRun,
  type RunTransition,
} from '../../src/machines/kernel.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { isFlujoError } from '../../src/errors.js';
import { e, planOf, T0, trace } from '../helpers/run-trace.js';

const line = planOf([
  { id: 'fetch', kind: 'operator', operator: 'fetch' },
  { id: 'report', kind: 'operator', operator: 'report', dependsOn: ['fetch'] },
  { id: 'send', kind: 'operator', operator: 'send', dependsOn: ['report'] },
]);

const diamond = planOf([
  { id: 'a', kind: 'operator', operator: 'op' },
  { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'] },
  { id: 'c', kind: 'operator', operator: 'op', dependsOn: ['a'] },
  { id: 'd', kind: 'operator', operator: 'op', dependsOn: ['b', 'c'] },
]);

const gated = planOf([
  { id: 'draft', kind: 'operator', operator: 'draft' },
  { id: 'review', kind: 'human_gate', dependsOn: ['draft'] },
  { id: 'send', kind: 'operator', operator: 'send', dependsOn: ['review'] },
]);

describe('run machine traces', () => {
  it('a 3-step line runs one step after the other', () => {
    const t = trace(line, [e.ok('fetch'), e.ok('report'), e.ok('send')]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | fetch:PENDING→READY | execute fetch#1
      step.succeeded fetch#1 ⇒ running | fetch:READY→SUCCEEDED report:PENDING→READY | execute report#1
      step.succeeded report#1 ⇒ running | report:READY→SUCCEEDED send:PENDING→READY | execute send#1
      step.succeeded send#1 ⇒ succeeded | send:READY→SUCCEEDED
      end: fetch=SUCCEEDED report=SUCCEEDED send=SUCCEEDED
      "
    `);
  });

  it('a diamond fans out b and c together and joins on d', () => {
    const t = trace(diamond, [e.ok('a'), e.ok('c'), e.ok('b'), e.ok('d')]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | a:PENDING→READY | execute a#1
      step.succeeded a#1 ⇒ running | a:READY→SUCCEEDED b:PENDING→READY c:PENDING→READY | execute b#1, execute c#1
      step.succeeded c#1 ⇒ running | c:READY→SUCCEEDED
      step.succeeded b#1 ⇒ running | b:READY→SUCCEEDED d:PENDING→READY | execute d#1
      step.succeeded d#1 ⇒ succeeded | d:READY→SUCCEEDED
      end: a=SUCCEEDED b=SUCCEEDED c=SUCCEEDED d=SUCCEEDED
      "
    `);
  });

  it('a gate approved: the run waits, then goes on', () => {
    const t = trace(gated, [e.ok('draft'), e.approve('review'), e.ok('review'), e.ok('send')]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | draft:PENDING→READY | execute draft#1
      step.succeeded draft#1 ⇒ waiting | draft:READY→SUCCEEDED review:PENDING→WAITING_APPROVAL | ask approval review
      gate.approved review ⇒ running | review:WAITING_APPROVAL→READY | execute review#1
      step.succeeded review#1 ⇒ running | review:READY→SUCCEEDED send:PENDING→READY | execute send#1
      step.succeeded send#1 ⇒ succeeded | send:READY→SUCCEEDED
      end: draft=SUCCEEDED review=SUCCEEDED send=SUCCEEDED
      "
    `);
    const review = runSteps(t.snapshot).find((s) => s.stepId === 'review');
    expect(review?.approval).toEqual({ by: 'ana', at: T0 + 3000, comment: 'looks right' });
  });

  it('a gate rejected: the step fails finally and its dependents are cancelled', () => {
    const t = trace(gated, [e.ok('draft'), e.reject('review')]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | draft:PENDING→READY | execute draft#1
      step.succeeded draft#1 ⇒ waiting | draft:READY→SUCCEEDED review:PENDING→WAITING_APPROVAL | ask approval review
      gate.rejected review ⇒ failed | review:WAITING_APPROVAL→FAILED_FINAL send:PENDING→CANCELLED
      end: draft=SUCCEEDED review=FAILED_FINAL send=CANCELLED
      "
    `);
    const review = runSteps(t.snapshot).find((s) => s.stepId === 'review');
    expect(review).toMatchObject({
      reason: 'approval_rejected',
      rejection: { by: 'bo', comment: 'wrong recipient' },
    });
  });

  it('a retryable failure retried twice, then succeeding', () => {
    const t = trace(line, [
      e.ok('fetch'),
      e.fail('report', 1),
      e.due('report', 2),
      e.fail('report', 2),
      e.due('report', 3),
      e.ok('report', 3),
      e.ok('send'),
    ]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | fetch:PENDING→READY | execute fetch#1
      step.succeeded fetch#1 ⇒ running | fetch:READY→SUCCEEDED report:PENDING→READY | execute report#1
      step.failed report#1 ⇒ running | report:READY→FAILED_RETRYABLE | retry report#2 in 1000ms
      retry.due report#2 ⇒ running | report:FAILED_RETRYABLE→READY | execute report#2
      step.failed report#2 ⇒ running | report:READY→FAILED_RETRYABLE | retry report#3 in 2000ms
      retry.due report#3 ⇒ running | report:FAILED_RETRYABLE→READY | execute report#3
      step.succeeded report#3 ⇒ running | report:READY→SUCCEEDED send:PENDING→READY | execute send#1
      step.succeeded send#1 ⇒ succeeded | send:READY→SUCCEEDED
      end: fetch=SUCCEEDED report=SUCCEEDED send=SUCCEEDED
      "
    `);
  });

  it('a final failure: dependents are cancelled, an independent branch finishes, the run fails', () => {
    const t = trace(diamond, [e.ok('a'), e.fail('b', 1, false), e.ok('c')]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | a:PENDING→READY | execute a#1
      step.succeeded a#1 ⇒ running | a:READY→SUCCEEDED b:PENDING→READY c:PENDING→READY | execute b#1, execute c#1
      step.failed b#1 ⇒ running | b:READY→FAILED_FINAL d:PENDING→CANCELLED
      step.succeeded c#1 ⇒ failed | c:READY→SUCCEEDED
      end: a=SUCCEEDED b=FAILED_FINAL c=SUCCEEDED d=CANCELLED
      "
    `);
    const d = runSteps(t.snapshot).find((s) => s.stepId === 'd');
    expect(d).toMatchObject({ status: 'CANCELLED', reason: 'upstream_failed', causeStepId: 'b' });
  });

  it('cancel in the middle of a run aborts what runs and cancels what waits', () => {
    const t = trace(diamond, [e.ok('a'), e.ok('b'), e.cancel(), e.ok('c')]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | a:PENDING→READY | execute a#1
      step.succeeded a#1 ⇒ running | a:READY→SUCCEEDED b:PENDING→READY c:PENDING→READY | execute b#1, execute c#1
      step.succeeded b#1 ⇒ running | b:READY→SUCCEEDED
      run.cancelled ⇒ cancelled | c:READY→CANCELLED d:PENDING→CANCELLED | abort c#1
      step.succeeded c#1 ⇒ cancelled (ignored)
      end: a=SUCCEEDED b=SUCCEEDED c=CANCELLED d=CANCELLED
      "
    `);
    expect(t.snapshot.context.cancel).toEqual({ by: 'ops', reason: 'deploy', at: T0 + 6000 });
  });
});

describe('run machine: stop and resume', () => {
  it('a budget stop cancels open steps, aborts running attempts, and fails the run with the reason', () => {
    const t = trace(diamond, [e.ok('a'), e.stop()]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | a:PENDING→READY | execute a#1
      step.succeeded a#1 ⇒ running | a:READY→SUCCEEDED b:PENDING→READY c:PENDING→READY | execute b#1, execute c#1
      run.stopped ⇒ failed | b:READY→CANCELLED c:READY→CANCELLED d:PENDING→CANCELLED | abort b#1, abort c#1
      end: a=SUCCEEDED b=CANCELLED c=CANCELLED d=CANCELLED
      "
    `);
    expect(t.snapshot.context.stop).toEqual({
      reason: 'budget_exceeded',
      detail: { budget: 'maxSteps', limit: 3 },
      at: T0 + 7000,
    });
    expect(runSteps(t.snapshot).find((s) => s.stepId === 'b')?.reason).toBe('budget_exceeded');
  });

  it('a failed run resumed re-opens its failed and cancelled steps; attempts go on', () => {
    const t = trace(diamond, [
      e.ok('a'),
      e.fail('b', 1, false),
      e.ok('c'),
      e.resume(),
      e.ok('b', 2),
      e.ok('d'),
    ]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | a:PENDING→READY | execute a#1
      step.succeeded a#1 ⇒ running | a:READY→SUCCEEDED b:PENDING→READY c:PENDING→READY | execute b#1, execute c#1
      step.failed b#1 ⇒ running | b:READY→FAILED_FINAL d:PENDING→CANCELLED
      step.succeeded c#1 ⇒ failed | c:READY→SUCCEEDED
      run.resumed ⇒ running | b:FAILED_FINAL→READY d:CANCELLED→PENDING | execute b#2
      step.succeeded b#2 ⇒ running | b:READY→SUCCEEDED d:PENDING→READY | execute d#1
      step.succeeded d#1 ⇒ succeeded | d:READY→SUCCEEDED
      end: a=SUCCEEDED b=SUCCEEDED c=SUCCEEDED d=SUCCEEDED
      "
    `);
    expect(t.snapshot.context.resumes).toBe(1);
  });

  it('a run stopped by a budget resumes where it stopped', () => {
    const t = trace(diamond, [
      e.ok('a'),
      e.stop(),
      e.resume(),
      e.ok('b', 2),
      e.ok('c', 2),
      e.ok('d'),
    ]);
    expect(t.last.status).toBe('succeeded');
    expect(t.snapshot.context.stop).toBeNull();
  });

  it('resume is ignored unless the run failed; stop is ignored once it failed', () => {
    const running = trace(diamond, [e.ok('a')]);
    expect(advanceRun(running.snapshot, e.resume()).accepted).toBe(false);
    const failed = trace(diamond, [e.ok('a'), e.fail('b', 1, false), e.ok('c')]);
    expect(failed.last.status).toBe('failed');
    expect(advanceRun(failed.snapshot, e.stop()).accepted).toBe(false);
  });

  it('a failed run that is cancelled ends cancelled, its steps as they were; once only', () => {
    const failed = trace(diamond, [e.ok('a'), e.fail('b', 1, false), e.ok('c')]);
    const t = advanceRun(failed.snapshot, e.cancel());
    expect(t.accepted).toBe(true);
    expect(t.status).toBe('cancelled');
    expect(t.planned).toEqual([]);
    expect(t.changes).toEqual([]);
    expect(runSteps(t.snapshot)).toEqual(runSteps(failed.snapshot));
    expect(advanceRun(t.snapshot, e.cancel()).accepted).toBe(false);
    expect(advanceRun(t.snapshot, e.resume()).accepted).toBe(false);
  });

  it('a gate rejected and resumed asks for approval again', () => {
    const t = trace(gated, [e.ok('draft'), e.reject('review'), e.resume()]);
    expect(t.last.status).toBe('waiting');
    expect(t.last.planned).toEqual([{ type: 'step.requestApproval', stepId: 'review' }]);
  });
});

describe('run machine rules', () => {
  it('a SKIPPED step satisfies its dependents', () => {
    const t = trace(line, [e.ok('fetch'), e.skip('send'), e.ok('report')]);
    expect(runStatus(t.snapshot)).toBe('succeeded');
    expect(runSteps(t.snapshot).map((s) => s.status)).toEqual([
      'SUCCEEDED',
      'SUCCEEDED',
      'SKIPPED',
    ]);
  });

  it('independent roots start together', () => {
    const plan = planOf([
      { id: 'x', kind: 'operator', operator: 'op' },
      { id: 'y', kind: 'operator', operator: 'op' },
    ]);
    const t = startRun(plan, { runId: 'r', at: T0 });
    expect(t.planned).toEqual([
      { type: 'step.execute', stepId: 'x', attempt: 1 },
      { type: 'step.execute', stepId: 'y', attempt: 1 },
    ]);
  });

  it('approving a step that is not waiting is not accepted and changes nothing', () => {
    const start = startRun(gated, { runId: 'r', at: T0 });
    const t = advanceRun(start.snapshot, e.approve('review'));
    expect(t.accepted).toBe(false);
    expect(t.snapshot).toEqual(start.snapshot);
  });

  it('an event for an unknown step is refused with the known steps named', () => {
    const start = startRun(gated, { runId: 'r', at: T0 });
    let caught: unknown;
    try {
      advanceRun(start.snapshot, e.ok('nope'));
    } catch (err) {
      caught = err;
    }
    expect(isFlujoError(caught, 'event_invalid')).toBe(true);
    expect((caught as Error).message).toContain(
      'event.stepId: unknown step "nope"; this run has: draft, review, send',
    );
  });

  it('a malformed event is refused with its path', () => {
    const start = startRun(gated, { runId: 'r', at: T0 });
    expect(() =>
      advanceRun(start.snapshot, { type: 'step.succeeded', stepId: 'draft', attempt: 0, at: 1 }),
    ).toThrow(/event\.attempt: .*\n.*event\.output/s);
    expect(() => advanceRun(start.snapshot, { type: 'step.exploded' })).toThrow(/event\.type/);
  });

  it('events after the run ended are ignored', () => {
    const t = trace(line, [e.ok('fetch'), e.ok('report'), e.ok('send')]);
    const after = advanceRun(t.snapshot, e.cancel());
    expect(after.accepted).toBe(false);
    expect(after.status).toBe('succeeded');
    expect(after.snapshot).toEqual(t.snapshot);
  });

  it('a plan whose every root is gated starts waiting', () => {
    const plan = planOf([{ id: 'g', kind: 'human_gate' }]);
    const t = startRun(plan, { runId: 'r', at: T0 });
    expect(t.status).toBe('waiting');
    expect(t.planned).toEqual([{ type: 'step.requestApproval', stepId: 'g' }]);
  });
});

describe('run machine: skipping a step that failed or was cancelled', () => {
  it('a failed step skipped: its cancelled dependents reopen, transitively, and the run goes on', () => {
    const t = trace(line, [
      e.fail('fetch', 1, false),
      e.skip('fetch'),
      e.ok('report'),
      e.ok('send'),
    ]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | fetch:PENDING→READY | execute fetch#1
      step.failed fetch#1 ⇒ failed | fetch:READY→FAILED_FINAL report:PENDING→CANCELLED send:PENDING→CANCELLED
      step.skipped fetch ⇒ running | fetch:FAILED_FINAL→SKIPPED report:CANCELLED→READY send:CANCELLED→PENDING | execute report#1
      step.succeeded report#1 ⇒ running | report:READY→SUCCEEDED send:PENDING→READY | execute send#1
      step.succeeded send#1 ⇒ succeeded | send:READY→SUCCEEDED
      end: fetch=SKIPPED report=SUCCEEDED send=SUCCEEDED
      "
    `);
    const fetch = runSteps(t.snapshot).find((s) => s.stepId === 'fetch');
    // The skip's reason; the attempts made are kept.
    expect(fetch).toMatchObject({ status: 'SKIPPED', reason: 'not needed', attempt: 1 });
  });

  it('a dependent cancelled because of another failure stays cancelled; the run stays failed', () => {
    const t = trace(diamond, [
      e.ok('a'),
      e.fail('b', 1, false),
      e.fail('c', 1, false),
      e.skip('b'),
    ]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | a:PENDING→READY | execute a#1
      step.succeeded a#1 ⇒ running | a:READY→SUCCEEDED b:PENDING→READY c:PENDING→READY | execute b#1, execute c#1
      step.failed b#1 ⇒ running | b:READY→FAILED_FINAL d:PENDING→CANCELLED
      step.failed c#1 ⇒ failed | c:READY→FAILED_FINAL
      step.skipped b ⇒ failed | b:FAILED_FINAL→SKIPPED
      end: a=SUCCEEDED b=SKIPPED c=FAILED_FINAL d=CANCELLED
      "
    `);
    expect(t.last.accepted).toBe(true);
    // Skipping c too lets d run.
    const next = advanceRun(t.snapshot, e.skip('c'));
    expect(next.status).toBe('running');
    expect(next.planned).toEqual([{ type: 'step.execute', stepId: 'd', attempt: 1 }]);
  });

  it('a step that failed in a running run is skipped: its dependent reopens, the other branch goes on', () => {
    const t = trace(diamond, [e.ok('a'), e.fail('b', 1, false), e.skip('b'), e.ok('c'), e.ok('d')]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | a:PENDING→READY | execute a#1
      step.succeeded a#1 ⇒ running | a:READY→SUCCEEDED b:PENDING→READY c:PENDING→READY | execute b#1, execute c#1
      step.failed b#1 ⇒ running | b:READY→FAILED_FINAL d:PENDING→CANCELLED
      step.skipped b ⇒ running | b:FAILED_FINAL→SKIPPED d:CANCELLED→PENDING
      step.succeeded c#1 ⇒ running | c:READY→SUCCEEDED d:PENDING→READY | execute d#1
      step.succeeded d#1 ⇒ succeeded | d:READY→SUCCEEDED
      end: a=SUCCEEDED b=SKIPPED c=SUCCEEDED d=SUCCEEDED
      "
    `);
  });

  it('a cancelled step skipped, its failed upstream kept: its own dependents reopen, the run still fails', () => {
    const t = trace(line, [e.fail('fetch', 1, false), e.skip('report'), e.ok('send')]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | fetch:PENDING→READY | execute fetch#1
      step.failed fetch#1 ⇒ failed | fetch:READY→FAILED_FINAL report:PENDING→CANCELLED send:PENDING→CANCELLED
      step.skipped report ⇒ running | report:CANCELLED→SKIPPED send:CANCELLED→READY | execute send#1
      step.succeeded send#1 ⇒ failed | send:READY→SUCCEEDED
      end: fetch=FAILED_FINAL report=SKIPPED send=SUCCEEDED
      "
    `);
  });

  it('a rejected gate skipped: its dependent runs; a reopened gate asks for approval again', () => {
    const t = trace(gated, [e.ok('draft'), e.reject('review'), e.skip('review'), e.ok('send')]);
    expect(t.last.status).toBe('succeeded');
    // The gate's upstream skipped instead: the gate is reopened and waits for a person again.
    const upstream = trace(gated, [e.fail('draft', 1, false), e.skip('draft')]);
    expect(upstream.last.status).toBe('waiting');
    expect(upstream.last.planned).toEqual([{ type: 'step.requestApproval', stepId: 'review' }]);
  });

  it('a step cancelled by a budget stop is not reopened by a skip; a stopped run stays failed', () => {
    const t = trace(diamond, [e.ok('a'), e.fail('b', 1, false), e.stop(), e.skip('b')]);
    expect(t.last.accepted).toBe(true);
    expect(t.last.status).toBe('failed');
    const byId = Object.fromEntries(runSteps(t.snapshot).map((s) => [s.stepId, s]));
    expect(byId['b']).toMatchObject({ status: 'SKIPPED' });
    // c was cancelled by the stop: it stays so, and d, which needs it, stays cancelled too.
    expect(byId['c']).toMatchObject({ status: 'CANCELLED', reason: 'budget_exceeded' });
    expect(byId['d']).toMatchObject({ status: 'CANCELLED', reason: 'upstream_failed' });
    // A resume reopens them; the skipped step stays skipped.
    const resumed = advanceRun(t.snapshot, e.resume());
    expect(resumed.changes.map((c) => `${c.stepId}:${c.from}→${c.to}`)).toEqual([
      'c:CANCELLED→READY',
      'd:CANCELLED→PENDING',
    ]);
  });

  it('a SUCCEEDED or SKIPPED step, a cancelled run, or a skip naming an attempt: refused, nothing changes', () => {
    const succeeded = trace(diamond, [e.ok('a')]);
    const t1 = advanceRun(succeeded.snapshot, e.skip('a'));
    expect(t1.accepted).toBe(false);
    expect(t1.snapshot).toEqual(succeeded.snapshot);
    const skipped = trace(diamond, [e.ok('a'), e.skip('b')]);
    expect(advanceRun(skipped.snapshot, e.skip('b')).accepted).toBe(false);
    const cancelled = trace(diamond, [e.ok('a'), e.fail('b', 1, false), e.ok('c'), e.cancel()]);
    expect(cancelled.last.status).toBe('cancelled');
    expect(advanceRun(cancelled.snapshot, e.skip('b')).accepted).toBe(false);
    expect(advanceRun(cancelled.snapshot, e.skip('d')).accepted).toBe(false);
    // A worker's late "nothing to do" for an attempt of a step that has ended is ignored.
    const failed = trace(diamond, [e.ok('a'), e.fail('b', 1, false), e.ok('c')]);
    const late = advanceRun(failed.snapshot, { ...e.skip('b'), attempt: 1 });
    expect(late.accepted).toBe(false);
  });

  it('advanceRun gives what a run held open gives', () => {
    const events = [e.ok('a'), e.fail('b', 1, false), e.ok('c'), e.skip('b'), e.ok('d')];
    const first = startRun(diamond, { runId: 'r', at: T0 });
    const open = openRun(first.snapshot);
    let snapshot = first.snapshot;
    for (const event of events) {
      const one = advanceRun(snapshot, event);
      const held = open.send(event);
      expect(JSON.parse(JSON.stringify(one.snapshot))).toEqual(
        JSON.parse(JSON.stringify(held.snapshot)),
      );
      expect([one.planned, one.changes, one.status]).toEqual([
        held.planned,
        held.changes,
        held.status,
      ]);
      snapshot = one.snapshot;
    }
    expect(runStatus(snapshot)).toBe('succeeded');
  });
});

describe('the kernel: one event at a time', () => {
  const longLine = planOf(
    ['s0', 's1', 's2', 's3', 's4'].map((id, i) => ({
      id,
      kind: 'operator' as const,
      operator: 'op',
      ...(i === 0 ? {} : { dependsOn: [`s${i - 1}`] }),
    })),
  );
  const sameAs = (t: RunTransition) => ({
    snapshot: JSON.parse(JSON.stringify(t.snapshot)) as unknown,
    planned: t.planned,
    changes: t.changes,
    accepted: t.accepted,
    status: t.status,
  });

  // advanceRun restores only the steps an event reaches; a run held open has all of them.
  it.each<[string, RunEvent[]]>([
    ['a line that succeeds', [e.ok('s0'), e.ok('s1'), e.ok('s2'), e.ok('s3'), e.ok('s4')]],
    // s0 fails finally: the cancel cascades past its direct dependent, to every step.
    ['a failure that cascades, then a resume', [e.fail('s0', 1, false), e.resume(), e.ok('s0', 2)]],
    ['a cancel, then a late result', [e.ok('s0'), e.cancel(), e.ok('s1')]],
    ['a stale attempt', [e.ok('s0', 2), e.fail('s0'), e.ok('s0', 1), e.due('s0', 2)]],
  ])('advanceRun gives what a run held open gives: %s', (_, events) => {
    const first = startRun(longLine, { runId: 'r', at: T0 });
    const open = openRun(first.snapshot);
    let snapshot = first.snapshot;
    for (const event of events) {
      const one = advanceRun(snapshot, event);
      const held = open.send(event);
      expect(sameAs(one)).toEqual(sameAs(held));
      snapshot = one.snapshot;
    }
    expect(runSteps(snapshot).length).toBe(5);
  });

  it('a failure cascading past the dependents cancels every later step, in order', () => {
    const start = startRun(longLine, { runId: 'r', at: T0 });
    const t = advanceRun(start.snapshot, e.fail('s0', 1, false));
    expect(t.accepted).toBe(true);
    expect(t.status).toBe('failed');
    expect(t.changes.map((c) => `${c.stepId}:${c.from}→${c.to}`)).toEqual([
      's0:READY→FAILED_FINAL',
      's1:PENDING→CANCELLED',
      's2:PENDING→CANCELLED',
      's3:PENDING→CANCELLED',
      's4:PENDING→CANCELLED',
    ]);
    expect(Object.keys(t.snapshot.children)).toEqual(['s0', 's1', 's2', 's3', 's4']);
  });

  it('steps an event does not move keep their objects in the next snapshot', () => {
    const start = startRun(longLine, { runId: 'r', at: T0 });
    const t = advanceRun(start.snapshot, e.ok('s0'));
    const { children: before } = start.snapshot;
    const { children: after } = t.snapshot;
    expect(after['s0']).not.toBe(before['s0']);
    expect(after['s1']).not.toBe(before['s1']);
    for (const id of ['s2', 's3', 's4']) expect(after[id]).toBe(before[id]);
    // The same through a run held open: only the steps that moved are new objects.
    const open = openRun(t.snapshot);
    const next = open.send(e.ok('s1'));
    expect(next.snapshot.children['s0']).toBe(t.snapshot.children['s0']);
    expect(next.snapshot.children['s1']).not.toBe(t.snapshot.children['s1']);
    expect(next.snapshot.children['s2']).not.toBe(t.snapshot.children['s2']);
    for (const id of ['s3', 's4']) {
      expect(next.snapshot.children[id]).toBe(t.snapshot.children[id]);
    }
    // An event that changes nothing hands back the very same snapshot.
    const ignored = open.send(e.ok('s1'));
    expect(ignored.accepted).toBe(false);
    expect(ignored.snapshot).toBe(next.snapshot);
  });
});
