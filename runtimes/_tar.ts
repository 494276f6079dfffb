/**
 * A minimal in-memory tar writer and reader: ustar headers, PAX `path`/`size` records for
 * long names and large files, GNU long names when reading. Enough for the Docker archive API
 * (which speaks PAX/ustar) without pulling a streaming library into the hot path.
 * @module
 */

import { concatBytes } from "./_util.ts";

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
  return concatBytes(parts);
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

/**
 * A matcher for exclude globs, as tar applies them: a pattern matches at any depth (after
 * any `/`) and excludes everything below what it matches. `*` and `?` stay within one path
 * component, `**` crosses them.
 */
export function excludeMatcher(patterns: string[]): (relativePath: string) => boolean {
  const res = patterns.map((glob) => {
    let re = "";
    for (let i = 0; i < glob.length; i++) {
      const c = glob[i];
      if (c === "*") {
        if (glob[i + 1] === "*") {
          re += ".*";
          i++;
          if (glob[i + 1] === "/") i++;
        } else re += "[^/]*";
      } else if (c === "?") re += "[^/]";
      else re += c.replace(/[.+^${}()|[\]\\]/g, "\\$&");
    }
    const anchored = glob.startsWith("/");
    return new RegExp(`${anchored ? "^" : "(^|/)"}${anchored ? re.slice(1) : re}(/.*)?$`);
  });
  return (path) => res.some((re) => re.test(path));
}

/** Options of {@linkcode TarCollector}. */
export interface TarCollectOptions {
  /** Drop members whose path below the archive's root entry this returns true for. */
  exclude?: (relativePath: string) => boolean;
  /** Throw `tooLarge(bytes)` as soon as the kept bytes pass this. */
  maxBytes?: number;
  /** The error to throw when `maxBytes` is passed. */
  tooLarge?: (bytes: number) => Error;
}

/**
 * Collects a tar arriving in chunks, keeping only the members `exclude` spares, with the
 * byte limit enforced while it arrives: an excluded member's data is never held, and an
 * archive over `maxBytes` stops at the first chunk that passes it. Kept members keep their
 * original bytes (headers, links, modes).
 */
export class TarCollector {
  readonly #options: TarCollectOptions;
  #pending = new Uint8Array(0);
  #out: Uint8Array[] = [];
  #kept = 0;
  /** Extension headers (pax, GNU long names) waiting for the member they describe. */
  #meta: Uint8Array[] = [];
  #pax: Record<string, string> = {};
  #longName: string | undefined;
  /** Data bytes (with padding) of the current member still to come, and whether it is kept. */
  #remaining = 0;
  #keep = true;
  #ended = false;

  constructor(options: TarCollectOptions = {}) {
    this.#options = options;
  }

  /** Bytes kept so far. */
  get kept(): number {
    return this.#kept;
  }

