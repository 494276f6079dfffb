/**
 * Timers that never keep the process alive, under Deno (numeric ids) and Node or Bun
 * (timer objects) alike.
 * @module
 */

/** Lets the process exit while `timer` is still pending; returns the timer. */
export function unrefTimer<T extends ReturnType<typeof setTimeout>>(timer: T): T {
  if (typeof timer === "object" && timer !== null && "unref" in timer) {
    (timer as { unref(): void }).unref();
    return timer;
  }
  const deno = (globalThis as { Deno?: { unrefTimer?(id: number): void } }).Deno;
  deno?.unrefTimer?.(timer as unknown as number);
  return timer;
}
