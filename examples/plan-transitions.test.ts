import { describe, expect, it } from 'vitest';
import { parsePlan } from '../src/index.js';
import { runEvents as e, traceTransitions } from '../src/testing/index.js';

const plan = parsePlan({
  name: 'refund',
  defaults: { retry: { maxAttempts: 2, initialDelayMs: 1000, jitter: 0 } },
  steps: [
    { id: 'lookup', kind: 'operator', operator: 'lookup' },
    { id: 'approve', kind: 'human_gate', dependsOn: ['lookup'] },
    { id: 'refund', kind: 'operator', operator: 'refund', dependsOn: ['approve'] },
  ],
});

describe('the refund plan', () => {
  it('waits for a person, then retries a refund that timed out once', () => {
    const t = traceTransitions(plan, [
      e.ok('lookup'),
      e.approve('approve'),
      e.ok('approve'),
      e.fail('refund', 1),
      e.due('refund', 2),
      e.ok('refund', 2),
    ]);
    expect(t.text).toMatchInlineSnapshot(`
      "
      start ⇒ running | lookup:PENDING→READY | execute lookup#1
      step.succeeded lookup#1 ⇒ waiting | lookup:READY→SUCCEEDED approve:PENDING→WAITING_APPROVAL | ask approval approve
      gate.approved approve ⇒ running | approve:WAITING_APPROVAL→READY | execute approve#1
      step.succeeded approve#1 ⇒ running | approve:READY→SUCCEEDED refund:PENDING→READY | execute refund#1
      step.failed refund#1 ⇒ running | refund:READY→FAILED_RETRYABLE | retry refund#2 in 1000ms
      retry.due refund#2 ⇒ running | refund:FAILED_RETRYABLE→READY | execute refund#2
      step.succeeded refund#2 ⇒ succeeded | refund:READY→SUCCEEDED
      end: lookup=SUCCEEDED approve=SUCCEEDED refund=SUCCEEDED
      "
    `);
  });
});
