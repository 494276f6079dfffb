/**
 * A minimal in-memory tar writer and reader: ustar headers, PAX `path`/`size` records for
 * long names and large files, GNU long names when reading. Enough for the Docker archive API
 * (which speaks PAX/ustar) without pulling a streaming library into the hot path.
 * @module
 */

const BLOCK = 512;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** One entry to pack. */
export interface TarEntry {
  /** Path inside the archive, `/`-separated, no leading slash. Directories may end in `/`. */
  name: string;
  type: "file" | "directory";
  /** File content (files only). */
  data?: Uint8Array;
  /** Permission bits; default 0o644 for files and 0o755 for directories. */
  mode?: number;
  /** Modification time in seconds; default now. */
  mtime?: number;
  uid?: number;
  gid?: number;
}

/** One entry read back. */
export interface TarRecord {
  name: string;
  /** `0` file, `5` directory, `2` symlink, `1` hard link, ... (the ustar type flag). */
  typeflag: string;
  size: number;
  mode: number;
  linkname: string;
  data: Uint8Array;
}

function writeString(buf: Uint8Array, offset: number, length: number, value: string): void {
  const bytes = encoder.encode(value);
  buf.set(bytes.subarray(0, length), offset);
}

function writeOctal(buf: Uint8Array, offset: number, length: number, value: number): void {
  // length - 1 digits then NUL.
  const text = Math.floor(value).toString(8).padStart(length - 1, "0");
  writeString(buf, offset, length - 1, text);
  buf[offset + length - 1] = 0;
}

function header(
  name: string,
  typeflag: string,
  size: number,
  mode: number,
  mtime: number,
  uid: number,
  gid: number,
): Uint8Array {
  const h = new Uint8Array(BLOCK);
  writeString(h, 0, 100, name);
  writeOctal(h, 100, 8, mode);
  writeOctal(h, 108, 8, uid);
  writeOctal(h, 116, 8, gid);
  writeOctal(h, 124, 12, size);
  writeOctal(h, 136, 12, mtime);
  h.fill(0x20, 148, 156); // checksum is computed with this field as spaces
  writeString(h, 156, 1, typeflag);
  writeString(h, 257, 6, "ustar");
  writeString(h, 263, 2, "00");
  writeString(h, 265, 32, uid === 0 ? "root" : "");
  writeString(h, 297, 32, gid === 0 ? "root" : "");
  let sum = 0;
  for (const b of h) sum += b;
  writeString(h, 148, 7, sum.toString(8).padStart(6, "0") + "\0");
  h[155] = 0x20;
  return h;
}

function paxRecord(key: string, value: string): string {
  // "<length> key=value\n", where <length> counts its own digits too.
  const base = encoder.encode(` ${key}=${value}\n`).length;
  let length = base + 1;
  while (String(length).length + base !== length) length = base + String(length).length;
  return `${length} ${key}=${value}\n`;
}

function padding(size: number): number {
  return (BLOCK - (size % BLOCK)) % BLOCK;
}

/** Packs entries into a tar archive (with the two closing zero blocks). */
export function packTar(entries: TarEntry[]): Uint8Array {
  const parts: Uint8Array[] = [];
  const now = Math.floor(Date.now() / 1000);
  for (const entry of entries) {
    const isDir = entry.type === "directory";
    let name = entry.name.replace(/^\/+/, "");
    if (isDir && !name.endsWith("/")) name += "/";
    const data = isDir ? new Uint8Array(0) : entry.data ?? new Uint8Array(0);
    const mode = entry.mode ?? (isDir ? 0o755 : 0o644);
    const mtime = entry.mtime ?? now;
    const uid = entry.uid ?? 0;
    const gid = entry.gid ?? 0;
    const tooLong = encoder.encode(name).length > 100 || data.length > 0o77777777777;
    if (tooLong) {
      const pax = encoder.encode(paxRecord("path", name) + paxRecord("size", String(data.length)));
      parts.push(header("PaxHeader", "x", pax.length, 0o644, mtime, 0, 0));
      parts.push(pax, new Uint8Array(padding(pax.length)));
      name = name.slice(0, 99);
    }
    parts.push(header(name, isDir ? "5" : "0", data.length, mode, mtime, uid, gid));
    if (data.length > 0) parts.push(data, new Uint8Array(padding(data.length)));
  }
  parts.push(new Uint8Array(BLOCK * 2));
  let total = 0;
  for (const p of parts) total += p.length;
  const out = new Uint8Array(total);
  let offset = 0;
  for (const p of parts) {
    out.set(p, offset);
    offset += p.length;
  }
  return out;
}

function readString(buf: Uint8Array, offset: number, length: number): string {
  let end = offset;
  while (end < offset + length && buf[end] !== 0) end++;
  return decoder.decode(buf.subarray(offset, end));
}

function readOctal(buf: Uint8Array, offset: number, length: number): number {
  if (buf[offset] & 0x80) {
    // GNU base-256 encoding for large values.
    let value = 0;
    for (let i = offset + 1; i < offset + length; i++) value = value * 256 + buf[i];
    return value;
  }
  const text = readString(buf, offset, length).trim();
  return text === "" ? 0 : parseInt(text, 8);
}

function parsePax(data: Uint8Array): Record<string, string> {
  const out: Record<string, string> = {};
  let i = 0;
  while (i < data.length) {
    const space = data.indexOf(0x20, i);
    if (space < 0) break;
    const length = parseInt(decoder.decode(data.subarray(i, space)), 10);
    if (!(length > 0)) break;
    const record = data.subarray(space + 1, i + length - 1); // drop the trailing newline
    const eq = record.indexOf(0x3d);
    if (eq > 0) {
      out[decoder.decode(record.subarray(0, eq))] = decoder.decode(record.subarray(eq + 1));
    }
    i += length;
  }
  return out;
}

/** Reads every entry of a tar archive held in memory. */
export function* readTar(buf: Uint8Array): Generator<TarRecord> {
  let offset = 0;
  let pax: Record<string, string> = {};
  let longName: string | undefined;
  let longLink: string | undefined;
  while (offset + BLOCK <= buf.length) {
    const h = buf.subarray(offset, offset + BLOCK);
    if (h.every((b) => b === 0)) return;
    const typeflag = String.fromCharCode(h[156] || 0x30);
    let size = readOctal(h, 124, 12);
    const dataStart = offset + BLOCK;
    if (pax.size !== undefined && typeflag !== "x" && typeflag !== "g") size = Number(pax.size);
    const data = buf.subarray(dataStart, dataStart + size);
    offset = dataStart + size + padding(size);
    if (typeflag === "x") {
      pax = { ...pax, ...parsePax(data) };
      continue;
    }
    if (typeflag === "g") continue;
    if (typeflag === "L") {
      longName = readString(data, 0, data.length);
      continue;
    }
    if (typeflag === "K") {
      longLink = readString(data, 0, data.length);
      continue;
    }
    const prefix = readString(h, 345, 155);
    const baseName = readString(h, 0, 100);
    const name = pax.path ?? longName ?? (prefix ? `${prefix}/${baseName}` : baseName);
    const linkname = pax.linkpath ?? longLink ?? readString(h, 157, 100);
    yield { name, typeflag, size, mode: readOctal(h, 100, 8), linkname, data };
    pax = {};
    longName = undefined;
    longLink = undefined;
  }
}
