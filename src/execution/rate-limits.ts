/**
 * Model rate limits: `rateLimits: { '<model or provider>': { requestsPerMinute?, tokensPerMinute?
 * } }`, shared by every worker of a prefix through Redis (`persistence/rate-limit-store.ts`). A
 * model call under a limit waits for capacity in the worker before it is sent, instead of drawing
 * 429s; a 429 that still comes blocks the model's limits for its `retry-after`, for every worker.
 *
 * Which limits a call is under: every configured name that is the agent's model exactly
 * (`gpt-4o-mini`, `openai/gpt-4o`), a provider prefix of it (`openai` for `openai/gpt-4o`, each
 * part before a `/`), or the host of the agent's `provider.baseURL` (`api.openai.com`, with its
 * port when the URL gives one: `localhost:8080`). A call under several waits until all of them
 * let it through.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { AgentDefinition } from '../agents/define-agent.js';
import { InputValidationError, ModelError, type ValidationIssue } from '../errors.js';
import type { Logger } from '../logging.js';
import type { ChatMessage, ModelReply } from '../llm/messages.js';
import { displayURL } from '../llm/classify-error.js';
import { RATE_LIMIT_NAME_PATTERN } from '../persistence/keys.js';
import type { RateLimitStore } from '../persistence/rate-limit-store.js';
import { traceRateLimitWait } from '../observability/spans.js';

/** The limits of one model, or of one provider's models, per minute. */
export interface ModelRateLimit {
  /** Requests sent per minute (any 60 s), by every worker together. */
  requestsPerMinute?: number;
  /**
   * Tokens per minute (any 60 s): each request counts its estimate (input, and the output it may
   * use: the agent's `settings.maxTokens`, else `defaultOutputTokens`) when it is let through, and
   * the usage its reply reports once it comes.
   */
  tokensPerMinute?: number;
  /**
   * The longest one model call waits for capacity in the worker, in ms; past it the call fails
   * with a retryable `ModelError` of kind `rate_limit` (its `retryAfterMs` the wait still ahead),
   * and the step's retry policy applies. @defaultValue 300000 (5 minutes)
   */
  maxWaitMs?: number;
}

/** Model rate limits by model name, provider prefix or provider host (see the module's comment). */
export type RateLimits = Record<string, ModelRateLimit>;

/**
 * How long a request counts against its limits after it is let through: a minute, and a second
 * more that covers the time between letting a request through and its arrival at the provider
 * (which counts it from its arrival), so that the provider never sees more than the limit in any
 * minute.
 */
export const RATE_WINDOW_MS = 61_000;
const DEFAULT_MAX_WAIT_MS = 300_000;
/** How long a 429 without `retry-after` blocks its model's limits. */
const DEFAULT_BLOCK_MS = 1_000;
const FIELDS = ['requestsPerMinute', 'tokensPerMinute', 'maxWaitMs'] as const;

/**
 * Checks `rateLimits`; throws `InputValidationError` naming each bad field
 * (`rateLimits.<name>.requestsPerMinute`) before anything is written.
 */
export function checkRateLimits(value: unknown, field = 'rateLimits'): RateLimits {
  const issues: ValidationIssue[] = [];
  const example = `e.g. ${field}: { 'gpt-4o-mini': { requestsPerMinute: 500 } }`;
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new InputValidationError('rate limits', [
      { path: field, message: `must be an object of limits by model or provider, ${example}` },
    ]);
  }
  const out: RateLimits = {};
  for (const [name, spec] of Object.entries(value as Record<string, unknown>)) {
    const at = `${field}.${name}`;
    if (!RATE_LIMIT_NAME_PATTERN.test(name)) {
      issues.push({
        path: at,
        message: `names a model or provider: 1 to 200 characters without "{", "}" or spaces`,
      });
      continue;
    }
    if (typeof spec !== 'object' || spec === null || Array.isArray(spec)) {
      issues.push({ path: at, message: `must be { requestsPerMinute?, tokensPerMinute? }` });
      continue;
    }
    const limit: ModelRateLimit = {};
    for (const [key, v] of Object.entries(spec as Record<string, unknown>)) {
      if (!(FIELDS as readonly string[]).includes(key)) {
        issues.push({ path: `${at}.${key}`, message: `is not a limit; use ${FIELDS.join(', ')}` });
      } else if (v === undefined) {
        continue;
      } else if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) {
        issues.push({
          path: `${at}.${key}`,
          message: `must be a positive integer, got ${JSON.stringify(v) ?? typeof v}`,
        });
      } else limit[key as (typeof FIELDS)[number]] = v;
    }
    const given = spec as ModelRateLimit;
    if (given.requestsPerMinute === undefined && given.tokensPerMinute === undefined) {
      issues.push({
        path: at,
        message: 'sets no limit: give requestsPerMinute or tokensPerMinute',
      });
    }
    out[name] = limit;
  }
  if (issues.length > 0) throw new InputValidationError('rate limits', issues);
  return out;
}

