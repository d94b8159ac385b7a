/**
 * Cost of one agent turn: a 20-turn agent (19 replies that each call a no-op read-only tool, then a
 * final answer) against the scripted model server answering at 0 ms and at 50 ms, in atomic mode
 * (the whole loop in one unit, one commit at the end) and in granular mode (one unit and one commit
 * per turn), one run at a time on a worker of concurrency 1, on a private redis-server with AOF
 * `everysec`. Measured in the same run, beside it:
 *   - the model round trip alone: the `openai` client against the scripted server at 0 ms, the same
 *     20 requests with the same growing conversation, no Redis, over the same fetch the runtime
 *     gives its model clients (`nodeHttpFetch`);
 *   - a bare WATCH/HGET/MULTI/HSET/XADD/RPUSH/EXEC commit of a payload the size of a granular turn's
 *     commit (its snapshot, events and messages, measured from a real run): the CAS floor.
 * The worker runs as configured by default: a granular step's turns follow one another in the job
 * of its first turn (chained units, see `chainMs`). At 0 ms, granular is also timed with one job
 * per turn (`chainMs: 0`), so the cost of a turn's own queue hop stays visible.
 * A run's time is read from its own events (`run.created` → `run.finished`).
 * Beside each time, the Redis round trips a turn waits on (see `countTrips`) and the commands it
 * sends: counted from the run's second model request to its last, over the turns in between (the
 * steady state: a run's first load and its end are left out). Granular at 0 ms is also run with a
 * tenant quota set (one the runs never reach), so each reservation is checked against it.
 *
 *   npm run bench:agent
 *   BENCH_REPS=5 BENCH_RUNS=10 BENCH_SLOW_RUNS=3 npm run bench:agent
 */
import { randomUUID } from 'node:crypto';
import { subscribe } from 'node:diagnostics_channel';
import type { IncomingMessage } from 'node:http';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  plan,
  silentLogger,
  Step,
  type AgentDefinition,
  type Plan,
} from '../src/index.js';
import {
  startScriptedModelServer,
  type ScriptedModelServer,
  type ScriptedReply,
} from '../src/testing/index.js';
import { startRedisServer } from '../test/helpers/redis-server.js';
import { runtimeCore } from '../src/runtime.js';
import { nodeHttpFetch } from '../src/llm/http-fetch.js';
import { median, spread } from './stats.js';

const TURNS = 20;
const REPS = Number(process.env['BENCH_REPS'] ?? 5);
/** Runs per repetition with the 0 ms model. */
const RUNS = Number(process.env['BENCH_RUNS'] ?? 10);
/** Runs per repetition with the 50 ms model (each takes a second or more). */
const SLOW_RUNS = Number(process.env['BENCH_SLOW_RUNS'] ?? 3);
const LATENCIES = [0, 50] as const;
const STEP_ID = 'loop';
const SYSTEM_PROMPT = 'Call noop once per turn until told otherwise, then answer in one sentence.';
const USER_INPUT = 'Count the turns.';

type Mode = 'atomic' | 'granular';

// Model requests in flight in this process, and the counts of the runtime being measured as each
// request went out. Seen through Node's HTTP client diagnostics channels: the runtime's model
// clients send plain requests over node:http.
let modelPending = 0;
let measured: Trips | undefined;
const marks: Trips[] = [];
const open = new WeakSet<object>();
const ended = (request: object) => {
  if (open.delete(request)) modelPending--;
};
subscribe('http.client.request.start', (message) => {
  if (measured !== undefined) marks.push({ ...measured });
  open.add((message as { request: object }).request);
  modelPending++;
});
subscribe('http.client.request.error', (message) => {
  ended((message as { request: object }).request);
});
subscribe('http.client.response.finish', (message) => {
  // Published when the reply's head arrives; the request is over once its body has been read.
  const { request, response } = message as { request: object; response: IncomingMessage };
  response.once('end', () => ended(request));
  response.once('close', () => ended(request));
});

/** What a runtime's Redis connection sent and waited on. */
interface Trips {
  commands: number;
  /** Round trips on the critical path (see {@link countTrips}). */
  trips: number;
}

