/**
 * A requeued rollout (`vf ctl requeue`: the errored row stays in `results.jsonl`, a later row
 * names it by `retry_of`) is one rollout in `vf view`'s API and in `vf export`, as it is in
 * `loadOutputs`; a `vf run` task retried is its latest line in the viewer, as `loadEpisodes`
 * keeps it. The retry lands after the viewer indexed the errored row, as in a live run.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { finetuneRows } from "../lib/cli/_finetune.ts";
import { loadOutputs } from "../lib/eval/results.ts";
import { viewApp } from "../lib/view/server.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const row = (id: number, tid: string, reward: number | null, extra: Json = {}) =>
  JSON.stringify({
    example_id: id,
    trajectory_id: tid,
    prompt: [{ role: "user", content: `q${id}` }],
    completion: reward === null ? [] : [{ role: "assistant", content: `a${id}` }],
    reward,
    error: reward === null ? { error: "ModelError", message: "down" } : null,
    token_usage: { input_tokens: 10, output_tokens: reward === null ? 0 : 5 },
    ...extra,
  }) + "\n";

async function api(app: ReturnType<typeof viewApp>, path: string): Promise<Json> {
  const res = await app.fetch(
    new Request(`http://127.0.0.1/${path}`, { headers: { host: "127.0.0.1" } }),
  );
  assert.equal(res.status, 200, path);
  return await res.json();
}

Deno.test("vf view and vf export: a requeued rollout's errored row is dropped once its retry lands, and the counts, histogram, tokens and pages follow", async () => {
  const root = await Deno.makeTempDir({ prefix: "vf-view-retry-" });
  try {
    const dir = join(root, "run");
    await Deno.mkdir(dir);
    await Deno.writeTextFile(join(dir, "metadata.json"), JSON.stringify({ env_id: "e" }));
    const file = join(dir, "results.jsonl");
    await Deno.writeTextFile(file, row(0, "t0", 1) + row(1, "t1", null) + row(2, "t2", 0.5));
    const app = viewApp(root, { indexDir: join(root, "index") });

    const before = await api(app, "api/run?id=run");
    assert.equal(before.rollouts, 3);
    assert.equal(before.errors, 1);
    assert.equal(before.histogram.unscored, 1);
    const errorsPage = await api(app, "api/rollouts?id=run&errors=only");
    assert.equal(errorsPage.total, 1);

    // The retry lands later (a live run), and the errored row it re-ran no longer counts.
    await Deno.writeTextFile(file, row(1, "t1b", 0.75, { retry_of: "t1" }), { append: true });
    const after = await api(app, "api/run?id=run");
    assert.equal(after.rollouts, 3);
    assert.equal(after.errors, 0);
    assert.deepEqual(after.histogram.errors, {});
    assert.equal(after.histogram.unscored, 0);
    assert.deepEqual(after.histogram.buckets, [0, 0, 0, 0, 0, 1, 0, 1, 0, 1]);
    assert.equal(after.tokens, 45);
    const all = await api(app, "api/rollouts?id=run");
    assert.equal(all.total, 3);
    assert.deepEqual(all.rows.map((r: Json) => [r.line, r.example, r.rollout, r.reward]), [
      [0, "0", 0, 1],
      [2, "2", 0, 0.5],
      [3, "1", 0, 0.75],
    ]);
    const mean = all.rows.reduce((a: number, r: Json) => a + r.reward, 0) / all.rows.length;
    assert.equal(mean, 0.75);
    assert.equal((await api(app, "api/rollouts?id=run&errors=only")).total, 0);
    assert.equal((await api(app, "api/rollouts?id=run&example=1")).total, 1);
    assert.equal((await loadOutputs(dir)).length, all.total); // as the run's own reader counts

    const report = await finetuneRows(file, "results", "messages", {}, () => {});
    assert.equal(report.rows.length, 3);
    const one = report.rows.map((r) => JSON.parse(r)).filter((r) => r.metadata.example_id === 1);
    assert.equal(one.length, 1);
    assert.equal(one[0].metadata.trajectory_id, "t1b");
    // The retried rollout's own filter: it passed on its retry.
    const passed = await finetuneRows(file, "results", "sharegpt", { success: true }, () => {});
    assert.equal(passed.rows.length, 3);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("vf view: a vf run task written again (a resumed or retried episode) is its latest line only", async () => {
  const root = await Deno.makeTempDir({ prefix: "vf-view-rerun-" });
  try {
    const dir = join(root, "run");
    await Deno.mkdir(dir);
    await Deno.writeTextFile(join(dir, "metadata.json"), JSON.stringify({ taskset: "t" }));
    const trace = (key: string, index: number, reward: number | null, id: string) =>
      JSON.stringify({
        trace_id: id,
        task: { key },
        rollout_index: index,
        reward,
        error: reward === null ? { error: "SandboxError", message: "gone" } : null,
        messages: [{ role: "user", content: "go" }, { role: "assistant", content: "ok" }],
        usage: { input_tokens: 4, output_tokens: 2 },
      }) + "\n";
    const file = join(dir, "traces.jsonl");
    await Deno.writeTextFile(file, trace("a", 0, 1, "x1") + trace("a", 1, null, "x2"));
    const app = viewApp(root, { indexDir: join(root, "index") });
    assert.equal((await api(app, "api/run?id=run")).errors, 1);
    await Deno.writeTextFile(file, trace("a", 1, 0, "x3"), { append: true });
    const run = await api(app, "api/run?id=run");
    assert.equal(run.rollouts, 2);
    assert.equal(run.errors, 0);
    assert.equal(run.tokens, 12);
    const all = await api(app, "api/rollouts?id=run");
    assert.deepEqual(all.rows.map((r: Json) => [r.line, r.rollout, r.reward]), [[0, 0, 1], [
      2,
      1,
      0,
    ]]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
