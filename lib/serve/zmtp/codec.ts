/**
 * ZMTP 3.1 (RFC 23) on the byte level: the 64-byte greeting, frames (short and long, the MORE
 * and COMMAND flags), commands and the metadata READY carries, and a parser that turns the
 * bytes of one connection into greeting, commands and multipart messages as they arrive.
 * @module
 */

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Frame flag bits. */
const MORE = 0x01;
const LONG = 0x02;
const COMMAND = 0x04;

/** The greeting's length: signature 10, version 2, mechanism 20, as-server 1, filler 31. */
export const GREETING_BYTES = 64;

/**
 * Our greeting: signature `FF 00*8 7F`, version 3.1, mechanism `NULL` (zero padded), as-server
 * 0 (NULL has no server role).
 */
export function greeting(mechanism = "NULL"): Uint8Array {
  const bytes = new Uint8Array(GREETING_BYTES);
  bytes[0] = 0xff;
  bytes[9] = 0x7f;
  bytes[10] = 3;
  bytes[11] = 1;
  bytes.set(encoder.encode(mechanism).subarray(0, 20), 12);
  return bytes;
}

/** A peer's greeting, read. */
export interface PeerGreeting {
  major: number;
  minor: number;
  mechanism: string;
  asServer: boolean;
}

/**
 * Read a peer's 64-byte greeting.
 * @throws {Error} when it is not ZMTP 3.x (a 1.0 or 2.0 peer, or not ZeroMQ at all)
 */
export function parseGreeting(bytes: Uint8Array): PeerGreeting {
  if (bytes[0] !== 0xff || (bytes[9] & 1) !== 1) {
    throw new Error("the peer's greeting has no ZMTP signature: it does not speak ZMTP 3");
  }
  if (bytes[10] < 3) {
    throw new Error(`the peer speaks ZMTP ${bytes[10]}.${bytes[11]}; ZMTP 3.0 or later is needed`);
  }
  let end = 12;
  while (end < 32 && bytes[end] !== 0) end++;
  return {
    major: bytes[10],
    minor: bytes[11],
    mechanism: decoder.decode(bytes.subarray(12, end)),
    asServer: bytes[32] === 1,
  };
}

function header(flags: number, size: number): Uint8Array {
  if (size <= 255) return Uint8Array.of(flags, size);
  const bytes = new Uint8Array(9);
  bytes[0] = flags | LONG;
  const view = new DataView(bytes.buffer);
  view.setUint32(1, Math.floor(size / 2 ** 32));
  view.setUint32(5, size >>> 0);
  return bytes;
}

/** The bytes of a multipart message: each part a frame, MORE on all but the last. */
export function encodeMessage(parts: Uint8Array[]): Uint8Array[] {
  const out: Uint8Array[] = [];
  parts.forEach((part, i) => {
    out.push(header(i < parts.length - 1 ? MORE : 0, part.length));
    if (part.length > 0) out.push(part);
  });
  return out;
}

/** The bytes of a command frame: name length, name, data. */
export function encodeCommand(name: string, data: Uint8Array = new Uint8Array()): Uint8Array {
  const nameBytes = encoder.encode(name);
  const body = new Uint8Array(1 + nameBytes.length + data.length);
  body[0] = nameBytes.length;
  body.set(nameBytes, 1);
  body.set(data, 1 + nameBytes.length);
  return concat([header(COMMAND, body.length), body]);
}

/** READY's (and the other commands') metadata: name, 4-byte length, value, per property. */
export function encodeMetadata(properties: Record<string, Uint8Array | string>): Uint8Array {
  const parts: Uint8Array[] = [];
  for (const [name, raw] of Object.entries(properties)) {
    const value = typeof raw === "string" ? encoder.encode(raw) : raw;
    const nameBytes = encoder.encode(name);
    const length = new Uint8Array(4);
    new DataView(length.buffer).setUint32(0, value.length);
    parts.push(Uint8Array.of(nameBytes.length), nameBytes, length, value);
  }
  return concat(parts);
}

/**
 * Metadata read back; property names are case-insensitive, so they come lowercased.
 * @throws {Error} when a property runs past the end
 */
export function parseMetadata(bytes: Uint8Array): Map<string, Uint8Array> {
  const properties = new Map<string, Uint8Array>();
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let at = 0;
  while (at < bytes.length) {
    const nameLength = bytes[at];
    if (at + 1 + nameLength + 4 > bytes.length) throw new Error("metadata is truncated");
    const name = decoder.decode(bytes.subarray(at + 1, at + 1 + nameLength)).toLowerCase();
    at += 1 + nameLength;
    const valueLength = view.getUint32(at);
    at += 4;
    if (at + valueLength > bytes.length) throw new Error(`metadata "${name}" is truncated`);
    properties.set(name, bytes.subarray(at, at + valueLength));
    at += valueLength;
  }
  return properties;
}