  #emit(bytes: Uint8Array): void {
    if (bytes.length === 0) return;
    this.#kept += bytes.length;
    const max = this.#options.maxBytes;
    if (max !== undefined && this.#kept > max) {
      throw this.#options.tooLarge?.(this.#kept) ??
        new RangeError(`The archive is over ${max} bytes`);
    }
    this.#out.push(bytes.slice());
  }

  /** Feeds the next chunk; throws `tooLarge` once the kept bytes pass `maxBytes`. */
  push(chunk: Uint8Array): void {
    let data = this.#pending.length ? concatBytes([this.#pending, chunk]) : chunk;
    this.#pending = new Uint8Array(0);
    while (data.length > 0 && !this.#ended) {
      if (this.#remaining > 0) {
        const n = Math.min(this.#remaining, data.length);
        if (this.#keep) this.#emit(data.subarray(0, n));
        this.#remaining -= n;
        data = data.subarray(n);
        continue;
      }
      if (data.length < BLOCK) break;
      const h = data.subarray(0, BLOCK);
      if (h.every((b) => b === 0)) {
        this.#ended = true;
        break;
      }
      const typeflag = String.fromCharCode(h[156] || 0x30);
      let size = readOctal(h, 124, 12);
      if (typeflag === "x" || typeflag === "g" || typeflag === "L" || typeflag === "K") {
        // An extension header: small, held whole with its data until its member comes.
        const total = BLOCK + size + padding(size);
        if (data.length < total) break;
        const body = data.subarray(BLOCK, BLOCK + size);
        if (typeflag === "x") this.#pax = { ...this.#pax, ...parsePax(body) };
        if (typeflag === "L") this.#longName = readString(body, 0, body.length);
        this.#meta.push(data.slice(0, total));
        data = data.subarray(total);
        continue;
      }
      if (this.#pax.size !== undefined) size = Number(this.#pax.size);
      const prefix = readString(h, 345, 155);
      const base = readString(h, 0, 100);
      const name = this.#pax.path ?? this.#longName ?? (prefix ? `${prefix}/${base}` : base);
      const rel = name.replace(/^[^/]+\/?/, ""); // below the archived entry
      this.#keep = !(rel && this.#options.exclude?.(rel.replace(/\/$/, "")));
      if (this.#keep) {
        for (const m of this.#meta) this.#emit(m);
        this.#emit(h);
      }
      this.#meta = [];
      this.#pax = {};
      this.#longName = undefined;
      this.#remaining = size + padding(size);
      data = data.subarray(BLOCK);
    }
    if (data.length && !this.#ended) this.#pending = data.slice();
  }

  /** The kept archive, with its end-of-archive blocks. */
  finish(): Uint8Array {
    return concatBytes([...this.#out, new Uint8Array(BLOCK * 2)]);
  }
}

function setChecksum(h: Uint8Array): void {
  h.fill(0x20, 148, 156);
  let sum = 0;
  for (const b of h) sum += b;
  writeString(h, 148, 7, sum.toString(8).padStart(6, "0") + "\0");
  h[155] = 0x20;
}

/** One archive to place below a directory in {@linkcode joinTars}. */
export interface TarPart {
  /** Directory the part's members go below, `/`-separated, no leading slash; "" for the root. */
  under: string;
  tar: Uint8Array;
}

/**
 * Joins archives into one, each part's members renamed to sit below its `under` directory
 * (hard-link targets too, since they are archive paths). Every other header field, the data
 * and the member order are kept byte for byte, so one upload restores what several did.
 */
export function joinTars(parts: TarPart[]): Uint8Array {
  const out: Uint8Array[] = [];
  for (const { under, tar } of parts) {
    const base = under.replace(/^\/+|\/+$/g, "");
    const place = (name: string) => (base ? `${base}/${name}` : name);
    let offset = 0;
    let pax: Record<string, string> = {};
    let longName: string | undefined;
    let longLink: string | undefined;
    while (offset + BLOCK <= tar.length) {
      const h = tar.subarray(offset, offset + BLOCK);
      if (h.every((b) => b === 0)) break;
      const typeflag = String.fromCharCode(h[156] || 0x30);
      let size = readOctal(h, 124, 12);
      const isMeta = typeflag === "x" || typeflag === "g" || typeflag === "L" || typeflag === "K";
      if (!isMeta && pax.size !== undefined) size = Number(pax.size);
      const data = tar.subarray(offset + BLOCK, offset + BLOCK + size);
      const next = offset + BLOCK + size + padding(size);
      if (isMeta) {
        if (typeflag === "x") pax = { ...pax, ...parsePax(data) };
        if (typeflag === "L") longName = readString(data, 0, data.length);
        if (typeflag === "K") longLink = readString(data, 0, data.length);
        offset = next;
        continue;
      }
      const prefix = readString(h, 345, 155);
      const baseName = readString(h, 0, 100);
      const name = place(pax.path ?? longName ?? (prefix ? `${prefix}/${baseName}` : baseName));
      const rawLink = pax.linkpath ?? longLink ?? readString(h, 157, 100);
      const link = typeflag === "1" ? place(rawLink) : rawLink;
      const { path: _path, linkpath: _linkpath, ...rest } = pax;
      const needsPax = encoder.encode(name).length > 100 || encoder.encode(link).length > 100 ||
        Object.keys(rest).length > 0;
      const copy = h.slice();
      copy.fill(0, 0, 100);
      copy.fill(0, 345, 500);
      writeString(copy, 0, 100, name);
      copy.fill(0, 157, 257);
      writeString(copy, 157, 100, link);
      setChecksum(copy);
      if (needsPax) {
        const records = Object.entries({ ...rest, path: name, ...(link ? { linkpath: link } : {}) })
          .map(([key, value]) => paxRecord(key, value)).join("");
        const body = encoder.encode(records);
        out.push(header("PaxHeader", "x", body.length, 0o644, readOctal(h, 136, 12), 0, 0));
        out.push(body, new Uint8Array(padding(body.length)));
      }
      out.push(copy, tar.subarray(offset + BLOCK, next));
      pax = {};
      longName = undefined;
      longLink = undefined;
      offset = next;
    }
  }
  out.push(new Uint8Array(BLOCK * 2));
  return concatBytes(out);
}

/** A command that streams its output, as {@linkcode collectTarOutput} starts it. */
export interface StreamingCommand<T> {
  close(): void;
  done: Promise<T>;
}

/**
 * Runs a command that writes a tar on stdout into `collector` as it arrives (filtered and
 * bounded there): when the collector refuses a chunk (over its byte limit), the command is
 * closed and that refusal is thrown once it has ended. Otherwise gives what the command's
 * `done` gave and its stderr; the caller judges the exit and calls `collector.finish()`.
 */
export async function collectTarOutput<T>(
  collector: TarCollector,
  start: (io: {
    onStdout: (chunk: Uint8Array) => void;
    onStderr: (chunk: Uint8Array) => void;
  }) => Promise<StreamingCommand<T>>,
): Promise<{ exit: T | undefined; stderr: Uint8Array[] }> {
  let failure: unknown;
  // Assigned once start() returns; the output callback may run before that (no const: TDZ).
  // deno-lint-ignore prefer-const
  let command: StreamingCommand<T> | undefined;
  const stderr: Uint8Array[] = [];
  command = await start({
    onStdout: (chunk) => {
      if (failure !== undefined) return;
      try {
        collector.push(chunk);
      } catch (error) {
        failure = error;
        command?.close(); // else closed below, once start() has returned
      }
    },
    onStderr: (chunk) => stderr.push(chunk),
  });
  if (failure !== undefined) command.close();
  const exit = await command.done.catch((error) => {
    if (failure === undefined) throw error;
    return undefined;
  });
  if (failure !== undefined) throw failure;
  return { exit, stderr };
}