/**
 * Counts the commands a runtime sends on its shared Redis connection, and its round trips on the
 * critical path: a stretch from a command sent while none was outstanding to the reply that
 * leaves none outstanding is one round trip, unless a model request was still in flight when it
 * ended (it was then hidden behind the model call, as the mark that a request went out is).
 * Commands sent together (a pipeline, or in one turn of the event loop) share one round trip.
 */
function countTrips(redis: Redis): Trips {
  const counts: Trips = { commands: 0, trips: 0 };
  let outstanding = 0;
  const send = redis.sendCommand.bind(redis);
  const counting = (command: { promise: Promise<unknown> }, stream?: unknown) => {
    counts.commands++;
    outstanding++;
    // Registered before the caller awaits the reply, so it runs before the caller goes on.
    const done = () => {
      outstanding--;
      if (outstanding === 0 && modelPending === 0) counts.trips++;
    };
    command.promise.then(done, done);
    return send(command as Parameters<Redis['sendCommand']>[0], stream as undefined);
  };
  redis.sendCommand = counting;
  return counts;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const noop = defineTool({
  name: 'noop',
  description: 'Does nothing.',
  input: z.object({ n: z.number() }),
  class: 'read_only',
  run: () => ({ ok: true }),
});

/**
 * The model's replies for one run: 19 calls of `noop` (arguments differ per turn, so atomic mode's
 * ledger, keyed by arguments, runs every call too), then a final answer; each after `latencyMs`.
 */
function script(latencyMs: number): ScriptedReply[] {
  const replies: ScriptedReply[] = Array.from({ length: TURNS - 1 }, (_, n) => ({
    toolCalls: [{ name: 'noop', arguments: { n } }],
    usage: { prompt_tokens: 40 + 20 * n, completion_tokens: 12 },
  }));
  replies.push({
    text: `Done after ${TURNS} turns.`,
    usage: { prompt_tokens: 40 + 20 * TURNS, completion_tokens: 8 },
  });
  return latencyMs === 0
    ? replies
    : replies.map((then) => ({ fault: 'delay', ms: latencyMs, then }));
}

function agentPlan(agent: AgentDefinition, mode: Mode): Plan {
  const step =
    mode === 'granular'
      ? Step.granular(STEP_ID, agent, USER_INPUT, { maxTurns: TURNS })
      : Step.agent(STEP_ID, agent, USER_INPUT, { maxTurns: TURNS });
  return plan(`bench-agent-${mode}`, [step]);
}

/**
 * `runs` runs of the agent, one after the other, on a worker of concurrency 1, after one untimed run
 * that opens the new runtime's connections. Each run is timed by its own events (created →
 * finished). Completion is detected with one SCARD of the active-runs set every 10 ms: the events
 * time the run, so the poll only needs to be rare enough not to compete with the worker. Returns
 * the summed run time in ms and the ids of the timed runs.
 */
async function agentRuns(
  url: string,
  model: ScriptedModelServer,
  agent: AgentDefinition,
  mode: Mode,
  latencyMs: number,
  runs: number,
  chainMs?: number,
  quota = false,
): Promise<{ ms: number; runIds: string[]; prefix: string; trips: Trips }> {
  const prefix = `b${randomUUID().slice(0, 6)}`;
  const runtime = createRuntime({ redis: url, prefix, logger: silentLogger }).agent(agent);
  if (quota) await runtime.setTenantQuota('default', { maxTokens: 1_000_000_000_000 });
  const { keys } = runtimeCore(runtime).stores;
  // Polled on a connection of its own, so the counts below hold only the runtime's commands.
  const poll = new Redis(url);
  const idle = async () => {
    while ((await poll.scard(keys.activeRuns())) > 0) await sleep(10);
  };
  const counted = countTrips(runtimeCore(runtime).redis);
  measured = counted;
  const trips: Trips = { commands: 0, trips: 0 };
  const worker = runtime.createWorker({
    concurrency: 1,
    recoverOnStart: false,
    ...(chainMs === undefined ? {} : { chainMs }),
  });
  await worker.ready();
  const thePlan = agentPlan(agent, mode);
  const replies = script(latencyMs);
  const runIds: string[] = [];
  for (let i = 0; i <= runs; i++) {
    // A fresh script and an empty request log per run (the server keeps every request it saw).
    model.reset();
    model.script(replies);
    marks.length = 0;
    const { runId } = await runtime.start(thePlan, USER_INPUT);
    await idle();
    if (model.remaining !== 0) throw new Error(`${mode} run left ${model.remaining} replies`);
    if (i > 0) {
      runIds.push(runId);
      const [second, last] = [marks[1]!, marks[TURNS - 1]!];
      trips.commands += last.commands - second.commands;
      trips.trips += last.trips - second.trips;
    }
  }
  measured = undefined;
  let ms = 0;
  for (const runId of runIds) {
    const events = await runtimeCore(runtime).stores.store.readEvents(runId);
    const created = events.find((e) => e.type === 'run.created');
    const finished = events.find((e) => e.type === 'run.finished');
    const produced = (
      finished?.data['produced'] as
        Record<string, { turns?: number; toolCalls?: number }> | undefined
    )?.[STEP_ID];
    if (created === undefined || finished?.data['status'] !== 'succeeded') {
      throw new Error(`${mode} run ${runId} did not succeed: ${JSON.stringify(finished?.data)}`);
    }
    if (produced?.turns !== TURNS || produced.toolCalls !== TURNS - 1) {
      throw new Error(`${mode} run ${runId} produced ${JSON.stringify(produced)}`);
    }
    ms += Number(finished.data['at']) - Number(created.data['at']);
  }
  await worker.close();
  await runtime.close();
  poll.disconnect();
  return { ms, runIds, prefix, trips };
}

/**
 * The model round trip alone: the `openai` client runs the same 20-request loop against the
 * scripted server at 0 ms (the conversation growing by an assistant and a tool message per turn),
 * with no Redis and no runtime. Returns ms per request.
 */
async function modelRoundTrips(model: ScriptedModelServer, runs: number): Promise<number> {
  const client = new OpenAI({
    baseURL: model.url,
    apiKey: 'bench',
    maxRetries: 0,
    fetch: nodeHttpFetch,
  });
  const tools = [
    {
      type: 'function' as const,
      function: {
        name: 'noop',
        description: 'Does nothing.',
        parameters: {
          type: 'object',
          properties: { n: { type: 'number' } },
          required: ['n'],
          additionalProperties: false,
        },
      },
    },
  ];
  let ms = 0;
  for (let r = 0; r < runs; r++) {
    model.reset();
    model.script(script(0));
    const messages: ChatCompletionMessageParam[] = [
      { role: 'system', content: SYSTEM_PROMPT },
      { role: 'user', content: USER_INPUT },
    ];
    const t0 = performance.now();
    for (let turn = 0; turn < TURNS; turn++) {
      const completion = await client.chat.completions.create({
        model: 'bench-model',
        messages,
        tools,
      });
      const message = completion.choices[0]!.message;
      messages.push({
        role: 'assistant',
        content: message.content,
        ...(message.tool_calls === undefined ? {} : { tool_calls: message.tool_calls }),
      });
      for (const call of message.tool_calls ?? []) {
        messages.push({ role: 'tool', tool_call_id: call.id, content: '{"ok":true}' });
      }
    }
    ms += performance.now() - t0;
  }
  return ms / (runs * TURNS);
}

/** What a granular turn's commit writes, by size: the snapshot, its events, its messages. */
interface TurnPayload {
  snapshot: number;
  events: { type: string; json: string }[];
  messages: string[];
}

/**
 * The commit of a middle turn of a finished granular run, as written: its events and messages, and
 * the run's stored snapshot (the final one, a little larger than a middle turn's).
 */
async function turnPayload(url: string, prefix: string, runId: string): Promise<TurnPayload> {
  const runtime = createRuntime({ redis: url, prefix, logger: silentLogger });
  try {
    const { redis } = runtimeCore(runtime);
    const { store, keys, history } = runtimeCore(runtime).stores;
    const events = await store.readEvents(runId);
    const turn = events.find((e) => e.type === 'turn.committed' && e.data['turn'] === TURNS / 2);
    if (turn === undefined) throw new Error(`run ${runId} has no turn ${TURNS / 2}`);
    const cursor = Number(turn.data['cursor']);
    const messages = await history.read(runId, STEP_ID, { from: cursor - 2, to: cursor });
    return {
      // A turn's commit writes the run's field and its step's field of the snapshot.
      snapshot:
        (await redis.hstrlen(keys.snap(runId), 'run')) +
        (await redis.hstrlen(keys.snap(runId), `s:${STEP_ID}`)),
      events: events
        .filter((e) => e.version === turn.version)
        .map((e) => ({ type: e.type, json: JSON.stringify(e.data) })),
      messages: messages.map((m) => JSON.stringify(m)),
    };
  } finally {
    await runtime.close();
  }
}

/** The CAS floor: ms per bare WATCH/HGET/MULTI/HSET/XADD…/RPUSH/EXEC of a turn's payload. */
async function bareCas(url: string, payload: TurnPayload, n: number): Promise<number> {
  const r = new Redis(url);
  const tag = `{bench-cas-${randomUUID().slice(0, 6)}}`;
  const snap = `${tag}:snap`;
  const stream = `${tag}:events`;
  const list = `${tag}:history`;
  const s = 'x'.repeat(payload.snapshot);
  await r.hset(snap, 'v', '0', 'sv', '1', 's', s, 'u', String(Date.now()));
  const t0 = performance.now();
  for (let v = 0; v < n; v++) {
    const [, stored] = await Promise.all([r.watch(snap), r.hget(snap, 'v')]);
    if (stored !== String(v)) throw new Error(`bare CAS: expected version ${v}, found ${stored}`);
    const vs = String(v + 1);
    const tx = r.multi().hset(snap, 'v', vs, 'sv', '1', 's', s, 'u', String(Date.now()));
    for (const e of payload.events) tx.xadd(stream, '*', 'v', vs, 't', e.type, 'd', e.json);
    tx.rpush(list, ...payload.messages);
    const replies = await tx.exec();
    if (replies === null) throw new Error('bare CAS: EXEC aborted');
    for (const [err] of replies) if (err !== null) throw err;
  }
  const ms = (performance.now() - t0) / n;
  await r.del(snap, stream, list);
  r.disconnect();
  return ms;
}

const server = await startRedisServer(['--appendonly', 'yes', '--appendfsync', 'everysec']);
const model = await startScriptedModelServer();
try {
  const agent = defineAgent({
    name: 'counter',
    model: 'bench-model',
    provider: { baseURL: model.url, apiKey: 'bench' },
    systemPrompt: SYSTEM_PROMPT,
    tools: [noop],
    timeoutMs: 10_000,
  });
  const perTurn = (ms: number, runs: number) => ms / (runs * TURNS);

  // Warm-up: every path once or more, and a granular run to size the bare commit's payload.
  await modelRoundTrips(model, 5);
  await agentRuns(server.url, model, agent, 'atomic', 0, 5);
  const warm = await agentRuns(server.url, model, agent, 'granular', 0, 5);
  await agentRuns(server.url, model, agent, 'granular', 0, 5, 0);
  const payload = await turnPayload(server.url, warm.prefix, warm.runIds[0]!);
  await bareCas(server.url, payload, 1000);

  const rows = {
    model: [] as number[],
    cas: [] as number[],
    atomic0: [] as number[],
    granular0: [] as number[],
    atomic50: [] as number[],
    granular50: [] as number[],
    single0: [] as number[],
    quota0: [] as number[],
  };
  /** Round trips and commands per turn, by row. */
  const trips = new Map<string, { trips: number[]; commands: number[] }>();
  const tripsOf = (row: string, t: Trips, runs: number) => {
    const entry = trips.get(row) ?? { trips: [], commands: [] };
    entry.trips.push(t.trips / (runs * (TURNS - 2)));
    entry.commands.push(t.commands / (runs * (TURNS - 2)));
    trips.set(row, entry);
  };
  for (let rep = 0; rep < REPS; rep++) {
    rows.model.push(await modelRoundTrips(model, RUNS));
    rows.cas.push(await bareCas(server.url, payload, 2000));
    // Alternate the order so drift (AOF rewrite, GC, other load) hits both modes alike.
    const order: Mode[] = rep % 2 === 0 ? ['atomic', 'granular'] : ['granular', 'atomic'];
    for (const latency of LATENCIES) {
      const runs = latency === 0 ? RUNS : SLOW_RUNS;
      for (const mode of order) {
        const done = await agentRuns(server.url, model, agent, mode, latency, runs);
        rows[`${mode}${latency}`].push(perTurn(done.ms, runs));
        tripsOf(`${mode}${latency}`, done.trips, runs);
      }
    }
    const single = await agentRuns(server.url, model, agent, 'granular', 0, RUNS, 0);
    rows.single0.push(perTurn(single.ms, RUNS));
    tripsOf('single0', single.trips, RUNS);
    const quota = await agentRuns(server.url, model, agent, 'granular', 0, RUNS, undefined, true);
    rows.quota0.push(perTurn(quota.ms, RUNS));
    tripsOf('quota0', quota.trips, RUNS);
  }

  const bytes =
    payload.snapshot +
    payload.events.reduce((n, e) => n + e.json.length, 0) +
    payload.messages.reduce((n, m) => n + m.length, 0);
  console.log(
    `${TURNS}-turn agent (${TURNS - 1} no-op tool calls, then an answer), one run at a time, worker concurrency 1`,
  );
  console.log(
    `AOF appendfsync everysec; ${REPS} repetitions of ${RUNS} runs (0 ms model) and ${SLOW_RUNS} runs (50 ms model); median, min–max`,
  );
  console.log(
    `a granular turn's commit: snapshot ${payload.snapshot} B, ${payload.events.length} event(s) (${payload.events.map((e) => e.type).join(', ')}), ${payload.messages.length} messages; ${bytes} B in all\n`,
  );
  const row = (label: string, xs: number[], unit: string, note = '', key?: string) => {
    const t = key === undefined ? undefined : trips.get(key);
    const rt =
      t === undefined
        ? ''
        : `  ${median(t.trips).toFixed(2)} round trips, ${median(t.commands).toFixed(2)} commands per turn`;
    console.log(
      `  ${label.padEnd(34)}${median(xs).toFixed(3).padStart(8)} ${unit.padEnd(8)} (${spread(xs)})${rt}${note}`,
    );
  };
  row('model round trip alone (0 ms)', rows.model, 'ms', '  openai client, no Redis');
  row('bare WATCH/MULTI/EXEC commit', rows.cas, 'ms', '  same-size payload');
  for (const latency of LATENCIES) {
    const atomic = rows[`atomic${latency}`];
    const granular = rows[`granular${latency}`];
    console.log(`\n${latency} ms model`);
    row('atomic', atomic, 'ms/turn', '', `atomic${latency}`);
    row(
      'granular',
      granular,
      'ms/turn',
      latency === 0 ? '  (target ≤ 1.5)' : '',
      `granular${latency}`,
    );
    if (latency === 0) {
      row('granular, one job per turn', rows.single0, 'ms/turn', '  chainMs: 0', 'single0');
      row('granular, tenant quota', rows.quota0, 'ms/turn', '', 'quota0');
    }
    const ratio = median(granular) / median(atomic);
    console.log(
      `  ${'granular / atomic'.padEnd(34)}${ratio.toFixed(3).padStart(8)}${latency === 50 ? '          (target ≤ 1.05)' : ''}`,
    );
    if (latency === 0) {
      const share = (x: number[]) => `${((100 * median(rows.model)) / median(x)).toFixed(0)}%`;
      console.log(
        `  ${'model round trip share of a turn'.padEnd(34)}${share(atomic).padStart(8)} of atomic, ${share(granular)} of granular`,
      );
    }
    const overhead = median(granular) - median(atomic);
    console.log(
      `  ${'durability overhead per turn'.padEnd(34)}${overhead.toFixed(3).padStart(8)} ms       granular − atomic, beside a bare commit of ${median(rows.cas).toFixed(3)} ms`,
    );
  }
  const granularTrips = median(trips.get('granular0')?.trips ?? [0]);
  console.log(`\ngranular at 0 ms model: ${granularTrips.toFixed(2)} Redis round trips per turn`);
  console.log(`granular at 0 ms model: ${median(rows.granular0).toFixed(2)} ms per turn`);
} finally {
  await model.close();
  await server.stop();
}
