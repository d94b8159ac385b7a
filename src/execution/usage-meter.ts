/**
 * Usage accounting around each model call: estimate the request, reserve
 * the estimate against the run's budget and the tenant's quota, mark the reservation sent right
 * before the request goes out, and reconcile it exactly once in a single `finally`:
 * - a reply came: the provider's usage (estimated from the reply only if the provider gave none);
 * - the provider answered with an error status: nothing was generated, nothing is charged;
 * - the request was sent and no answer came (timeout, dropped connection): the baseline input
 *   estimate, never refunded;
 * - nothing was sent: nothing.
 * A worker that dies mid-call leaves its reservation open; the step's next reservation finds it
 * (the store says others were open) and settles it: with the journaled reply's usage when that
 * reply was this reservation's, else as above.
 */
import { randomUUID } from 'node:crypto';
import { isDeepStrictEqual } from 'node:util';
import {
  BudgetExceededError,
  UsageLimitExceededError,
  isFlujoError,
  type ModelError,
} from '../errors.js';
import type { AgentDefinition } from '../agents/define-agent.js';
import { debugPoint, DebugPoint } from '../internal/debug-points.js';
import { toolParametersSchema } from '../agents/tool-schema.js';
import type { Logger } from '../logging.js';
import type { ChatMessage, ModelReply } from '../llm/messages.js';
import { costMicroUsd, resolvePrice, type ModelPrice, type PricingTable } from '../llm/pricing.js';
import { estimateRequest, type RequestEstimate, type TokenCounter } from '../llm/tokens.js';
import {
  othersOpen,
  type QuotaStore,
  type ReconcileOutcome,
  type Reservation,
} from '../persistence/quota-store.js';

/** Limits of one run (or one step), from its plan's budgets. */
export interface RunUsageBudget {
  maxTokens?: number | undefined;
  maxCostUsd?: number | undefined;
}

/** Where a model call happens. */
export interface MeteredCall {
  agent: AgentDefinition;
  tenantId: string;
  runId: string;
  stepId: string;
  /** The turn the call is for (0-based). */
  turn: number;
  /**
   * The step's attempt, and how many times it paused before, whose execution makes the call: part
   * of the reservation's id (see {@link reservationUnit}). @defaultValue not recorded
   */
  attempt?: number;
  pause?: number;
  /** The conversation as sent, after the system prompt. */
  messages: readonly ChatMessage[];
  budget: RunUsageBudget | undefined;
  /** The step's own `budgets.maxTokens` / `maxCostUsd`, over all its calls in the run. */
  stepBudget?: RunUsageBudget | undefined;
  /**
   * Told how the call went once it is reconciled (e.g. to record it in the run's events); not told
   * of a call that sent nothing (its reservation released). @defaultValue nobody
   */
  observer?: ModelCallObserver;
  /**
   * Given a reply once its reconcile is on the connection, before the reconcile's answer is
   * awaited: writes started here (the reply's journal) share the reconcile's round trip, and Redis
   * applies them after it. What it starts is not awaited here. @defaultValue nothing
   */
  alongside?: (reply: MeteredReply) => void;
}

/** Told how each metered model call went, e.g. to record it in the run's event stream. */
export interface ModelCallObserver {
  /** One call, once reconciled (a call that sent nothing is not told). */
  modelCalled(call: ModelCallObservation): void;
}

/** How one metered model call went: its reservation, what it was charged, how long it took. */
export interface ModelCallObservation {
  reservationId: string;
  model: string;
  turn: number;
  /**
   * How the reservation was reconciled: `usage` or `baseline` (sent, no reply). (`none`, nothing
   * sent, is not observed; events an earlier release recorded may carry it.)
   */
  charged: 'usage' | 'baseline' | 'none';
  inputTokens: number;
  outputTokens: number;
  costUsd: number;
  /** From the request to the reply (or the failure), in ms. */
  durationMs: number;
}

/** A reply with the id of the reservation it was charged to. */
export type MeteredReply = ModelReply & { reservationId: string };

