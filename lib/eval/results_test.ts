import assert from "node:assert/strict";
import { appendFile, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConfigError, ModelError } from "../errors.ts";
import {
  type CorruptLine,
  loadMetadata,
  loadOutputs,
  type MetadataBase,
  MetadataBuilder,
  passAtK,
  repairTrailingLine,
  ResultsWriter,
  writeJsonAtomic,
} from "./results.ts";
import type { State } from "../state.ts";
import type { Tool, Usage } from "../types.ts";
import { testState, testStep } from "../../tests/_state.ts";
import { captureWarnings } from "../../tests/_warnings.ts";
import { FORMAT_VERSION, type RolloutOutput, stateToOutput } from "../state.ts";

// ---- helpers ----------------------------------------------------------------------------

/** A finished rollout, scored 1 (advantage 0, no metrics) and stopped by has_completed. */
function scoredState(overrides: Partial<State> = {}): State {
  return testState({
    reward: 1,
    advantage: 0,
    metrics: {},
    stop_condition: "has_completed",
    ...overrides,
  });
}

const usage = (prompt: number, completion: number): Usage => ({
  prompt_tokens: prompt,
  completion_tokens: completion,
  reasoning_tokens: 0,
  total_tokens: prompt + completion,
});

function base(overrides: Partial<MetadataBase> = {}): MetadataBase {
  return {
    format_version: FORMAT_VERSION,
    env_id: "gsm8k",
    env_args: {},
    model: "test-model",
    base_url: "http://127.0.0.1/v1",
    num_examples: 2,
    rollouts_per_example: 1,
    sampling_args: {},
    pass_threshold: 0.5,
    vf_version: "0.0.0",
    ...overrides,
  };
}

function out(exampleId: number, reward: number, extra: Partial<RolloutOutput> = {}): RolloutOutput {
  return {
    format_version: FORMAT_VERSION,
    example_id: exampleId,
    task: "default",
    prompt: [],
    completion: [],
    reward,
    metrics: {},
    timing: {},
    is_completed: true,
    is_truncated: false,
    stop_condition: null,
    tool_defs: null,
    error: null,
    trajectory_id: `t${exampleId}`,
    ...extra,
  };
}

const tool = (name: string): Tool => ({ name, description: "", parameters: {} });

