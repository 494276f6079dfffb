import assert from "node:assert/strict";
import { OpenAIChatClient } from "../model/client.ts";
import { Dataset } from "../data/dataset.ts";
import { MultiTurnEnv, type MultiTurnEnvOptions, SingleTurnEnv } from "./multi_turn.ts";
import { ConfigError, VfError } from "../errors.ts";
import {
  contextLengthReply,
  type ModelServer,
  type Responder,
  scriptedResponder,
  startModelServer,
} from "../../tests/model_server.ts";
import type { State } from "../state.ts";
import { RESOLVED, Rubric } from "../scoring/rubric.ts";
import type { Messages, Row } from "../types.ts";
import { noModel } from "../../tests/_state.ts";

const ROWS = [
  { question: "What is 1+1?", answer: "2" },
  { question: "What is 2+2?", answer: "4" },
  { question: "What is 3+3?", answer: "6" },
  { question: "What is 4+4?", answer: "8" },
  { question: "What is 5+5?", answer: "10" },
];

/** A multi-turn environment that always answers "Try again." (or what `reply` says). */
class EchoEnv extends MultiTurnEnv {
  reply: (messages: Messages, state: State) => Messages;
  constructor(
    options: MultiTurnEnvOptions & { reply?: (messages: Messages, state: State) => Messages } = {},
  ) {
    super({ dataset: ROWS, ...options });
    this.reply = options.reply ?? (() => [{ role: "user", content: "Try again." }]);
  }
  envResponse(messages: Messages, state: State): Messages {
    return this.reply(messages, state);
  }
}

function clientFor(server: ModelServer): OpenAIChatClient {
  return new OpenAIChatClient({ base_url: server.url, max_retries: 2, timeout: 5 });
}

async function firstRow(env: MultiTurnEnv): Promise<Row> {
  return (await env.getDataset()).toList()[0];
}

async function serve(responder: Responder): Promise<ModelServer> {
  return await startModelServer({ responder });
}

Deno.test("constructor formats an eager list so a bad row throws there", () => {
  assert.throws(
    () => new SingleTurnEnv({ dataset: [{ text: "no question or prompt" }] }),
    (e: unknown) =>
      e instanceof ConfigError && /^dataset: no "question" \(or "prompt"\) column/.test(e.message),
  );
  assert.throws(
    () => new SingleTurnEnv({ evalDataset: Dataset.fromList([{ question: null }]) }),
    ConfigError,
  );
});

Deno.test("constructor throws TypeError when neither dataset nor evalDataset is given", () => {
  assert.throws(() => new SingleTurnEnv({}), TypeError);
  assert.throws(() => new SingleTurnEnv({ dataset: null, evalDataset: null }), TypeError);
});

Deno.test("a dataset builder is called lazily, once, and its result cached", async () => {
  let calls = 0;
  const env = new SingleTurnEnv({
    dataset: () => {
      calls++;
      return ROWS;
    },
  });
  assert.equal(calls, 0);
  const [a, b] = await Promise.all([env.getDataset(), env.getDataset()]);
  const c = await env.getDataset(2);
  assert.equal(calls, 1);
  assert.equal(a.length, 5);
  assert.deepEqual(a.toList(), b.toList());
  assert.equal(c.length, 2);
});

Deno.test("getEvalDataset() falls back to the training dataset", async () => {
  const env = new SingleTurnEnv({ dataset: ROWS, systemPrompt: "Be brief." });
  assert.equal(env.hasEvalDataset, false);
  const ds = await env.getEvalDataset();
  assert.equal(ds.length, ROWS.length);
  const row = ds.toList()[1];
  assert.equal(row.example_id, 1);
  assert.equal(row.task, "default");
  assert.deepEqual(row.prompt, [
    { role: "system", content: "Be brief." },
    { role: "user", content: "What is 2+2?" },
  ]);
});

Deno.test("an eval-only environment has an eval dataset and no training dataset", async () => {
  const env = new SingleTurnEnv({ evalDataset: ROWS, envId: "arith" });
  assert.equal(env.hasEvalDataset, true);
  assert.equal((await env.getEvalDataset()).toList()[0].task, "arith");
  await assert.rejects(env.getDataset(), TypeError);
});

