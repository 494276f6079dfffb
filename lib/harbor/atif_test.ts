/**
 * Tests of ATIF (the Agent Trajectory Interchange Format) beside its code: a vf trace written
 * as a trajectory, a trajectory read back into chat messages, and a Harbor job folder read
 * into vf traces (trials with exceptions are errors, trials without a verifier result are
 * unscored, never a 0).
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { ConfigError, type TaskTrace, VERSION } from "../../mod.ts";
import {
  ATIF_VERSION,
  atifToMessages,
  type AtifTrajectory,
  importHarborJob,
  traceToAtif,
} from "./atif.ts";

/** A two-turn bash trace: a tool call answered by its output, then a final reply. */
function bashTrace(): TaskTrace {
  return {
    format_version: 3,
    trace_id: "trace-1",
    run_id: "run-1",
    taskset: "sums",
    task: { key: "sum", idx: 0, hash: "h" },
    example_id: 0,
    rollout_index: 2,
    model: "vf-test",
    harness: "bash",
    messages: [
      { role: "system", content: "You are in a sandbox." },
      { role: "user", content: [{ type: "text", text: "Sum " }, { type: "text", text: "it." }] },
      {
        role: "assistant",
        content: "",
        reasoning_content: "cat first",
        tool_calls: [{ id: "c1", name: "bash", arguments: '{"command":"cat in.txt"}' }],
      },
      { role: "tool", tool_call_id: "c1", content: "1\n2\n" },
      { role: "assistant", content: "The sum is 3." },
    ],
    model_calls: [
      {
        turn: 0,
        started_at: 1_700_000_000,
        duration_ms: 5,
        request_messages: 2,
        response: { model: "served-name", usage: { prompt_tokens: 11, completion_tokens: 4 } },
      },
      {
        turn: 1,
        started_at: 1_700_000_001.5,
        duration_ms: 5,
        request_messages: 4,
        response: { model: "", usage: { prompt_tokens: 20, completion_tokens: 6 } },
      },
    ],
    usage: { input_tokens: 31, output_tokens: 10 },
    reward: 1,
    rewards: { correct: 1 },
    stop_condition: "no_tools",
    error: null,
  } as unknown as TaskTrace;
}

Deno.test("traceToAtif(): one step per message, tool outputs as the observation of the step that called, each agent step with its call's model, time and tokens", () => {
  const doc = traceToAtif(bashTrace());
  assert.equal(doc.schema_version, ATIF_VERSION);
  assert.equal(doc.session_id, "trace-1");
  assert.deepEqual(doc.agent, { name: "vf-bash", version: VERSION, model_name: "vf-test" });
  assert.deepEqual(doc.steps.map((s) => [s.step_id, s.source]), [
    [1, "system"],
    [2, "user"],
    [3, "agent"],
    [4, "agent"],
  ]);
  assert.equal(doc.steps[1].message, "Sum it.", "text parts are joined");
  const [, , call, answer] = doc.steps;
  assert.equal(call.model_name, "served-name");
  assert.equal(call.timestamp, new Date(1_700_000_000_000).toISOString());
  assert.equal(call.reasoning_content, "cat first");
  assert.deepEqual(call.tool_calls, [
    { tool_call_id: "c1", function_name: "bash", arguments: { command: "cat in.txt" } },
  ]);
  assert.deepEqual(call.observation, { results: [{ source_call_id: "c1", content: "1\n2\n" }] });
  assert.deepEqual(call.metrics, { prompt_tokens: 11, completion_tokens: 4 });
  assert.equal(
    answer.model_name,
    "vf-test",
    "a response without a model name falls back to the trace's",
  );
  assert.equal(answer.message, "The sum is 3.");
  assert.equal(answer.observation, undefined);
  assert.deepEqual(doc.final_metrics, {
    total_prompt_tokens: 31,
    total_completion_tokens: 10,
    total_steps: 4,
  });
  assert.deepEqual(doc.extra, {
    vf_run_id: "run-1",
    task: "sum",
    rollout_index: 2,
    reward: 1,
    rewards: { correct: 1 },
    stop_condition: "no_tools",
    error: null,
  });
});