async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "vf-results-test-"));
  try {
    await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const close = (actual: number, expected: number) =>
  assert.ok(Math.abs(actual - expected) < 1e-12, `${actual} is not ${expected}`);

// ---- passAtK ----------------------------------------------------------------------------

Deno.test("passAtK() is 1 for pass and pass^k when every rollout is correct", () => {
  for (const k of [1, 2, 4]) assert.deepEqual(passAtK(4, 4, k), { pass: 1, passAll: 1 });
});

Deno.test("passAtK() is 0 for pass and pass^k when no rollout is correct", () => {
  for (const k of [1, 2, 4]) assert.deepEqual(passAtK(4, 0, k), { pass: 0, passAll: 0 });
});

Deno.test("passAtK() gives the unbiased estimate for a partial example", () => {
  // n=4, c=2: pass@1 = 1 - C(2,1)/C(4,1) = 1/2; pass@2 = 1 - C(2,2)/C(4,2) = 5/6.
  close(passAtK(4, 2, 1).pass, 0.5);
  close(passAtK(4, 2, 2).pass, 5 / 6);
  // pass^1 = C(2,1)/C(4,1) = 1/2; pass^2 = C(2,2)/C(4,2) = 1/6.
  close(passAtK(4, 2, 1).passAll, 0.5);
  close(passAtK(4, 2, 2).passAll, 1 / 6);
});

Deno.test("passAtK() is exactly 1 when fewer than k rollouts are wrong", () => {
  assert.equal(passAtK(4, 3, 2).pass, 1);
  assert.equal(passAtK(4, 1, 4).pass, 1);
  assert.equal(passAtK(4, 1, 4).passAll, 0);
});

Deno.test("passAtK() with n=3 gives the expected values for k=1 and k=2", () => {
  close(passAtK(3, 1, 1).pass, 1 / 3);
  close(passAtK(3, 1, 2).pass, 2 / 3);
  close(passAtK(3, 2, 1).pass, 2 / 3);
  assert.equal(passAtK(3, 2, 2).pass, 1);
  close(passAtK(3, 1, 1).passAll, 1 / 3);
  assert.equal(passAtK(3, 1, 2).passAll, 0);
  close(passAtK(3, 2, 2).passAll, 1 / 3);
});

// ---- MetadataBuilder --------------------------------------------------------------------

Deno.test("MetadataBuilder keeps the base fields and averages reward", () => {
  const b = new MetadataBuilder(base({ env_id: "x" }));
  assert.equal(b.meanReward, 0);
  b.add([out(0, 1), out(1, 0)]);
  b.add([out(2, 0.5)]);
  const m = b.build();
  assert.equal(m.env_id, "x");
  assert.equal(m.num_rollouts, 3);
  assert.equal(b.count, 3);
  close(m.avg_reward!, 0.5);
  assert.equal(typeof m.date, "string");
  assert.ok(m.time_ms >= 0);
});

Deno.test("MetadataBuilder uses the powers of two up to r as pass@k keys", () => {
  const keys = (r: number) => {
    const b = new MetadataBuilder(base({ rollouts_per_example: r }));
    b.add(Array.from({ length: r }, () => out(0, 1)));
    const m = b.build();
    assert.deepEqual(Object.keys(m.pass_all_k), Object.keys(m.pass_at_k));
    return Object.keys(m.pass_at_k);
  };
  assert.deepEqual(keys(2), ["1", "2"]);
  assert.deepEqual(keys(3), ["1", "2"]);
  assert.deepEqual(keys(4), ["1", "2", "4"]);
  assert.deepEqual(keys(7), ["1", "2", "4"]);
  assert.deepEqual(keys(8), ["1", "2", "4", "8"]);
});

Deno.test("MetadataBuilder computes no pass@k when there is one rollout per example", () => {
  const b = new MetadataBuilder(base({ rollouts_per_example: 1 }));
  b.add([out(0, 1), out(1, 1)]);
  assert.deepEqual(b.build().pass_at_k, {});
  assert.deepEqual(b.build().pass_all_k, {});
});

Deno.test("MetadataBuilder averages pass@k over complete examples only", () => {
  const b = new MetadataBuilder(base({ rollouts_per_example: 2 }));
  // example 0: 2/2 correct; example 1: 1/2 correct; example 2: only one rollout (incomplete).
  b.add([out(0, 1), out(0, 1), out(1, 1), out(1, 0), out(2, 0)]);
  const m = b.build();
  close(m.pass_at_k["1"], (1 + 0.5) / 2);
  close(m.pass_at_k["2"], (1 + 1) / 2);
  close(m.pass_all_k["1"], (1 + 0.5) / 2);
  close(m.pass_all_k["2"], (1 + 0) / 2);
});

Deno.test("MetadataBuilder gives empty pass@k when no example is complete yet", () => {
  const b = new MetadataBuilder(base({ rollouts_per_example: 3 }));
  b.add([out(0, 1), out(0, 1), out(1, 1)]);
  assert.deepEqual(b.build().pass_at_k, {});
  b.add([out(0, 1)]);
  assert.deepEqual(b.build().pass_at_k, { "1": 1, "2": 1 });
});

Deno.test("MetadataBuilder leaves errored rollouts out of the reward, metrics and pass@k", () => {
  const err = { error: "ModelError", message: "connection refused" } as RolloutOutput["error"];
  const b = new MetadataBuilder(base({ rollouts_per_example: 2 }));
  // example 0: one correct, one errored; example 1: both correct; example 2: both errored.
  b.add([
    out(0, 1, { metrics: { m: 1 } }),
    out(0, 0, { error: err, metrics: { m: 0 } }),
    out(1, 1, { metrics: { m: 1 } }),
    out(1, 1, { metrics: { m: 1 } }),
    out(2, 0, { error: err }),
    out(2, 0, { error: err }),
  ]);
  const m = b.build();
  assert.equal(m.avg_reward, 1, "the errored zeros are not in the mean");
  assert.equal(b.meanReward, 1);
  assert.deepEqual(m.avg_metrics, { m: 1 });
  assert.equal(m.num_errors, 3);
  assert.equal(m.num_unscored, 3);
  close(m.avg_error, 0.5);
  assert.equal(m.pass_at_k_excluded, 3);
  // pass@1 over examples 0 (1 of 1) and 1 (2 of 2); pass@2 only over example 1.
  assert.deepEqual(m.pass_at_k, { "1": 1, "2": 1 });
});

Deno.test("MetadataBuilder counts a rollout the model broke itself (a stopped tool call) as scored", () => {
  const toolErr = { error: "ToolParseError", message: "bad JSON" } as RolloutOutput["error"];
  const b = new MetadataBuilder(base());
  b.add([out(0, 1), out(1, 0, { error: toolErr })]);
  const m = b.build();
  assert.equal(m.avg_reward, 0.5, "the model's own failure is its 0");
  assert.equal(m.num_errors, 1);
  assert.equal(m.num_unscored, 0);
});

Deno.test("MetadataBuilder writes a null average with a reason when every rollout errored", () => {
  const err = { error: "SandboxError", message: "gone" } as RolloutOutput["error"];
  const b = new MetadataBuilder(base());
  b.add([out(0, 0, { error: err }), out(1, 0, { error: err })]);
  const m = b.build();
  assert.equal(m.avg_reward, null);
  assert.equal(m.avg_reward_reason, "no rollout (of 2) was scored: every one errored");
});

Deno.test("MetadataBuilder counts a reward equal to pass_threshold as correct", () => {
  const at = new MetadataBuilder(base({ rollouts_per_example: 2, pass_threshold: 0.5 }));
  at.add([out(0, 0.5), out(0, 0.5)]);
  assert.deepEqual(at.build().pass_at_k, { "1": 1, "2": 1 });
  const below = new MetadataBuilder(base({ rollouts_per_example: 2, pass_threshold: 0.5 }));
  below.add([out(0, 0.4999), out(0, 0.4999)]);
  assert.deepEqual(below.build().pass_at_k, { "1": 0, "2": 0 });
});

Deno.test("MetadataBuilder averages each metric over the outputs that have it", () => {
  const b = new MetadataBuilder(base());
  b.add([
    out(0, 1, { metrics: { a: 1, b: 4 } }),
    out(1, 0, { metrics: { a: 0 } }),
    out(2, 0, { metrics: { a: 0.5, c: "x" as unknown as number } }),
  ]);
  const m = b.build();
  close(m.avg_metrics.a, 0.5);
  assert.equal(m.avg_metrics.b, 4);
  assert.equal("c" in m.avg_metrics, false);
});

Deno.test("MetadataBuilder reports the fraction of outputs with an error as avg_error", () => {
  const b = new MetadataBuilder(base());
  assert.equal(b.build().avg_error, 0);
  const error = { error: "ModelError", message: "m", error_chain_repr: "", error_chain_str: "" };
  b.add([out(0, 0, { error }), out(1, 1), out(2, 1), out(3, 0, { error })]);
  assert.equal(b.build().avg_error, 0.5);
});

Deno.test("MetadataBuilder reports usage only once an output carried token_usage", () => {
  const b = new MetadataBuilder(base());
  b.add([out(0, 1), out(1, 1)]);
  assert.equal(b.build().usage, null);
  const tu = (i: number, o: number) => ({
    input_tokens: i,
    output_tokens: o,
    final_input_tokens: 0,
    final_output_tokens: 0,
  });
  b.add([out(2, 1, { token_usage: tu(10, 4) }), out(3, 1, { token_usage: tu(30, 8) })]);
  assert.deepEqual(b.build().usage, {
    input_tokens: 20,
    output_tokens: 6,
    total_input_tokens: 40,
    total_output_tokens: 12,
  });
});

Deno.test("MetadataBuilder reports tools when every output has the same tool-name set", () => {
  const b = new MetadataBuilder(base());
  const first = [tool("search"), tool("calc")];
  b.add([
    out(0, 1, { tool_defs: first }),
    out(1, 1, { tool_defs: [tool("calc"), tool("search")] }),
  ]);
  assert.equal(b.build().tools, first);
});

Deno.test("MetadataBuilder reports no tools when the tool-name sets differ", () => {
  const b = new MetadataBuilder(base());
  b.add([out(0, 1, { tool_defs: [tool("search")] }), out(1, 1, { tool_defs: [tool("calc")] })]);
  assert.equal(b.build().tools, null);
  b.add([out(2, 1, { tool_defs: [tool("search")] })]);
  assert.equal(b.build().tools, null);
});

Deno.test("MetadataBuilder reports no tools when only some outputs have tools", () => {
  const b = new MetadataBuilder(base());
  b.add([out(0, 1, { tool_defs: null }), out(1, 1, { tool_defs: [tool("calc")] })]);
  assert.equal(b.build().tools, null);
  const none = new MetadataBuilder(base());
  none.add([out(0, 1), out(1, 1)]);
  assert.equal(none.build().tools, null);
  // A first output without the field at all (an older results line read on resume) counts
  // as "no tools" too; one list shared by the outputs after it is compared once.
  const older = new MetadataBuilder(base());
  const shared = [tool("calc")];
  const legacy = out(0, 1);
  delete (legacy as { tool_defs?: unknown }).tool_defs;
  older.add([legacy, out(1, 1, { tool_defs: shared }), out(2, 1, { tool_defs: shared })]);
  assert.equal(older.build().tools, null);
});

// ---- stateToOutput ----------------------------------------------------------------------

Deno.test("stateToOutput() writes the core fields of a finished rollout", () => {
  const state = scoredState({
    example_id: 3,
    task: "math",
    reward: 0.75,
    advantage: 0.25,
    is_truncated: true,
    stop_condition: "max_turns_reached",
    trajectory_id: "abc",
  });
  const o = stateToOutput(state);
  assert.equal(o.format_version, FORMAT_VERSION);
  assert.equal(o.example_id, 3);
  assert.equal(o.task, "math");
  assert.deepEqual(o.prompt, state.prompt);
  assert.deepEqual(o.completion, state.completion);
  assert.equal(o.reward, 0.75);
  assert.equal(o.advantage, 0.25);
  assert.equal(o.is_completed, true);
  assert.equal(o.is_truncated, true);
  assert.equal(o.stop_condition, "max_turns_reached");
  assert.equal(o.trajectory_id, "abc");
  assert.equal(o.error, null);
  assert.equal(o.tool_defs, null);
  assert.equal(typeof (o.timing as { total: unknown }).total, "number");
  assert.doesNotThrow(() => JSON.stringify(o));
});

Deno.test("stateToOutput() defaults a null reward to 0", () => {
  assert.equal(stateToOutput(scoredState({ reward: null })).reward, 0);
});

Deno.test("stateToOutput() omits answer and info when they are empty", () => {
  const o = stateToOutput(scoredState({ answer: "", info: {} }));
  assert.equal("answer" in o, false);
  assert.equal("info" in o, false);
  const full = stateToOutput(scoredState({ answer: "4", info: { level: 2 } }));
  assert.equal(full.answer, "4");
  assert.deepEqual(full.info, { level: 2 });
});

Deno.test("stateToOutput() flattens metrics to the top level without overwriting core fields", () => {
  const o = stateToOutput(
    scoredState({ reward: 1, metrics: { exact: 1, num_turns: 2, reward: 9 } }),
  );
  assert.deepEqual(o.metrics, { exact: 1, num_turns: 2, reward: 9 });
  assert.equal(o.exact, 1);
  assert.equal(o.num_turns, 2);
  assert.equal(o.reward, 1);
});

Deno.test("stateToOutput() writes tool_defs when the rollout had tools", () => {
  const defs = [tool("calc")];
  assert.deepEqual(stateToOutput(scoredState({ tool_defs: defs })).tool_defs, defs);
});

Deno.test("stateToOutput() omits token_usage when usage was never seen", () => {
  const o = stateToOutput(scoredState({ trajectory: [testStep({ usage: usage(10, 5) })] }));
  assert.equal("token_usage" in o, false);
});

Deno.test("stateToOutput() writes token_usage with final_* fields when usage was seen", () => {
  const state = scoredState({
    usage: { input_tokens: 30, output_tokens: 12, seen: true },
    trajectory: [testStep({ usage: usage(10, 5) }), testStep(), testStep({ usage: usage(20, 7) })],
  });
  // final_output = 5 + 7; final_input = max(0, 20 + 7 - 12).
  assert.deepEqual(stateToOutput(state).token_usage, {
    input_tokens: 30,
    output_tokens: 12,
    final_input_tokens: 15,
    final_output_tokens: 12,
  });
});

Deno.test("stateToOutput() sets final_* tokens to 0 when no step reported usage", () => {
  const state = scoredState({
    usage: { input_tokens: 3, output_tokens: 1, seen: true },
    trajectory: [testStep()],
  });
  assert.deepEqual(stateToOutput(state).token_usage, {
    input_tokens: 3,
    output_tokens: 1,
    final_input_tokens: 0,
    final_output_tokens: 0,
  });
});

Deno.test("stateToOutput() serialises an error with its cause chain", () => {
  const error = new ModelError("endpoint failed", { cause: new TypeError("fetch failed") });
  const o = stateToOutput(scoredState({ error }));
  assert.deepEqual(o.error, {
    error: "ModelError",
    message: "endpoint failed",
    error_chain_repr: 'ModelError("endpoint failed") -> TypeError("fetch failed")',
    error_chain_str: "ModelError -> TypeError",
  });
  assert.equal(o.error_chain, 'ModelError("endpoint failed") -> TypeError("fetch failed")');
  assert.equal(o.long_error_chain, "ModelError -> TypeError");
});

Deno.test("stateToOutput() writes no error_chain keys when there is no error", () => {
  const o = stateToOutput(scoredState());
  assert.equal("error_chain" in o, false);
  assert.equal("long_error_chain" in o, false);
});

Deno.test("stateToOutput() copies state columns, with null for missing keys", () => {
  const state = scoredState({ judge_response: { "q?": "yes" }, turns: 3 });
  const o = stateToOutput(state, ["judge_response", "turns", "missing"]);
  assert.deepEqual(o.judge_response, { "q?": "yes" });
  assert.equal(o.turns, 3);
  assert.equal(o.missing, null);
});

Deno.test("stateToOutput() makes Map, Set and BigInt state columns JSON-safe", () => {
  const state = scoredState({ m: new Map([["a", 1]]), s: new Set([1, 2]), big: 5n });
  const o = stateToOutput(state, ["m", "s", "big"]);
  assert.deepEqual(o.m, { a: 1 });
  assert.deepEqual(o.s, [1, 2]);
  assert.equal(o.big, 5);
});

Deno.test("stateToOutput() rejects a state column that cannot be serialised, naming it", () => {
  const loop: Record<string, unknown> = {};
  loop.self = loop;
  assert.throws(
    () => stateToOutput(scoredState({ loop }), ["loop"]),
    (e: unknown) => e instanceof TypeError && e.message.startsWith('State column "loop"'),
  );
});

Deno.test("stateToOutput() copies the prompt so later state changes do not leak in", () => {
  const state = scoredState();
  const o = stateToOutput(state);
  (state.prompt[0] as { content: string }).content = "changed";
  assert.equal((o.prompt[0] as { content: string }).content, "What is 2+2?");
});

// ---- ResultsWriter, repairTrailingLine, loadOutputs ------------------------------------

Deno.test("ResultsWriter.append() creates the directory and writes one JSON line per output", async () => {
  await withTempDir(async (dir) => {
    const writer = new ResultsWriter(join(dir, "run", "abc"));
    await writer.append([out(0, 1), out(1, 0)]);
    await writer.append([out(2, 0.5)]);
    const text = await readFile(writer.resultsPath, "utf8");
    const lines = text.split("\n");
    assert.equal(lines.at(-1), "");
    assert.deepEqual(lines.slice(0, -1).map((l) => JSON.parse(l).example_id), [0, 1, 2]);
    assert.deepEqual((await loadOutputs(writer.dir)).map((o) => o.reward), [1, 0, 0.5]);
  });
});

Deno.test("ResultsWriter keeps concurrent appends whole and in call order", async () => {
  await withTempDir(async (dir) => {
    const writer = new ResultsWriter(dir);
    await Promise.all(Array.from({ length: 20 }, (_, i) => writer.append([out(i, 1)])));
    await writer.flush();
    const ids = (await loadOutputs(dir)).map((o) => o.example_id);
    assert.deepEqual(ids, Array.from({ length: 20 }, (_, i) => i));
  });
});

Deno.test("ResultsWriter writes appends that follow a write closely together, and flush() writes them at once", async () => {
  await withTempDir(async (dir) => {
    // A window no test run outlasts: what waits, waits for flush().
    const writer = new ResultsWriter(dir, { coalesceMs: 600_000 });
    await writer.append([out(0, 1)]); // written at once: nothing was written before
    // Rollouts finishing one by one right after a write wait to be written with the next ones.
    const later = [writer.append([out(1, 1)]), writer.append([out(2, 1)])];
    assert.equal(writer.unwritten, 2);
    const ids = async () => (await loadOutputs(dir)).map((o) => o.example_id);
    assert.deepEqual(await ids(), [0]);
    assert.equal(writer.unwritten, 2);
    // flush() does not leave lines waiting for the window to pass.
    await writer.flush();
    await Promise.all(later);
    assert.equal(writer.unwritten, 0);
    assert.deepEqual(await ids(), [0, 1, 2]);
  });
  await withTempDir(async (dir) => {
    // The default window (10 ms) passes by itself: no flush() needed.
    const writer = new ResultsWriter(dir);
    assert.equal(writer.coalesceMs, 10);
    await writer.append([out(0, 1)]);
    await Promise.all([writer.append([out(1, 1)]), writer.append([out(2, 1)])]);
    assert.equal(writer.unwritten, 0);
    assert.deepEqual((await loadOutputs(dir)).map((o) => o.example_id), [0, 1, 2]);
  });
});

Deno.test("ResultsWriter writes multi-byte text and batches larger than its buffer intact, batch after batch", async () => {
  await withTempDir(async (dir) => {
    const writer = new ResultsWriter(dir, { coalesceMs: 0 });
    // Three-byte and four-byte characters, a batch far over the 64 KiB starting buffer, then
    // a small batch into the reused buffer.
    const text = (i: number) => `${"€".repeat(200)} ${"𝄞".repeat(100)} #${i} ` + "x".repeat(i * 7);
    const big = Array.from(
      { length: 300 },
      (_, i) => out(i, 1, { completion: [{ role: "assistant", content: text(i) }] }),
    );
    await writer.append(big);
    const small = [out(300, 0, { completion: [{ role: "assistant", content: "é" }] })];
    await writer.append(small);
    await writer.flush();
    const lines = (await readFile(writer.resultsPath, "utf8")).split("\n");
    assert.equal(lines.pop(), "", "every line ends with a newline");
    assert.deepEqual(lines.map((l) => JSON.parse(l)), [...big, ...small]);
  });
});

Deno.test("ResultsWriter truncates a torn last line before its first append", async () => {
  await withTempDir(async (dir) => {
    const writer = new ResultsWriter(dir);
    await writeFile(writer.resultsPath, JSON.stringify(out(0, 1)) + '\n{"example_id": 1, "rew');
    await writer.append([out(1, 1)]);
    const text = await readFile(writer.resultsPath, "utf8");
    assert.deepEqual(text.trimEnd().split("\n").map((l) => JSON.parse(l).example_id), [0, 1]);
  });
});

Deno.test("ResultsWriter keeps a complete last record whose newline was lost", async () => {
  await withTempDir(async (dir) => {
    const writer = new ResultsWriter(dir);
    await writeFile(
      writer.resultsPath,
      JSON.stringify(out(0, 1)) + "\n" + JSON.stringify(out(1, 1)),
    );
    assert.equal((await loadOutputs(dir)).length, 2);
    await writer.append([out(2, 1)]);
    assert.deepEqual((await loadOutputs(dir)).map((o) => o.example_id), [0, 1, 2]);
  });
});

Deno.test("ResultsWriter.writeMetadata() rewrites metadata.json, throttled until flush()", async () => {
  await withTempDir(async (dir) => {
    const writer = new ResultsWriter(dir, { metadataIntervalMs: 60_000 });
    await writer.writeMetadata({ env_id: "a", num_examples: 1 });
    await writer.writeMetadata({ env_id: "b", num_examples: 2 });
    assert.equal(JSON.parse(await readFile(writer.metadataPath, "utf8")).env_id, "a");
    await writer.flush();
    assert.deepEqual(JSON.parse(await readFile(writer.metadataPath, "utf8")), {
      env_id: "b",
      num_examples: 2,
    });
    assert.equal((await loadMetadata(dir)).env_id, "b");
  });
});

Deno.test("ResultsWriter appends again after flush(), remaking a directory removed since", async () => {
  await withTempDir(async (dir) => {
    const writer = new ResultsWriter(join(dir, "run"));
    await writer.append([out(0, 1)]);
    await writer.flush();
    await rm(writer.dir, { recursive: true });
    await writer.append([out(1, 1)]);
    await writer.flush();
    assert.deepEqual((await loadOutputs(writer.dir)).map((o) => o.example_id), [1]);
  });
});

Deno.test("ResultsWriter.writeMetadata() calls a builder only when it writes", async () => {
  await withTempDir(async (dir) => {
    const writer = new ResultsWriter(dir, { metadataIntervalMs: 60_000 });
    let calls = 0;
    const build = () => ({ env_id: "e", num_examples: ++calls });
    await writer.writeMetadata(build);
    await writer.writeMetadata(build);
    await writer.writeMetadata(build);
    assert.equal(calls, 1);
    await writer.flush();
    assert.equal(calls, 2);
    assert.equal((await loadMetadata(dir)).num_examples, 2);
  });
});

Deno.test("repairTrailingLine() drops a malformed last line and keeps complete ones", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, '{"a":1}\n{"b":2}\n{"c":');
    await repairTrailingLine(path);
    assert.equal(await readFile(path, "utf8"), '{"a":1}\n{"b":2}\n');
  });
});

