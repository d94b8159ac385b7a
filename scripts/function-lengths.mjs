#!/usr/bin/env node
// Measures how many lines of its own every function in src/ has: the lines its body spans, less
// the lines of the functions and classes nested in it (they are measured on their own). A function
// that does one thing in a few named phases stays short; one that grows past the limit is a sign
// that a phase wants a name and a helper.
//
//   node scripts/function-lengths.mjs             the functions over 100 own lines; exit 1 if any
//   node scripts/function-lengths.mjs --limit 80  the same with another limit
//   node scripts/function-lengths.mjs --all       the 30 longest, whatever the limit (same exit code)
//
// Each line reads `file:line name ownLines`, largest first.
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

/** The limit the check applies unless told otherwise. */
export const DEFAULT_LIMIT = 100;

const repoRoot = resolve(fileURLToPath(new URL('..', import.meta.url)));

/** Every `.ts` file under `dir` (declaration files aside), sorted, as absolute paths. */
function listSourceFiles(dir) {
  const files = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) files.push(...listSourceFiles(path));
    else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) files.push(path);
  }
  return files.sort();
}

/** The nodes that are functions with a body of their own. */
function isFunctionLike(node) {
  return (
    (ts.isFunctionDeclaration(node) ||
      ts.isFunctionExpression(node) ||
      ts.isArrowFunction(node) ||
      ts.isMethodDeclaration(node) ||
      ts.isConstructorDeclaration(node) ||
      ts.isGetAccessorDeclaration(node) ||
      ts.isSetAccessorDeclaration(node)) &&
    node.body !== undefined
  );
}

/** The nodes whose lines a function around them does not own: functions and class bodies. */
function isNestedUnit(node) {
  return isFunctionLike(node) || ts.isClassDeclaration(node) || ts.isClassExpression(node);
}

/** A readable name for a property, method or variable name node; undefined for a pattern. */
function nameText(name, sourceFile) {
  if (name === undefined) return undefined;
  if (ts.isIdentifier(name) || ts.isPrivateIdentifier(name)) return name.text;
  if (ts.isStringLiteral(name) || ts.isNumericLiteral(name)) return name.text;
  if (ts.isComputedPropertyName(name)) return `[${name.expression.getText(sourceFile)}]`;
  return undefined;
}

/** The name of the class a member belongs to, or `<class>` for an anonymous one. */
function className(member, sourceFile) {
  const owner = member.parent;
  if (owner !== undefined && ts.isClassLike(owner)) {
    const own = nameText(owner.name, sourceFile);
    if (own !== undefined) return own;
    // `const Foo = class { ... }`
    if (owner.parent !== undefined && ts.isVariableDeclaration(owner.parent)) {
      const assigned = nameText(owner.parent.name, sourceFile);
      if (assigned !== undefined) return assigned;
    }
  }
  return '<class>';
}

/** A short name for what is called: `assign`, `items.map`, or `...map` for a long chain. */
function calleeName(expression, sourceFile) {
  const text = expression.getText(sourceFile).replace(/\s+/g, '');
  if (text.length <= 40) return text;
  return ts.isPropertyAccessExpression(expression) ? `...${expression.name.text}` : '...';
}

/**
 * The name a function is known by: its own, the class member it is, or what it is assigned to; an
 * anonymous function passed to a call is `<arrow passed to f in X>`, any other `<arrow in X>`
 * (or `<function …>`), X being the function around it (`<module>` at the top level).
 */
function functionName(node, sourceFile, enclosingName) {
  if (ts.isConstructorDeclaration(node)) return `${className(node, sourceFile)}.constructor`;
  if (ts.isGetAccessorDeclaration(node) || ts.isSetAccessorDeclaration(node)) {
    const kind = ts.isGetAccessorDeclaration(node) ? 'get' : 'set';
    const member = nameText(node.name, sourceFile) ?? '<computed>';
    return ts.isClassLike(node.parent)
      ? `${className(node, sourceFile)}.${kind} ${member}`
      : `${kind} ${member}`;
  }
  if (ts.isMethodDeclaration(node)) {
    const member = nameText(node.name, sourceFile) ?? '<computed>';
    return ts.isClassLike(node.parent) ? `${className(node, sourceFile)}.${member}` : member;
  }
  const own =
    ts.isFunctionDeclaration(node) || ts.isFunctionExpression(node) ? node.name : undefined;
  if (own !== undefined) return own.text;
  if (ts.isFunctionDeclaration(node)) return 'default';

  // A function expression or arrow: name it after what holds it, looking through `as`, `satisfies`
  // and parentheses.
  let holder = node.parent;
  while (
    holder !== undefined &&
    (ts.isParenthesizedExpression(holder) ||
      ts.isAsExpression(holder) ||
      ts.isSatisfiesExpression(holder) ||
      ts.isTypeAssertionExpression(holder) ||
      ts.isNonNullExpression(holder))
  ) {
    holder = holder.parent;
  }
  if (holder !== undefined) {
    if (ts.isVariableDeclaration(holder) || ts.isPropertyAssignment(holder)) {
      const name = nameText(holder.name, sourceFile);
      if (name !== undefined) return name;
    }
    if (ts.isPropertyDeclaration(holder)) {
      const name = nameText(holder.name, sourceFile);
      if (name !== undefined) return `${className(holder, sourceFile)}.${name}`;
    }
    if (
      ts.isBinaryExpression(holder) &&
      holder.operatorToken.kind === ts.SyntaxKind.EqualsToken &&
      holder.right.pos <= node.pos
    ) {
      return holder.left.getText(sourceFile);
    }
    if (ts.isExportAssignment(holder)) return 'default';
  }
  const kind = ts.isArrowFunction(node) ? 'arrow' : 'function';
  const where = enclosingName ?? '<module>';
  if (holder !== undefined && (ts.isCallExpression(holder) || ts.isNewExpression(holder))) {
    return `<${kind} passed to ${calleeName(holder.expression, sourceFile)} in ${where}>`;
  }
  return `<${kind} in ${where}>`;
}

