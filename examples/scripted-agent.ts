/**
 * A job module whose agent talks to the scripted model server of `flujo/testing`, which answers
 * every request with a function of that request (`defaultReply`) instead of a queue that plays
 * once: a long-lived `flujo worker` runs any number of runs of it.
 *
 *   npx flujo run examples/scripted-agent.ts --input '{"text":"one two three"}'
 *   npx flujo worker examples/scripted-agent.ts
 */
import { defineAgent, defineTool, Step, plan as planOf } from 'flujo';
import { startScriptedModelServer, type ScriptedModelServer } from 'flujo/testing';
import { z } from 'zod';

const countWords = defineTool({
  name: 'count_words',
  input: z.object({ text: z.string() }),
  class: 'read_only',
  run: ({ text }) => ({ words: text.split(/\s+/).filter((w) => w !== '').length }),
});

export const plan = planOf('count-words', [Step.agent('count', 'counter')]);
export const input = { text: 'durable runs survive a crash' };

let model: ScriptedModelServer | undefined;

/** Called once before run, resume and worker: starts the model; its teardown stops it. */
export async function setup() {
  model = await startScriptedModelServer({
    // Every request, as long as the process lives: call the tool once, then answer with its result.
    defaultReply: ({ messages, tools }) => {
      const result = messages.findLast((m) => m.role === 'tool');
      if (result === undefined) {
        const { text } = JSON.parse(String(messages.at(-1)?.content)) as { text: string };
        const tool = tools[0]?.function?.name ?? 'count_words';
        return { toolCalls: [{ name: tool, arguments: { text } }] };
      }
      const { words } = JSON.parse(String(result.content)) as { words: number };
      return { text: `${words} words.` };
    },
  });
  return () => model?.close();
}

/** Called after setup, when the model's URL is known. */
export const agents = () => [
  defineAgent({
    name: 'counter',
    model: 'scripted-counter',
    provider: { baseURL: model!.url, apiKey: 'unused' },
    systemPrompt: 'Count the words of the text with count_words, then say how many.',
    tools: [countWords],
  }),
];
