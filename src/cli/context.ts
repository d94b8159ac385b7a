/** What every command receives, and the small parsers of option values they share. */
import { isClusterUrl, maskClusterUrl } from '../persistence/connection.js';
import type { JsonValue } from '../internal/json.js';
import { badInput } from './exit-codes.js';

/** The parsed option values (see `OPTIONS` in main.ts). */
export interface Values {
  json?: boolean;
  input?: string;
  'run-id'?: string;
  'request-key'?: string;
  priority?: string;
  singleton?: string;
  concurrency?: string;
  follow?: boolean;
  by?: string;
  comment?: string;
  call?: string;
  reason?: string;
  out?: string;
  html?: boolean;
  succeeded?: string;
  retry?: boolean;
  redis?: string;
  prefix?: string;
  mode?: string;
  from?: string;
  'allow-effects'?: boolean;
  status?: string;
  plan?: string;
  tenant?: string;
  since?: string;
  until?: string;
  limit?: string;
  quiet?: boolean;
  'redis-timeout'?: string;
  replicas?: string;
  'replicas-timeout'?: string;
  'redis-outage-limit'?: string;
  port?: string;
  host?: string;
  url?: string;
  'status-every'?: string;
  full?: boolean;
  verbose?: boolean;
  /** `flujo init --no-node`. */
  'no-node'?: boolean;
  /** `flujo signal --data JSON`: the signal's payload. */
  data?: string;
  /** `flujo signal --id ID`: the signal's id (a send again with it is a no-op). */
  id?: string;
  /** `flujo run --signal NAME`: start or signal. */
  signal?: string;
  cron?: string;
  every?: string;
  tz?: string;
  overlap?: string;
  'catchup-window'?: string;
}

/** A command's arguments and surroundings. */
export interface Ctx {
  /** Positionals after the command name. */
  args: string[];
  values: Values;
  cwd: string;
  env: NodeJS.ProcessEnv;
}

/** Parses a JSON option value; the message says how to pass it. */
export function parseJsonOption(text: string, option: string, example: string): JsonValue {
  try {
    return JSON.parse(text) as JsonValue;
  } catch (error) {
    const why = (error as Error).message.split('\n')[0] ?? 'invalid JSON';
    return badInput(`${option} is not JSON: ${why}; pass JSON, e.g. ${option} '${example}'`);
  }
}

/** `--concurrency N`: a whole number from 1 to 1000. @defaultValue 8 */
export function parseConcurrency(text: string | undefined): number {
  if (text === undefined) return 8;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1 || n > 1000) {
    badInput(
      `--concurrency "${text}" is not a whole number from 1 to 1000; pass e.g. --concurrency 8`,
    );
  }
  return n;
}

/** `--by NAME`, else `$USER`, else `cli`. */
export function whoDecides(values: Values, env: NodeJS.ProcessEnv): string {
  if (values.by !== undefined) {
    if (values.by.trim() === '') badInput('--by is empty; pass who decides, e.g. --by ana');
    return values.by;
  }
  return env['USER'] || env['USERNAME'] || 'cli';
}

/** What a masked password is printed as. */
export const MASKED_PASSWORD = '***';

/**
 * A Redis URL as printed: its password, if it has one, replaced by `***`
 * (`redis://:***@127.0.0.1:6390`, `redis+cluster://user:***@127.0.0.1:7000,127.0.0.1:7001`). Text that is not a URL is printed as `<not a URL>` only if it
 * could carry a password (it has an `@`).
 */
export function maskRedisUrl(raw: string): string {
  if (isClusterUrl(raw)) return maskClusterUrl(raw, MASKED_PASSWORD);
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    return raw.includes('@') ? '<not a URL>' : raw;
  }
  if (u.password === '') return raw;
  u.password = MASKED_PASSWORD;
  return u.toString().replace(`:${encodeURIComponent(MASKED_PASSWORD)}@`, `:${MASKED_PASSWORD}@`);
}

/** Whether `flags` (from {@link repeatFlags}) carry a `--redis` URL whose password is masked. */
export function hasMaskedPassword(flags: readonly string[]): boolean {
  const i = flags.indexOf('--redis');
  return i >= 0 && (flags[i + 1] ?? '').includes(`:${MASKED_PASSWORD}@`);
}

/** Said beside commands whose `--redis` password is masked. */
export const MASKED_PASSWORD_HINT = `the password given with --redis is printed as ${MASKED_PASSWORD}: set REDIS_URL to the Redis URL (with its password) in the environment and leave --redis out, and these commands run as printed`;

/**
 * The flags to repeat in a printed follow-up command (only what was given on the command line),
 * the password of `--redis` masked (see {@link maskRedisUrl}).
 */
export function repeatFlags(values: Values): string[] {
  const flags: string[] = [];
  if (values.redis !== undefined) flags.push('--redis', maskRedisUrl(values.redis));
  if (values.prefix !== undefined) flags.push('--prefix', values.prefix);
  if (values['redis-timeout'] !== undefined) flags.push('--redis-timeout', values['redis-timeout']);
  if (values.replicas !== undefined) flags.push('--replicas', values.replicas);
  if (values['replicas-timeout'] !== undefined) {
    flags.push('--replicas-timeout', values['replicas-timeout']);
  }
  if (values['redis-outage-limit'] !== undefined) {
    flags.push('--redis-outage-limit', values['redis-outage-limit']);
  }
  return flags;
}
