/**
 * Heap bytes a call allocates, for `bench/allocation.ts`. V8
 * reports what the isolate allocated in all; the least over many rounds is taken, so the
 * rounds before the optimising compiler has the code (later on a busy machine) do not count.
 * @module
 */
import v8 from "node:v8";

function allocated(): number {
  // Deno's V8 reports it; the Node typings do not list it.
  const stats = v8.getHeapStatistics() as { total_allocated_bytes?: number };
  if (stats.total_allocated_bytes === undefined) {
    throw new TypeError("This runtime does not report total_allocated_bytes");
  }
  return stats.total_allocated_bytes;
}

/** The least heap bytes per call of `fn` over `rounds` rounds of `calls` calls each. */
export function bytesPerCall(fn: () => unknown, calls = 5000, rounds = 30): number {
  let least = Infinity;
  for (let r = 0; r < rounds; r++) {
    const before = allocated();
    for (let i = 0; i < calls; i++) fn();
    least = Math.min(least, (allocated() - before) / calls);
  }
  return least;
}

/** The least heap bytes per unit of `run()` (which does `units` of work) over `rounds` runs. */
export async function bytesPerUnit(
  run: () => Promise<unknown>,
  units: number,
  rounds = 5,
): Promise<number> {
  let least = Infinity;
  for (let r = 0; r < rounds; r++) {
    const before = allocated();
    await run();
    least = Math.min(least, (allocated() - before) / units);
  }
  return least;
}