Deno.test("repairTrailingLine() drops a malformed last line that ends in a newline", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, '{"a":1}\n{"b":\n');
    await repairTrailingLine(path);
    assert.equal(await readFile(path, "utf8"), '{"a":1}\n');
  });
});

Deno.test("repairTrailingLine() empties a file whose only line is torn", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, '{"a":');
    await repairTrailingLine(path);
    assert.equal(await readFile(path, "utf8"), "");
  });
});

Deno.test("repairTrailingLine() leaves a well-formed file unchanged", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, '{"a":1}\n{"b":2}\n\n');
    await repairTrailingLine(path);
    assert.equal(await readFile(path, "utf8"), '{"a":1}\n{"b":2}\n\n');
  });
});

Deno.test("repairTrailingLine() keeps a complete last record that lacks its newline", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, '{"a":1}\n{"b":2}');
    await repairTrailingLine(path);
    assert.equal(await readFile(path, "utf8"), '{"a":1}\n{"b":2}\n');
    await writeFile(path, '{"only":1}');
    await repairTrailingLine(path);
    assert.equal(await readFile(path, "utf8"), '{"only":1}\n');
  });
});

Deno.test("repairTrailingLine() keeps a complete last record followed by spaces", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, '{"a":1}\n{"b":2}  ');
    await repairTrailingLine(path);
    const text = await readFile(path, "utf8");
    assert.deepEqual(text.split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l)), [
      { a: 1 },
      { b: 2 },
    ]);
    assert.ok(text.endsWith("\n"));
  });
});

