/**
 * Flujo: a durable execution runtime for AI agents and multi-step jobs. Runs and steps are XState
 * machines whose snapshots live in Redis, written with compare-and-set.
 *
 * The public surface, explicitly: nothing else is part of the API. Test helpers (the scripted
 * OpenAI-compatible model server) are published separately as `flujo/testing`.
 *
 * @packageDocumentation
 */

// Errors: every error has `name`, `code` and `retryable`, and survives JSON.
export {
  BlobCapExceededError,
  BlobMissingError,
  BudgetExceededError,
  ConfigurationError,
  ErrorCode,
  EventValidationError,
  HistoryConflictError,
  FlujoError,
  InputValidationError,
  InvariantError,
  LedgerStateError,
  MaxTurnsExceededError,
  ModelError,
  NonDeterminismError,
  PlanValidationError,
  PricingNotConfiguredError,
  RedisUnavailableError,
  ReservationNotFoundError,
  ResumeError,
  RevivedError,
  RunAlreadyExistsError,
  RunNotFoundError,
  RunNotResumableError,
  SnapshotConflictError,
  SnapshotCorruptError,
  SnapshotUnsupportedError,
  StepNotWaitingError,
  ToolCallBusyError,
  ToolInputError,
  ToolOutcomeUnknownError,
  UnknownError,
  UnknownToolError,
  UsageLimitExceededError,
  findCause,
  isFlujoError,
  isRetryable,
  reviveError,
  toFlujoError,
} from './errors.js';
export type { FlujoErrorOptions, SerializedError, ValidationIssue } from './errors.js';

// Plain JSON: what inputs, outputs and snapshots are made of.
export { assertPlainJson, findNonJson, isPlainJson } from './internal/json.js';
export type { JsonObject, JsonValue } from './internal/json.js';

// Plans as data.
export { parsePlan } from './plan/parse-plan.js';
export {
  STEP_ID_PATTERN,
  planSchema,
  retryPolicySchema,
  stepNeedsApproval,
  stepSchema,
} from './plan/schema.js';
export { dependentsOf, topologicalOrder } from './plan/graph.js';
export type {
  AgentStep,
  CachePolicy,
  EffectClass,
  HumanGateStep,
  OperatorStep,
  Plan,
  PlanInput,
  PlanStep,
  PolicyCheckStep,
  RetryPolicy,
  RiskLevel,
  RunBudgets,
  StepBudgets,
  StepKind,
} from './plan/schema.js';

// The pure core: run and step machines, and the kernel that feeds them one event at a time.
export { stepMachine } from './machines/step-machine.js';
export type { StepInput, StepEvent } from './machines/step-machine.js';
export { runMachine } from './machines/run-machine.js';
export type { CancelRequest, RunContext, RunInput } from './machines/run-machine.js';
export { deriveRunStatus } from './machines/run-status.js';
export { advanceRun, runStatus, runSteps, startRun, validateRunEvent } from './machines/kernel.js';
export type {
  RunSnapshot,
  RunTransition,
  StartRunOptions,
  StepChange,
  StepState,
} from './machines/kernel.js';
export {
  FINAL_STEP_STATUSES,
  RunStatus,
  StepReason,
  StepStatus,
  isFinalStepStatus,
} from './machines/types.js';
export type {
  AgentProgress,
  Decision,
  PlannedAction,
  StepContext,
  StepReport,
  StepView,
} from './machines/types.js';

// Events a run accepts, and typed step outcomes.
export { runEventSchema } from './schemas/events.js';
export type {
  GateApprovedEvent,
  GateRejectedEvent,
  RetryDueEvent,
  TurnCommittedEvent,
  RunCancelledEvent,
  RunEvent,
  StepFailedEvent,
  StepSkippedEvent,
  StepSucceededEvent,
} from './schemas/events.js';
export { serializedErrorSchema } from './schemas/error.js';
export {
  abortedSchema,
  chunkSchema,
  failureFrom,
  failureSchema,
  parseOutcome,
  pausedSchema,
  stepOutcomeSchema,
  successSchema,
} from './schemas/outcomes.js';
export type { Aborted, Chunk, Failure, Paused, StepOutcome, Success } from './schemas/outcomes.js';