/** Options of {@link createUsageMeter}. */
export interface UsageMeterOptions {
  quota: QuotaStore;
  /** Prices per model. @defaultValue no prices (calls cost 0 unless `strict`) */
  pricing?: PricingTable;
  /** A model without a price is refused before any request. @defaultValue false */
  strictPricing?: boolean;
  /** The output buffer reserved when the agent sets no `maxTokens`. @defaultValue 1024 */
  defaultOutputTokens?: number;
  log: Logger;
  /** The token counter of a model. */
  counterFor: (model: string) => TokenCounter;
  /**
   * Writes the commands given to the quota store's connection so far now (see `flushWrites`).
   * @defaultValue nothing to do (the connection writes each command as it is given)
   */
  flush?: () => void;
}

/** Reserves, marks sent and reconciles around model calls. */
export interface UsageMeter {
  /**
   * Runs `send` under a reservation for the call. Throws `PricingNotConfiguredError` (strict
   * pricing, no price) or `UsageLimitExceededError` (tenant quota) or `BudgetExceededError` (the
   * run's `maxTokens` / `maxCostUsd`) before anything is sent.
   */
  call(
    call: MeteredCall,
    send: (onSend: () => Promise<void>) => Promise<ModelReply>,
  ): Promise<MeteredReply>;
  /**
   * Settles every open reservation of the step but `keep`: what a worker that died left behind.
   * `journaled(turn)` gives the reply journaled for a turn, if any.
   */
  settle(
    where: { tenantId: string; runId: string; stepId?: string; agent?: AgentDefinition },
    journaled: (r: Reservation) => Promise<ModelReply | null>,
    keep?: string,
  ): Promise<void>;
  /** The price usage of `model` is charged by, or null when the table has none. */
  priceOf(model: string): ModelPrice | null;
  /**
   * The tokens a request of `agent` with `messages` is estimated at, as its reservation counts
   * them: the input and the output buffer.
   */
  estimateTokens(agent: AgentDefinition, messages: readonly ChatMessage[]): number;
  /**
   * Prepares the reservation of a call to come (the next turn of a granular step), so it can be
   * sent beside the commit before it rather than after: `reserve()` sends it (once; later calls do
   * nothing), and the step's next {@link UsageMeter.call} for `call.turn` takes it when it asks for
   * the same thing (same agent, messages and limits), else releases it and reserves afresh. Nothing
   * is sent before `reserve()`. A reservation nobody takes is released by {@link release}.
   */
  prepare(call: MeteredCall): { reserve(): void };
  /**
   * Releases (reconciles as `none`: nothing was sent) the reservation sent ahead for the step's
   * turn `turn` or an earlier one that no call took; does nothing when there is none.
   */
  release(runId: string, stepId: string, turn: number): Promise<void>;
}

