/** What every command receives, and the small parsers of option values they share. */
import type { JsonValue } from '../internal/json.js';
import { badInput } from './exit-codes.js';

/** The parsed option values (see `OPTIONS` in main.ts). */
export interface Values {
  json?: boolean;
  input?: string;
  'run-id'?: string;
  'request-key'?: string;
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
  'redis-outage-limit'?: string;
  port?: string;
  host?: string;
  url?: string;
  'status-every'?: string;
  /** `flujo init --no-node`. */
  'no-node'?: boolean;
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

/** The flags to repeat in a printed follow-up command (only what was given on the command line). */
export function repeatFlags(values: Values): string[] {
  const flags: string[] = [];
  if (values.redis !== undefined) flags.push('--redis', values.redis);
  if (values.prefix !== undefined) flags.push('--prefix', values.prefix);
  if (values['redis-timeout'] !== undefined) flags.push('--redis-timeout', values['redis-timeout']);
  if (values['redis-outage-limit'] !== undefined) {
    flags.push('--redis-outage-limit', values['redis-outage-limit']);
  }
  return flags;
}
