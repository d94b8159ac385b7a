/**
 * Side-effect classification of tools by name, namespace and metadata. Conservative: a tool is
 * `external` (its effects leave the process and cannot be taken back) unless clear signals say
 * otherwise, because misclassifying a write as a read would let the runtime repeat it.
 */

/** What a tool's side effects reach. */
export const ToolClass = {
  /** No side effects: safe to run again at any time. */
  ReadOnly: 'read_only',
  /** Effects on the local machine (files). */
  Local: 'local',
  /** Effects on the agent's own memory. */
  Memory: 'memory',
  /** Effects on the outside world (e-mail, payments, uploads, APIs). The default. */
  External: 'external',
} as const;
/** A value of {@link ToolClass}. */
export type ToolClass = (typeof ToolClass)[keyof typeof ToolClass];

const CLASSES = new Set<string>(Object.values(ToolClass));

/** True when `value` is a {@link ToolClass}. */
export function isToolClass(value: unknown): value is ToolClass {
  return typeof value === 'string' && CLASSES.has(value);
}

const READ_VERBS = new Set(['search', 'get', 'list', 'read', 'fetch', 'query', 'lookup', 'find']);

// Verbs that change something; any of them outweighs a read verb ("get_or_create_user").
const WRITE_VERBS = new Set([
  'send', 'upload', 'post', 'create', 'delete', 'update', 'pay', 'email', 'put', 'patch', 'write',
  'insert', 'remove', 'add', 'set', 'edit', 'modify', 'move', 'copy', 'rename', 'publish', 'submit',
  'charge', 'transfer', 'book', 'place', 'cancel', 'invite', 'share', 'execute', 'exec', 'run',
  'deploy', 'reply', 'forward', 'archive', 'append', 'replace', 'merge', 'approve', 'reject',
  'schedule', 'purchase', 'buy', 'refund', 'mark', 'assign', 'start', 'stop', 'trigger', 'commit',
  'push', 'save', 'store', 'upsert', 'drop', 'apply', 'mkdir', 'notify', 'invoke', 'kill',
  'restart', 'install', 'grant', 'revoke', 'disable', 'enable', 'reset', 'clear', 'purge',
  'truncate', 'import', 'follow', 'block',
]); // prettier-ignore

const MEMORY_PREFIXES = [
  ['core', 'memory'],
  ['archival', 'memory'],
  ['recall', 'memory'],
  ['memory'],
];
const LOCAL_FS = new Set(['fs', 'filesystem']);
const FILE_WORDS = new Set(['file', 'files', 'dir', 'directory', 'folder', 'path', 'disk']);

/**
 * Splits a name into lower-case words on `_ - . : /`, whitespace and camelCase boundaries:
 * `mcp:writeLocalFile` → `['mcp', 'write', 'local', 'file']`, `HTTPRequest` → `['http', 'request']`.
 */
export function toolNameWords(name: string): string[] {
  return name
    .replace(/([a-z0-9])([A-Z])/g, '$1 $2')
    .replace(/([A-Z]+)([A-Z][a-z])/g, '$1 $2')
    .split(/[\s_\-.:/]+/)
    .filter((w) => w !== '')
    .map((w) => w.toLowerCase());
}

/** The name without a namespace prefix: `mcp:core_memory_append` → `core_memory_append`. */
function baseName(name: string): string {
  const parts = name.split(/[:/]|__/).filter((p) => p !== '');
  return parts[parts.length - 1] ?? name;
}

function startsWith(words: readonly string[], prefix: readonly string[]): boolean {
  return prefix.every((w, i) => words[i] === w);
}

/** What `metadata` says outright, if anything: `class`, `readOnly` or MCP's `annotations.readOnlyHint`. */
function fromMetadata(metadata: Record<string, unknown> | undefined): ToolClass | undefined {
  if (metadata === undefined) return undefined;
  if (isToolClass(metadata['class'])) return metadata['class'];
  if (metadata['readOnly'] === true) return ToolClass.ReadOnly;
  const annotations = metadata['annotations'];
  if (
    typeof annotations === 'object' &&
    annotations !== null &&
    (annotations as Record<string, unknown>)['readOnlyHint'] === true
  ) {
    return ToolClass.ReadOnly;
  }
  return undefined;
}

/**
 * Classifies a tool's side effects. `metadata.class` wins when valid; `metadata.readOnly` or MCP
 * `annotations.readOnlyHint` make it read-only; then, by the words of the name (case-insensitive,
 * split on `_ - . : /` and camelCase): memory tools (`core_memory_*`, `archival_memory_*`,
 * `memory_*`), local file tools (`local_*`, `write_local_file`, a `fs`/`filesystem` namespace),
 * any write verb → external, a read verb (search, get, list, read, fetch, query, lookup, find) →
 * read-only, and everything else → external.
 */
export function classifyTool(
  name: string,
  namespace?: string,
  metadata?: Record<string, unknown>,
): ToolClass {
  const forced = fromMetadata(metadata);
  if (forced !== undefined) return forced;

  const words = toolNameWords(name);
  const base = toolNameWords(baseName(name));
  const spaces = [...toolNameWords(namespace ?? ''), ...words.slice(0, words.length - base.length)];

  if (MEMORY_PREFIXES.some((p) => startsWith(base, p))) return ToolClass.Memory;

  const onLocalFiles =
    base[0] === 'local' ||
    (base.includes('local') && base.some((w) => FILE_WORDS.has(w))) ||
    [...spaces, ...base].some((w) => LOCAL_FS.has(w));
  if (onLocalFiles) return ToolClass.Local;

  if (base.some((w) => WRITE_VERBS.has(w))) return ToolClass.External;
  if (base.some((w) => READ_VERBS.has(w))) return ToolClass.ReadOnly;
  return ToolClass.External;
}
