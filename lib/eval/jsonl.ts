/**
 * Reading JSON Lines files that untrusted code may have written, or a crash may have cut: a
 * torn or corrupt line is named by file and line and skipped, never a bare SyntaxError, and a
 * file of any size is read line by line.
 * @module
 */
import { appendFile, open, readFile, stat } from "node:fs/promises";
import { terminalText } from "../util/terminal.ts";

/** Truncate a partial last line left by a crash mid-write. */
export async function repairTrailingLine(path: string): Promise<void> {
  let size: number;
  try {
    size = (await stat(path)).size;
  } catch {
    return;
  }
  if (size === 0) return;
  // Bytes, not text: a torn multi-byte character must not shift where the cut falls, and
  // nothing before the last line is ever rewritten.
  const bytes = await readFile(path);
  let end = bytes.length;
  while (end > 0 && [0x0a, 0x0d, 0x20, 0x09].includes(bytes[end - 1])) end--;
  if (end === 0) return;
  const start = bytes.lastIndexOf(0x0a, end - 1) + 1; // the last non-blank line
  try {
    const value = JSON.parse(
      new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(start, end)),
    );
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      // A complete record whose newline was lost: end the line instead of dropping it.
      if (!bytes.subarray(end).includes(0x0a)) await appendFile(path, "\n");
      return;
    }
  } catch { /* fall through: drop the torn last line */ }
  const fh = await open(path, "r+");
  try {
    await fh.truncate(start);
  } finally {
    await fh.close();
  }
}

/**
 * The longest line read as a record (256 MiB); a longer one is skipped as corrupt without
 * being held, so a hostile file cannot make a reader copy or parse it.
 */
export const MAX_JSON_LINE_BYTES = 256 << 20;

/** A line of a JSONL file that could not be read as a record. */
export interface CorruptLine {
  path: string;
  /** 1-based line number. */
  line: number;
  reason: string;
}

/** Options of {@linkcode readJsonLines}. */
export interface ReadJsonLinesOptions {
  /** Told of each corrupt line. Default: a warning on stderr naming file and line. */
  onCorrupt?: (corrupt: CorruptLine) => void;
  /** What is wrong with a line's object (null: nothing); a line it faults is corrupt too. */
  check?: (value: Record<string, unknown>) => string | null;
}

/**
 * The records of a JSONL file: blank lines skipped, and a corrupt line anywhere (a torn
 * write, a disk error, an edit) skipped and reported to `onCorrupt` (default: a warning on
 * stderr naming file and line), so one bad line never hides the rest. `options` may be the
 * `onCorrupt` function itself.
 */
export async function readJsonLines<T>(
  path: string,
  options: ((corrupt: CorruptLine) => void) | ReadJsonLinesOptions = {},
): Promise<T[]> {
  const out: T[] = [];
  await eachJsonLine<T>(path, (value) => void out.push(value), options);
  return out;
}

/**
 * Visit the records of a JSONL file in order, as {@linkcode readJsonLines} reads them, without
 * keeping them: a reader that needs a few fields of each record (a resume, a comparison) holds
 * what it keeps, not the file. Returns the number of records visited (0 for a missing file).
 */
export async function eachJsonLine<T>(
  path: string,
  visit: (value: T) => void,
  options: ((corrupt: CorruptLine) => void) | ReadJsonLinesOptions = {},
): Promise<number> {
  const { onCorrupt = warnCorrupt, check } = typeof options === "function"
    ? { onCorrupt: options }
    : options;
  let handle;
  try {
    handle = await open(path, "r");
  } catch {
    return 0;
  }
  let visited = 0;
  let i = -1;
  const take = (line: string) => {
    i++;
    if (!line.trim()) return;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch (error) {
      onCorrupt({ path, line: i + 1, reason: `malformed JSON: ${(error as Error).message}` });
      return;
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      onCorrupt({ path, line: i + 1, reason: "not a JSON object" });
      return;
    }
    const problem = check?.(value as Record<string, unknown>);
    if (problem) {
      onCorrupt({ path, line: i + 1, reason: problem });
      return;
    }
    visited++;
    visit(value as T);
  };
  // A line longer than a record can be is not held: it is counted, then reported.
  const oversize = (bytes: number) => {
    i++;
    onCorrupt({
      path,
      line: i + 1,
      reason: `a line of ${bytes} bytes, over the ${
        MAX_JSON_LINE_BYTES >> 20
      } MiB a record may hold`,
    });
  };
  // Line by line from 1 MiB reads: a file past V8's longest string (512 MiB, about half a
  // million rollouts) is read like any other. A line that spans reads keeps its pieces in a
  // list (joined once), not a copy per read.
  try {
    const decoder = new TextDecoder();
    const buffer = new Uint8Array(1 << 20);
    let carry: Uint8Array[] = [];
    let held = 0;
    for (;;) {
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, null);
      if (bytesRead === 0) break;
      const chunk = buffer.subarray(0, bytesRead);
      let start = 0;
      for (let nl = chunk.indexOf(10); nl >= 0; nl = chunk.indexOf(10, start)) {
        const piece = chunk.subarray(start, nl);
        if (held + piece.length > MAX_JSON_LINE_BYTES) oversize(held + piece.length);
        else take(decoder.decode(carry.length ? concatBytes([...carry, piece]) : piece));
        carry = [];
        held = 0;
        start = nl + 1;
      }
      if (start < chunk.length) {
        const rest = chunk.subarray(start);
        if (held + rest.length <= MAX_JSON_LINE_BYTES) carry.push(rest.slice());
        else carry = [];
        held += rest.length;
      }
    }
    if (held > MAX_JSON_LINE_BYTES) oversize(held);
    else take(carry.length ? decoder.decode(concatBytes(carry)) : "");
  } finally {
    await handle.close();
  }
  return visited;
}

function concatBytes(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) (out.set(p, at), at += p.length);
  return out;
}

function warnCorrupt(c: CorruptLine): void {
  // The reason may quote the line, which the file's writer chose: no terminal escapes.
  console.warn(`${c.path}:${c.line}: skipping a corrupt line (${terminalText(c.reason)})`);
}
