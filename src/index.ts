/**
 * Flujo: a durable execution runtime for AI agents and multi-step jobs. Runs and steps are XState
 * machines whose snapshots live in Redis, written with compare-and-set.
 *
 * The public surface, explicitly: what a user writes code with (the runtime, tool and agent
 * definitions, plans, the machines and their kernel, outcomes and errors, job modules). Nothing
 * else is part of the API: the stores, key builders, token counters and the like behind the runtime
 * are internal. Test helpers (the scripted OpenAI-compatible model server, an embedded
 * redis-server) are published separately as `flujo/testing`.
 *
 * @packageDocumentation
 */

// Errors: every error has `name`, `code` and `retryable`, and survives JSON.
export {
  ApprovalNotAllowedError,
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
  MissingContextError,
  ModelError,
  NonDeterminismError,
  StepNonDeterminismError,
  FallbackFailedError,
  PlanValidationError,
  PolicyDeniedError,
  PricingNotConfiguredError,
  RedisUnavailableError,
  ReplicasBehindError,
  ReservationNotFoundError,
  ResumeError,
  RevivedError,
  RunAlreadyExistsError,
  RunNotFoundError,
  RunRemovedError,
  RunNotResumableError,
  RunEndedError,
  SignalIdConflictError,
  WaitTimeoutError,
  ItemFailedError,
  MapOverError,
  ChildFailedError,
  ServiceError,
  SnapshotConflictError,
  SnapshotCorruptError,
  SnapshotUnsupportedError,
  StepNotSkippableError,
  StepNotWaitingError,
  StepTimeoutError,
  ToolCallBusyError,
  ToolCallRejectedError,
  ToolInputError,
  ToolOutcomeUnknownError,
  UnknownError,
  UnknownToolError,
  UsageLimitExceededError,
  findCause,
  isFlujoError,
  isRetryable,
  reviveError,
} from './errors.js';
export type {
  FingerprintField,
  FlujoErrorOptions,
  ModelErrorKind,
  SerializedError,
  ThrownError,
  UsageLimitInfo,
  ValidationIssue,
} from './errors.js';

// Plain JSON: what inputs, outputs and snapshots are made of.
export { MAX_JSON_DEPTH } from './internal/json.js';
export type { JsonObject, JsonValue } from './internal/json.js';

