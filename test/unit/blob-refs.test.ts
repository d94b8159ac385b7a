import { describe, expect, it } from 'vitest';
import { InputValidationError } from '../../src/errors.js';
import {
  BLOB_REF_PATTERN,
  blobIdOf,
  blobRef,
  isBlobRef,
  missingBlobMarker,
  parseBlobRefs,
} from '../../src/persistence/blob-store.js';

const A = 'a'.repeat(64);
const B = '0123456789abcdef'.repeat(4);

describe('blob references', () => {
  it('ids are the sha256 of the UTF-8 bytes', () => {
    expect(blobIdOf('')).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
    expect(blobIdOf('abc')).toBe(
      'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad',
    );
    expect(blobIdOf('é')).toBe(blobIdOf(Buffer.from([0xc3, 0xa9])));
  });

  it('blobRef builds the reference and refuses bad ids and sizes', () => {
    expect(blobRef(A, 20481)).toBe(`<<FL_BLOB_REF:${A}:size=20481>>`);
    expect(blobRef(B, 0)).toBe(`<<FL_BLOB_REF:${B}:size=0>>`);
    expect(() => blobRef(A.toUpperCase(), 1)).toThrow(/id: must be a sha256/);
    for (const size of [-1, 1.5, Number.NaN, 1e15]) {
      expect(() => blobRef(A, size)).toThrow(InputValidationError);
    }
  });

  it('parseBlobRefs finds every reference with its id, size, text and index', () => {
    const r1 = blobRef(A, 12);
    const r2 = blobRef(B, 999_999);
    const text = `head ${r1}${r2} mid ${r1}\ntail`;
    expect(parseBlobRefs(text)).toEqual([
      { id: A, size: 12, ref: r1, index: 5 },
      { id: B, size: 999_999, ref: r2, index: 5 + r1.length },
      { id: A, size: 12, ref: r1, index: 5 + r1.length + r2.length + 5 },
    ]);
    expect(parseBlobRefs('no refs here')).toEqual([]);
  });

  it('ignores look-alikes', () => {
    const lookAlikes = [
      `<<FL_BLOB_REF:${A.toUpperCase()}:size=1>>`,
      `<<FL_BLOB_REF:${A.slice(1)}:size=1>>`,
      `<<FL_BLOB_REF:${A}a:size=1>>`,
      `<<FL_BLOB_REF:${A}:size=01>>`,
      `<<FL_BLOB_REF:${A}:size=>>`,
      `<<FL_BLOB_REF:${A}:size=1>`,
      `<FL_BLOB_REF:${A}:size=1>>`,
      `<<FL_BLOB_REF:${A}:size=1000000000000000>>`,
      `<<fl_blob_ref:${A}:size=1>>`,
    ];
    for (const text of lookAlikes) {
      expect(parseBlobRefs(text), text).toEqual([]);
      expect(isBlobRef(text), text).toBe(false);
    }
  });

  it('isBlobRef is true only for exactly one reference', () => {
    const r = blobRef(A, 3);
    expect(isBlobRef(r)).toBe(true);
    expect(isBlobRef(` ${r}`)).toBe(false);
    expect(isBlobRef(`${r}\n`)).toBe(false);
    expect(isBlobRef(r + r)).toBe(false);
    expect(isBlobRef('')).toBe(false);
  });

  it('the exported pattern is global, and its lastIndex does not disturb parsing', () => {
    expect(BLOB_REF_PATTERN.flags).toContain('g');
    const text = `x ${blobRef(A, 1)}`;
    BLOB_REF_PATTERN.lastIndex = text.length;
    expect(parseBlobRefs(text)).toHaveLength(1);
    BLOB_REF_PATTERN.lastIndex = 0;
    expect([...text.matchAll(BLOB_REF_PATTERN)].map((m) => m[1])).toEqual([A]);
  });

  it('the degraded-replay marker names the blob and its size', () => {
    expect(missingBlobMarker(A, 42)).toBe(`[blob ${A} (42 bytes) is no longer available]`);
  });
});