/** Bytes joined. */
export function concat(parts: Uint8Array[]): Uint8Array {
  let length = 0;
  for (const p of parts) length += p.length;
  const out = new Uint8Array(length);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** What the parser yields. */
export type Incoming =
  | { type: "greeting"; greeting: PeerGreeting }
  | { type: "command"; name: string; data: Uint8Array }
  | { type: "message"; parts: Uint8Array[] };

/**
 * The bytes of one connection as they arrive, read into greeting, commands and whole
 * messages. Chunks are kept as they came and copied once, into the frame they belong to.
 */
export class ZmtpParser {
  #chunks: Uint8Array[] = [];
  #offset = 0;
  #available = 0;
  #greeted = false;
  #parts: Uint8Array[] = [];
  #partBytes = 0;
  readonly #maxMessageBytes: number;

  /** @param maxMessageBytes a message larger than this is a protocol error; default none */
  constructor(maxMessageBytes = Infinity) {
    this.#maxMessageBytes = maxMessageBytes;
  }

  /**
   * Take in a chunk and return what it completes.
   * @throws {Error} on a protocol error (the connection is then to be closed)
   */
  push(chunk: Uint8Array): Incoming[] {
    if (chunk.length > 0) {
      this.#chunks.push(chunk);
      this.#available += chunk.length;
    }
    const out: Incoming[] = [];
    for (;;) {
      if (!this.#greeted) {
        if (this.#available < GREETING_BYTES) return out;
        this.#greeted = true;
        out.push({ type: "greeting", greeting: parseGreeting(this.#take(GREETING_BYTES)) });
        continue;
      }
      if (this.#available < 2) return out;
      const flags = this.#peek(0);
      const long = (flags & LONG) !== 0;
      if (long && this.#available < 9) return out;
      let size: number;
      if (long) {
        const high = this.#peek(1) * 2 ** 24 + this.#peek(2) * 2 ** 16 + this.#peek(3) * 2 ** 8 +
          this.#peek(4);
        const low = this.#peek(5) * 2 ** 24 + this.#peek(6) * 2 ** 16 + this.#peek(7) * 2 ** 8 +
          this.#peek(8);
        if (high >= 2 ** 21) throw new Error("a frame's size is over 2^53 bytes");
        size = high * 2 ** 32 + low;
      } else {
        size = this.#peek(1);
      }
      if ((flags & COMMAND) === 0 && this.#partBytes + size > this.#maxMessageBytes) {
        throw new Error(
          `a message is over the limit of ${this.#maxMessageBytes} bytes`,
        );
      }
      const headerBytes = long ? 9 : 2;
      if (this.#available < headerBytes + size) return out;
      this.#take(headerBytes);
      const body = this.#take(size);
      if ((flags & COMMAND) !== 0) {
        if (body.length < 1 || body.length < 1 + body[0]) {
          throw new Error("a command frame is shorter than its name");
        }
        out.push({
          type: "command",
          name: decoder.decode(body.subarray(1, 1 + body[0])),
          data: body.subarray(1 + body[0]),
        });
        continue;
      }
      this.#parts.push(body);
      this.#partBytes += size;
      if ((flags & MORE) === 0) {
        out.push({ type: "message", parts: this.#parts });
        this.#parts = [];
        this.#partBytes = 0;
      }
    }
  }

  #peek(i: number): number {
    let at = this.#offset + i;
    for (const chunk of this.#chunks) {
      if (at < chunk.length) return chunk[at];
      at -= chunk.length;
    }
    throw new RangeError("peek past the end");
  }

  #take(n: number): Uint8Array {
    this.#available -= n;
    const first = this.#chunks[0];
    if (n === 0) return new Uint8Array();
    if (first.length - this.#offset >= n) {
      const out = first.subarray(this.#offset, this.#offset + n);
      this.#offset += n;
      if (this.#offset === first.length) {
        this.#chunks.shift();
        this.#offset = 0;
      }
      return out;
    }
    const out = new Uint8Array(n);
    let filled = 0;
    while (filled < n) {
      const chunk = this.#chunks[0];
      const count = Math.min(n - filled, chunk.length - this.#offset);
      out.set(chunk.subarray(this.#offset, this.#offset + count), filled);
      filled += count;
      this.#offset += count;
      if (this.#offset === chunk.length) {
        this.#chunks.shift();
        this.#offset = 0;
      }
    }
    return out;
  }
}

export { decoder as textDecoder, encoder as textEncoder };