/** Creates a {@link UsageMeter}. */
export function createUsageMeter(options: UsageMeterOptions): UsageMeter {
  const { quota, log } = options;
  const pricing = options.pricing ?? { models: {} };
  const strict = options.strictPricing ?? false;
  const defaultOutputTokens = options.defaultOutputTokens ?? 1024;
  const { counterFor } = options;
  const flush = options.flush ?? (() => {});
  const toolsJson = new WeakMap<AgentDefinition, string>();

  const toolsOf = (agent: AgentDefinition): string => {
    let json = toolsJson.get(agent);
    if (json === undefined) {
      json = agent.tools.length === 0 ? '' : JSON.stringify(agent.tools.map(toolParametersSchema));
      toolsJson.set(agent, json);
    }
    return json;
  };

  /** What a reply is charged: the provider's figures, or (when it gave none) an estimate. */
  const charge = (
    agent: AgentDefinition,
    price: ModelPrice | null,
    reply: ModelReply,
    inputEstimate: number,
  ): ReconcileOutcome => {
    const inputTokens = reply.usage?.promptTokens ?? inputEstimate;
    const outputTokens =
      reply.usage?.completionTokens ?? counterFor(agent.model).countMessage(reply.message);
    const microUsd = price === null ? 0 : costMicroUsd(price, { inputTokens, outputTokens });
    return { kind: 'usage', inputTokens, outputTokens, microUsd };
  };

  /** Reservations sent ahead of their call, by run and step (one per step at most). */
  const ahead = new Map<string, Ahead>();

  /** Takes the step's reservation sent ahead for `turn` or an earlier turn; a later one stays. */
  const take = (runId: string, stepId: string, turn: number): Ahead | undefined => {
    const key = aheadKey(runId, stepId);
    const held = ahead.get(key);
    if (held === undefined || held.call.turn > turn) return undefined;
    ahead.delete(key);
    return held;
  };

  /** The estimated tokens of a request of `agent` with `messages`. */
  const estimateOf = (agent: AgentDefinition, messages: readonly ChatMessage[]) =>
    estimateRequest({
      counter: counterFor(agent.model),
      systemPrompt: agent.systemPrompt,
      messages,
      toolsJson: toolsOf(agent),
      ...(agent.settings.maxTokens === undefined
        ? {}
        : { maxOutputTokens: agent.settings.maxTokens }),
      defaultOutputTokens,
    });

  /** What a call reserves: its estimate (with its cost) and the limits it is checked against. */
  const figuresOf = (call: MeteredCall): Figures => {
    const { agent } = call;
    const price = resolvePrice(pricing, agent.model, { strict });
    const estimate = estimateOf(agent, call.messages);
    const microUsd = price === null ? 0 : costMicroUsd(price, estimate);
    const baselineMicroUsd =
      price === null
        ? 0
        : costMicroUsd(price, { inputTokens: estimate.inputTokens, outputTokens: 0 });
    return {
      estimate: { ...estimate, microUsd, baselineMicroUsd },
      limits: { run: limitsOf(call.budget), step: limitsOf(call.stepBudget) },
    };
  };

  /**
   * Reserves a call's estimate. The run's or the step's own budget refused: `BudgetExceededError`
   * (the run stops with budget_exceeded, or the step fails with it, like its other budgets); the
   * tenant's quota refused: `UsageLimitExceededError`.
   */
  async function reserveFor(
    call: MeteredCall,
    estimate: Figures['estimate'],
    limits: Figures['limits'],
  ): Promise<Reservation> {
    const { tenantId, runId, stepId, turn } = call;
    try {
      return await quota.reserve({
        reservationId: reservationIdOf(call),
        tenantId,
        runId,
        stepId,
        turn,
        estimate,
        runLimits: limits.run,
        stepLimits: limits.step,
      });
    } catch (error) {
      if (error instanceof UsageLimitExceededError && error.info.scope !== 'tenant') {
        const { limit: budget, limitValue, used: spent, reserved, requested } = error.info;
        const limit = budget === 'maxTokens' ? limitValue : limitValue / 1_000_000;
        const used = spent + reserved + requested;
        throw new BudgetExceededError(
          budget,
          limit,
          budget === 'maxTokens' ? used : used / 1_000_000,
          { cause: error, ...(error.info.scope === 'step' ? { stepId } : {}) },
        );
      }
      throw error;
    }
  }

  /** Reconciles a reservation sent ahead that no call took: nothing was sent, nothing is due. */
  async function releaseAhead(held: Ahead): Promise<void> {
    const { tenantId, runId, stepId, turn } = held.call;
    let reservation: Reservation;
    try {
      reservation = await held.reserved;
    } catch {
      return; // refused or never written: nothing to release
    }
    try {
      await quota.reconcile(tenantId, reservation.id, { kind: 'none' }, undefined, runId);
    } catch (error) {
      // Left open: the step's next reservation finds it and settles it.
      log.warn(
        { runId, stepId, turn, reservationId: reservation.id, error: (error as Error).message },
        'could not release a usage reservation sent ahead of its call',
      );
    }
  }

  async function settle(
    where: { tenantId: string; runId: string; stepId?: string; agent?: AgentDefinition },
    journaled: (r: Reservation) => Promise<ModelReply | null>,
    keep?: string,
  ): Promise<void> {
    const open = await quota.open(where.tenantId, where.runId);
    for (const r of open) {
      if (r.id === keep || (where.stepId !== undefined && r.stepId !== where.stepId)) continue;
      const reply = await journaled(r);
      let outcome: ReconcileOutcome;
      if (reply !== null && (reply as Partial<MeteredReply>).reservationId === r.id) {
        const price =
          where.agent === undefined
            ? null
            : resolvePrice(pricing, where.agent.model, { strict: false });
        outcome =
          where.agent === undefined
            ? {
                kind: 'usage',
                inputTokens: reply.usage?.promptTokens ?? r.estimate.inputTokens,
                outputTokens: reply.usage?.completionTokens ?? 0,
                microUsd: 0,
              }
            : charge(where.agent, price, reply, r.estimate.inputTokens);
      } else {
        // Sent and never answered (or its answer was lost with the worker): the baseline.
        outcome = r.state === 'sent' ? { kind: 'baseline' } : { kind: 'none' };
      }
      const { applied } = await quota.reconcile(
        where.tenantId,
        r.id,
        outcome,
        undefined,
        where.runId,
      );
      if (applied) {
        log.info(
          {
            runId: where.runId,
            stepId: r.stepId,
            turn: r.turn,
            reservationId: r.id,
            outcome: outcome.kind,
          },
          'settled a usage reservation left open by a worker that stopped mid-call',
        );
      }
    }
  }

  return {
    settle,
    priceOf: (model) => resolvePrice(pricing, model, { strict: false }),
    estimateTokens(agent, messages) {
      const estimate = estimateOf(agent, messages);
      return estimate.inputTokens + estimate.outputTokens;
    },

    prepare(call) {
      const key = aheadKey(call.runId, call.stepId);
      let figures: Figures;
      try {
        figures = figuresOf(call);
      } catch {
        // Refused before anything is sent (strict pricing): the call itself will say why.
        return { reserve: () => {} };
      }
      let sent = false;
      return {
        reserve() {
          if (sent) return;
          sent = true;
          const before = ahead.get(key);
          if (before !== undefined) void releaseAhead(before);
          const reserved = reserveFor(call, figures.estimate, figures.limits);
          reserved.catch(() => {}); // met by the call that takes it, or by the release
          ahead.set(key, { call, estimate: figures.estimate, reserved });
        },
      };
    },

    async release(runId, stepId, turn) {
      const held = take(runId, stepId, turn);
      if (held !== undefined) await releaseAhead(held);
    },

    async call(call, send) {
      const { agent, tenantId, runId, stepId, turn } = call;
      debugPoint(DebugPoint.beforeReserve, `${stepId}:${turn}`);
      const price = resolvePrice(pricing, agent.model, { strict });
      const held = take(runId, stepId, turn);
      let estimate: Figures['estimate'];
      let reserving: Promise<Reservation>;
      if (held !== undefined && held.call.turn === turn && sameCall(held.call, call)) {
        ({ estimate } = held);
        reserving = held.reserved;
      } else {
        // Asked for something else (its history changed under it, say): released first, so the
        // reservation below does not find it open.
        if (held !== undefined) await releaseAhead(held);
        const figures = figuresOf(call);
        estimate = figures.estimate;
        reserving = reserveFor(call, estimate, figures.limits);
      }
      const reservation = await reserving;
      if (othersOpen(reservation) > 0) {
        await settle(
          { tenantId, runId, stepId, agent },
          () => Promise.resolve(null),
          reservation.id,
        );
      }
      debugPoint(DebugPoint.afterReserve, `${stepId}:${turn}`);
      let sent = false;
      const sentAt = performance.now();
      // The mark goes out on the Redis connection as the request goes out on HTTP, without
      // waiting for it (a written command reaches Redis even if this process dies next); the
      // reconcile below follows it on the same connection, so Redis applies them in order.
      let marked: Promise<unknown> = Promise.resolve();
      let reply: ModelReply | undefined;
      let failure: unknown;
      try {
        reply = await send(() => {
          sent = true;
          marked = quota.markSent(tenantId, reservation.id).catch((error: unknown) => error);
          return Promise.resolve();
        });
        return { ...reply, reservationId: reservation.id };
      } catch (error) {
        failure = error;
        throw error;
      } finally {
        let outcome: ReconcileOutcome;
        if (reply !== undefined) outcome = charge(agent, price, reply, estimate.inputTokens);
        else if (!sent) outcome = { kind: 'none' };
        else if (answeredWithError(failure)) {
          outcome = { kind: 'usage', inputTokens: 0, outputTokens: 0, microUsd: 0 };
        } else outcome = { kind: 'baseline' };
        const markError = await marked;
        if (markError instanceof Error && reply === undefined)
          log.warn(
            { runId, stepId, turn, error: markError.message },
            'could not mark a usage reservation sent',
          );
        const reconciled = quota.reconcile(tenantId, reservation.id, outcome, undefined, runId);
        if (reply !== undefined && call.alongside !== undefined) {
          reconciled.catch(() => {}); // met below
          // The reconcile goes on the wire before anything `alongside` sends: a process that dies
          // right after still has the reply's usage charged.
          flush();
          call.alongside({ ...reply, reservationId: reservation.id });
        }
        await reconciled;
        // A call that sent nothing is no model call: its reservation is released, not observed.
        if (outcome.kind !== 'none') {
          call.observer?.modelCalled({
            reservationId: reservation.id,
            model: agent.model,
            turn,
            charged: outcome.kind,
            inputTokens: outcome.kind === 'usage' ? outcome.inputTokens : 0,
            outputTokens: outcome.kind === 'usage' ? outcome.outputTokens : 0,
            costUsd: outcome.kind === 'usage' ? outcome.microUsd / 1_000_000 : 0,
            durationMs: Math.round((performance.now() - sentAt) * 1000) / 1000,
          });
        }
      }
    },
  };
}

