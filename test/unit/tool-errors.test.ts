import { describe, expect, it } from 'vitest';
import type { FlujoError } from '../../src/errors.js';
import {
  ConfigurationError,
  ErrorCode,
  LedgerStateError,
  NonDeterminismError,
  ToolCallBusyError,
  ToolInputError,
  ToolOutcomeUnknownError,
  UnknownToolError,
  isFlujoError,
  reviveError,
  type SerializedError,
} from '../../src/errors.js';

const call = { runId: 'run-1', stepId: 'send', callId: 'c0ffee', tool: 'send_email@1' };
const shape = (tool: string, argsHash: string) => ({ tool, argsHash });

// Each tool error with the name, code and retryability it must keep across processes.
const cases: [FlujoError, string, string, boolean][] = [
  [new ToolOutcomeUnknownError(call), 'ToolOutcomeUnknownError', 'tool_outcome_unknown', false],
  [
    new ToolInputError('send_email@1', [{ path: 'args.to', message: 'Invalid email address' }]),
    'ToolInputError',
    'tool_input_invalid',
    false,
  ],
  [
    new NonDeterminismError(
      'run-1',
      'c1',
      shape('a@1', 'a'.repeat(64)),
      shape('b@1', 'b'.repeat(64)),
    ),
    'NonDeterminismError',
    'non_determinism',
    false,
  ],
  [new ToolCallBusyError('run-1', 'c1', 'a@1', 1234), 'ToolCallBusyError', 'tool_call_busy', true],
  [
    new ConfigurationError('bad', { field: 'name' }),
    'ConfigurationError',
    'configuration_invalid',
    false,
  ],
  [new UnknownToolError('nope', ['a', 'b']), 'UnknownToolError', 'tool_unknown', false],
  [
    new LedgerStateError('run-1', 'c1', 'SUCCEEDED', 'no'),
    'LedgerStateError',
    'ledger_state_invalid',
    false,
  ],
];

describe('tool errors', () => {
  it.each(cases)(
    '%s keeps name, code, retryability and details through JSON',
    (error, name, code, retryable) => {
      expect([error.name, error.code, error.retryable]).toEqual([name, code, retryable]);
      expect(Object.values(ErrorCode)).toContain(code);
      const revived = reviveError(JSON.parse(JSON.stringify(error)) as SerializedError);
      expect([revived.name, revived.code, revived.retryable, revived.message]).toEqual([
        name,
        code,
        retryable,
        error.message,
      ]);
      expect(revived.details).toEqual(error.details);
      expect(revived.retryAfterMs).toBe(error.retryAfterMs);
      expect(isFlujoError(revived, error.code)).toBe(true);
    },
  );

  it('an unknown outcome says exactly how to resolve it', () => {
    expect(new ToolOutcomeUnknownError(call).message).toBe(
      `Tool "send_email@1" call c0ffee of step "send" started but its outcome is unknown (its worker stopped before recording a receipt) and the tool is not idempotent, so it was not run again. Check the tool's side effect, then resolve it: flujo ledger resolve run-1 c0ffee --succeeded '<receipt json>'  or  flujo ledger resolve run-1 c0ffee --retry (then flujo resume run-1)`,
    );
    expect(new ToolOutcomeUnknownError({ ...call, tenantId: 't1' }).details).toEqual({
      ...call,
      tenantId: 't1',
    });
  });

  it('input errors list issues with their paths', () => {
    const e = new ToolInputError('send_email@1', [
      { path: 'args.to', message: 'Invalid email address' },
    ]);
    expect(e.message).toBe(
      'Invalid arguments for tool "send_email@1" (1 problem):\n  - args.to: Invalid email address',
    );
  });

  it('a busy call is retryable after the rest of the lease', () => {
    const e = new ToolCallBusyError('run-1', 'c1', 'a@1', 1234);
    expect(e.retryAfterMs).toBe(1234);
    expect(e.message).toContain('lease ends in 1234 ms');
  });

  it('non-determinism names both tools and short hashes', () => {
    const e = new NonDeterminismError(
      'run-1',
      'c1',
      shape('a@1', 'a'.repeat(64)),
      shape('b@1', 'b'.repeat(64)),
    );
    expect(e.message).toBe(
      'Non-determinism in run "run-1": ledger entry c1 was recorded for tool "a@1" (args hash aaaaaaaaaaaa), but this call is tool "b@1" (args hash bbbbbbbbbbbb). The run\'s code or inputs changed since the call was recorded; resume it with the code that started it, or start a new run.',
    );
  });

  it('an unknown tool lists the registered ones', () => {
    expect(new UnknownToolError('nope', ['a', 'b']).message).toBe(
      `Unknown tool "nope". Registered tools: a, b. Fix the name, or add defineTool({ name: "nope", ... }) to the job module's \`export const tools\` (or runtime.tool(...)).`,
    );
    expect(new UnknownToolError('nope', []).message).toContain('no tools are registered');
  });
});
