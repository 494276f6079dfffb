/** Small helpers shared by the runtimes. @module */

import { homedir } from "node:os";
import { posix } from "node:path";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** UTF-8 bytes of a string; bytes pass through. */
/** `~/…` → the home directory (TOML and JSON configs do not expand it the way a shell does). */
export function expandHome(path: string): string;
export function expandHome(path: string | undefined): string | undefined;
export function expandHome(path: string | undefined): string | undefined {
  return path === "~" || path?.startsWith("~/") ? homedir() + path.slice(1) : path;
}

export function toBytes(data: string | Uint8Array): Uint8Array {
  return typeof data === "string" ? encoder.encode(data) : data;
}

/** Concatenates byte chunks into a new plain `Uint8Array` (never a `Buffer`). */
export function concatBytes(chunks: Uint8Array[]): Uint8Array {
  let total = 0;
  for (const c of chunks) total += c.length;
  const out = new Uint8Array(total);
  let offset = 0;
  for (const c of chunks) {
    out.set(c, offset);
    offset += c.length;
  }
  return out;
}

/** Decodes UTF-8 chunks (invalid sequences become U+FFFD). */
export function decodeChunks(chunks: Uint8Array[]): string {
  return decoder.decode(chunks.length === 1 ? chunks[0] : concatBytes(chunks));
}

/** A readable rendering of argv for messages, shortened. */
export function describeArgv(argv: string[]): string {
  const text = argv.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : JSON.stringify(a))).join(" ");
  return text.length > 120 ? `${text.slice(0, 117)}...` : text;
}

/** Resolves a sandbox path against a sandbox working directory (both POSIX). */
export function resolveSandboxPath(workdir: string, path: string): string {
  if (typeof path !== "string" || path === "") {
    throw new TypeError(`Expected a non-empty sandbox path, got ${JSON.stringify(path)}`);
  }
  return posix.resolve("/", workdir, path);
}

/** Random lowercase hex of `bytes` bytes. */
export function randomHex(bytes: number): string {
  const buf = crypto.getRandomValues(new Uint8Array(bytes));
  return [...buf].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Resolves after `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** `promise`'s value, or undefined when it takes longer than `ms` (the timer is cleared). */
export async function within<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** Environment entries as `KEY=value` strings. */
export function envList(env: Record<string, string> | undefined): string[] | undefined {
  if (!env) return undefined;
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

/** The check every `run()` starts with: argv is a non-empty array. */
export function requireArgv(argv: string[]): void {
  if (!Array.isArray(argv) || argv.length === 0) {
    throw new TypeError("run() needs a non-empty argv");
  }
}

/** The longest delay `setTimeout` keeps; a longer one fires at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Waits for `done`, a timeout or an abort, whichever comes first (timer and listener are
 * removed either way): `{ outcome: "done", value }`, or the interruption without a value.
 */
export async function untilInterrupted<T>(
  done: Promise<T>,
  options: { timeoutMs?: number; signal?: AbortSignal },
): Promise<{ outcome: "done"; value: T } | { outcome: "timeout" | "abort"; value?: undefined }> {
  const { timeoutMs, signal } = options;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let onAbort: (() => void) | undefined;
  const interrupted = new Promise<{ outcome: "timeout" | "abort" }>((resolve) => {
    // A delay past what a timer holds (about 24.8 days) would fire at once: no limit instead.
    if (timeoutMs !== undefined && timeoutMs <= MAX_TIMER_MS) {
      timer = setTimeout(() => resolve({ outcome: "timeout" }), timeoutMs);
    }
    if (signal) {
      onAbort = () => resolve({ outcome: "abort" });
      signal.addEventListener("abort", onAbort, { once: true });
    }
  });
  try {
    return await Promise.race([
      done.then((value) => ({ outcome: "done" as const, value })),
      interrupted,
    ]);
  } finally {
    clearTimeout(timer);
    if (onAbort) signal?.removeEventListener("abort", onAbort);
  }
}