Deno.test("repairTrailingLine() truncates by bytes, so multi-byte text before the cut survives", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, '{"q":"日本語 ✓"}\n{"q":"ünï');
    await repairTrailingLine(path);
    assert.equal(await readFile(path, "utf8"), '{"q":"日本語 ✓"}\n');
  });
});

Deno.test("repairTrailingLine() does nothing for a missing or empty file", async () => {
  await withTempDir(async (dir) => {
    await repairTrailingLine(join(dir, "missing.jsonl"));
    const path = join(dir, "empty.jsonl");
    await writeFile(path, "");
    await repairTrailingLine(path);
    assert.equal(await readFile(path, "utf8"), "");
  });
});

Deno.test("loadOutputs() returns [] when there is no results.jsonl", async () => {
  await withTempDir(async (dir) => {
    assert.deepEqual(await loadOutputs(dir), []);
  });
});

Deno.test("loadOutputs() skips blank lines", async () => {
  await withTempDir(async (dir) => {
    await writeFile(join(dir, "results.jsonl"), '\n{"example_id":0}\n   \n\n{"example_id":1}\n\n');
    assert.deepEqual((await loadOutputs(dir)).map((o) => o.example_id), [0, 1]);
  });
});

Deno.test("loadOutputs() skips a malformed last line with a warning naming file and line", async () => {
  await withTempDir(async (dir) => {
    await writeFile(join(dir, "results.jsonl"), '{"example_id":0}\n{"example_id":1}\n{"exa\n\n');
    let outputs: RolloutOutput[] = [];
    const warnings = await captureWarnings(async () => (outputs = await loadOutputs(dir)));
    assert.deepEqual(outputs.map((o) => o.example_id), [0, 1]);
    assert.equal(warnings.length, 1);
    assert.match(warnings[0], /results\.jsonl:3: skipping a corrupt line \(malformed JSON/);
  });
});

Deno.test("loadOutputs() skips and reports corrupt lines anywhere, and reads every good line", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, '{"example_id":0}\n\n{oops}\n[1,2]\n{"example_id":2}\n');
    const corrupt: CorruptLine[] = [];
    const outputs = await loadOutputs(dir, { onCorrupt: (c) => corrupt.push(c) });
    assert.deepEqual(outputs.map((o) => o.example_id), [0, 2]);
    assert.deepEqual(corrupt.map((c) => [c.path, c.line]), [[path, 3], [path, 4]]);
    assert.match(corrupt[0].reason, /^malformed JSON/);
    assert.equal(corrupt[1].reason, "not a JSON object");
  });
});