Deno.test("getDataset() shuffles a copy when a seed is given and later calls are unchanged", async () => {
  const env = new SingleTurnEnv({ dataset: ROWS });
  const ids = (ds: Dataset) => ds.toList().map((r) => r.example_id);
  const original = ids(await env.getDataset());
  assert.deepEqual(original, [0, 1, 2, 3, 4]);
  const shuffled = ids(await env.getDataset(-1, 7));
  assert.notDeepEqual(shuffled, original);
  assert.deepEqual([...shuffled].sort(), original);
  assert.deepEqual(ids(await env.getDataset(-1, 7)), shuffled);
  assert.deepEqual(ids(await env.getDataset(3, 7)), shuffled.slice(0, 3));
  assert.deepEqual(ids(await env.getDataset()), original);
  assert.deepEqual(ids(await env.getDataset(2)), [0, 1]);
});

Deno.test("SingleTurnEnv stops after one model turn", async () => {
  await using server = await serve(() => ({ content: "2" }));
  const env = new SingleTurnEnv({ dataset: ROWS });
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(server.requests.length, 1);
  assert.deepEqual(state.completion, [{ role: "assistant", content: "2" }]);
  assert.equal(state.stop_condition, "max_turns_reached");
  assert.equal(state.is_completed, true);
  assert.equal(state.is_truncated, false);
  assert.equal(state.error, null);
  assert.equal(state.trajectory.length, 1);
});

Deno.test("rollout() with maxTurns 2 and an env that always answers gives assistant, user, assistant", async () => {
  await using server = await serve(
    scriptedResponder([{ content: "first" }, { content: "second" }]),
  );
  const env = new EchoEnv({ maxTurns: 2 });
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.deepEqual(state.completion, [
    { role: "assistant", content: "first" },
    { role: "user", content: "Try again." },
    { role: "assistant", content: "second" },
  ]);
  assert.equal(state.trajectory.length, 2);
  assert.equal(state.stop_condition, "max_turns_reached");
  // The second request carried the whole conversation so far.
  assert.deepEqual(server.requests[1].body.messages.map((m) => m.role), [
    "user",
    "assistant",
    "user",
  ]);
});

Deno.test("stop conditions run by priority, then name, with has_error first", () => {
  const env = new EchoEnv();
  assert.deepEqual(env.stopConditionNames, [
    "has_error",
    "has_final_env_response",
    "max_total_completion_tokens_reached",
    "max_turns_reached",
    "prompt_too_long",
  ]);
  env.addStopCondition("zz_urgent", () => false, 10);
  env.addStopCondition("aa_plain", () => false);
  env.addStopCondition("last", () => false, -1);
  assert.deepEqual(env.stopConditionNames, [
    "has_error",
    "zz_urgent",
    "aa_plain",
    "has_final_env_response",
    "max_total_completion_tokens_reached",
    "max_turns_reached",
    "prompt_too_long",
    "last",
  ]);
});

Deno.test("addStopCondition() with a higher priority wins over max_turns_reached", async () => {
  await using server = await serve(() => ({ content: "done" }));
  const env = new EchoEnv({ maxTurns: 1 });
  env.addStopCondition("answered", (s) => s.trajectory.length >= 1, 10);
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(state.stop_condition, "answered");

  const later = new EchoEnv({ maxTurns: 1 });
  later.addStopCondition("answered", (s) => s.trajectory.length >= 1, -1);
  const other = await later.rollout(await firstRow(later), clientFor(server), "m");
  assert.equal(other.stop_condition, "max_turns_reached");
});

Deno.test("a custom stop condition ends the rollout before max_turns", async () => {
  await using server = await serve(scriptedResponder([{ content: "guess" }, { content: "WIN" }], {
    repeatLast: true,
  }));
  const env = new EchoEnv({ maxTurns: 10 });
  env.addStopCondition("game_won", (s) => s.trajectory.at(-1)?.response.message.content === "WIN");
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(state.stop_condition, "game_won");
  assert.equal(server.requests.length, 2);
});

