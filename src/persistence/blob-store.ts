/**
 * Durable blobs for large tool results. A result above the threshold is
 * stored once per run under its sha256 and replaced in the history by a reference
 * `<<FL_BLOB_REF:<id>:size=<n>>>`; a resumed step rehydrates the references. A missing blob fails
 * fast (`BlobMissingError`) unless the step opted into degraded replay, which puts a fixed marker
 * in its place. Blobs live as long as their run (the run's retention removes them), or, with
 * `retentionMs`, that long after their last put; each run's bytes are capped.
 *
 * Keys (run's hash tag): `blob(runId, id)` STRING (with `retentionMs`, its TTL); `blobs(runId)`
 * HASH `bytes`, `count`, `<id>` → size (with `retentionMs`, its TTL refreshed with every put so it
 * never outlives the run's newest blob by more than that).
 */
import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';
import {
  BlobCapExceededError,
  BlobMissingError,
  ConfigurationError,
  InputValidationError,
  InvariantError,
  SnapshotCorruptError,
} from '../errors.js';
import { assertBlobId, assertRunId, assertStepId, createKeys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';

/** How long a blob is kept after its last put by default: 7 days. */
export const DEFAULT_BLOB_RETENTION_MS = null;
/** The default cap on a run's blob bytes: 256 MiB. */
export const DEFAULT_MAX_BLOB_BYTES_PER_RUN = 256 * 1024 * 1024;

/** Matches every blob reference in a text; global (prefer {@link parseBlobRefs}). */
export const BLOB_REF_PATTERN = /<<FL_BLOB_REF:([0-9a-f]{64}):size=(0|[1-9][0-9]{0,14})>>/g;
const WHOLE_REF = new RegExp(`^${BLOB_REF_PATTERN.source}$`);

/** A stored blob. */
export interface StoredBlob {
  /** The sha256 of the content's UTF-8 bytes, lowercase hex. */
  id: string;
  /** The content's size in UTF-8 bytes. */
  size: number;
  /** The reference that stands for it in a history: {@link blobRef}`(id, size)`. */
  ref: string;
}

/** One reference found by {@link parseBlobRefs}. */
export interface BlobRefMatch {
  id: string;
  size: number;
  /** The reference's text. */
  ref: string;
  /** Where it starts in the text, in UTF-16 code units. */
  index: number;
}

/** What a degraded replay reports for each missing blob, so the runtime can log a warning. */
export interface DegradedBlobInfo {
  runId: string;
  stepId: string;
  blobId: string;
  /** The size the reference gave. */
  size: number;
  /** The marker that replaced the reference. */
  marker: string;
}

/** Options of {@link BlobStore.rehydrate}. */
export interface RehydrateOptions {
  /** The step whose history is rehydrated (named in errors). */
  stepId: string;
  /**
   * Replace a missing blob by {@link missingBlobMarker} instead of failing. Only for steps that
   * opted in and whose tool is idempotent.
   * @defaultValue false
   */
  degraded?: boolean;
  /** Called once per missing blob in degraded replay. */
  onDegraded?: (info: DegradedBlobInfo) => void;
}

/** Content-addressed blobs per run, with retention and a per-run byte cap. */
export interface BlobStore {
  /**
   * Stores `content` once per run (a second put only refreshes the TTLs) and returns its id, size
   * and reference. Throws `BlobCapExceededError` (nothing written) past `maxBytesPerRun`.
   */
  put(runId: string, content: string): Promise<StoredBlob>;
  /** The content, or null when missing. Throws `SnapshotCorruptError` when it fails its sha256. */
  get(runId: string, id: string): Promise<string | null>;
  /** The content; throws `BlobMissingError` naming the blob and the step when it is missing. */
  mustGet(runId: string, id: string, stepId: string): Promise<string>;
  /**
   * `content` itself when its UTF-8 size is at most `thresholdBytes` (and it holds nothing that
   * looks like a reference), else the reference of the stored blob.
   */
  offload(runId: string, content: string, thresholdBytes: number): Promise<string>;
  /**
   * `text` with every reference replaced by its content. A missing blob throws `BlobMissingError`,
   * or in degraded replay becomes {@link missingBlobMarker}. Content failing its sha256 or its
   * size always throws `SnapshotCorruptError`.
   */
  rehydrate(runId: string, text: string, options: RehydrateOptions): Promise<string>;
}

/** Options of {@link createBlobStore}. */
export interface BlobStoreOptions {
  /** The client; the store defines its Lua command on it. It stays the caller's to close. */
  redis: Redis;
  /**
   * The key prefix (see `createKeys`).
   * @defaultValue `'flujo'`
   */
  prefix?: string;
  /**
   * How long a blob is kept after its last put, in ms. Left out, a blob has no expiry of its own:
   * it is kept as long as its run, and leaves with the run's other keys (the run's retention).
   * @defaultValue none
   */
  retentionMs?: number;
  /**
   * The most bytes one run may store in blobs.
   * @defaultValue {@link DEFAULT_MAX_BLOB_BYTES_PER_RUN} (256 MiB)
   */
  maxBytesPerRun?: number;
}

/** The reference that stands for a blob: `<<FL_BLOB_REF:<id>:size=<n>>>`. */
export function blobRef(id: string, size: number): string {
  assertBlobId(id, 'id');
  if (!Number.isSafeInteger(size) || size < 0 || size >= 1e15) {
    throw new InputValidationError('blob reference', [
      { path: 'size', message: `must be an integer from 0 to 999999999999999, got ${size}` },
    ]);
  }
  return `<<FL_BLOB_REF:${id}:size=${size}>>`;
}

/** Every blob reference in `text`, in order. */
export function parseBlobRefs(text: string): BlobRefMatch[] {
  // A fresh regex: the exported one is global, so its lastIndex is shared state.
  return [...text.matchAll(new RegExp(BLOB_REF_PATTERN.source, 'g'))].map((m) => ({
    id: m[1]!,
    size: Number(m[2]),
    ref: m[0],
    index: m.index,
  }));
}

/** True when the whole of `text` is exactly one blob reference. */
export function isBlobRef(text: string): boolean {
  return WHOLE_REF.test(text);
}

/**
 * The field of a ledger receipt that stands for a result stored as a blob: a granular step records
 * `{ "$flujoBlob": "<<FL_BLOB_REF:…>>" }` instead of a result over its threshold, so the run keeps
 * the result's bytes once (in the blob store), not twice (blob and ledger).
 */
export const BLOB_RECEIPT_FIELD = '$flujoBlob';

/** The ledger receipt standing for the blob `ref` (see {@link BLOB_RECEIPT_FIELD}). */
export function blobReceipt(ref: string): { [BLOB_RECEIPT_FIELD]: string } {
  return { [BLOB_RECEIPT_FIELD]: ref };
}

/** The blob reference a receipt stands for, or undefined when it holds the result itself. */
export function refOfReceipt(receipt: unknown): string | undefined {
  if (typeof receipt !== 'object' || receipt === null || Array.isArray(receipt)) return undefined;
  const fields = Object.keys(receipt);
  if (fields.length !== 1 || fields[0] !== BLOB_RECEIPT_FIELD) return undefined;
  const ref = (receipt as Record<string, unknown>)[BLOB_RECEIPT_FIELD];
  return typeof ref === 'string' && WHOLE_REF.test(ref) ? ref : undefined;
}

/** The text that replaces the reference of a missing blob in degraded replay. */
export function missingBlobMarker(id: string, size: number): string {
  return `[blob ${id} (${size} bytes) is no longer available]`;
}

/** The blob id of `content`: the sha256 of its UTF-8 bytes, lowercase hex. */
export function blobIdOf(content: string | Buffer): string {
  return createHash('sha256').update(content).digest('hex');
}

/*
 * put: stores a blob once and accounts for it, unless the run's bytes would pass the cap.
 *   KEYS[1]  the blob (STRING)           KEYS[2] the run's blob accounting (HASH)
 *   ARGV[1]  blob id                     ARGV[2] content        ARGV[3] size in bytes
 *   ARGV[4]  retention ms ('0': none)    ARGV[5] the cap in bytes
 *   Returns  {'stored', bytes after} | {'refused', bytes} (nothing written) |
 *            {'existing', bytes} (accounted before: nothing counted again, both TTLs refreshed,
 *            the content stored again if it had expired)
 */
const PUT_LUA = `
local keep = ARGV[4] == '0'
local function store()
  if keep then redis.call('SET', KEYS[1], ARGV[2]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4]) end
end
local function refresh(key)
  if keep then return redis.call('EXISTS', key) end
  return redis.call('PEXPIRE', key, ARGV[4])
end
local bytes = tonumber(redis.call('HGET', KEYS[2], 'bytes') or '0')
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  if refresh(KEYS[1]) == 0 then store() end
  refresh(KEYS[2])
  return {'existing', bytes}
end
local size = tonumber(ARGV[3])
if bytes + size > tonumber(ARGV[5]) then return {'refused', bytes} end
store()
redis.call('HINCRBY', KEYS[2], 'bytes', ARGV[3])
redis.call('HINCRBY', KEYS[2], 'count', 1)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
refresh(KEYS[2])
return {'stored', bytes + size}
`;

/** Bump when the script changes meaning, so clients never mix versions under one command name. */
const BLOB_SCRIPT_VERSION = 2;
const PUT_COMMAND = `flujoBlob_put_v${BLOB_SCRIPT_VERSION}`;

// A lone surrogate has no UTF-8 form: it would be stored as U+FFFD and read back changed.
const LONE_SURROGATE = /\p{Surrogate}/u;

function positiveOption(value: number | undefined, field: string, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new ConfigurationError(
      `createBlobStore: ${field} must be a positive integer, got ${String(value)}.`,
      { field },
    );
  }
  return value;
}

