import type { Logger } from '../logging.js';

const LEVELS = ['debug', 'info', 'warn', 'error'] as const;
type Level = (typeof LEVELS)[number];

/**
 * The command's log: one readable line per record on stderr (`flujo: warning: …`), from `warn`
 * up, or from the level in `FLUJO_LOG_LEVEL`. A person reads the CLI's stderr; services that
 * want JSON lines pass their own logger to `createRuntime`.
 */
export function createCliLogger(
  write: (line: string) => void = (line) => process.stderr.write(line),
  env: Readonly<Record<string, string | undefined>> = process.env,
): Logger {
  const wanted = env['FLUJO_LOG_LEVEL'];
  const min = LEVELS.indexOf(
    (LEVELS as readonly string[]).includes(wanted ?? '') ? (wanted as Level) : 'warn',
  );
  const line = (level: Level) => (fields: object, message: string) => {
    if (LEVELS.indexOf(level) < min) return;
    const label = level === 'warn' ? 'warning' : level;
    const details = Object.entries(fields)
      .map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`)
      .join(' ');
    write(`flujo: ${label}: ${message}${details === '' ? '' : ` (${details})`}\n`);
  };
  return { debug: line('debug'), info: line('info'), warn: line('warn'), error: line('error') };
}
