/**
 * The state of the CLI's live view of a run (`flujo run`, `flujo resume`): where the event stream
 * was read to, each step's state as the stream told it, which agent reply is being written on the
 * current line, and which idle steps were reported. In this process only (an `@xstate/store`
 * store): the run's own state is in Redis, this is what the view has drawn of it.
 */
import { createStore } from '@xstate/store';

/** A step as the view last drew it. */
export interface LiveStep {
  status: string;
  attempt: number;
  /** Turns committed so far (granular agent steps). */
  turns: number;
}

/** What the live view has drawn. */
export interface LiveState {
  /** The id of the last event read: the stream is read on from it after an outage. */
  after: string | undefined;
  /** Steps by id, as their last change said. */
  steps: Record<string, LiveStep>;
  /** `stepId:turn` of the reply being written on the current line, or null. */
  streaming: string | null;
  /** Steps whose due work waiting for a worker was reported (once each). */
  toldIdle: string[];
}

/** Creates the store of a live view that reads the stream after `after`. */
export function createLiveState(after: string | undefined) {
  const context: LiveState = { after, steps: {}, streaming: null, toldIdle: [] };
  return createStore({
    context,
    on: {
      /** An event of the run was read (and drawn). */
      event: (ctx, e: { id: string; eventType: string; data: Record<string, unknown> }) => {
        const stepId = typeof e.data['stepId'] === 'string' ? e.data['stepId'] : undefined;
        if (
          stepId === undefined ||
          (e.eventType !== 'step.changed' && e.eventType !== 'turn.committed')
        ) {
          return { ...ctx, after: e.id };
        }
        const was = ctx.steps[stepId] ?? { status: 'PENDING', attempt: 0, turns: 0 };
        const step: LiveStep =
          e.eventType === 'step.changed'
            ? { ...was, status: String(e.data['to']), attempt: Number(e.data['attempt'] ?? 0) }
            : { ...was, turns: Number(e.data['turn']) + 1 };
        // Changed in place: only this reducer reads the steps, and a copy per event of a run of
        // 1,000 steps (three events each) would cost the view a million entries copied.
        ctx.steps[stepId] = step;
        return { ...ctx, after: e.id };
      },
      /** A piece of a streamed reply was written on the current line. */
      streamed: (ctx, e: { who: string }) => ({ ...ctx, streaming: e.who }),
      /** A whole line was written: no reply is open on the current line. */
      lineWritten: (ctx) => (ctx.streaming === null ? ctx : { ...ctx, streaming: null }),
      /** Due work of a step waiting for a worker was reported. */
      idleTold: (ctx, e: { stepId: string }) => ({ ...ctx, toldIdle: [...ctx.toldIdle, e.stepId] }),
    },
  });
}

/** A live view's store. */
export type LiveStore = ReturnType<typeof createLiveState>;
