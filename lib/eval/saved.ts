/**
 * Visiting a run's saved outputs one at a time, for readers that keep a few fields of each
 * (`--resume`, `vf compare`): a million-rollout `results.jsonl` is about a gigabyte of records,
 * and holding them all made every such reader slower per rollout the larger the run.
 * @module
 */
import { Buffer } from "node:buffer";
import { open } from "node:fs/promises";
import { join } from "node:path";
import type { RolloutOutput } from "../state.ts";
import { type CorruptLine, eachJsonLine } from "./jsonl.ts";
import { loadOutputs } from "./results.ts";

/** The key a line carries when it re-runs an earlier one (`vf ctl requeue`). */
const RETRY_KEY = Buffer.from('"retry_of"');

/** Whether `path` holds `needle` anywhere (false for a missing file). */
async function fileHolds(path: string, needle: Buffer): Promise<boolean> {
  let handle;
  try {
    handle = await open(path, "r");
  } catch {
    return false;
  }
  try {
    const buffer = Buffer.alloc(1 << 20);
    let kept = 0; // bytes carried over from the last read, so a needle across reads is seen
    for (;;) {
      const { bytesRead } = await handle.read(buffer, kept, buffer.length - kept, null);
      if (bytesRead === 0) return false;
      const end = kept + bytesRead;
      if (buffer.subarray(0, end).indexOf(needle) >= 0) return true;
      kept = Math.min(needle.length - 1, end);
      buffer.copyWithin(0, end - kept, end);
    }
  } finally {
    await handle.close();
  }
}

/**
 * Visit the outputs {@linkcode loadOutputs} returns for `dir`, in the same order, without
 * keeping them; returns how many were visited. When a line re-runs an earlier one (a requeued
 * rollout names the one it replaces), which lines count is known only at the end of the file,
 * so such a file is read whole, as `loadOutputs` reads it.
 */
export async function eachSavedOutput(
  dir: string,
  visit: (output: RolloutOutput) => void,
  options: { onCorrupt?: (corrupt: CorruptLine) => void } = {},
): Promise<number> {
  const path = join(dir, "results.jsonl");
  if (await fileHolds(path, RETRY_KEY)) {
    const outputs = await loadOutputs(dir, options);
    for (const o of outputs) visit(o);
    return outputs.length;
  }
  return await eachJsonLine<RolloutOutput>(path, visit, {
    onCorrupt: options.onCorrupt,
    check: (o) => Number.isInteger(o.example_id) ? null : 'no integer "example_id"',
  });
}
