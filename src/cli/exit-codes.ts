/** Exit codes of the `flujo` command (documented in `flujo --help` and the README). */
export const ExitCode = {
  /** The run succeeded, or the command did what it was asked. */
  ok: 0,
  /** The run failed. */
  failed: 1,
  /** Bad input: the message names the field and the fix. Nothing was written. */
  badInput: 2,
  /** The run waits: for a person's approval, a signal or a timer. */
  waiting: 3,
  /** The run failed because it hit one of its budgets (`budget_exceeded`). */
  budgetExceeded: 4,
  /** The run was cancelled. */
  cancelled: 5,
  /** Redis could not be reached. */
  redisUnavailable: 6,
  /** Interrupted (Ctrl-C): the run goes on with `flujo resume`. */
  interrupted: 130,
} as const;
/** A value of {@link ExitCode}. */
export type ExitCode = (typeof ExitCode)[keyof typeof ExitCode];

/** An error the CLI reports as it is, on one line (or a few, for a plan's problems), with its exit code. */
export class CliError extends Error {
  override name = 'CliError';
  constructor(
    message: string,
    readonly exitCode: ExitCode = ExitCode.badInput,
  ) {
    super(message);
  }
}

/** Throws a bad-input {@link CliError}. */
export function badInput(message: string): never {
  throw new CliError(message, ExitCode.badInput);
}
