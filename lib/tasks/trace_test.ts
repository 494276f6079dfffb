import assert from "node:assert/strict";
import { OpenAIChatClient } from "../model/client.ts";
import { startModelServer } from "../model/local_server.ts";
import { MessageGraph, messageHash } from "../graph.ts";
import { assistantMessage, callModel, type Harness, type HarnessContext } from "./harness.ts";
import { runTaskRollout, type TaskTrace } from "./rollout/mod.ts";
import { reward, Task } from "./task.ts";
import { Trace } from "./trace.ts";

Deno.test("messageHash(): tool-call arguments in any key order and null or empty content are the same message", () => {
  const a = messageHash({
    role: "assistant",
    content: null,
    tool_calls: [{ id: "1", name: "f", arguments: '{"b": 2, "a": 1}' }],
  });
  const b = messageHash({
    role: "assistant",
    content: "",
    tool_calls: [{ id: "1", name: "f", arguments: '{"a":1,"b":2}' }],
  });
  assert.equal(a, b);
  assert.notEqual(
    messageHash({ role: "assistant", content: "x", reasoning_content: "plan A" }),
    messageHash({ role: "assistant", content: "x", reasoning_content: "plan B" }),
  );
});

Deno.test("MessageGraph: prompts that extend the last one stay one branch; a rewritten history forks a second", () => {
  const g = new MessageGraph();
  const q = { role: "user" as const, content: "q" };
  const a = { role: "assistant" as const, content: "A" };
  g.commit([q], a);
  g.commit([q, a, { role: "user", content: "more" }], { role: "assistant", content: "B" });
  assert.equal(g.branches().length, 1);
  assert.deepEqual(g.branches()[0].map((m) => m.content), ["q", "A", "more", "B"]);
  g.commit([{ role: "user", content: "summary" }], { role: "assistant", content: "C" });
  assert.deepEqual(g.branches().map((b) => b.map((m) => m.content)), [
    ["q", "A", "more", "B"],
    ["summary", "C"],
  ]);
  assert.deepEqual(g.nodes.map((n) => n.sampled), [false, true, false, true, false, true]);
  // A prompt that fabricates an assistant message: only the real reply is sampled.
  const h = new MessageGraph();
  h.commit([q, { role: "assistant", content: "fake" }, { role: "user", content: "go" }], a);
  assert.deepEqual(h.nodes.map((n) => n.sampled), [false, false, false, true]);
});

class EchoTask extends Task {
  static override HARNESS = "null";
  replied = reward(({ trace }) => (trace.messages.some((m) => m.role === "assistant") ? 1 : 0), {
    weight: 2,
  });
}

/** A harness that compacts its history after two turns (a summary replaces the conversation). */
const compacting: Harness = {
  id: "compacting",
  executesCode: false,
  async run(ctx: HarnessContext) {
    const messages = ctx.recorder.messages;
    messages.push({ role: "user", content: "q" });
    messages.push(assistantMessage(await callModel(ctx, 0, [])));
    messages.push({ role: "user", content: "more" });
    messages.push(assistantMessage(await callModel(ctx, 1, [])));
    messages.splice(0, messages.length, { role: "user", content: "summary of q and more" });
    messages.push(assistantMessage(await callModel(ctx, 2, [])));
    ctx.recorder.stop_condition = "done";
  },
};

Deno.test("Trace: a rollout whose harness rewrites history keeps both branches, and write → read is lossless", async () => {
  let n = 0;
  await using server = await startModelServer({
    responder: () => ({
      content: `reply ${++n}`,
      usage: { prompt_tokens: 5, completion_tokens: 2 },
    }),
  });
  const record = await runTaskRollout({
    task: new EchoTask({ id: "t", prompt: "q" }),
    tasksetId: "echo",
    policy: { runtime: { type: "subprocess" }, harness: compacting },
    client: new OpenAIChatClient({ base_url: server.url }),
    model: "m",
    runId: "trace-test",
  });
  assert.equal(record.ok, true, JSON.stringify(record.error));
  assert.equal(record.nodes?.length, 6);
  const trace = new Trace(record);
  assert.deepEqual(trace.branches.map((b) => b.map((m) => m.content)), [
    ["q", "reply 1", "more", "reply 2"],
    ["summary of q and more", "reply 3"],
  ]);
  assert.equal(trace.numTurns, 3);
  assert.equal(trace.lastReply, "reply 3");
  assert.equal(trace.transcript, "[user]\nsummary of q and more\n\n[assistant]\nreply 3");
  assert.deepEqual(trace.rewards, { replied: { score: 1, weight: 2 } });
  assert.equal(trace.reward, 2);
  assert.deepEqual(trace.usage, { input_tokens: 15, output_tokens: 6, total_tokens: 21 });
  assert.deepEqual(record.model_calls.map((c) => c.node), [1, 3, 5]);
  const line = JSON.stringify(trace.toJSON());
  const again = Trace.read(JSON.parse(line));
  assert.deepEqual(again.toJSON(), JSON.parse(line));
  assert.deepEqual(again.branches, trace.branches);
  assert.equal(again.numTurns, 3);
  assert.equal(again.isLegacy, false);
});

