import { describe, expect, it } from 'vitest';
import { advanceRun, startRun, type RunSnapshot } from '../../src/machines/kernel.js';
import type { RunEvent } from '../../src/schemas/events.js';
import {
  carrierNote,
  deadlineJobId,
  dueJobs,
  isUnitJobOf,
  parseCarrierNote,
  retryJobId,
  soleUnit,
  stepJobId,
  turnJobId,
  unitJobOf,
  unitJobsGlob,
} from '../../src/actors/jobs.js';
import { e, planOf, T0 } from '../helpers/run-trace.js';

const line = planOf([
  { id: 'a', kind: 'operator', operator: 'op' },
  { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'] },
]);

const diamond = planOf([
  { id: 'a', kind: 'operator', operator: 'op' },
  { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'] },
  { id: 'c', kind: 'operator', operator: 'op', dependsOn: ['a'] },
  { id: 'd', kind: 'operator', operator: 'op', dependsOn: ['b', 'c'] },
]);

const agentLine = planOf([
  { id: 'prep', kind: 'operator', operator: 'op' },
  { id: 'chat', kind: 'agent', agent: 'helper', mode: 'granular', dependsOn: ['prep'] },
]);

function after(plan: ReturnType<typeof planOf>, events: RunEvent[]): RunSnapshot {
  let snapshot = startRun(plan, { runId: 'r 1', at: T0 }).snapshot;
  for (const event of events) snapshot = advanceRun(snapshot, event).snapshot;
  return snapshot;
}

const turnCommitted = (stepId: string, turn: number): RunEvent => ({
  type: 'turn.committed',
  stepId,
  attempt: 1,
  turn,
  cursor: 2 * (turn + 1),
  fingerprint: 'f'.repeat(64),
  at: T0 + 10 + turn,
});

describe('soleUnit: the one unit of work a run has in flight', () => {
  it('is the RUNNING step of a line, with the job id its own job would have', () => {
    const unit = soleUnit('r 1', after(line, [e.ok('a')]));
    expect(unit).toEqual({
      name: 'step',
      data: { runId: 'r 1', stepId: 'b', attempt: 1 },
      opts: { jobId: stepJobId('r 1', 'b', 1) },
    });
    expect(dueJobs('r 1', after(line, [e.ok('a')]), T0)).toEqual([unit]);
  });

  it('is null while two steps run side by side, and the join once they are done', () => {
    expect(soleUnit('r 1', after(diamond, [e.ok('a')]))).toBeNull();
    expect(soleUnit('r 1', after(diamond, [e.ok('a'), e.ok('b')]))?.data.stepId).toBe('c');
    expect(soleUnit('r 1', after(diamond, [e.ok('a'), e.ok('b'), e.ok('c')]))?.opts.jobId).toBe(
      stepJobId('r 1', 'd', 1),
    );
  });

  it('is the next turn of a granular agent step', () => {
    const snapshot = after(agentLine, [
      e.ok('prep'),
      turnCommitted('chat', 0),
      turnCommitted('chat', 1),
    ]);
    expect(soleUnit('r 1', snapshot)).toEqual({
      name: 'turn',
      data: { runId: 'r 1', stepId: 'chat', attempt: 1, turn: 2 },
      opts: { jobId: turnJobId('r 1', 'chat', 1, 2) },
    });
  });

  it('is null when the run has ended or waits for a retry', () => {
    expect(soleUnit('r 1', after(line, [e.ok('a'), e.ok('b')]))).toBeNull();
    const waiting = after(line, [e.fail('a')]);
    expect(soleUnit('r 1', waiting)).toBeNull();
    // The retry is due work, but it has a delayed job of its own.
    expect(dueJobs('r 1', waiting, T0).map((j) => j.name)).toEqual(['retry']);
  });
});

describe('unitJobOf', () => {
  it('gives a unit its own job back from its data: a step, or a turn when it names one', () => {
    const step = { runId: 'r 1', stepId: 'b', attempt: 2 };
    expect(unitJobOf(step)).toEqual({
      name: 'step',
      data: step,
      opts: { jobId: stepJobId('r 1', 'b', 2) },
    });
    const turn = { ...step, turn: 3 };
    expect(unitJobOf(turn).opts.jobId).toBe(turnJobId('r 1', 'b', 2, 3));
    expect(unitJobOf(turn).name).toBe('turn');
  });
});

describe('carrier notes', () => {
  it('round trip the carrier job and the unit it carries', () => {
    const note = { job: stepJobId('r 1', 'a', 1), unit: stepJobId('r 1', 'b', 1) };
    expect(parseCarrierNote(carrierNote(note))).toEqual(note);
  });

  it('read nothing from an absent or malformed note', () => {
    for (const bad of [undefined, '', 'one', ' lead', 'trail ']) {
      expect(parseCarrierNote(bad)).toBeNull();
    }
  });
});

describe('the unit jobs of one run', () => {
  /** Redis's glob, enough of it: `?`, `*`, and a backslash that escapes the next character. */
  const globMatches = (glob: string, text: string): boolean => {
    let source = '';
    for (let i = 0; i < glob.length; i++) {
      const c = glob[i]!;
      if (c === '\\') source += `\\${glob[++i]!}`;
      else if (c === '*') source += '.*';
      else if (c === '?') source += '.';
      else source += c.replace(/[.+^${}()|[\]]/g, (m) => `\\${m}`);
    }
    return new RegExp(`^${source}$`, 's').test(text);
  };

  it("are told apart from other runs' jobs, whatever the run id holds", () => {
    for (const run of ['r1', 'a*b', 'x?[y]\\z', 'a|b', 'caf\u00e9 1']) {
      const mine = [
        stepJobId(run, 's', 1),
        stepJobId(run, 's', 2, 1),
        turnJobId(run, 's', 1, 3),
        retryJobId(run, 's', 2),
      ];
      const others = [
        stepJobId(`${run}x`, 's', 1),
        stepJobId('r', 's', 1),
        turnJobId(`x${run}`, 's', 1, 0),
        deadlineJobId(run),
      ];
      for (const id of mine) {
        expect(isUnitJobOf(id, run)).toBe(true);
        expect(globMatches(unitJobsGlob(run), id)).toBe(true);
      }
      for (const id of others) expect(isUnitJobOf(id, run)).toBe(false);
    }
  });
});
