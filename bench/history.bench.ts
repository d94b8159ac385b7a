/**
 * A long granular agent run with large tool results: 1,000 turns, each of the first 999 calling a
 * read-only tool that returns a 50 KB result of varied words (a different one every turn, so
 * content addressing saves nothing), the last answering. Run one at a time on a worker of
 * concurrency 1, against the scripted model server at 0 ms (in a child process, so that this
 * process's memory is the worker's), on a private redis-server with AOF `everysec`, in two
 * configurations, alternated per repetition:
 *   - offload: the default `blobThresholdBytes` (20 000): each result goes to the blob store once
 *     and the history holds a 90-byte reference, put back when a turn sends it to the model;
 *   - inline: a threshold above any result: the history holds every result itself.
 * For each it prints:
 *   - the commit latency of a turn (the compare-and-set script that writes the snapshot, the turn's
 *     events and its history appends), timed around `store.commit` in this process: the median of
 *     turns 1–10 and of the last ten turns over all repetitions, and their ratio;
 *   - the time a turn takes end to end, early and late, from the `turn.committed` events' clocks;
 *   - the Redis bytes the run leaves (`MEMORY USAGE` of each of its keys: snapshot, events,
 *     history, blobs);
 *   - the worker's memory: its live heap (after a full GC) at turn 11 and 20 turns before the end, and the
 *     growth per turn between them; the peak RSS during the run.
 * The line `turn 1000 vs turn 1 commit ratio: <x>` is the default (offload) configuration's.
 * `BENCH_TURNS` sets another number of turns (at least 40).
 *
 *   npm run bench:history
 *   BENCH_REPS=5 npm run bench:history
 */
import { fork, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  plan,
  silentLogger,
  Step,
  type AgentDefinition,
} from '../src/index.js';
import { startScriptedModelServer, type ScriptedReply } from '../src/testing/index.js';
import { startRedisServer } from '../test/helpers/redis-server.js';
import { runtimeCore } from '../src/runtime.js';
import { median, spread } from './stats.js';

const TURNS = Math.max(40, Number(process.env['BENCH_TURNS'] ?? 1000));
const RESULT_BYTES = 50_000;
const REPS = Math.max(1, Number(process.env['BENCH_REPS'] ?? 3));
/** Turns (1-based) whose commits make the early and the late figure. */
const EARLY = [1, 10] as const;
const LATE = [TURNS - 9, TURNS] as const;
const STEP_ID = 'reader';
/** Turns (1-based) after whose commit the worker's live heap is sampled. */
const HEAP_TURNS = [11, TURNS - 19];

type Config = 'offload' | 'inline';
const THRESHOLD: Record<Config, number> = { offload: 20_000, inline: 1_000_000_000 };

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const mib = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
const kib = (bytes: number) => `${(bytes / 1024).toFixed(1)} KiB`;

/** The model's replies for one run: `TURNS - 1` calls of `fetch_page`, then an answer. */
function script(): ScriptedReply[] {
  const replies: ScriptedReply[] = Array.from({ length: TURNS - 1 }, (_, n) => ({
    toolCalls: [{ name: 'fetch_page', arguments: { page: n } }],
    usage: { prompt_tokens: 1000, completion_tokens: 12 },
  }));
  replies.push({
    text: `Read ${TURNS - 1} pages.`,
    usage: { prompt_tokens: 1000, completion_tokens: 8 },
  });
  return replies;
}

/** A request to the model server's process, answered by the next message of type `answer`. */
function ask<T>(child: ChildProcess, type: string, answer: string): Promise<T> {
  return new Promise((resolve) => {
    const on = (message: { type: string }) => {
      if (message.type !== answer) return;
      child.off('message', on);
      resolve(message as T);
    };
    child.on('message', on);
    child.send({ type });
  });
}

/** 50 KB of varied words for page `n`, so the tokenizer cannot fold it into a few tokens. */
function page(n: number): string {
  let text = '';
  for (let i = 0; text.length < RESULT_BYTES; i++) text += `p${n}w${(i * 7919 + n) % 1000} `;
  return text.slice(0, RESULT_BYTES);
}

const fetchPage = defineTool({
  name: 'fetch_page',
  description: 'Returns one page of the corpus.',
  input: z.object({ page: z.number().int() }),
  class: 'read_only',
  run: ({ page: n }) => page(n),
});

interface RunFigures {
  /** Commit ms by 0-based turn. */
  commitMs: number[];
  /** ms per turn from the turn.committed clocks, early and late windows. */
  turnMsEarly: number;
  turnMsLate: number;
  redisBytes: Record<'snapshot' | 'events' | 'history' | 'blobs' | 'ledger' | 'other', number>;
  /** Live heap after a full GC, sampled after the commits of `HEAP_TURNS` (outside both windows). */
  heapAt: [number, number];
  peakRss: number;
  ms: number;
}