/**
 * The names of `limits` a call of `model` at `baseURL` is under: the model exactly, each provider
 * prefix of it (the parts before a `/`), and the URL's host.
 */
export function rateLimitNames(
  limits: Readonly<RateLimits>,
  model: string,
  baseURL: string,
): string[] {
  const candidates = [model];
  for (let i = model.indexOf('/'); i > 0; i = model.indexOf('/', i + 1)) {
    candidates.push(model.slice(0, i));
  }
  try {
    candidates.push(new URL(baseURL).host);
  } catch {
    // not a URL: no host to match
  }
  return [...new Set(candidates)].filter((name) => Object.hasOwn(limits, name));
}

/** One model call's wait for capacity, as its unit records it (`model.rate_limited`). */
export interface RateLimitWait {
  model: string;
  /** The turn (0-based) whose call it was, when the caller says. */
  turn?: number;
  /** The limits that made it wait. */
  limits: string[];
  /** What held it last: a 429's block (`blocked`), the requests, or the tokens in the window. */
  reason: 'blocked' | 'requests' | 'tokens';
  /** How long it waited, in ms. */
  waitedMs: number;
  /** How it ended: let through, past `maxWaitMs`, or aborted (the unit's cancel or time limit). */
  outcome: 'sent' | 'gave_up' | 'aborted';
}

/** Told of each model call that waited for capacity, e.g. to record it in the run's events. */
export interface RateLimitObserver {
  modelRateLimited(wait: RateLimitWait): void;
}

/** A request let through under an agent's limits. */
export interface RateGrant {
  /** Counts what the reply used in place of the estimate (tokens limits); not awaited. */
  used(reply: ModelReply): void;
  /** Takes the grant back: the request was not sent. */
  release(): Promise<void>;
}

/** The limits one agent's calls are under. */
export interface AgentRateLimits {
  /** The names of the limits. */
  readonly names: readonly string[];
  /** Waits until every limit lets a request of `messages` through (see {@link ModelRateLimit}). */
  acquire(
    messages: readonly ChatMessage[],
    signal: AbortSignal,
    observer?: RateLimitObserver,
  ): Promise<RateGrant>;
  /**
   * After a failed call: a 429 from the provider blocks every limit of the agent for its
   * `retry-after` (1 s without one). True when it did, and the call may be asked again.
   */
  rejected(error: unknown): Promise<boolean>;
}

/** The model rate limits of a runtime. */
export interface ModelRateLimiter {
  /** The limits `agent`'s calls are under, or null when none matches. */
  forAgent(agent: AgentDefinition): AgentRateLimits | null;
}

/** Options of {@link createModelRateLimiter}. */
export interface ModelRateLimiterOptions {
  store: RateLimitStore;
  limits: Readonly<RateLimits>;
  /** Estimated tokens of a request (input and output buffer). */
  estimate: (agent: AgentDefinition, messages: readonly ChatMessage[]) => number;
  log: Logger;
}

