/**
 * The Redis Cluster slot of a key: CRC16 (XMODEM) of the key's hash tag (the part between the
 * first `{` and the next `}`, when not empty) or of the whole key, modulo 16384, as the server
 * computes it (`CLUSTER KEYSLOT`).
 */

const TABLE = (() => {
  const table = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let crc = i << 8;
    for (let bit = 0; bit < 8; bit++) {
      crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    }
    table[i] = crc;
  }
  return table;
})();

function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) crc = ((crc << 8) & 0xffff) ^ TABLE[((crc >> 8) ^ byte) & 0xff]!;
  return crc;
}

/** The part of `key` that decides its slot: its hash tag when it has a non-empty one, else all of it. */
export function hashTagOf(key: string): string {
  const open = key.indexOf('{');
  if (open >= 0) {
    const close = key.indexOf('}', open + 1);
    if (close > open + 1) return key.slice(open + 1, close);
  }
  return key;
}

/** The slot (0 to 16383) Redis Cluster places `key` in. */
export function keySlot(key: string): number {
  return crc16(Buffer.from(hashTagOf(key), 'utf8')) % 16384;
}
