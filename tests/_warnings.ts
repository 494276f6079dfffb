/**
 * What code under test prints with `console.warn`, captured so tests can assert on it and stay
 * quiet.
 * @module
 */

/** Runs `fn` (and waits for it) with console.warn captured; returns the warnings, in order. */
export async function captureWarnings(fn: () => unknown): Promise<string[]> {
  const seen: string[] = [];
  const original = console.warn;
  console.warn = (...args: unknown[]) => void seen.push(args.map(String).join(" "));
  try {
    await fn();
  } finally {
    console.warn = original;
  }
  return seen;
}