async function oneRun(
  url: string,
  child: ChildProcess,
  agent: AgentDefinition,
  config: Config,
): Promise<RunFigures> {
  const prefix = `h${randomUUID().slice(0, 6)}`;
  const runtime = createRuntime({ redis: url, prefix, logger: silentLogger }).agent(agent);
  const { redis } = runtimeCore(runtime);
  const { keys, store } = runtimeCore(runtime).stores;

  // Time every commit; the turn it commits is read from its turn.committed fact.
  const commitMs: number[] = [];
  const heapAt: [number, number] = [0, 0];
  const commit = store.commit.bind(store);
  store.commit = async (runId, expected, next, events, options) => {
    const t0 = performance.now();
    const envelope = await commit(runId, expected, next, events, options);
    const ms = performance.now() - t0;
    const turn = events.find((e) => e.type === 'turn.committed')?.['turn'];
    if (typeof turn === 'number') {
      commitMs[turn] = ms;
      const sample = HEAP_TURNS.indexOf(turn + 1);
      if (sample >= 0) {
        global.gc?.();
        heapAt[sample] = process.memoryUsage().heapUsed;
      }
    }
    return envelope;
  };

  const worker = runtime.createWorker({ concurrency: 1, recoverOnStart: false });
  await worker.ready();
  await ask(child, 'script', 'scripted');
  let peakRss = process.memoryUsage().rss;
  const thePlan = plan(`bench-history-${config}`, [
    Step.granular(STEP_ID, agent, 'Read every page.', {
      maxTurns: TURNS,
      blobThresholdBytes: THRESHOLD[config],
    }),
  ]);
  const { runId } = await runtime.start(thePlan, 'Read every page.');
  while ((await redis.scard(keys.activeRuns())) > 0) {
    peakRss = Math.max(peakRss, process.memoryUsage().rss);
    await sleep(25);
  }
  const { remaining } = await ask<{ remaining: number }>(child, 'remaining', 'remaining');
  if (remaining !== 0) throw new Error(`${config} run left ${remaining} replies`);

  const events = await store.readEvents(runId);
  const finished = events.find((e) => e.type === 'run.finished');
  if (finished?.data['status'] !== 'succeeded') {
    throw new Error(`${config} run ${runId} did not succeed: ${JSON.stringify(finished?.data)}`);
  }
  const turnAt = events.filter((e) => e.type === 'turn.committed').map((e) => Number(e.data['at']));
  if (turnAt.length !== TURNS || commitMs.filter((x) => x !== undefined).length !== TURNS) {
    throw new Error(`${config} run ${runId}: ${turnAt.length} turns committed, expected ${TURNS}`);
  }
  const created = Number(events.find((e) => e.type === 'run.created')?.data['at']);
  const perTurn = (from: number, to: number) =>
    (turnAt[to - 1]! - (from === 1 ? created : turnAt[from - 2]!)) / (to - from + 1);

  // Every key of the run shares its hash tag.
  const redisBytes = { snapshot: 0, events: 0, history: 0, blobs: 0, ledger: 0, other: 0 };
  let cursor = '0';
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `*{${runId}}*`, 'COUNT', 1000);
    cursor = next;
    for (const key of found) {
      const bytes = Number(await redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0'));
      const kind = key.slice(key.indexOf('}') + 2);
      if (kind.startsWith('snap')) redisBytes.snapshot += bytes;
      else if (kind.startsWith('events')) redisBytes.events += bytes;
      else if (kind.startsWith('history')) redisBytes.history += bytes;
      else if (kind.startsWith('blob')) redisBytes.blobs += bytes;
      else if (kind.startsWith('ledger')) redisBytes.ledger += bytes;
      else redisBytes.other += bytes;
    }
  } while (cursor !== '0');

  await worker.close();
  await runtime.close();
  return {
    commitMs,
    turnMsEarly: perTurn(...EARLY),
    turnMsLate: perTurn(...LATE),
    redisBytes,
    heapAt,
    peakRss,
    ms: turnAt[TURNS - 1]! - created,
  };
}