Deno.test("final_env_response stops without another model call and is in the completion", async () => {
  await using server = await serve(() => ({ content: "my answer" }));
  const env = new EchoEnv({
    maxTurns: 5,
    reply: (_messages, state) => {
      const final: Messages = [{ role: "user", content: "Correct, well done." }];
      state.final_env_response = final;
      return final;
    },
  });
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(server.requests.length, 1);
  assert.equal(state.stop_condition, "has_final_env_response");
  assert.deepEqual(state.completion, [
    { role: "assistant", content: "my answer" },
    { role: "user", content: "Correct, well done." },
  ]);
  assert.equal(state.trajectory.length, 1);
});

Deno.test("finish_reason length marks the step and rollout truncated but does not stop", async () => {
  await using server = await serve(scriptedResponder([
    { content: "cut off", finish_reason: "length" },
    { content: "complete" },
  ]));
  const env = new EchoEnv({ maxTurns: 2 });
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(server.requests.length, 2);
  assert.equal(state.trajectory.length, 2);
  assert.equal(state.trajectory[0].is_truncated, true);
  assert.equal(state.trajectory[1].is_truncated, false);
  assert.equal(state.is_truncated, true);
  assert.equal(state.stop_condition, "max_turns_reached");
});

Deno.test("a context-length 400 sets prompt_too_long and stops with prompt_too_long", async () => {
  await using server = await serve(scriptedResponder([{ content: "first" }, contextLengthReply()]));
  const env = new EchoEnv({ maxTurns: 5 });
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(server.requests.length, 2); // not retried
  assert.equal(state.prompt_too_long, true);
  assert.equal(state.is_truncated, true);
  assert.equal(state.stop_condition, "prompt_too_long");
  assert.equal(state.error, null);
  assert.deepEqual(state.completion, [{ role: "assistant", content: "first" }]);
});

Deno.test("maxTotalCompletionTokens stops once the tracked output tokens reach it", async () => {
  await using server = await serve(() => ({
    content: "words",
    usage: { prompt_tokens: 5, completion_tokens: 40 },
  }));
  const env = new EchoEnv({ maxTurns: 10, maxTotalCompletionTokens: 100 });
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(state.stop_condition, "max_total_completion_tokens_reached");
  assert.equal(state.trajectory.length, 3);
  assert.equal(state.usage.output_tokens, 120);
});

Deno.test("timeoutSeconds with a slow reply marks the rollout timed out and runs cleanups", async () => {
  await using server = await serve(scriptedResponder([{ content: "fast" }, { hang: true }]));
  const env = new EchoEnv({ maxTurns: 5, timeoutSeconds: 0.2 });
  const cleaned: string[] = [];
  env.addCleanup("release", (s) => {
    cleaned.push(s.trajectory_id);
  });
  const started = Date.now();
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.ok(Date.now() - started < 2_000);
  assert.equal(state.timed_out, true);
  assert.equal(state.is_completed, true);
  assert.equal(state.stop_condition, "timeout_reached");
  assert.deepEqual(cleaned, [state.trajectory_id]);
  assert.deepEqual(state.completion, [{ role: "assistant", content: "fast" }]);
  assert.ok(state.timing.generation.end >= state.timing.generation.start);
});

