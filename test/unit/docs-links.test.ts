/**
 * Every relative link in README.md, CONTRIBUTING.md and docs/**\/*.md points at a file that exists,
 * and a link to a heading of a markdown page (`page.md#heading`) at a heading that exists. The
 * generated API reference (docs/api/, not kept in the repository) is not checked.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));

function markdownUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory())
      return path === join(root, 'docs/api') ? [] : markdownUnder(path);
    return name.endsWith('.md') ? [path] : [];
  });
}

const pages = [
  join(root, 'README.md'),
  ...(existsSync(join(root, 'CONTRIBUTING.md')) ? [join(root, 'CONTRIBUTING.md')] : []),
  ...markdownUnder(join(root, 'docs')),
];

/** The page's text without fenced code blocks and inline code, where links are not links. */
function prose(text: string): string {
  return text.replace(/^```[\s\S]*?^```/gm, '').replace(/`[^`\n]*`/g, '');
}

/** Link targets: `[text](target)` and `![alt](target)`, a title after the target left out. */
function links(text: string): string[] {
  return [...prose(text).matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)].map((m) => m[1]!);
}

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes. */
function slug(heading: string): string {
  return heading
    .replace(/`/g, '')
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

function anchors(file: string): Set<string> {
  const text = readFileSync(file, 'utf8').replace(/^```[\s\S]*?^```/gm, '');
  return new Set([...text.matchAll(/^#{1,6} (.+)$/gm)].map((m) => slug(m[1]!)));
}

describe('links in the docs', () => {
  it('checks the pages it should', () => {
    const names = pages.map((p) => relative(root, p));
    expect(names).toContain('README.md');
    expect(names).toContain('docs/concepts.md');
    expect(names).toContain('docs/reference/errors.md');
  });

  it('every relative link points at a file that exists, and at a heading of it', () => {
    const broken: string[] = [];
    for (const page of pages) {
      for (const target of links(readFileSync(page, 'utf8'))) {
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:, …
        const [path = '', anchor] = target.split('#');
        const file = path === '' ? page : resolve(dirname(page), decodeURI(path));
        const where = `${relative(root, page)}: ${target}`;
        if (!existsSync(file)) broken.push(`${where} (no such file)`);
        else if (anchor !== undefined && file.endsWith('.md') && !anchors(file).has(anchor)) {
          broken.push(`${where} (no such heading)`);
        }
      }
    }
    expect(broken).toEqual([]);
  });
});
