import assert from "node:assert/strict";
import { captureWarnings } from "../../../tests/_warnings.ts";
import { metric, readText, reward, Task } from "../task.ts";
import { rescoreTrace } from "./rescore.ts";
import type { TaskTrace } from "../trace.ts";
import { Trace } from "../trace.ts";

class SavedTask extends Task {
  // Reads only the trace: can be rescored offline.
  said_paris = reward(
    ({ trace }) => (trace.messages.some((m) => String(m.content).includes("Paris")) ? 1 : 0),
    { offline: true, weight: 2 },
  );
  // Needs the sandbox.
  file_ok = reward(async ({ runtime }) => ((await readText(runtime, "/app/x")) ? 1 : 0));
  length = metric(({ trace }) => trace.messages.length, { offline: true });
}

Deno.test("rescoreTrace(): offline hooks and plugged ones score a saved trace; hooks that need the sandbox are skipped and named", async () => {
  const saved = Trace.read({
    trace_id: "t1",
    task: { key: "k", idx: 0, hash: "h" },
    messages: [{ role: "user", content: "Capital?" }, { role: "assistant", content: "Paris" }],
    info: { note: 1 },
  } as unknown as TaskTrace).record;
  const task = new SavedTask({ prompt: "Capital?" }, {
    rewards: { extra: { fn: () => 0.5, offline: true } },
  });
  let result!: Awaited<ReturnType<typeof rescoreTrace>>;
  const warned = await captureWarnings(async () => (result = await rescoreTrace(task, saved)));
  const { scores, skipped } = result;
  assert.deepEqual(scores.rewards, { extra: 0.5, said_paris: 1 });
  assert.equal(scores.reward, 0.5 + 2);
  assert.deepEqual(scores.metrics, { length: 2 });
  assert.deepEqual(skipped, ["file_ok"]);
  assert.match(warned.join("\n"), /skipped "file_ok": they need a live sandbox/);
});

Deno.test("rescoreTrace(): a task with nothing it can score offline gets no reward, never a 0", async () => {
  class LiveOnly extends Task {
    ok = reward(async ({ runtime }) => ((await readText(runtime, "/x")) ? 1 : 0));
  }
  const saved = Trace.read({
    trace_id: "t2",
    task: { key: "k", idx: 0, hash: "h" },
    info: { judge: [{ judge: "old", usage: { input_tokens: 9, output_tokens: 9 } }] },
  } as unknown as TaskTrace).record;
  let result!: Awaited<ReturnType<typeof rescoreTrace>>;
  await captureWarnings(
    async () => (result = await rescoreTrace(new LiveOnly({ prompt: "q" }), saved)),
  );
  assert.equal(result.scores.reward, null);
  assert.deepEqual(result.skipped, ["ok"]);
  assert.equal(
    result.info.judge,
    undefined,
    "old judge replies are not carried into the new scoring",
  );
});
