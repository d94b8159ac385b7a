import { describe, expect, it } from 'vitest';
import { createLiveState } from '../../src/cli/live-state.js';

describe('the live view state', () => {
  it('follows step changes and turns, and remembers the last event read', () => {
    const state = createLiveState('1-0');
    expect(state.getSnapshot().context).toEqual({
      after: '1-0',
      steps: {},
      streaming: null,
      toldIdle: [],
    });
    state.trigger.event({
      id: '2-0',
      eventType: 'step.changed',
      data: { stepId: 'a', from: 'READY', to: 'RUNNING', attempt: 1 },
    });
    state.trigger.event({
      id: '2-1',
      eventType: 'turn.committed',
      data: { stepId: 'a', attempt: 1, turn: 0, cursor: 3 },
    });
    state.trigger.event({
      id: '3-0',
      eventType: 'run.status',
      data: { from: null, to: 'running' },
    });
    const ctx = state.getSnapshot().context;
    expect(ctx.after).toBe('3-0');
    expect(ctx.steps).toEqual({ a: { status: 'RUNNING', attempt: 1, turns: 1 } });
  });

  it('knows which reply is open on the current line, and which idle steps were told', () => {
    const state = createLiveState(undefined);
    state.trigger.streamed({ who: 'a:0' });
    expect(state.getSnapshot().context.streaming).toBe('a:0');
    state.trigger.lineWritten();
    expect(state.getSnapshot().context.streaming).toBeNull();
    state.trigger.idleTold({ stepId: 'b' });
    expect(state.getSnapshot().context.toldIdle).toEqual(['b']);
  });
});