/** A call's reservation figures: the estimate with its cost, and the limits it is checked against. */
interface Figures {
  estimate: RequestEstimate & { microUsd: number; baselineMicroUsd: number };
  limits: { run: UsageLimits; step: UsageLimits };
}

type UsageLimits = { maxTokens?: number; maxMicroUsd?: number };

/** A reservation sent ahead of its call. */
interface Ahead {
  call: MeteredCall;
  estimate: Figures['estimate'];
  reserved: Promise<Reservation>;
}

const aheadKey = (runId: string, stepId: string): string => `${runId}\n${stepId}`;

/**
 * A fresh reservation id for `call`: `<stepId>:<turn>:<uuid>`, or, when the call names its
 * attempt, `<stepId>:<turn>:a<attempt>p<pause>:<uuid>`, so that the reservations an execution
 * made can be told from those of another execution of the step (see {@link reservationUnit}).
 */
function reservationIdOf(call: MeteredCall): string {
  const { stepId, turn, attempt } = call;
  const unit = attempt === undefined ? '' : `a${attempt}p${call.pause ?? 0}:`;
  return `${stepId}:${turn}:${unit}${randomUUID()}`;
}

const UNIT_OF_ID = /^[^:]+:\d+:a(\d+)p(\d+):/;

/**
 * The attempt, and the pauses before it, of the execution that made reservation `id`; null for
 * an id that does not say (made by an earlier release, or for a call that named no attempt).
 */
