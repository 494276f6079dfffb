import assert from "node:assert/strict";
import { join } from "node:path";
import { eachSavedOutput } from "./saved.ts";
import { loadOutputs } from "./results.ts";
import type { RolloutOutput } from "../state.ts";

const line = (o: Record<string, unknown>) => JSON.stringify(o) + "\n";

async function visited(dir: string): Promise<{ outputs: RolloutOutput[]; count: number }> {
  const outputs: RolloutOutput[] = [];
  const count = await eachSavedOutput(dir, (o) => void outputs.push(o), { onCorrupt: () => {} });
  return { outputs, count };
}

Deno.test("eachSavedOutput: the outputs loadOutputs returns, in order, across reads of 1 MiB, with corrupt lines and rows without an example_id left out", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-saved-" });
  try {
    const big = "x".repeat(300_000); // lines that straddle the reader's 1 MiB reads
    let text = "";
    for (let i = 0; i < 12; i++) text += line({ example_id: i, reward: i % 2, pad: big, s: "é" });
    text += "{torn\n" + line({ example_id: "x", reward: 1 }) + "\n" + line({ example_id: 12 });
    await Deno.writeTextFile(join(dir, "results.jsonl"), text + '{"example_id": 13');
    const { outputs, count } = await visited(dir);
    const loaded = await loadOutputs(dir, { onCorrupt: () => {} });
    assert.equal(count, 13);
    assert.deepEqual(outputs.map((o) => o.example_id), [...Array(13).keys()]);
    assert.deepEqual(outputs, loaded);
    assert.equal((await visited(join(dir, "missing"))).count, 0);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test('eachSavedOutput: a file where a line re-runs another ("retry_of", split across two reads) is read as loadOutputs reads it', async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-saved-" });
  try {
    // The key straddles the first 1 MiB read, so the scan must see it across reads.
    const first = line({ example_id: 0, trajectory_id: "a", error: { error: "E", message: "m" } });
    const head = '{"example_id":1,"p":"';
    const pad = (1 << 20) - 3 - first.length - head.length - '",'.length;
    const second = `${head}${"y".repeat(pad)}","retry_of":"a","trajectory_id":"b"}\n`;
    assert.equal(first.length + second.indexOf('"retry_of"'), (1 << 20) - 3);
    await Deno.writeTextFile(join(dir, "results.jsonl"), first + second);
    const { outputs } = await visited(dir);
    assert.deepEqual(outputs, await loadOutputs(dir));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