// Plans as data, checked by `parsePlan` or built with `plan`, `Step` and `Pipeline`.
export { parsePlan } from './plan/parse-plan.js';
export { Pipeline, Step, plan } from './plan/builders.js';
export type {
  AgentLoopOptions,
  AgentRef,
  AgentStepOptions,
  GranularStepOptions,
  PlanOptions,
  StepOptions,
} from './plan/builders.js';
export type {
  AgentStep,
  CachePolicy,
  StepFallback,
  EffectClass,
  HumanGateStep,
  OperatorStep,
  Plan,
  PlanInput,
  PlanStep,
  PolicyCheckStep,
  RunStep,
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
  CacheSource,
  Decision,
  FallbackPhase,
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
export { parseOutcome } from './schemas/outcomes.js';
export type { Aborted, Chunk, Failure, Paused, StepOutcome, Success } from './schemas/outcomes.js';

// Persistence for a service that embeds the kernel: the versioned envelope, the CAS snapshot store.
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
// Traces: a run as JSON (`runtime.trace`), and as an HTML timeline.
export { renderTraceHtml } from './observability/trace-html.js';
export {
  runSpanIdGenerator,
  spansRecorded,
  type SpanIdGenerator,
} from './observability/tracing.js';
export type {
  AttemptOutcome,
  RunTrace,
  TraceAttempt,
  TraceModelCall,
  TraceStep,
  TraceTakeover,
  TraceToolCall,
  TraceToolExecution,
  TraceTurn,
  TraceWait,
} from './observability/run-trace.js';

// The runtime: start, steer and observe runs; workers execute them through BullMQ.
export { createRuntime } from './runtime.js';
export type {
  ConcurrencyWait,
  DecisionInput,
  PendingApproval,
  PendingWait,
  RunChild,
  RunHandle,
  RunParent,
  RunReport,
  RunUsage,
  Runtime,
  RuntimeOptions,
  RegisterOptions,
  SignalOptions,
  SignalReceipt,
  SignalSchema,
  StartSignal,
  BeginOptions,
  SingletonOptions,
  DebounceOptions,
  DebounceInfo,
  SkipInput,
  StartOptions,
  StepProgress,
  FireOutcome,
  OverlapPolicy,
  ScheduleFire,
  ScheduleInfo,
  ScheduleOptions,
  RunRouting,
  WorkerInfo,
} from './runtime.js';
export { jobQueueName } from './persistence/keys.js';
export type { CoreOptions, StepFailureInfo } from './actors/core.js';
export type { RetentionOptions } from './persistence/retention.js';
export type { DurabilityOptions } from './persistence/replicas.js';
// What `createRuntime({ inspect })` takes: an XState inspection observer.
export type { InspectObserver } from './observability/inspect.js';
export type { FlujoWorker, WorkerOptions } from './worker/worker.js';
// The web view (`flujo ui`): the run list, live run pages, approve/reject forms.
export { startUi } from './ui/server.js';
export type { UiOptions, UiServer } from './ui/server.js';
// Replay: reproduce a run as stored, replay or regenerate it, fork it from a step.
export { ReplayMode } from './worker/replay.js';
export type {
  ReplayedRun,
  ReplayOptions,
  ReproducedRun,
  RunIntegrity,
  RunLineage,
} from './worker/replay.js';
export type { SnapshotDifference } from './machines/refold.js';
export type { ReplayLink } from './persistence/lineage-store.js';
export type { JournaledReply } from './persistence/model-journal.js';
export type { RunListEntry, RunListFilter } from './worker/run-list.js';
export type { Operator, OperatorContext, StepTools } from './execution/execute-step.js';
export type { StreamedText } from './execution/ports.js';
export type {
  Policy,
  PolicyContext,
  PolicyDecision,
  PolicyExport,
  PolicyOptions,
} from './execution/policies.js';
export type { AgentResult } from './execution/model-call.js';
export { createDefaultLogger, silentLogger } from './logging.js';
export type { Logger } from './logging.js';
export type { RunSummary } from './actors/run-host.js';

// Tools: definitions checked once, their classification; every call from a step goes through the
// ledger, whose entries `runtime.ledger` returns.
export { defineTool } from './tools/define-tool.js';
export { classifyFailure } from './tools/classify-failure.js';
export type { ToolContext, ToolDefinition, ToolSpec } from './tools/define-tool.js';
export { classifyTool } from './tools/classify.js';
export type { ToolClass } from './tools/classify.js';
export { LedgerState } from './persistence/ledger.js';
export type { LedgerEntry } from './persistence/ledger.js';

// Agents: definitions, and the messages of their conversations.
export { defineAgent } from './agents/define-agent.js';
export type {
  AgentDefinition,
  AgentProvider,
  AgentProviderSpec,
  AgentSettings,
  AgentSpec,
  ApiKeySource,
} from './agents/define-agent.js';
export type { ChatMessage, ModelReply, ToolCall } from './llm/messages.js';

// Usage: the prices a runtime or a job module is given; the reservations and totals
// `runtime.usage` reports.
export type { ModelPrice, PricingTable } from './llm/pricing.js';
// Model rate limits a runtime or a job module is given.
export type { ModelRateLimit, RateLimits } from './execution/rate-limits.js';
export { ReservationState } from './persistence/quota-store.js';
export type {
  ReconcileOutcome,
  Reservation,
  TenantQuota,
  UsageTotals,
} from './persistence/quota-store.js';

// Job modules: their exports in one typed object.
export { defineJob } from './define-job.js';
export type { JobDefinition, JobSetupContext, OperatorNamesOf } from './define-job.js';

// Starting runs from a plain BullMQ producer: the queue, the job name and its data.
export {
  DEFAULT_QUEUE_NAME,
  runQueue,
  START_JOB_NAME,
  startJobDataSchema,
  type RunQueue,
  type StartJobData,
  type StartJobResult,
} from './worker/start-job.js';

// A worker's in-process status (`worker.status()`).
export type { RunningUnit, WorkerCounters, WorkerStatus } from './worker/registry.js';
