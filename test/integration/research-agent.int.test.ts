/**
 * The research-agent example (examples/research-agent) through the real `flujo` binary (bin/flujo.js
 * → dist, rebuilt when src/ changes): its job module runs to success, and a run whose command
 * is killed with SIGKILL at a point inside a turn is finished by `flujo resume` with each tool
 * effect once and the answer of the run that was not killed. Each test file's runs live on their
 * own key prefix, and the job's data (notes, the e-mail service, the scripted model's port) in a
 * temporary working directory.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startService, type Service } from '../../examples/durable-job/service.ts';
import { notesRecords } from '../../examples/research-agent/job.ts';
import { root, runFlujo, type ChildResult } from '../helpers/cli.js';
import { deleteRuntimeKeys } from '../helpers/redis.js';

const JOB = join(root, 'examples', 'research-agent', 'job.ts');
const cwd = mkdtempSync(join(tmpdir(), 'flujo-research-'));
const dataDir = join(cwd, '.flujo', 'data');
const prefix = `t-${randomUUID().slice(0, 8)}`;
// In this process, for the data directory the commands use: their setup finds it through
// <dataDir>/service.json and leaves it running, so it can be asked what it saw.
let service: Service;

const flujo = (args: string[], env: Record<string, string> = {}) =>
  // The scripted model, never a real endpoint from the environment.
  runFlujo(args, { prefix, cwd, env: { OPENAI_BASE_URL: '', ...env } });

interface Line {
  type?: string;
  runId?: string;
  status?: string;
  summary?: { produced: Record<string, { answer: string; turns: number; toolCalls: number }> };
}
const lines = (r: ChildResult): Line[] =>
  r.out
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Line);
const runIdOf = (r: ChildResult) => lines(r).find((l) => l.type === 'run')?.runId ?? '';
const answerOf = (r: ChildResult) =>
  lines(r).find((l) => l.type === 'result')?.summary?.produced['research']?.answer;
const modelPort = () =>
  (JSON.parse(readFileSync(join(dataDir, 'research-model.json'), 'utf8')) as { port: number }).port;

/** The effects a run had: notes files written (and duplicates), e-mails sent (and duplicates). */
function effectsOf(runId: string) {
  const notes = notesRecords(dataDir, runId);
  const mail = service.stats(runId);
  return {
    notes: notes.filter((n) => n.outcome === 'effect').length,
    notesDuplicates: notes.filter((n) => n.outcome === 'duplicate').length,
    email: mail.effects.email,
    emailDuplicates: mail.duplicates.email,
  };
}

beforeAll(async () => {
  service = await startService({ dataDir });
});
afterAll(async () => {
  await service.close();
  await deleteRuntimeKeys(prefix);
  rmSync(cwd, { recursive: true, force: true });
});

/** A run that nobody kills (once per file): what the others must come to. */
let uncrashed: Promise<ChildResult> | undefined;
const baseline = () => (uncrashed ??= flujo(['run', JOB, '--json']));

describe('examples/research-agent through the flujo CLI', { timeout: 60_000 }, () => {
  it('flujo run: a granular agent step searches, writes notes, e-mails once, answers; exit 0', async () => {
    const r = await baseline();
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    const runId = runIdOf(r);
    const result = lines(r).find((l) => l.type === 'result');
    expect(result?.status).toBe('succeeded');
    expect(result?.summary?.produced['research']).toMatchObject({ turns: 4, toolCalls: 4 });
    // The live progress shows each committed turn of the granular step.
    const turns = lines(r).filter((l) => l.type === 'turn.committed');
    expect(turns.map((l) => (l as unknown as { turn: number }).turn)).toEqual([0, 1, 2, 3]);
    expect(answerOf(r)).toContain('The colony survives winter as a group');
    expect(effectsOf(runId)).toEqual({
      notes: 1,
      notesDuplicates: 0,
      email: 1,
      emailDuplicates: 0,
    });
    const ledger = await flujo(['ledger', runId, '--json']);
    const entries = JSON.parse(ledger.out) as { tool: string; state: string; runs: number }[];
    expect(entries.map((e) => [e.tool, e.state, e.runs])).toEqual([
      ['search_corpus@1', 'SUCCEEDED', 1],
      ['search_corpus@1', 'SUCCEEDED', 1],
      ['write_notes@1', 'SUCCEEDED', 1],
      ['send_email@1', 'SUCCEEDED', 1],
    ]);
  });

  it.each([
    { killAt: 'between-tools:research:0:1', notesDuplicates: 0, emailDuplicates: 0, emailRuns: 1 },
    { killAt: 'after-tools:research:1', notesDuplicates: 0, emailDuplicates: 0, emailRuns: 1 },
    { killAt: 'after-journal:research:2', notesDuplicates: 0, emailDuplicates: 0, emailRuns: 1 },
    // The e-mail went out, its receipt did not reach the ledger: in doubt once the lease lapses,
    // then sent again with the same key, which the service answers from its record.
    {
      killAt: 'after-tool-effect:send_email',
      notesDuplicates: 0,
      emailDuplicates: 1,
      emailRuns: 2,
    },
  ])(
    'killed with SIGKILL at $killAt, then flujo resume: each effect once, the same answer',
    async (c) => {
      const answer = answerOf(await baseline());
      const port = modelPort();
      const killed = await flujo(['run', JOB, '--json'], { FLUJO_KILL_AT: c.killAt });
      expect(killed.signal, killed.err).toBe('SIGKILL');
      const runId = runIdOf(killed);
      expect(runId).not.toBe('');
      expect(lines(killed).find((l) => l.type === 'result')).toBeUndefined();

      const resumed = await flujo(['resume', runId, JOB, '--json']);
      expect(resumed.err).toBe('');
      expect(resumed.code).toBe(0);
      expect(answerOf(resumed)).toBe(answer);
      // The resumed command found the scripted model at the URL the run started with.
      expect(modelPort()).toBe(port);
      expect(effectsOf(runId)).toEqual({
        notes: 1,
        notesDuplicates: c.notesDuplicates,
        email: 1,
        emailDuplicates: c.emailDuplicates,
      });
      const ledger = await flujo(['ledger', runId, '--json']);
      const entries = JSON.parse(ledger.out) as { tool: string; state: string; runs: number }[];
      expect(entries.map((e) => [e.tool, e.state, e.runs])).toEqual([
        ['search_corpus@1', 'SUCCEEDED', 1],
        ['search_corpus@1', 'SUCCEEDED', 1],
        ['write_notes@1', 'SUCCEEDED', 1],
        ['send_email@1', 'SUCCEEDED', c.emailRuns],
      ]);
    },
  );
});
