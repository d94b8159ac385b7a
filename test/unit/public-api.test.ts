import { describe, expect, it } from 'vitest';
import * as flujo from '../../src/index.js';
import * as testing from '../../src/testing/index.js';

// What a user writes code with, by group. Tests that need more import it from its src/ path.
const userFacing = [
  // the runtime and job modules
  'createRuntime',
  'defineJob',
  'ReplayMode',
  'startUi',
  'createDefaultLogger',
  'silentLogger',
  // spans: the run's span over the whole run with an SDK of the application's own
  'runSpanIdGenerator',
  'spansRecorded',
  // tools and agents
  'defineTool',
  'defineAgent',
  'classifyFailure',
  'classifyTool',
  'LedgerState',
  // plans
  'parsePlan',
  'plan',
  'Step',
  'Pipeline',
  // the machines and their kernel
  'runMachine',
  'stepMachine',
  'startRun',
  'advanceRun',
  'runStatus',
  'runSteps',
  'validateRunEvent',
  'deriveRunStatus',
  'runEventSchema',
  'RunStatus',
  'StepStatus',
  'StepReason',
  'createSnapshotStore',
  'createSnapshotCodec',
  // outcomes and errors
  'parseOutcome',
  'FlujoError',
  'ErrorCode',
  'isFlujoError',
  'isRetryable',
  'reviveError',
  'findCause',
  'RunNotFoundError',
  'SnapshotConflictError',
] as const;

// The machinery behind the runtime: stores, key builders, token counters, the raw zod schemas.
const internal = [
  'createKeys',
  'createBlobStore',
  'createHistoryStore',
  'createModelJournal',
  'createQuotaStore',
  'createToolRegistry',
  'createTokenCounter',
  'estimateRequest',
  'encodingForModel',
  'costMicroUsd',
  'resolvePrice',
  'parsePricing',
  'truncateMiddleOut',
  'blobRef',
  'parseBlobRefs',
  'toFlujoError',
  'describeThrown',
  'assertPlainJson',
  'failureFrom',
  'stepOutcomeSchema',
  'serializedErrorSchema',
  'planSchema',
  'stepNeedsApproval',
  'topologicalOrder',
  'AGENT_LOOP_DEFAULTS',
  'runtimeCore',
  'RuntimeCore',
  'RuntimeStores',
  'RuntimeQueues',
  'RuntimeRegistry',
  'RuntimeMeta',
  // published from flujo/testing instead
  'startEmbeddedRedis',
  'ensureEmbeddedRedis',
] as const;

// Every value the root exports: a new export is a decision, made here on purpose.
const everyValue = [
  // error classes, one per code
  'ApprovalNotAllowedError',
  'BlobCapExceededError',
  'BlobMissingError',
  'BudgetExceededError',
  'ChildFailedError',
  'ConfigurationError',
  'EventValidationError',
  'FallbackFailedError',
  'FlujoError',
  'HistoryConflictError',
  'InputValidationError',
  'InvariantError',
  'LedgerStateError',
  'MaxTurnsExceededError',
  'MissingContextError',
  'ModelError',
  'NonDeterminismError',
  'PlanValidationError',
  'PolicyDeniedError',
  'PricingNotConfiguredError',
  'RedisUnavailableError',
  'ReplicasBehindError',
  'ReservationNotFoundError',
  'ResumeError',
  'RevivedError',
  'RunAlreadyExistsError',
  'RunEndedError',
  'RunNotFoundError',
  'RunNotResumableError',
  'RunRemovedError',
  'ServiceError',
  'SignalIdConflictError',
  'SnapshotConflictError',
  'SnapshotCorruptError',
  'SnapshotUnsupportedError',
  'StepNonDeterminismError',
  'StepNotSkippableError',
  'StepNotWaitingError',
  'StepTimeoutError',
  'ToolCallBusyError',
  'ToolCallRejectedError',
  'ToolInputError',
  'ToolOutcomeUnknownError',
  'UnknownError',
  'UnknownToolError',
  'UsageLimitExceededError',
  'WaitTimeoutError',
  'ItemFailedError',
  'MapOverError',
  'isFlujoError',
  'reviveError',
  // the rest
  'DEFAULT_QUEUE_NAME',
  'ErrorCode',
  'FINAL_STEP_STATUSES',
  'LedgerState',
  'MAX_JSON_DEPTH',
  'Pipeline',
  'ReplayMode',
  'ReservationState',
  'RunStatus',
  'START_JOB_NAME',
  'Step',
  'StepReason',
  'StepStatus',
  'advanceRun',
  'classifyFailure',
  'classifyTool',
  'createDefaultLogger',
  'createRuntime',
  'createSnapshotCodec',
  'createSnapshotStore',
  'defineAgent',
  'defineJob',
  'defineTool',
  'deriveRunStatus',
  'findCause',
  'isFinalStepStatus',
  'isRetryable',
  'jobQueueName',
  'parseOutcome',
  'parsePlan',
  'plan',
  'renderTraceHtml',
  'runEventSchema',
  'runMachine',
  'runQueue',
  'runSpanIdGenerator',
  'runStatus',
  'runSteps',
  'silentLogger',
  'spansRecorded',
  'startJobDataSchema',
  'startRun',
  'startUi',
  'stepMachine',
  'validateRunEvent',
] as const;

describe('the public API', () => {
  it('the root export holds what a user writes code with', () => {
    const exported = Object.keys(flujo);
    const missing = userFacing.filter((name) => !exported.includes(name));
    expect(missing).toEqual([]);
    expect(userFacing.map((name) => typeof flujo[name])).not.toContain('undefined');
  });

  it('the root exports exactly the values listed here', () => {
    expect(Object.keys(flujo).sort()).toEqual([...everyValue].sort());
    for (const name of userFacing) expect(everyValue).toContain(name);
  });

  it('internals are not exported from the root', () => {
    const exported = new Set(Object.keys(flujo));
    expect(internal.filter((name) => exported.has(name))).toEqual([]);
  });

  it('flujo/testing holds the scripted model server, the embedded Redis and transition traces, nothing else', () => {
    expect(Object.keys(testing).sort()).toEqual([
      'TRACE_T0',
      'ensureEmbeddedRedis',
      'runEvents',
      'startEmbeddedRedis',
      'startScriptedModelServer',
      'traceTransitions',
      'transitionLine',
    ]);
  });
});
