import assert from "node:assert/strict";
import { join } from "node:path";
import { RunIndex } from "./run_index.ts";

// An error the model caused (a bad tool call) leaves its rollout scored; any other, unscored.
const line = (i: number, reward: number | null, error: string | false = false) =>
  JSON.stringify({
    example_id: i,
    reward,
    error: error ? { error, message: "down" } : null,
    completion: [{ role: "assistant", content: "hi" }],
    token_usage: { input_tokens: 2, output_tokens: 1 },
  }) + "\n";

Deno.test("RunIndex: totals, the histogram and the tokens follow rows appended after they were first asked for; sorted pages keep file order among equal values", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-run-index-" });
  const file = join(dir, "results.jsonl");
  let text = "";
  for (let i = 0; i < 30; i++) text += line(i, i % 3 === 0 ? 1 : 0.25, i % 10 === 9 && "ToolError");
  await Deno.writeTextFile(file, text);
  const index = await RunIndex.open(file, join(dir, "index"));
  try {
    index.refresh();
    assert.equal(index.query({ errors: "only" }).total, 3);
    assert.equal(index.query({}).total, 30);
    assert.deepEqual(index.histogram().buckets, [0, 0, 20, 0, 0, 0, 0, 0, 0, 10]);
    assert.equal(index.tokens, 90);
    const desc = index.query({ sort: "reward", desc: true, pageSize: 12 }).rows;
    assert.deepEqual(desc.map((r) => r.line), [0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 1, 2]);
    const turnsDesc = index.query({ sort: "turns", desc: true, page: 1, pageSize: 5 }).rows;
    assert.deepEqual(turnsDesc.map((r) => r.line), [5, 6, 7, 8, 9]);

    // A live run: more lines, and every count asked for before sees them.
    await Deno.writeTextFile(file, line(30, null, "ModelError") + line(31, 0.55) + line(32, -2), {
      append: true,
    });
    assert.equal(index.refresh(), 3);
    assert.equal(index.query({ errors: "only" }).total, 4);
    assert.equal(index.query({}).total, 33);
    const h = index.histogram();
    // -2 widens the bars to -2 … 1 (0.3 wide): -2, then 0.25, 0.55 and 1 near the top.
    assert.deepEqual([h.lo, h.hi], [-2, 1]);
    assert.deepEqual(h.buckets, [1, 0, 0, 0, 0, 0, 0, 20, 1, 10]);
    assert.equal(h.unscored, 1);
    assert.deepEqual(h.errors, { ToolError: 3, ModelError: 1 });
    assert.equal(index.tokens, 99);
    const asc = index.query({ sort: "reward", pageSize: 3 }).rows;
    assert.deepEqual(asc.map((r) => r.line), [30, 32, 1]); // no reward first, then -2
  } finally {
    index.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("RunIndex: a vf eval row that errored unscored (reward 0 in the file, as upstream writes it) is unscored, not a 0 in the histogram", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-run-index-" });
  const file = join(dir, "results.jsonl");
  await Deno.writeTextFile(
    file,
    line(0, 1) + line(1, 0) + line(2, 0, "RewardError") + line(3, 0.5, "ToolError"),
  );
  const index = await RunIndex.open(file, join(dir, "index"));
  try {
    index.refresh();
    const h = index.histogram();
    assert.deepEqual(h.buckets, [1, 0, 0, 0, 0, 1, 0, 0, 0, 1]);
    assert.equal(h.unscored, 1);
    assert.deepEqual(h.errors, { RewardError: 1, ToolError: 1 });
    const rows = index.query({}).rows;
    assert.deepEqual(rows.map((r) => r.reward), [1, 0, null, 0.5]);
    assert.deepEqual([h.lo, h.hi], [0, 1]);
    // Rewards outside 0 … 1 widen the bars' range to whole numbers around them.
    await Deno.writeTextFile(file, line(4, 2) + line(5, -0.5), { append: true });
    index.refresh();
    const wide = index.histogram();
    assert.deepEqual([wide.lo, wide.hi], [-1, 2]);
    // Bars 0.3 wide from -1: -0.5 in the 2nd, 0 in the 4th, 0.5 in the 6th, 1 in the 7th, 2 in
    // the last.
    assert.deepEqual(wide.buckets, [0, 1, 0, 1, 0, 1, 1, 0, 0, 1]);
  } finally {
    index.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("RunIndex: a results row re-run by a row read before it (retry_of) is not counted, as loadOutputs leaves it out in any order", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-run-index-retry-" });
  const file = join(dir, "results.jsonl");
  const row = (tid: string, reward: number | null, retryOf?: string) =>
    JSON.stringify({
      example_id: 4,
      trajectory_id: tid,
      ...(retryOf ? { retry_of: retryOf } : {}),
      reward,
      error: reward === null ? { error: "ModelError" } : null,
    }) + "\n";
  await Deno.writeTextFile(file, row("new", 1, "old") + row("old", null) + row("other", 0));
  const index = await RunIndex.open(file, join(dir, "index"));
  try {
    index.refresh();
    assert.equal(index.count, 2);
    assert.equal(index.query({ errors: "only" }).total, 0);
    assert.deepEqual(index.query({}).rows.map((r) => [r.line, r.rollout]), [[0, 0], [2, 1]]);
    assert.deepEqual(index.rowsAt(1).map((r) => r.error), ["ModelError"]); // still opened by line
  } finally {
    index.close();
    await Deno.remove(dir, { recursive: true });
  }
});
