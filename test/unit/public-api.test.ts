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
  // published from flujo/testing instead
  'startEmbeddedRedis',
  'ensureEmbeddedRedis',
] as const;

describe('the public API', () => {
  it('the root export holds what a user writes code with', () => {
    const exported = Object.keys(flujo);
    const missing = userFacing.filter((name) => !exported.includes(name));
    expect(missing).toEqual([]);
    expect(userFacing.map((name) => typeof flujo[name])).not.toContain('undefined');
  });

  it('internals are not exported from the root', () => {
    const exported = new Set(Object.keys(flujo));
    expect(internal.filter((name) => exported.has(name))).toEqual([]);
  });

  it('flujo/testing holds the scripted model server and the embedded Redis, nothing else', () => {
    expect(Object.keys(testing).sort()).toEqual([
      'ensureEmbeddedRedis',
      'startEmbeddedRedis',
      'startScriptedModelServer',
    ]);
  });
});