/** Creates the {@link ModelRateLimiter} of `options.limits`. */
export function createModelRateLimiter(options: ModelRateLimiterOptions): ModelRateLimiter {
  const { store, limits, log } = options;
  const cache = new WeakMap<AgentDefinition, AgentRateLimits | null>();
  return {
    forAgent(agent) {
      let found = cache.get(agent);
      if (found === undefined) {
        const names = rateLimitNames(limits, agent.model, agent.provider.baseURL);
        found = names.length === 0 ? null : agentLimits(agent, names);
        cache.set(agent, found);
      }
      return found;
    },
  };

  function agentLimits(agent: AgentDefinition, names: readonly string[]): AgentRateLimits {
    const counted = names.some((n) => limits[n]!.tokensPerMinute !== undefined);
    const maxWaitMs = Math.min(...names.map((n) => limits[n]!.maxWaitMs ?? DEFAULT_MAX_WAIT_MS));
    const windowOf = (name: string) => ({
      requests: limits[name]!.requestsPerMinute,
      tokens: limits[name]!.tokensPerMinute,
    });

    /** One try at every limit: null when all let it through, else the first that did not. */
    async function tryAll(id: string, tokens: number) {
      const granted: string[] = [];
      for (const name of names) {
        const answer = await store.acquire(name, windowOf(name), id, tokens, RATE_WINDOW_MS);
        if (!answer.go) {
          // The limits that let it through take it back: it is not sent yet.
          await Promise.all(granted.map((n) => store.release(n, id)));
          return { name, waitMs: answer.waitMs, reason: answer.reason };
        }
        granted.push(name);
      }
      return null;
    }

    function grant(id: string): RateGrant {
      return {
        used(reply) {
          if (!counted || reply.usage === null) return;
          const tokens = reply.usage.promptTokens + reply.usage.completionTokens;
          for (const name of names) {
            store.settle(name, id, tokens).catch((error: unknown) => {
              log.debug({ error: (error as Error).message }, 'could not settle a rate grant');
            });
          }
        },
        async release() {
          await Promise.all(names.map((n) => store.release(n, id).catch(() => {})));
        },
      };
    }

    return {
      names,
      async acquire(messages, signal, observer) {
        const id = randomUUID();
        const tokens = counted ? options.estimate(agent, messages) : 0;
        const first = await tryAll(id, tokens);
        if (first === null) return grant(id);
        await traceRateLimitWait({ model: agent.model, limits: names }, async () => {
          const began = performance.now();
          const held = new Set<string>();
          let denied = first;
          const report = (outcome: RateLimitWait['outcome']): RateLimitWait => {
            const waitedMs = Math.round(performance.now() - began);
            const wait = { model: agent.model, limits: [...held], reason: denied.reason };
            const out = { ...wait, waitedMs, outcome };
            observer?.modelRateLimited(out);
            return out;
          };
          for (;;) {
            held.add(denied.name);
            const waited = performance.now() - began;
            if (waited + denied.waitMs > maxWaitMs) {
              report('gave_up');
              throw new ModelError(
                {
                  kind: 'rate_limit',
                  model: agent.model,
                  baseURL: displayURL(agent.provider.baseURL),
                  providerMessage: `no capacity under the runtime's rate limit "${denied.name}" within maxWaitMs (${maxWaitMs} ms)`,
                },
                { retryAfterMs: denied.waitMs },
              );
            }
            // Spread the waiters that wake for the same free capacity.
            const pause = denied.waitMs + Math.floor(Math.random() * 50);
            try {
              await sleep(pause, undefined, { signal });
            } catch (error) {
              report('aborted');
              throw error;
            }
            const next = await tryAll(id, tokens);
            if (next === null) return report('sent');
            denied = next;
          }
        });
        return grant(id);
      },

      async rejected(error) {
        if (!(error instanceof ModelError) || error.kind !== 'rate_limit') return false;
        if (error.status !== 429 || !error.retryable) return false;
        const ms = error.retryAfterMs ?? DEFAULT_BLOCK_MS;
        try {
          await Promise.all(names.map((n) => store.block(n, ms, RATE_WINDOW_MS)));
        } catch (failure) {
          log.warn(
            { model: agent.model, limits: names, error: (failure as Error).message },
            'a 429 could not block the rate limits of its model',
          );
          return false;
        }
        log.warn(
          { model: agent.model, limits: names, retryAfterMs: ms },
          'the model answered 429 under its rate limits: no worker sends it a request until retry-after',
        );
        return true;
      },
    };
  }
}