Deno.test("a timeout during setupState leaves an empty trajectory and completion", async () => {
  await using server = await serve(() => ({ content: "never asked" }));
  class SlowSetup extends EchoEnv {
    override async setupState(state: State): Promise<void> {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 5_000);
        state.signal?.addEventListener("abort", () => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }
  const env = new SlowSetup({ maxTurns: 2, timeoutSeconds: 0.05 });
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(state.timed_out, true);
  assert.equal(state.stop_condition, "timeout_reached");
  assert.deepEqual(state.trajectory, []);
  assert.deepEqual(state.completion, []);
  assert.equal(server.requests.length, 0);
});

Deno.test("setupState throwing a VfError records the error and stops with has_error", async () => {
  await using server = await serve(() => ({ content: "never asked" }));
  class BrokenSetup extends EchoEnv {
    override setupState(): void {
      throw new VfError("Cannot create the sandbox");
    }
  }
  const env = new BrokenSetup({ maxTurns: 2 });
  let cleanups = 0;
  env.addCleanup("count", () => cleanups++);
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.ok(state.error instanceof VfError);
  assert.equal((state.error as Error).message, "Cannot create the sandbox");
  assert.equal(state.stop_condition, "has_error");
  assert.equal(state.is_completed, true);
  assert.equal(server.requests.length, 0);
  assert.equal(cleanups, 1);
  assert.deepEqual(state.completion, []);
});

Deno.test("initState() parses an info JSON string", async () => {
  await using server = await serve(() => ({ content: "ok" }));
  const env = new SingleTurnEnv({
    dataset: [{ question: "q", answer: "a", info: '{"difficulty":"hard","tags":["x"]}' }],
  });
  const [row] = (await env.getDataset()).toList();
  const state = await env.rollout(row, clientFor(server), "m");
  assert.deepEqual(state.info, { difficulty: "hard", tags: ["x"] });
  assert.equal(state.answer, "a");
});

Deno.test("info.tool_defs overrides the environment's tools for that row", async () => {
  await using server = await serve(() => ({ content: "ok" }));
  const envTool = { name: "env_tool", description: "", parameters: { type: "object" } };
  const rowTool = {
    name: "row_tool",
    description: "Only for this row",
    parameters: { type: "object", properties: { x: { type: "string" } } },
  };
  const env = new SingleTurnEnv({
    dataset: [
      { question: "with row tools", info: { tool_defs: [rowTool] } },
      { question: "with env tools" },
    ],
    toolDefs: [envTool],
  });
  const [withRow, withEnv] = (await env.getDataset()).toList();
  const client = clientFor(server);
  const a = await env.rollout(withRow, client, "m");
  const b = await env.rollout(withEnv, client, "m");
  assert.deepEqual(a.tool_defs.map((t) => t.name), ["row_tool"]);
  assert.deepEqual(b.tool_defs.map((t) => t.name), ["env_tool"]);
  assert.deepEqual(server.requests[0].body.tools?.map((t) => t.function?.name), ["row_tool"]);
  assert.deepEqual(server.requests[1].body.tools?.map((t) => t.function?.name), ["env_tool"]);
});

Deno.test("info.oai_tools is rejected", async () => {
  await using server = await serve(() => ({ content: "ok" }));
  const env = new SingleTurnEnv({
    dataset: [{ question: "q", info: JSON.stringify({ oai_tools: [] }) }],
  });
  const [row] = (await env.getDataset()).toList();
  await assert.rejects(env.rollout(row, clientFor(server), "m"), /oai_tools/);
  assert.equal(server.requests.length, 0);
});

Deno.test("rollout() does not mutate the input or its prompt", async () => {
  await using server = await serve(scriptedResponder([{ content: "a" }, { content: "b" }]));
  const env = new EchoEnv({ maxTurns: 2, systemPrompt: "sys" });
  const row = await firstRow(env);
  const before = structuredClone(row);
  const state = await env.rollout(row, clientFor(server), "m");
  assert.deepEqual(row, before);
  assert.deepEqual(state.prompt, before.prompt);
  assert.equal(state.completion.length, 3);
});

Deno.test("sampling args reach the server, call args over env args, max_tokens renamed", async () => {
  await using server = await serve(() => ({ content: "ok" }));
  const env = new SingleTurnEnv({
    dataset: ROWS,
    samplingArgs: { temperature: 0.7, max_tokens: 32, seed: 1 },
  });
  const row = (await env.getDataset()).toList()[0];
  await env.rollout(row, clientFor(server), "m", {
    samplingArgs: { temperature: 0, top_p: 0.9 },
  });
  const body = server.requests[0].body;
  assert.equal(body.temperature, 0);
  assert.equal(body.top_p, 0.9);
  assert.equal(body.seed, 1);
  assert.equal(body.max_completion_tokens, 32);
  assert.equal("max_tokens" in body, false);
  assert.equal(body.model, "m");
});

Deno.test("runGroup() scores with the num_turns metric and the user's rubric", async () => {
  await using server = await serve(() => ({ content: "answer" }));
  const env = new EchoEnv({ maxTurns: 3 });
  env.rubric.addRewardFunc(({ completion }) => completion.length > 0 ? 1 : 0, 1, "nonempty");
  const rows = (await env.getDataset(1)).toList();
  const states = await env.runGroup([rows[0], rows[0]], clientFor(server), "m");
  assert.equal(states.length, 2);
  for (const s of states) {
    assert.equal(s.metrics?.num_turns, 3);
    assert.equal(s.metrics?.nonempty, 1);
    assert.equal(s.reward, 1);
    assert.equal(s.advantage, 0);
  }
  assert.deepEqual(env.rubric.funcNames, ["nonempty", "num_turns"]);
});

Deno.test("a model error is recorded on the state and stops with has_error", async () => {
  await using server = await serve(() => ({ status: 500, headers: { "retry-after": "0" } }));
  const env = new EchoEnv({ maxTurns: 2 });
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(state.stop_condition, "has_error");
  assert.match(String((state.error as Error).message), /HTTP 500/);
  assert.deepEqual(state.completion, []);
});

Deno.test("SingleTurnEnv accepts timeoutSeconds", async () => {
  await using server = await serve(() => ({ hang: true }));
  const env = new SingleTurnEnv({ dataset: ROWS, timeoutSeconds: 0.05 });
  const [row] = (await env.getDataset()).toList();
  const state = await env.rollout(row, clientFor(server), "m");
  assert.equal(state.stop_condition, "timeout_reached");
});

Deno.test("rollout() with an already aborted signal rejects without calling the model", async () => {
  await using server = await serve(() => ({ content: "ok" }));
  const env = new EchoEnv({ maxTurns: 2 });
  const controller = new AbortController();
  controller.abort(new Error("cancelled before start"));
  await assert.rejects(
    env.rollout(await firstRow(env), clientFor(server), "m", { signal: controller.signal }),
    /cancelled before start/,
  );
  assert.equal(server.requests.length, 0);
});

Deno.test("scoreStates() is synchronous for a synchronous rubric; an async or failing cleanup keeps the order and the rest", async () => {
  const client = new OpenAIChatClient({ base_url: "http://127.0.0.1:9/v1" }); // never called
  const rows = (await new SingleTurnEnv({ dataset: ROWS }).getDataset()).toList().slice(0, 3);
  const states = () =>
    rows.map((row) => {
      const env = new SingleTurnEnv({ dataset: ROWS });
      const state = env.initState(row, client, "m");
      state.completion = [{ role: "assistant", content: String(state.answer) }];
      return state;
    });

  // A synchronous rubric without cleanups: scored before scoreStates() returns.
  const plain = new SingleTurnEnv({
    dataset: ROWS,
    rubric: new Rubric({ funcs: [({ answer }) => answer.length] }),
  });
  const sync = states();
  assert.equal(plain.scoreStates(sync), RESOLVED);
  assert.deepEqual(sync.map((s) => s.reward), [1, 1, 1]);
  for (const s of sync) assert.ok(s.timing.scoring.end! >= s.timing.scoring.start!);

  // Cleanups that wait, and one that fails: each state's runs, in order; the failure is
  // reported, not thrown.
  const seen: number[] = [];
  const rubric = new Rubric({ funcs: [() => 1] });
  rubric.addCleanup(async (state: State) => {
    await new Promise((r) => setTimeout(r, 5));
    seen.push(state.example_id);
    if (state.example_id === 0) throw new Error("boom");
  });
  const env = new SingleTurnEnv({ dataset: ROWS, rubric });
  const warnings: string[] = [];
  const warn = console.warn;
  console.warn = (message: string) => warnings.push(message);
  try {
    const scored = states();
    const scoring = env.scoreStates(scored);
    assert.notEqual(scoring, RESOLVED);
    await scoring;
    assert.deepEqual(seen, [0, 1, 2]);
    assert.deepEqual(scored.map((s) => s.reward), [1, 1, 1]);
    assert.deepEqual(warnings, ["Rubric cleanup failed: Error: boom"]);

    // Independent scoring runs the same cleanups after scoring each state.
    seen.length = 0;
    warnings.length = 0;
    const each = states();
    await env.scoreStates(each, true);
    assert.deepEqual(seen, [0, 1, 2]);
    assert.deepEqual(each.map((s) => s.reward), [1, 1, 1]);
    assert.deepEqual(warnings, ["Rubric cleanup failed: Error: boom"]);
  } finally {
    console.warn = warn;
  }
});

Deno.test("scoreStates() takes a rubric whose cleanup returns nothing (as JavaScript may) as done", async () => {
  const client = new OpenAIChatClient({ base_url: "http://127.0.0.1:9/v1" }); // never called
  const seen: number[] = [];
  class LooseRubric extends Rubric {
    override cleanup(state: State): Promise<void> {
      seen.push(state.example_id);
      return undefined as unknown as Promise<void>;
    }
  }
  const env = new SingleTurnEnv({ dataset: ROWS });
  env.rubric = new LooseRubric({ funcs: [() => 1] });
  const rows = (await env.getDataset()).toList().slice(0, 2);
  const states = rows.map((row) => env.initState(row, client, "m"));
  await env.scoreStates(states);
  assert.deepEqual(seen, [0, 1]);
  assert.deepEqual(states.map((s) => s.reward), [1, 1]);
});

Deno.test("rollout() rejects (never throws) on a bad row, with or without a timeout of its own", async () => {
  const client = new OpenAIChatClient({ base_url: "http://127.0.0.1:9/v1" }); // never called
  const row = { ...(await firstRow(new EchoEnv())), info: { oai_tools: [] } };
  for (const timeoutSeconds of [null, 5]) {
    const env = new EchoEnv({ timeoutSeconds });
    assert.equal(env.timeoutSeconds, timeoutSeconds);
    let thrown: unknown;
    let promise: Promise<State> | undefined;
    try {
      promise = env.rollout(row, client, "m");
    } catch (error) {
      thrown = error;
    }
    assert.equal(thrown, undefined);
    await assert.rejects(promise!, /info.oai_tools is not supported/);
  }
});

Deno.test("a timeoutSeconds left undefined (set from JavaScript) means no rollout timeout", async () => {
  await using server = await serve(scriptedResponder([{ content: "4" }]));
  const env = new SingleTurnEnv({ dataset: ROWS });
  (env as { timeoutSeconds: number | null | undefined }).timeoutSeconds = undefined;
  const state = await env.rollout(await firstRow(env), clientFor(server), "m");
  assert.equal(state.timed_out, false);
  assert.equal(state.error, null);
  assert.equal(state.stop_condition, "max_turns_reached");
});

Deno.test("a dataset file with a row lacking both question and prompt names the file and that row, shuffled or lazy", async () => {
  const { loadDataset } = await import("../data/io.ts");
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/train.jsonl`;
    // Mixed rows: row 0 is valid (a question), row 1 has a prompt, row 3 has neither.
    await Deno.writeTextFile(
      path,
      [
        { question: "What is 1+1?", answer: "2" },
        { prompt: [{ role: "user", content: "What is 2+2?" }], answer: "4" },
        { question: "What is 3+3?", answer: "6" },
        { answer: "8" },
      ].map((r) => JSON.stringify(r)).join("\n") + "\n",
    );
    const expected = `${path}: row 3: no "question" (or "prompt") column`;
    const ds = await loadDataset(path);
    assert.throws(
      () => new SingleTurnEnv({ dataset: ds }),
      (e: unknown) => e instanceof ConfigError && e.message.startsWith(expected),
    );
    // After a shuffle and a select, the row is still named by its place in the file.
    assert.throws(
      () => new SingleTurnEnv({ evalDataset: ds.shuffle(7).select([3, 2, 1, 0]) }),
      (e: unknown) => e instanceof ConfigError && e.message.startsWith(expected),
    );
    // A builder is formatted on first access, with the same message.
    const lazy = new SingleTurnEnv({ dataset: () => loadDataset(path) });
    await assert.rejects(
      () => lazy.getDataset(),
      (e: unknown) => e instanceof ConfigError && e.message.startsWith(expected),
    );
    // The valid rows alone format, each with its own prompt.
    const env = new SingleTurnEnv({ dataset: ds.select([0, 1, 2]) });
    const rows = (await env.getDataset()).toList();
    assert.deepEqual(rows.map((r) => (r.prompt as Messages).at(-1)?.content), [
      "What is 1+1?",
      "What is 2+2?",
      "What is 3+3?",
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("concatenated datasets from two files name the right file for a bad row", async () => {
  const { loadDataset } = await import("../data/io.ts");
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/a.jsonl`, '{"question":"q","answer":"1"}\n');
    await Deno.writeTextFile(`${dir}/b.csv`, "question,answer\nq,1\n,2\n");
    const both = Dataset.concatenate([
      await loadDataset(`${dir}/a.jsonl`),
      await loadDataset(`${dir}/b.csv`),
      Dataset.fromList([{ question: "in memory", answer: "3" }]),
    ]);
    // The CSV's empty question cell is "" (a question, if an empty one); null it to break it.
    const broken = both.map((r, i) => (i === 2 ? { question: null } : r));
    assert.throws(
      () => new SingleTurnEnv({ dataset: broken }),
      (e: unknown) =>
        e instanceof ConfigError && e.message.startsWith(`${dir}/b.csv: row 1: no "question"`),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("rollout ids are 32 lowercase hex digits of a version 4 UUID, none repeated across refills of their random pool", () => {
  const env = new EchoEnv();
  const client = new OpenAIChatClient({ base_url: "http://127.0.0.1:9/v1" });
  const row = { prompt: [{ role: "user", content: "q" }], example_id: 0 };
  const ids = new Set<string>();
  // 256 ids per pool: 1,000 of them cross three refills.
  for (let i = 0; i < 1000; i++) {
    const id = env.initState(row, client, "m").trajectory_id;
    assert.match(id, /^[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}$/);
    ids.add(id);
  }
  assert.equal(ids.size, 1000);
});

Deno.test("initState() takes an absent, empty or object info as is and refuses any other by example", () => {
  const env = new EchoEnv();
  const client = new OpenAIChatClient({ base_url: "http://127.0.0.1:9/v1" });
  const row = (info: unknown) => ({
    prompt: [{ role: "user", content: "q" }],
    example_id: 7,
    info,
  });
  assert.deepEqual(env.initState(row(undefined), client, "m").info, {});
  assert.deepEqual(env.initState(row(null), client, "m").info, {});
  assert.deepEqual(env.initState(row(""), client, "m").info, {});
  assert.deepEqual(env.initState(row({ level: 2 }), client, "m").info, { level: 2 });
  assert.deepEqual(env.initState(row('{"level":3}'), client, "m").info, { level: 3 });
  assert.throws(
    () => env.initState(row([1]), client, "m"),
    (e) => e instanceof ConfigError && /info of example 7 must be an object/.test(e.message),
  );
  assert.throws(
    () => env.initState(row("[1]"), client, "m"),
    (e) => e instanceof ConfigError && /info of example 7 must be a JSON object/.test(e.message),
  );
});

Deno.test("renderCompletion() writes what follows the prompt into one array of its size", async () => {
  const env = new EchoEnv({ systemPrompt: "Be brief." });
  const state = env.initState(await firstRow(env), noModel, "m");
  const prompt = state.prompt;
  state.trajectory.push(
    {
      prompt: [...prompt, { role: "assistant", content: "a" }, { role: "user", content: "u" }],
      completion: [{ role: "assistant", content: "b" }],
      response: { id: "r", created: 0, model: "m", message: { role: "assistant", content: "b" } },
      reward: null,
      advantage: null,
      is_truncated: false,
      trajectory_id: state.trajectory_id,
      extras: {},
    } as State["trajectory"][number],
  );
  state.final_env_response = [{ role: "user", content: "done" }];
  env.renderCompletion(state);
  assert.deepEqual(state.completion.map((m) => m.content), ["a", "u", "b", "done"]);
  assert.equal(state.prompt, prompt);
  // Rendered again, it is the same messages (nothing appended twice).
  env.renderCompletion(state);
  assert.deepEqual(state.completion.map((m) => m.content), ["a", "u", "b", "done"]);
});
