/**
 * The runtime's log: structured records for what an operator should know about but no caller is
 * waiting on (a turn skipped after a crash, a token estimate by heuristic, a blob replaced by a
 * marker). Pass your own logger (pino, or anything with the same four methods) to
 * `createRuntime({ logger })`; by default records go to stderr as JSON lines from `warn` up, or
 * from the level in `FLUJO_LOG_LEVEL`.
 */
import { pino } from 'pino';

/** A structured logger: pino's method shape (fields first, then the message). */
export interface Logger {
  /** Records a detail for debugging. */
  debug(fields: object, message: string): void;
  /** Records a notable event. */
  info(fields: object, message: string): void;
  /** Records something that went wrong and was handled. */
  warn(fields: object, message: string): void;
  /** Records a failure. */
  error(fields: object, message: string): void;
}

/** The default logger: JSON lines on stderr, level `FLUJO_LOG_LEVEL` or `warn`. */
export function createDefaultLogger(
  env: Readonly<Record<string, string | undefined>> = process.env,
): Logger {
  return pino({ name: 'flujo', level: env['FLUJO_LOG_LEVEL'] ?? 'warn' }, pino.destination(2));
}

/** A logger that drops everything (for tests and tools that print their own output). */
export const silentLogger: Logger = {
  debug: () => {},
  info: () => {},
  warn: () => {},
  error: () => {},
};
