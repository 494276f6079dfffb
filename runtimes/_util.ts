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

/** Decodes UTF-8 chunks (invalid sequences become U+FFFD). */
export function decodeChunks(chunks: Uint8Array[]): string {
  if (chunks.length === 1) return decoder.decode(chunks[0]);
  let total = 0;
  for (const c of chunks) total += c.length;
  const out = new Uint8Array(total);
  let offset = 0;
  for (const c of chunks) {
    out.set(c, offset);
    offset += c.length;
  }
  return decoder.decode(out);
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

/**
 * The start protocol runtimes share: once `launch` succeeds, `onRunning` marks the runtime
 * running; if it fails, the runtime is stopped (cleaning up what was created) and the
 * error is rethrown.
 */
export function settleStart(
  launch: Promise<void>,
  onRunning: () => void,
  stop: () => Promise<void>,
): Promise<void> {
  return launch.then(onRunning, async (error) => {
    await stop().catch(() => {});
    throw error;
  });
}