Deno.test("Trace.read(): a version-1 line from an older run reads as a single agent's, with its turns and last reply", () => {
  const v1 = {
    format_version: 1,
    trace_id: "0f3c",
    run_id: "r1",
    taskset: "file-sum",
    task: { key: "file-sum-0", idx: 0, hash: "ab" },
    example_id: 0,
    rollout_index: 0,
    model: "m",
    harness: "bash",
    runtime: { type: "docker", image: "python:3.11-slim" },
    scoring: { mode: "isolated", attempts: 1 },
    messages: [
      { role: "system", content: "sys" },
      { role: "user", content: "sum" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "c", name: "bash", arguments: '{"command":"cat x"}' }],
      },
      { role: "tool", tool_call_id: "c", content: "exit code: 0" },
      { role: "assistant", content: " 6 " },
    ],
    model_calls: [
      { turn: 0, started_at: 1, duration_ms: 3, request_messages: 2, response: { message: {} } },
      { turn: 1, started_at: 2, duration_ms: 3, request_messages: 4, response: { message: {} } },
    ],
    tool_calls: [],
    stop_condition: "no_tools_called",
    reward: 1,
    rewards: { correct: 1 },
    metrics: {},
    ok: true,
    error: null,
    usage: { input_tokens: 10, output_tokens: 4 },
    timing: { total_ms: 9 },
    info: { note: "kept" },
    some_future_field: [1, 2],
  };
  const t = Trace.read(structuredClone(v1));
  assert.equal(t.isLegacy, true);
  assert.deepEqual([t.record.role, t.record.trainable, t.record.attempt], ["agent", true, 0]);
  assert.equal(t.numTurns, 2);
  assert.equal(t.lastReply, "6");
  assert.equal(t.branches.length, 1);
  assert.deepEqual(t.rewards, { correct: { score: 1, weight: 1 } });
  assert.equal(
    t.transcript,
    '[system]\nsys\n\n[user]\nsum\n\n[assistant]\n[tool_call bash({"command":"cat x"})]\n\n' +
      "[tool bash]\nexit code: 0\n\n[assistant]\n 6 ",
  );
  assert.deepEqual((t.toJSON() as unknown as { some_future_field: number[] }).some_future_field, [
    1,
    2,
  ]);
  assert.throws(() => Trace.read({ hello: 1 }), TypeError);
});

Deno.test("Trace mutators: recordReward re-totals with weights, stop keeps the first condition, recordError voids the reward", () => {
  const t = Trace.read({
    trace_id: "x",
    task: { key: "k", idx: 0, hash: "h" },
    rewards: { a: 1 },
    reward: 1,
    ok: true,
  } as unknown as TaskTrace);
  t.recordReward("judge", 0.5, 2);
  assert.equal(t.reward, 2);
  assert.deepEqual(t.record.reward_weights, { judge: 2 });
  t.recordReward("judge", 0.5);
  assert.equal(t.reward, 1.5);
  assert.equal(t.record.reward_weights, undefined);
  t.recordMetric("turns", 3);
  assert.equal(t.record.metrics.turns, 3);
  t.stop("max_turns");
  t.stop("agent_completed");
  assert.equal(t.record.stop_condition, "max_turns");
  assert.equal(t.isTruncated, true);
  t.recordError(new RangeError("boom"), "scoring");
  assert.deepEqual([t.ok, t.reward, t.record.error?.phase, t.record.error?.error], [
    false,
    null,
    "scoring",
    "RangeError",
  ]);
});
