/**
 * What the scripted model plays for the research agent: a plausible researcher that searches the
 * corpus, writes notes, e-mails a summary and answers. Each reply is a function of the request
 * alone: the turn is the number of assistant messages the conversation already holds, and the
 * notes, the e-mail and the answer are built from the tool results in it. So a retried or resumed
 * turn gets the reply that fits the history it sends, in any process, and two runs with the same
 * input get the same answer.
 */
import type { RecordedRequest, RequestMessage, ScriptedReply } from 'flujo/testing';
import { textOf } from '../durable-job/model.ts';
import { terms, type Hit } from './corpus.ts';

/** The address the summary goes to when the run input names none. */
export const DEFAULT_TO = 'beekeepers@tidewater.example';

/** What the run asks: the first user message, JSON `{ question, to }` or plain text. */
export function askOf(messages: readonly RequestMessage[]): { question: string; to: string } {
  const text = textOf(messages.find((m) => m.role === 'user')?.content);
  try {
    const value = JSON.parse(text) as { question?: unknown; to?: unknown };
    if (typeof value.question === 'string') {
      return { question: value.question, to: typeof value.to === 'string' ? value.to : DEFAULT_TO };
    }
  } catch {
    // plain text: the question itself
  }
  return { question: text, to: DEFAULT_TO };
}

interface Call {
  name: string;
  args: Record<string, unknown>;
  result: unknown;
}

/** The tool calls the conversation holds, each with its arguments and its result. */
function callsOf(messages: readonly RequestMessage[]): Call[] {
  const results = new Map<string, unknown>();
  for (const m of messages) {
    if (m.role !== 'tool' || typeof m['tool_call_id'] !== 'string') continue;
    try {
      results.set(m['tool_call_id'], JSON.parse(textOf(m.content)));
    } catch {
      results.set(m['tool_call_id'], textOf(m.content));
    }
  }
  const calls: Call[] = [];
  for (const m of messages) {
    if (m.role !== 'assistant' || !Array.isArray(m['tool_calls'])) continue;
    for (const c of m['tool_calls'] as {
      id: string;
      function: { name: string; arguments: string };
    }[]) {
      let args: Record<string, unknown> = {};
      try {
        args = JSON.parse(c.function.arguments) as Record<string, unknown>;
      } catch {
        // left empty
      }
      calls.push({ name: c.function.name, args, result: results.get(c.id) });
    }
  }
  return calls;
}

/** Every search hit in the conversation, each file once (its best score), in the order found. */
function hitsOf(calls: readonly Call[]): Hit[] {
  const seen = new Map<string, Hit>();
  for (const c of calls) {
    if (c.name !== 'search_corpus') continue;
    for (const hit of (c.result as { hits?: Hit[] } | undefined)?.hits ?? []) {
      const before = seen.get(hit.file);
      if (before === undefined || hit.score > before.score) seen.set(hit.file, hit);
    }
  }
  return [...seen.values()];
}

/** A few sentences from the best hits. */
function summaryOf(hits: readonly Hit[]): string {
  if (hits.length === 0) return 'The corpus has nothing on this question.';
  // The four best, in the order they were found.
  const best = new Set([...hits].sort((a, b) => b.score - a.score).slice(0, 4));
  const said = hits.filter((h) => best.has(h)).map((h) => h.snippet);
  return `From ${hits.length} notes in the corpus: ${said.join(' ')}`;
}

/** The reply to one request of the research agent's conversation. */
export function researchReply(request: RecordedRequest): ScriptedReply {
  const { messages } = request;
  const turn = messages.filter((m) => m.role === 'assistant').length;
  const { question, to } = askOf(messages);
  const calls = callsOf(messages);
  const hits = hitsOf(calls);
  const words = [...new Set(terms(question))];
  const keywords = words.join(' ') || question;
  switch (turn) {
    case 0:
      // Two searches at once: the question, and what goes wrong (its last keyword: the topic).
      return {
        text: 'Searching the corpus.',
        toolCalls: [
          { id: 'search_1', name: 'search_corpus', arguments: { query: keywords } },
          {
            id: 'search_2',
            name: 'search_corpus',
            arguments: { query: `${words.at(-1) ?? keywords} losses causes` },
          },
        ],
      };
    case 1: {
      const sources = hits.map((h) => `- ${h.title} (${h.file}): ${h.snippet}`);
      const text = [`Question: ${question}`, '', 'Sources:', ...sources, '', summaryOf(hits)];
      return {
        toolCalls: [
          {
            id: 'notes_1',
            name: 'write_notes',
            arguments: { title: question, text: text.join('\n') },
          },
        ],
      };
    }
    case 2: {
      const notes = calls.find((c) => c.name === 'write_notes')?.result as
        { url?: string } | undefined;
      if (typeof notes?.url !== 'string') {
        return { text: `${summaryOf(hits)}\n\n(The notes were not saved, so no e-mail was sent.)` };
      }
      return {
        toolCalls: [
          {
            id: 'email_1',
            name: 'send_email',
            arguments: {
              to,
              subject: `Research summary: ${question}`,
              body: `${summaryOf(hits)}\n\nThe notes are attached.`,
              attachmentUrl: notes.url,
            },
          },
        ],
      };
    }
    default: {
      const sent = calls.some((c) => c.name === 'send_email');
      return {
        text: `${summaryOf(hits)}\n\nNotes saved ("${question}")${sent ? `; the summary was e-mailed to ${to}.` : '.'}`,
      };
    }
  }
}
