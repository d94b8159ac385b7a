/**
 * The research agent's library: the markdown files in `corpus/` (nine short notes on how honeybee
 * colonies get through the winter) and a small keyword search over them. Deterministic: the same
 * query always finds the same hits in the same order, so a re-run of a turn sees what the first
 * run saw.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Where the corpus files are. */
export const CORPUS_DIR = fileURLToPath(new URL('./corpus', import.meta.url));

/** One file of the corpus. */
export interface Doc {
  file: string;
  title: string;
  text: string;
}

/** One search hit. */
export interface Hit {
  file: string;
  title: string;
  /** The sentence of the file that matches the query best. */
  snippet: string;
  score: number;
}

const STOP = new Set(
  'a an and are as at be by can do does for from get gets has have how in into is it its of on or so that the their them then there they this to was what when where which while who why will with without you your'.split(
    ' ',
  ),
);

/** A word as the index keeps it: lower case, with a plural ending taken off. */
function stem(word: string): string {
  if (word.endsWith('ies') && word.length > 4) return `${word.slice(0, -3)}y`;
  if (word.endsWith('sses')) return word.slice(0, -2);
  if (word.endsWith('s') && !word.endsWith('ss') && word.length > 3) return word.slice(0, -1);
  return word;
}

/** The words of a text that count for search, in order, stop words left out. */
export function terms(text: string): string[] {
  return (text.toLowerCase().match(/[a-z0-9]+/g) ?? [])
    .filter((w) => w.length > 1 && !STOP.has(w))
    .map(stem);
}

let docs: Doc[] | undefined;

/** The corpus, read once, sorted by file name. */
export function corpus(): Doc[] {
  docs ??= readdirSync(CORPUS_DIR)
    .filter((f) => f.endsWith('.md') || f.endsWith('.txt'))
    .sort()
    .map((file) => {
      const raw = readFileSync(join(CORPUS_DIR, file), 'utf8');
      const title = /^#\s+(.+)$/m.exec(raw)?.[1]?.trim() ?? file;
      const text = raw.replace(/^#.*$/m, '').replace(/\s+/g, ' ').trim();
      return { file, title, text };
    });
  return docs;
}

const sentences = (text: string): string[] =>
  text
    .split(/(?<=[.!?])\s+(?=[A-Z("])/)
    .map((s) => s.replace(/^- /, '').trim())
    .filter((s) => s.length > 0);

/**
 * The files that match `query` best, by BM25: a query word counts more the rarer it is in the
 * corpus, with diminishing returns for repeats; a word in the title counts three times. Ties go to
 * the file name that sorts first.
 */
export function search(query: string, limit = 3): Hit[] {
  const wanted = [...new Set(terms(query))];
  if (wanted.length === 0) return [];
  const docs = corpus().map((doc) => ({
    doc,
    words: [...terms(doc.text), ...[1, 2, 3].flatMap(() => terms(doc.title))],
  }));
  const avg = docs.reduce((n, d) => n + d.words.length, 0) / docs.length;
  const idf = (w: string) => {
    const df = docs.filter((d) => d.words.includes(w)).length;
    return Math.log(1 + (docs.length - df + 0.5) / (df + 0.5));
  };
  const hits: Hit[] = [];
  for (const { doc, words } of docs) {
    let score = 0;
    for (const w of wanted) {
      const tf = words.filter((t) => t === w).length;
      score += (idf(w) * tf * 2.2) / (tf + 1.2 * (0.25 + (0.75 * words.length) / avg));
    }
    if (score === 0) continue;
    let snippet = '';
    let best = -1;
    for (const s of sentences(doc.text)) {
      const found = new Set(terms(s).filter((t) => wanted.includes(t))).size;
      if (found > best) {
        best = found;
        snippet = s;
      }
    }
    hits.push({ file: doc.file, title: doc.title, snippet, score: Math.round(score * 100) / 100 });
  }
  return hits
    .sort((a, b) => b.score - a.score || (a.file < b.file ? -1 : 1))
    .slice(0, Math.max(1, limit));
}
