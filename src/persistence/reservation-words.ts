/**
 * How a run's usage reservations read to a person (`flujo usage`, the web view). Its own module,
 * with types only from the quota store, so that a command that prints usage does not load the
 * store's schemas.
 */
import type { Reservation } from './quota-store.js';

/**
 * How a run's reservations read as model calls: a call is a reservation whose request went out
 * (charged the provider's usage, or the baseline when no reply came); one released with nothing
 * sent is no call; an open one is a call in flight or a worker that died mid-call.
 */
export function countModelCalls(reservations: readonly Reservation[]): {
  calls: number;
  released: number;
  open: number;
} {
  let calls = 0;
  let released = 0;
  let open = 0;
  for (const r of reservations) {
    if (r.outcome === null) open++;
    else if (r.outcome === 'none') released++;
    else calls++;
  }
  return { calls, released, open };
}

/** A reservation's reconciliation in words, as `flujo usage` and the web view print it. */
export function reconciliationText(r: Pick<Reservation, 'outcome' | 'state'>): string {
  switch (r.outcome) {
    case null:
      return `open (${r.state})`;
    case 'usage':
      return "usage (the provider's)";
    case 'baseline':
      return 'baseline (sent, no reply)';
    case 'none':
      return 'released (nothing sent: no call)';
  }
}