/** The 1-based lines a node spans, from its first token (not its leading comments) to its end. */
function lineSpan(node, sourceFile) {
  const first = sourceFile.getLineAndCharacterOfPosition(node.getStart(sourceFile)).line + 1;
  const last = sourceFile.getLineAndCharacterOfPosition(node.getEnd()).line + 1;
  return [first, last];
}

/**
 * The lines `fn` owns: those its body spans, less those spanned by the outermost functions and
 * classes inside it (whose own lines are theirs). A line shared with a nested one (`const f = () =>
 * {` or its closing `});`) goes to the nested one.
 */
function ownLineCount(fn, sourceFile) {
  const [first, last] = lineSpan(fn.body, sourceFile);
  const owned = new Set();
  for (let line = first; line <= last; line += 1) owned.add(line);
  const visit = (node) => {
    if (isNestedUnit(node)) {
      const [from, to] = lineSpan(node, sourceFile);
      for (let line = from; line <= to; line += 1) owned.delete(line);
      return;
    }
    ts.forEachChild(node, visit);
  };
  ts.forEachChild(fn.body, visit);
  return owned.size;
}

/**
 * Every function in one source text with the lines of its own.
 * @param {string} file the path to report (relative to the repository)
 * @param {string} text the file's contents
 */
export function measureSource(file, text) {
  const sourceFile = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const results = [];
  const visit = (node, enclosingName) => {
    let inner = enclosingName;
    if (isFunctionLike(node)) {
      const name = functionName(node, sourceFile, enclosingName);
      const line = sourceFile.getLineAndCharacterOfPosition(node.getStart(sourceFile)).line + 1;
      results.push({ file, line, name, ownLines: ownLineCount(node, sourceFile) });
      inner = name;
    } else if (ts.isClassLike(node)) {
      inner = nameText(node.name, sourceFile) ?? enclosingName;
    }
    ts.forEachChild(node, (child) => visit(child, inner));
  };
  visit(sourceFile, undefined);
  return results;
}

/**
 * Every function in every `.ts` file under `src/` (or `dir`), longest first (then by file and line).
 * @param {{ root?: string, dir?: string }} [options] the repository root; the folder to walk in it
 */
export function measureFunctions(options = {}) {
  const root = options.root ?? repoRoot;
  const dir = resolve(root, options.dir ?? 'src');
  const results = listSourceFiles(dir).flatMap((path) =>
    measureSource(relative(root, path).split('\\').join('/'), readFileSync(path, 'utf8')),
  );
  return results.sort(
    (a, b) => b.ownLines - a.ownLines || a.file.localeCompare(b.file) || a.line - b.line,
  );
}

/** One report line: `file:line name ownLines`. */
export function formatFunction(fn) {
  return `${fn.file}:${fn.line} ${fn.name} ${fn.ownLines}`;
}

function main(argv) {
  let limit = DEFAULT_LIMIT;
  let all = false;
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    if (arg === '--all') all = true;
    else if (arg === '--limit' || arg.startsWith('--limit=')) {
      const value = arg === '--limit' ? argv[(i += 1)] : arg.slice('--limit='.length);
      limit = Number(value);
      if (!Number.isInteger(limit) || limit < 0) {
        console.error(`function-lengths: --limit needs a whole number, got ${String(value)}`);
        return 2;
      }
    } else {
      console.error(`function-lengths: unknown argument ${arg} (use --limit N or --all)`);
      return 2;
    }
  }
  const functions = measureFunctions();
  const over = functions.filter((fn) => fn.ownLines > limit);
  for (const fn of all ? functions.slice(0, 30) : over) console.log(formatFunction(fn));
  if (over.length > 0) {
    console.error(
      `function-lengths: ${over.length} function(s) over ${limit} lines of their own; split them into named phases`,
    );
    return 1;
  }
  if (!all) console.log(`function-lengths: every function in src/ is within ${limit} own lines`);
  return 0;
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = main(process.argv.slice(2));
}