export function reservationUnit(id: string): { attempt: number; pause: number } | null {
  const m = UNIT_OF_ID.exec(id);
  return m === null ? null : { attempt: Number(m[1]), pause: Number(m[2]) };
}

function limitsOf(budget: RunUsageBudget | undefined): UsageLimits {
  return {
    ...(budget?.maxTokens === undefined ? {} : { maxTokens: budget.maxTokens }),
    ...(budget?.maxCostUsd === undefined
      ? {}
      : { maxMicroUsd: Math.floor(budget.maxCostUsd * 1_000_000) }),
  };
}

/**
 * Whether a call asks for what a reservation sent ahead was made for: the same agent and tenant,
 * the same messages, and the same limits. Messages are mostly the same objects (a step's history
 * is kept in memory between its turns); others (a truncation's placeholder, a tool result put back
 * from its blob) are compared by what they say.
 */
function sameCall(a: MeteredCall, b: MeteredCall): boolean {
  if (a.agent !== b.agent || a.tenantId !== b.tenantId) return false;
  if (a.messages.length !== b.messages.length) return false;
  for (let i = 0; i < a.messages.length; i++) {
    const [x, y] = [a.messages[i]!, b.messages[i]!];
    if (x !== y && !isDeepStrictEqual(x, y)) return false;
  }
  const same = (x: RunUsageBudget | undefined, y: RunUsageBudget | undefined) =>
    x?.maxTokens === y?.maxTokens && x?.maxCostUsd === y?.maxCostUsd;
  return same(a.budget, b.budget) && same(a.stepBudget, b.stepBudget);
}

/** True when the provider answered with an error status: it generated nothing. */
function answeredWithError(error: unknown): boolean {
  return (
    isFlujoError(error) &&
    error.code === 'model_error' &&
    typeof (error as ModelError).status === 'number'
  );
}