function checkContent(content: unknown): asserts content is string {
  const problem =
    typeof content !== 'string'
      ? `must be a string, got ${typeof content}`
      : LONE_SURROGATE.test(content)
        ? 'must be well-formed UTF-16 (it holds a lone surrogate, which UTF-8 cannot store)'
        : undefined;
  if (problem !== undefined) {
    throw new InputValidationError('blob content', [{ path: 'content', message: problem }]);
  }
}

/** Creates the Redis-backed {@link BlobStore}. */
export function createBlobStore(options: BlobStoreOptions): BlobStore {
  const { redis } = options;
  const keys = createKeys(options.prefix);
  const retentionMs =
    options.retentionMs === undefined
      ? null
      : positiveOption(options.retentionMs, 'retentionMs', 1);
  const maxBytesPerRun = positiveOption(
    options.maxBytesPerRun,
    'maxBytesPerRun',
    DEFAULT_MAX_BLOB_BYTES_PER_RUN,
  );
  // ioredis runs EVALSHA and falls back to EVAL after a NOSCRIPT (e.g. a restarted server).
  redis.defineCommand(PUT_COMMAND, { numberOfKeys: 2, lua: PUT_LUA });

  async function redisCall<T>(op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
  }

  /** Checks stored bytes against the id (and the size a reference gave) and decodes them. */
  function verify(runId: string, id: string, bytes: Buffer, size?: number): string {
    const actual = blobIdOf(bytes);
    if (actual !== id) {
      throw new SnapshotCorruptError(
        runId,
        `blob ${id} does not match its sha256 (the stored bytes hash to ${actual})`,
      );
    }
    if (size !== undefined && bytes.length !== size) {
      throw new SnapshotCorruptError(
        runId,
        `a reference gives blob ${id} ${size} bytes, but it has ${bytes.length}`,
      );
    }
    return bytes.toString('utf8');
  }

  async function put(runId: string, content: string): Promise<StoredBlob> {
    const accounting = keys.blobs(runId);
    checkContent(content);
    const bytes = Buffer.from(content, 'utf8');
    const id = blobIdOf(bytes);
    const size = bytes.length;
    const command = (
      redis as unknown as Record<string, (...a: (string | Buffer)[]) => Promise<[string, number]>>
    )[PUT_COMMAND]!;
    const [status, stored] = await redisCall(() =>
      command.call(
        redis,
        keys.blob(runId, id),
        accounting,
        id,
        bytes,
        String(size),
        String(retentionMs ?? 0),
        String(maxBytesPerRun),
      ),
    );
    if (status === 'refused') throw new BlobCapExceededError(runId, maxBytesPerRun, size, stored);
    if (status !== 'stored' && status !== 'existing') {
      throw new InvariantError(`blob put for run "${runId}" replied ${status}`);
    }
    return { id, size, ref: blobRef(id, size) };
  }

  async function get(runId: string, id: string): Promise<string | null> {
    const key = keys.blob(runId, id);
    const bytes = await redisCall(() => redis.getBuffer(key));
    return bytes === null ? null : verify(runId, id, bytes);
  }

  return {
    put,
    get,

    async mustGet(runId, id, stepId) {
      assertStepId(stepId);
      const content = await get(runId, id);
      if (content === null) throw new BlobMissingError(runId, stepId, id);
      return content;
    },

    async offload(runId, content, thresholdBytes) {
      checkContent(content);
      if (!Number.isSafeInteger(thresholdBytes) || thresholdBytes < 0) {
        throw new InputValidationError('blob threshold', [
          { path: 'thresholdBytes', message: `must be an integer ≥ 0, got ${thresholdBytes}` },
        ]);
      }
      // Text that looks like a reference is offloaded whatever its size, so rehydrate never
      // mistakes a tool's output for a reference: rehydrate(offload(x)) is always x.
      const small = Buffer.byteLength(content, 'utf8') <= thresholdBytes;
      if (small && parseBlobRefs(content).length === 0) return content;
      return (await put(runId, content)).ref;
    },

    async rehydrate(runId, text, rehydrateOptions) {
      const { stepId, degraded = false, onDegraded } = rehydrateOptions;
      assertRunId(runId);
      assertStepId(stepId);
      if (typeof text !== 'string') {
        throw new InputValidationError('history text', [
          { path: 'text', message: `must be a string, got ${typeof text}` },
        ]);
      }
      const refs = parseBlobRefs(text);
      if (refs.length === 0) return text;
      const ids = [...new Set(refs.map((r) => r.id))];
      const found = await redisCall(() =>
        redis.mgetBuffer(...ids.map((id) => keys.blob(runId, id))),
      );
      const stored = new Map(ids.map((id, i) => [id, found[i] ?? null]));
      // Each distinct reference is verified (or reported) once, however often it recurs.
      const replacements = new Map<string, string>();
      let out = '';
      let from = 0;
      for (const { id, size, ref, index } of refs) {
        let replacement = replacements.get(ref);
        if (replacement === undefined) {
          const bytes = stored.get(id) ?? null;
          if (bytes !== null) {
            replacement = verify(runId, id, bytes, size);
          } else if (!degraded) {
            throw new BlobMissingError(runId, stepId, id);
          } else {
            replacement = missingBlobMarker(id, size);
            onDegraded?.({ runId, stepId, blobId: id, size, marker: replacement });
          }
          replacements.set(ref, replacement);
        }
        out += text.slice(from, index) + replacement;
        from = index + ref.length;
      }
      return out + text.slice(from);
    },
  };
}