Deno.test("repairTrailingLine() cuts a torn last line at its byte offset and leaves every earlier byte alone", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "results.jsonl");
    // A corrupt middle line holding a byte that is not UTF-8, and multi-byte text before the
    // torn line: neither may shift the cut.
    const enc = (t: string) => [...new TextEncoder().encode(t)];
    const good = new Uint8Array([
      ...enc('{"q":"naïve — ✓"}\n{oops'),
      0xff,
      ...enc('}\n{"q":"日本"}\n'),
    ]);
    const torn = [...enc('{"q":"日'), 0xe6, 0x9c];
    await writeFile(path, new Uint8Array([...good, ...torn]));
    await repairTrailingLine(path);
    assert.deepEqual(new Uint8Array(await readFile(path)), good);
    await appendFile(path, '{"q":"next"}\n');
    assert.deepEqual(
      new Uint8Array(await readFile(path)),
      new Uint8Array([...good, ...enc('{"q":"next"}\n')]),
    );
  });
});

Deno.test("loadMetadata() rejects a missing or non-object metadata.json", async () => {
  await withTempDir(async (dir) => {
    await assert.rejects(() => loadMetadata(dir), /is not a results directory/);
    await writeFile(join(dir, "metadata.json"), "[1]");
    await assert.rejects(() => loadMetadata(dir), ConfigError);
    await writeFile(join(dir, "metadata.json"), "{bad");
    await assert.rejects(() => loadMetadata(dir), /invalid metadata/);
  });
});

// ---- writeJsonAtomic --------------------------------------------------------------------

Deno.test("writeJsonAtomic() creates parent directories and writes pretty JSON with a newline", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "a", "b", "meta.json");
    await writeJsonAtomic(path, { x: 1, y: [1, 2] });
    const text = await readFile(path, "utf8");
    assert.equal(text, JSON.stringify({ x: 1, y: [1, 2] }, null, 2) + "\n");
  });
});

Deno.test("writeJsonAtomic() replaces an existing file and leaves no temp files behind", async () => {
  await withTempDir(async (dir) => {
    const path = join(dir, "meta.json");
    await writeFile(path, "old content that is longer than the new one");
    await writeJsonAtomic(path, { v: 2 });
    assert.deepEqual(JSON.parse(await readFile(path, "utf8")), { v: 2 });
    assert.deepEqual(await readdir(dir), ["meta.json"]);
  });
});