Deno.test("traceToAtif(): tool arguments that are not a JSON object are kept raw; an errored trace carries its error's type and message", () => {
  const trace = bashTrace();
  (trace.messages[2] as { tool_calls: Array<{ arguments: string }> }).tool_calls[0].arguments =
    "not json";
  trace.error = {
    error: "CommandTimeoutError",
    message: "too slow",
    phase: "agent",
  } as TaskTrace["error"];
  const doc = traceToAtif(trace);
  assert.deepEqual(doc.steps[2].tool_calls?.[0].arguments, { raw: "not json" });
  assert.deepEqual(doc.extra?.error, { type: "CommandTimeoutError", message: "too slow" });
});

Deno.test("atifToMessages(): a written trajectory reads back as the trace's messages", () => {
  const trace = bashTrace();
  const messages = atifToMessages(JSON.parse(JSON.stringify(traceToAtif(trace))), "t.json");
  assert.deepEqual(messages, [
    { role: "system", content: "You are in a sandbox." },
    { role: "user", content: "Sum it." },
    {
      role: "assistant",
      content: null,
      reasoning_content: "cat first",
      tool_calls: [{ id: "c1", name: "bash", arguments: '{"command":"cat in.txt"}' }],
    },
    { role: "tool", tool_call_id: "c1", content: "1\n2\n" },
    { role: "assistant", content: "The sum is 3." },
  ]);
});

Deno.test("atifToMessages(): calls without ids get positional ones their observations answer; what is not ATIF is a ConfigError naming the source and step", () => {
  const doc: AtifTrajectory = {
    schema_version: "ATIF-v1.2",
    agent: { name: "other" },
    steps: [{
      step_id: 1,
      source: "agent",
      message: "checking",
      tool_calls: [{ tool_call_id: "", function_name: "ls", arguments: {} }],
      observation: { results: [{ content: "a b" }] },
    }],
  };
  assert.deepEqual(atifToMessages(doc, "x"), [
    {
      role: "assistant",
      content: "checking",
      tool_calls: [{ id: "call_0_0", name: "ls", arguments: "{}" }],
    },
    { role: "tool", tool_call_id: "call_0_0", content: "a b" },
  ]);
  const bad: Array<[unknown, string]> = [
    [{ steps: [] }, 'x: not an ATIF trajectory (no schema_version "ATIF-v1.x")'],
    [
      { schema_version: "ATIF-v2.0", steps: [] },
      'x: not an ATIF trajectory (no schema_version "ATIF-v1.x")',
    ],
    [{ schema_version: "ATIF-v1.6", steps: {} }, "x: steps must be a list"],
    [{ schema_version: "ATIF-v1.6", steps: [null] }, "x: steps[0] is not an object"],
    [
      {
        schema_version: "ATIF-v1.6",
        steps: [{ source: "user", message: "hi" }, { source: "tool" }],
      },
      'x: steps[1].source "tool" is not system, user or agent',
    ],
  ];
  for (const [value, message] of bad) {
    assert.throws(
      () => atifToMessages(value, "x"),
      (e: Error) => e instanceof ConfigError && e.message === message,
      message,
    );
  }
});

// ---------------------------------------------------------------------------------------
// Harbor job folders

async function write(root: string, files: Record<string, unknown>): Promise<void> {
  for (const [path, value] of Object.entries(files)) {
    const full = join(root, path);
    await Deno.mkdir(join(full, ".."), { recursive: true });
    await Deno.writeTextFile(full, typeof value === "string" ? value : JSON.stringify(value));
  }
}

