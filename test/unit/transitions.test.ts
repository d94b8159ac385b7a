import { describe, expect, it } from 'vitest';
import { isFlujoError } from '../../src/errors.js';
import { runEvents as e, traceTransitions, TRACE_T0 } from '../../src/testing/index.js';

const steps = [
  { id: 'a', kind: 'operator' as const, operator: 'op' },
  { id: 'b', kind: 'operator' as const, operator: 'op', dependsOn: ['a'] },
];

describe('traceTransitions (flujo/testing)', () => {
  it('takes plan data as written, and returns a line per transition plus the end', () => {
    const t = traceTransitions({ name: 'line', steps }, [e.ok('a'), e.ok('b')]);
    expect(t.lines).toEqual([
      'start ⇒ running | a:PENDING→READY | execute a#1',
      'step.succeeded a#1 ⇒ running | a:READY→SUCCEEDED b:PENDING→READY | execute b#1',
      'step.succeeded b#1 ⇒ succeeded | b:READY→SUCCEEDED',
      'end: a=SUCCEEDED b=SUCCEEDED',
    ]);
    expect(t.text).toBe(`\n${t.lines.join('\n')}\n`);
    expect(t.transitions).toHaveLength(3);
    expect(t.snapshot.status).toBe('done');
  });

  it('marks an event the kernel did not accept, and is the same text for the same input', () => {
    const events = [e.ok('b'), e.ok('a')];
    const t = traceTransitions({ name: 'line', steps }, events);
    expect(t.lines[1]).toBe('step.succeeded b#1 ⇒ running (ignored)');
    expect(traceTransitions({ name: 'line', steps }, events).text).toBe(t.text);
  });

  it('places the run at the given time and lets events carry their own', () => {
    const t = traceTransitions({ name: 'line', steps }, [e.ok('a', 1, { n: 1 }, TRACE_T0 + 42)], {
      at: TRACE_T0,
      runId: 'mine',
    });
    expect(t.snapshot.context.runId).toBe('mine');
    expect(t.lines[1]).toContain('execute b#1');
  });

  it('a bad plan or a bad event throws the error that names the field', () => {
    let planError: unknown;
    try {
      traceTransitions({ name: 'x', steps: [{ id: 'a', kind: 'operator' }] } as never, []);
    } catch (error) {
      planError = error;
    }
    expect(isFlujoError(planError)).toBe(true);
    expect(String((planError as Error).message)).toContain('operator');
    expect(() =>
      traceTransitions({ name: 'line', steps }, [{ type: 'step.succeeded', stepId: 'a' } as never]),
    ).toThrow(/attempt/);
  });
});
