/**
 * Where user code threw: the first stack frame outside vf's own source, for error messages
 * that name the user's file and line.
 * @module
 */
import { describeError } from "../errors.ts";

const VF_ROOT = new URL("../../", import.meta.url).href;

/**
 * Where `error` was thrown in the user's code: the first frame of its stack outside vf's own
 * source and installed packages, as `path:line:column`; null when there is none.
 */
export function userFrame(error: unknown): string | null {
  const stack = error instanceof Error ? error.stack ?? "" : "";
  for (const line of stack.split("\n").slice(1)) {
    const m = /\(?((?:file|https?):\/\/[^\s()]+):(\d+):(\d+)\)?\s*$/.exec(line.trim());
    if (!m) continue;
    const [, url, row, col] = m;
    if (url.startsWith(VF_ROOT) && !url.slice(VF_ROOT.length).startsWith("environments/")) {
      continue;
    }
    if (url.includes("/node_modules/") || url.includes("registry.npmjs.org")) continue;
    const path = url.startsWith("file://") ? decodeURIComponent(new URL(url).pathname) : url;
    return `${path}:${row}:${col}`;
  }
  return null;
}

/** `describeError(error)` followed by ` (at path:line:column)` where the user's code threw it. */
export function describeWhere(error: unknown): string {
  const where = userFrame(error);
  // Deno reports a module that does not parse as a TypeError whose message is the SyntaxError.
  const text = error instanceof Error && /^[A-Z]\w*Error\b/.test(error.message)
    ? error.message
    : describeError(error);
  return text + (where ? ` (at ${where})` : "");
}