async function main(): Promise<void> {
  const server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', 'everysec']);
  const child = fork(import.meta.filename, ['--model-server'], {
    execArgv: ['--import', 'tsx'],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  try {
    const { url: modelUrl } = await new Promise<{ url: string }>((resolve, reject) => {
      child.once('message', (m: { url: string }) => resolve(m));
      child.once('exit', (code) => reject(new Error(`model server exited with ${code}`)));
    });
    const agent = defineAgent({
      name: 'reader',
      model: 'bench-model',
      provider: { baseURL: modelUrl, apiKey: 'bench' },
      systemPrompt: 'Fetch one page per turn until told otherwise, then answer in one sentence.',
      tools: [fetchPage],
      timeoutMs: 30_000,
    });

    global.gc?.();
    const rssAtStart = process.memoryUsage().rss;
    // Warm-up: one run of each configuration, untimed.
    await oneRun(server.url, child, agent, 'offload');
    await oneRun(server.url, child, agent, 'inline');

    const runs: Record<Config, RunFigures[]> = { offload: [], inline: [] };
    for (let rep = 0; rep < REPS; rep++) {
      const order: Config[] = rep % 2 === 0 ? ['offload', 'inline'] : ['inline', 'offload'];
      for (const config of order) runs[config].push(await oneRun(server.url, child, agent, config));
    }

    console.log(
      `${TURNS}-turn granular agent: ${TURNS - 1} tool results of ${RESULT_BYTES / 1000} KB (all different), then an answer`,
    );
    console.log(
      `one run at a time, worker concurrency 1, model at 0 ms; AOF appendfsync everysec; ${REPS} runs per configuration; median (min–max over runs)`,
    );
    console.log(
      `worker RSS before the first run ${mib(rssAtStart)}${global.gc === undefined ? '; heap figures without --expose-gc: rough' : ''}\n`,
    );
    const window = (figures: RunFigures[], [from, to]: readonly [number, number]) =>
      figures.flatMap((f) => f.commitMs.slice(from - 1, to));
    const ratios: Record<Config, number> = { offload: 0, inline: 0 };
    for (const config of ['offload', 'inline'] as const) {
      const fs = runs[config];
      const early = window(fs, EARLY);
      const late = window(fs, LATE);
      ratios[config] = median(late) / median(early);
      const row = (label: string, value: string, note = '') =>
        console.log(`  ${label.padEnd(36)}${value.padStart(12)}  ${note}`);
      console.log(
        `${config === 'offload' ? 'offload (default, threshold 20 000 B)' : 'inline (no offload)'}`,
      );
      row('commit, turns 1–10', `${median(early).toFixed(3)} ms`, `(${spread(early, 3)})`);
      row(
        `commit, turns ${LATE[0]}–${LATE[1]}`,
        `${median(late).toFixed(3)} ms`,
        `(${spread(late, 3)})`,
      );
      row('late / early commit', ratios[config].toFixed(3));
      for (const [label, xs] of [
        ['turn end to end, turns 1–10', fs.map((f) => f.turnMsEarly)],
        [`turn end to end, turns ${LATE[0]}–${LATE[1]}`, fs.map((f) => f.turnMsLate)],
      ] as const) {
        row(label, `${median(xs).toFixed(2)} ms`, `(${spread(xs, 2)})`);
      }
      row('whole run', `${(median(fs.map((f) => f.ms)) / 1000).toFixed(2)} s`);
      const b = fs[0]!.redisBytes;
      const total = Object.values(b).reduce((x, y) => x + y, 0);
      row(
        'Redis bytes of the run',
        mib(total),
        `history ${mib(b.history)}, blobs ${mib(b.blobs)}, ledger ${mib(b.ledger)}, events ${kib(b.events)}, snapshot ${kib(b.snapshot)}, other ${kib(b.other)}`,
      );
      const [h0, h1] = [0, 1].map((i) => median(fs.map((f) => f.heapAt[i]!)));
      row(
        `worker live heap at turn ${HEAP_TURNS[0]} → ${HEAP_TURNS[1]}`,
        `${mib(h0!)} → ${mib(h1!)}`,
        `${((h1! - h0!) / (HEAP_TURNS[1]! - HEAP_TURNS[0]!) / 1024).toFixed(1)} KiB per turn`,
      );
      row('worker peak RSS during the run', mib(median(fs.map((f) => f.peakRss))));
      console.log('');
    }
    console.log(`turn ${TURNS} vs turn 1 commit ratio: ${ratios.offload.toFixed(2)}`);
  } finally {
    child.disconnect();
    await server.stop();
  }
}

// ---------------------------------------------------------------------------------------------
// The model server's process: started with `--model-server`, it prints its URL and re-scripts
// itself (emptying its request log) on every `script` message.
if (process.argv[2] === '--model-server') {
  const model = await startScriptedModelServer();
  process.on('message', (message: { type: string }) => {
    if (message.type === 'script') {
      model.reset();
      model.script(script());
      process.send!({ type: 'scripted' });
    } else if (message.type === 'remaining') {
      process.send!({ type: 'remaining', remaining: model.remaining });
    }
  });
  process.on('disconnect', () => void model.close().then(() => process.exit(0)));
  process.send!({ type: 'url', url: model.url });
} else {
  await main();
}