Deno.test("importHarborJob(): each trial is a trace, in folder order, counted per task; the reward is the verifier's 'reward' or the sum of its rewards; tokens and start time come from the result", async () => {
  const job = await Deno.makeTempDir({ prefix: "vf_atif_job_" });
  try {
    await write(job, {
      "hello__a1/result.json": {
        id: "trial-a1",
        task_name: "hello",
        started_at: "2025-01-02T03:04:05Z",
        agent_info: { name: "terminus", model_info: { name: "gpt-x" } },
        agent_result: { n_input_tokens: 120, n_output_tokens: 30 },
        verifier_result: { rewards: { reward: 1, extra: 5 } },
      },
      "hello__a1/agent/trajectory.json": traceToAtif(bashTrace()),
      "hello__b2/result.json": {
        task_name: "hello",
        verifier_result: { rewards: { tests: 0.5, style: 0.25, note: "n/a" } },
      },
      "add__c3/result.json": { verifier_result: { rewards: { reward: 0 } } },
      "stray.txt": "not a trial",
      "no-result/agent/trajectory.json": "{}",
    });
    const traces = await importHarborJob(job, "imported");
    assert.deepEqual(
      traces.map((t) => [t.task.key, t.rollout_index, t.reward]),
      [["add", 0, 0], ["hello", 0, 1], ["hello", 1, 0.75]],
    );
    const [add, first, second] = traces;
    assert.equal(add.task.key, "add", "a result without task_name is named by its folder");
    assert.equal(first.trace_id, "trial-a1");
    assert.equal(first.run_id, "imported");
    assert.equal(first.model, "gpt-x");
    assert.equal(first.harness, "terminus");
    assert.deepEqual(first.rewards, { reward: 1, extra: 5 });
    assert.deepEqual(first.usage, { input_tokens: 120, output_tokens: 30 });
    assert.equal(first.timing?.started_at, Date.parse("2025-01-02T03:04:05Z") / 1000);
    assert.equal(first.messages.length, 5, "the trajectory's messages");
    assert.deepEqual(first.info, { harbor_trial: "hello__a1" });
    assert.equal(first.ok, true);
    assert.equal(first.error, null);
    assert.deepEqual(second.rewards, { tests: 0.5, style: 0.25 }, "non-numbers are dropped");
    assert.equal(second.model, "", "no model named anywhere");
    assert.equal(second.harness, "harbor");
  } finally {
    await Deno.remove(job, { recursive: true });
  }
});

Deno.test("importHarborJob(): a trial with an exception is an infrastructure error in phase agent and one without a verifier result is unscored, never a 0; a folder without trials is a ConfigError", async () => {
  const job = await Deno.makeTempDir({ prefix: "vf_atif_job_" });
  try {
    await write(job, {
      "t__1/result.json": {
        task_name: "t",
        exception_info: { exception_type: "AgentTimeoutError", exception_message: "ran 2h" },
        verifier_result: { rewards: { reward: 1 } },
      },
      "t__2/result.json": { task_name: "t", verifier_result: null },
    });
    const [failed, unscored] = await importHarborJob(job, "r");
    assert.equal(failed.reward, null);
    assert.deepEqual(failed.rewards, {});
    assert.equal(failed.ok, false);
    assert.equal(failed.stop_condition, "has_error");
    assert.deepEqual(failed.error, {
      error: "AgentTimeoutError",
      message: "ran 2h",
      error_chain_repr: 'AgentTimeoutError("ran 2h")',
      error_chain_str: "AgentTimeoutError: ran 2h",
      phase: "agent",
      infra: true,
    });
    assert.equal(unscored.reward, null);
    assert.equal(unscored.ok, true);
    assert.equal(unscored.error?.phase, "scoring");
    assert.equal(unscored.error?.message, "the trial has no verifier result");

    await write(job, { "t__3/result.json": "{broken" });
    await assert.rejects(
      importHarborJob(job, "r"),
      (e: Error) =>
        e instanceof ConfigError &&
        e.message.startsWith(`${join(job, "t__3", "result.json")}: not JSON: `),
    );
  } finally {
    await Deno.remove(job, { recursive: true });
  }
  const empty = await Deno.makeTempDir({ prefix: "vf_atif_empty_" });
  try {
    await assert.rejects(
      importHarborJob(empty, "r"),
      (e: Error) =>
        e instanceof ConfigError &&
        e.message === `${empty}: no Harbor trial here (no */result.json)`,
    );
  } finally {
    await Deno.remove(empty);
  }
  await assert.rejects(
    importHarborJob(`${empty}-gone`, "r"),
    (e: Error) => e instanceof ConfigError && e.message === `${empty}-gone: no such folder`,
  );
});
