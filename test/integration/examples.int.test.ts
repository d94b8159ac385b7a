import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { redisUrl } from '../helpers/redis.js';

const run = promisify(execFile);
const root = new URL('../..', import.meta.url);
const tsx = new URL('node_modules/.bin/tsx', root).pathname;

async function runExample(file: string): Promise<string> {
  const { stdout } = await run(tsx, [file], {
    cwd: root.pathname,
    // The scripted model, never a real endpoint from the environment.
    env: { ...process.env, REDIS_URL: redisUrl(), OPENAI_BASE_URL: '' },
    timeout: 60_000,
  });
  return stdout;
}

// Formatting may differ (the docs' imports are shorter); the code may not.
const squash = (s: string) => s.replace(/\s+/g, '').replace(/,(?=[}\])])/g, '');

describe('examples run as documented', () => {
  it('the README quickstart is examples/quickstart.ts, and it runs', async () => {
    const readme = readFileSync(new URL('README.md', root), 'utf8');
    const block = /## Quickstart\n\n```ts\n([\s\S]*?)```/.exec(readme)?.[1];
    const file = readFileSync(new URL('examples/quickstart.ts', root), 'utf8');
    expect(block).toBeDefined();
    const published = file
      .replace("'../src/index.js'", "'flujo'")
      .replace("'../src/testing/index.js'", "'flujo/testing'");
    expect(squash(block!)).toBe(squash(published));
    const out = await runExample('examples/quickstart.ts');
    expect(out).toContain("stepId: 'draft'");
    expect(out).toContain("1 waiting [ { type: 'step.requestApproval', stepId: 'review' } ]");
  });

  it("the guide's snapshot-test example is examples/plan-transitions.test.ts (which the suite runs)", () => {
    const guide = readFileSync(new URL('docs/guides/embedding.md', root), 'utf8');
    const block = /## Snapshot-test how your plans move\n[\s\S]*?```ts\n([\s\S]*?)```/.exec(
      guide,
    )?.[1];
    const file = readFileSync(new URL('examples/plan-transitions.test.ts', root), 'utf8');
    expect(block).toBeDefined();
    const published = file
      .replace("'../src/index.js'", "'flujo'")
      .replace("'../src/testing/index.js'", "'flujo/testing'");
    expect(squash(block!)).toBe(squash(published));
    // The example pins a real trace: its inline snapshot is filled in, not empty.
    expect(file).toContain('retry.due refund#2 ⇒ running | refund:FAILED_RETRYABLE→READY');
  });

  it('the kernel tour drives a run to success through a retry and a gate', async () => {
    const out = await runExample('examples/kernel-tour/main.ts');
    expect(out).toContain('summarize READY→FAILED_RETRYABLE');
    expect(out).toContain('review PENDING→WAITING_APPROVAL');
    expect(out).toMatch(
      /stale writer refused: Snapshot conflict .* expected version 7, found version 8/,
    );
    expect(out).toContain(
      'final: fetch=SUCCEEDED summarize=SUCCEEDED translate=SUCCEEDED review=SUCCEEDED publish=SUCCEEDED',
    );
    expect(out).toContain("21 events in the run's stream, snapshot version 8");
  });

  it('the main demo (npm run demo) runs the durable job, survives its crash, and counts one effect per tool', async () => {
    const out = await runExample('examples/durable-job/main.ts');
    expect(out).toContain('report RUNNING → SUCCEEDED     drafted by the agent');
    expect(out).toContain('killed by SIGKILL');
    expect(out).toMatch(/upload 1 effect \(1 duplicate answered from its record\), email 1 effect/);
    expect(out).toMatch(/ok: both runs succeeded with 1 upload and 1 e-mail each/);
  }, 60_000);

  it('the agent demo (npm run demo:agent) runs the granular research agent, survives a kill inside a turn, and gives the same answer', async () => {
    const out = await runExample('examples/research-agent/main.ts');
    expect(out).toContain('turn 0 committed: search_corpus');
    expect(out).toContain('killed by SIGKILL');
    expect(out).toMatch(/\[resume\] turn 1 committed: write_notes/);
    expect(out).toMatch(/answer equal to run 1's; model calls 4 \(run 1: 4\)/);
    expect(out).toMatch(
      /ok: both runs succeeded with 1 notes file and 1 e-mail each, and the same answer/,
    );
  }, 60_000);
});