// Persistence: keys, the versioned envelope, the CAS snapshot store, an embedded redis-server.
export { createKeys } from './persistence/keys.js';
export type { Keys } from './persistence/keys.js';
export { createSnapshotCodec } from './persistence/codec.js';
export type { SnapshotCodec, SnapshotEnvelope, SnapshotMigration } from './persistence/codec.js';
export { createSnapshotStore } from './persistence/snapshot-store.js';
export type {
  CommitOptions,
  ListAppend,
  ReadEventsOptions,
  RunEventRecord,
  SnapshotStore,
  SnapshotStoreOptions,
  StoredRunEvent,
} from './persistence/snapshot-store.js';
export { startEmbeddedRedis } from './persistence/embedded-redis.js';
export type { EmbeddedRedis, EmbeddedRedisOptions } from './persistence/embedded-redis.js';

// The runtime: start, steer and observe runs; workers execute them through BullMQ.
export { createRuntime } from './runtime.js';
export type {
  DecisionInput,
  RunHandle,
  RunReport,
  RunUsage,
  Runtime,
  RuntimeOptions,
  StartOptions,
} from './runtime.js';
export type { CoreOptions } from './worker/core.js';
export type { FlujoWorker, WorkerOptions } from './worker/worker.js';
export type { Operator, OperatorContext, StepTools, StreamedText } from './actors/execute-step.js';
export type { AgentResult } from './actors/run-agent.js';
export { createDefaultLogger, silentLogger } from './logging.js';
export type { Logger } from './logging.js';
export type { RunSummary } from './actors/run-host.js';

// Tools: definitions checked once; every call from a step goes through the ledger.
export { defineTool } from './tools/define-tool.js';
export type { ToolContext, ToolDefinition, ToolSpec } from './tools/define-tool.js';

// Tools: definitions, classification, the ledger.
export { classifyTool } from './tools/classify.js';
export type { ToolClass } from './tools/classify.js';
export { createToolRegistry } from './tools/registry.js';
export type { ToolRegistry } from './tools/registry.js';
export { LedgerState } from './persistence/ledger.js';
export type { LedgerEntry } from './persistence/ledger.js';

// Agents: definitions and the resume fingerprint.
export { defineAgent } from './agents/define-agent.js';
export type { AgentDefinition, AgentSettings, AgentSpec } from './agents/define-agent.js';
export type { ChatMessage, ModelReply, ToolCall } from './llm/messages.js';
export { AGENT_LOOP_DEFAULTS, Pipeline, Step, plan } from './plan/builders.js';

// Usage: token estimates, prices, reservations and quotas; blobs of large tool results.
export { createTokenCounter, encodingForModel, estimateRequest } from './llm/tokens.js';
export type { RequestEstimate, TokenCounter, TokenEncoding } from './llm/tokens.js';
export {
  costMicroUsd,
  loadPricingFile,
  mergePricing,
  parsePricing,
  priceFor,
  resolvePrice,
} from './llm/pricing.js';
export type { ModelPrice, PricingTable } from './llm/pricing.js';
export { createQuotaStore, ReservationState } from './persistence/quota-store.js';
export type {
  QuotaStore,
  ReconcileOutcome,
  Reservation,
  TenantQuota,
  UsageTotals,
} from './persistence/quota-store.js';
export { blobRef, createBlobStore, parseBlobRefs } from './persistence/blob-store.js';
export type { BlobStore, StoredBlob } from './persistence/blob-store.js';
export { truncateMiddleOut, truncationPlaceholder } from './agents/truncate.js';

// Agent turn storage: the model-reply journal and the append-only history.
export { createModelJournal } from './persistence/model-journal.js';
export { createHistoryStore } from './persistence/history.js';
