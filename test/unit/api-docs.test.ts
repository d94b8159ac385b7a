/**
 * The API reference is generated from doc comments (`npm run docs`, with typedoc.json): every
 * declaration the package exports ("flujo" and "flujo/testing", re-exports included) has one, and
 * TypeDoc's validation (undocumented exports, broken `{@link}`s) finds nothing to warn about.
 */
import { fileURLToPath } from 'node:url';
import { Application, Logger, LogLevel, TSConfigReader, TypeDocReader } from 'typedoc';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));

/** Keeps every message TypeDoc logs at warning level or above. */
class CollectingLogger extends Logger {
  readonly messages: string[] = [];
  override log(message: string, level: LogLevel): void {
    super.log(message, level);
    if (level >= LogLevel.Warn) this.messages.push(message);
  }
}

describe('API reference', () => {
  it('every export of the entry points has a doc comment, and TypeDoc warns about nothing', async () => {
    const logger = new CollectingLogger();
    const app = await Application.bootstrap(
      {
        options: `${root}typedoc.json`,
        tsconfig: `${root}tsconfig.build.json`,
        // Converting and validating is the check; the markdown plugin only writes pages.
        plugin: [],
        treatValidationWarningsAsErrors: true,
      },
      [new TypeDocReader(), new TSConfigReader()],
    );
    app.logger = logger;
    const project = await app.convert();
    expect(project, logger.messages.join('\n')).toBeDefined();
    app.validate(project!);
    expect(logger.messages).toEqual([]);
    // The check has something to check: both entry points were converted.
    expect(project!.children?.map((c) => c.name).sort()).toEqual(['index', 'testing']);
  }, 120_000);
});
