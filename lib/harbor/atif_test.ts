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
import { atifErrors } from "../../tests/_atif_schema.ts";
import {
  ATIF_VERSION,
  atifProblems,
  atifToMessages,
  type AtifTrajectory,
  traceToAtif,
} from "./atif.ts";
import { importHarborJob } from "./import.ts";

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
  assert.equal(doc.session_id, "trace-1", "no episode: the trace is its own run");
  assert.equal(doc.trajectory_id, "trace-1");
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
  assert.equal(call.llm_call_count, 1);
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
    role: undefined,
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
    assert.deepEqual(first.reward_weights, { extra: 0 }, "kept beside the reward, not in it");
    assert.deepEqual(first.usage, { input_tokens: 120, output_tokens: 30 });
    assert.equal(first.timing?.started_at, Date.parse("2025-01-02T03:04:05Z") / 1000);
    assert.equal(first.messages.length, 5, "the trajectory's messages");
    assert.deepEqual(first.info, { harbor_trial: "hello__a1" });
    assert.equal(first.ok, true);
    assert.equal(first.error, null);
    assert.deepEqual(second.rewards, { tests: 0.5, style: 0.25 }, "non-numbers are dropped");
    assert.equal(second.reward_weights, undefined, "summed: each weighs 1");
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

// ---------------------------------------------------------------------------------------
// ATIF v1.7 against its schema

// deno-lint-ignore no-explicit-any
type Json = Record<string, any>;

/** A one-turn trace whose run kept token ids (`save_tokens`): prompt 1 2 3, reply 7 8. */
function tokenTrace(): TaskTrace {
  const user = { role: "user" as const, content: "Say hi." };
  const reply = { role: "assistant" as const, content: "hi" };
  return {
    ...bashTrace(),
    trace_id: "trace-tok",
    episode_id: "ep-1",
    role: "solver",
    trainable: true,
    attempt: 0,
    messages: [user, reply],
    nodes: [
      { parent: null, message: user, sampled: false, timestamp: 1, token_ids: [], mask: [] },
      {
        parent: 0,
        message: reply,
        sampled: true,
        timestamp: 2,
        token_ids: [1, 2, 3, 7, 8],
        mask: [false, false, false, true, true],
        logprobs: [-0.5, -0.25],
      },
    ],
    model_calls: [{
      turn: 0,
      started_at: 1_700_000_000,
      duration_ms: 3,
      request_messages: 1,
      node: 1,
      response: {
        model: "m",
        usage: {
          prompt_tokens: 3,
          completion_tokens: 2,
          prompt_tokens_details: { cached_tokens: 2 },
        },
      },
    }],
    tool_calls: [],
    usage: { input_tokens: 3, output_tokens: 2 },
  } as unknown as TaskTrace;
}

Deno.test("traceToAtif(): writes ATIF v1.7 that its JSON Schema and cross-value rules accept: trajectory_id per document, session_id per episode, token ids and logprobs per agent step, cached tokens", () => {
  for (const trace of [bashTrace(), tokenTrace()]) {
    const doc = JSON.parse(JSON.stringify(traceToAtif(trace)));
    assert.equal(doc.schema_version, "ATIF-v1.7");
    assert.deepEqual(atifErrors(doc), [], trace.trace_id);
  }
  const doc = traceToAtif(tokenTrace());
  assert.equal(doc.trajectory_id, "trace-tok");
  assert.equal(doc.session_id, "ep-1", "session_id is run-scoped: the episode");
  assert.deepEqual(doc.steps[1].metrics, {
    prompt_tokens: 3,
    completion_tokens: 2,
    cached_tokens: 2,
    prompt_token_ids: [1, 2, 3],
    completion_token_ids: [7, 8],
    logprobs: [-0.5, -0.25],
  });
  assert.equal(doc.final_metrics?.total_cached_tokens, 2);
});

Deno.test("traceToAtif(): the other agents of an episode are embedded subagent trajectories, each referenced by trajectory_id from a closing system step; the schema holds for parent and children", () => {
  const judge = {
    ...bashTrace(),
    trace_id: "trace-judge",
    episode_id: "ep-1",
    role: "judge",
    trainable: false,
    attempt: 0,
    reward: null,
  } as unknown as TaskTrace;
  const doc = JSON.parse(JSON.stringify(traceToAtif(tokenTrace(), { subagents: [judge] })));
  assert.deepEqual(atifErrors(doc), []);
  assert.equal(doc.subagent_trajectories.length, 1);
  const child = doc.subagent_trajectories[0];
  assert.equal(child.trajectory_id, "trace-judge");
  assert.equal(child.session_id, "ep-1");
  assert.equal(child.extra.role, "judge");
  const last = doc.steps.at(-1);
  assert.equal(last.source, "system");
  assert.deepEqual(last.observation.results[0].subagent_trajectory_ref, [{
    trajectory_id: "trace-judge",
    session_id: "ep-1",
    extra: { role: "judge", trainable: false },
  }]);
});

Deno.test("the ATIF schema and rules refuse what Harbor's validator refuses: agent-only fields on a user step, a v1.6 ref by session_id alone, an embedded subagent without trajectory_id, steps out of order, a result naming no tool call, an unknown key", () => {
  const good = () => JSON.parse(JSON.stringify(traceToAtif(bashTrace())));
  const cases: Array<[string, (d: Json) => void, RegExp]> = [
    ["metrics on a user step", (d) => (d.steps[1].metrics = { prompt_tokens: 1 }), /must be null/],
    ["ref by session only", (d) => {
      d.steps[0].observation = { results: [{ subagent_trajectory_ref: [{ session_id: "s" }] }] };
    }, /must have required property 'trajectory_id'/],
    ["subagent without id", (d) => {
      const sub = good();
      delete sub.trajectory_id;
      d.subagent_trajectories = [sub];
    }, /trajectory_id/],
    ["step ids", (d) => (d.steps[2].step_id = 7), /steps\[2\]\.step_id: 7 where 3 is due/],
    [
      "unmatched call",
      (d) => (d.steps[2].observation.results[0].source_call_id = "zz"),
      /"zz" is no tool call of the step/,
    ],
    ["unknown key", (d) => (d.steps[0].colour = "red"), /must NOT have additional properties/],
    ["agent version", (d) => delete d.agent.version, /required property 'version'/],
  ];
  for (const [name, spoil, want] of cases) {
    const d = good();
    spoil(d);
    const errors = atifErrors(d);
    assert.ok(errors.some((e) => want.test(e)), `${name}: ${JSON.stringify(errors)}`);
  }
  assert.deepEqual(atifProblems(good()), []);
});

Deno.test("traceToAtif(): a tool message no agent step asked for (a history that starts with one) stays a user step without a dangling source_call_id", () => {
  const trace = bashTrace();
  trace.messages = [{ role: "tool", tool_call_id: "old", content: "left over" }, ...trace.messages];
  const doc = JSON.parse(JSON.stringify(traceToAtif(trace)));
  assert.deepEqual(atifErrors(doc), []);
  assert.deepEqual(doc.steps[0], { step_id: 1, source: "user", message: "left over" });
});
