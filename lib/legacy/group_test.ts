import assert from "node:assert/strict";
import { OpenAIChatClient } from "../model/client.ts";
import { EnvGroup, EnvGroupRubric } from "./group.ts";
import { SingleTurnEnv } from "./multi_turn.ts";
import { ConfigError, RewardError } from "../errors.ts";
import { stateToOutput } from "../state.ts";
import { isUnscoredOutput } from "../eval/results.ts";
import { generate } from "../eval/evaluate.ts";
import { contentText } from "../messages.ts";
import { lastUserText, startModelServer } from "../../tests/model_server.ts";
import { Rubric } from "../scoring/rubric.ts";
import type { Messages } from "../types.ts";

function lastText(completion: Messages): string {
  return contentText(completion.at(-1)?.content ?? "");
}

/** Two children with different rubrics: exact-match math and a length check for writing. */
function children() {
  const math = new SingleTurnEnv({
    dataset: [{ question: "1+1", answer: "2" }, { question: "2+2", answer: "4" }],
    rubric: new Rubric({
      funcs: [({ completion, answer }) => lastText(completion) === answer ? 1 : 0],
    }),
  });
  math.rubric.addRewardFunc(
    ({ completion, answer }) => lastText(completion) === answer,
    1,
    "exact",
  );
  const writing = new SingleTurnEnv({
    dataset: [
      { question: "Write a haiku", answer: "" },
      { question: "Write a limerick", answer: "" },
      { question: "Write a sonnet", answer: "" },
    ],
  });
  writing.rubric.addRewardFunc(({ completion }) => lastText(completion).length > 3, 0.5, "long");
  return { math, writing };
}

Deno.test("EnvGroup gives rows unique example ids across children and task = env name", async () => {
  const { math, writing } = children();
  const group = new EnvGroup([math, writing], { envNames: ["math", "writing"] });
  const rows = (await group.getDataset()).toList();
  assert.deepEqual(rows.map((r) => r.example_id), [0, 1, 2, 3, 4]);
  assert.deepEqual(rows.map((r) => r.task), ["math", "math", "writing", "writing", "writing"]);
  const evalRows = (await group.getEvalDataset()).toList();
  assert.deepEqual(evalRows.map((r) => r.example_id), [0, 1, 2, 3, 4]);
  assert.deepEqual(group.envNames, ["math", "writing"]);
  assert.equal(group.envMap.get("writing"), writing);
});

Deno.test("EnvGroup names children env_0, env_1, … by default", async () => {
  const { math, writing } = children();
  const group = new EnvGroup([math, writing]);
  const tasks = (await group.getDataset()).toList().map((r) => r.task);
  assert.deepEqual([...new Set(tasks)], ["env_0", "env_1"]);
});

Deno.test("EnvGroup rejects no children and a names/children length mismatch", () => {
  const { math, writing } = children();
  assert.throws(() => new EnvGroup([]), RangeError);
  assert.throws(
    () => new EnvGroup([math, writing], { envNames: ["only-one"] }),
    (e: unknown) => e instanceof RangeError && /2 environments but 1 names/.test(e.message),
  );
});

Deno.test("getEnvForTask() routes by name and sends unknown tasks to the first env", () => {
  const { math, writing } = children();
  const group = new EnvGroup([math, writing], { envNames: ["math", "writing"] });
  assert.equal(group.getEnvForTask("writing"), writing);
  assert.equal(group.getEnvForTask("math"), math);
  assert.equal(group.getEnvForTask("chemistry"), math);
});

Deno.test("EnvGroup routes rollouts to the child and scores with the child's rubric", async () => {
  await using server = await startModelServer({
    responder: (request) => {
      const q = lastUserText(request);
      return { content: q === "1+1" ? "2" : q === "2+2" ? "5" : "A short poem" };
    },
  });
  const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 5 });
  const { math, writing } = children();
  const group = new EnvGroup([math, writing], { envNames: ["math", "writing"] });
  const { outputs, metadata } = await generate(group, await group.getEvalDataset(), client, "m");
  assert.equal(outputs.length, 5);
  const byId = new Map(outputs.map((o) => [o.example_id, o]));
  assert.equal(byId.get(0)!.task, "math");
  assert.equal(byId.get(0)!.reward, 2); // the anonymous exact match plus "exact"
  assert.equal(byId.get(1)!.reward, 0);
  assert.deepEqual(Object.keys(byId.get(0)!.metrics).sort(), ["exact", "num_turns", "reward_0"]);
  for (const id of [2, 3, 4]) {
    const o = byId.get(id)!;
    assert.equal(o.task, "writing");
    assert.equal(o.reward, 0.5);
    assert.deepEqual(Object.keys(o.metrics).sort(), ["long", "num_turns"]);
  }
  // Sparse metrics average over the outputs that have them.
  assert.equal(metadata.avg_metrics.long, 1);
  assert.equal(metadata.avg_metrics.exact, 0.5);
  assert.equal(metadata.avg_metrics.num_turns, 1);
});

Deno.test("EnvGroup with an eval-only child keeps its rows out of the training set", async () => {
  const { math } = children();
  const evalOnly = new SingleTurnEnv({ evalDataset: [{ question: "held out", answer: "x" }] });
  const group = new EnvGroup([math, evalOnly], { envNames: ["math", "held"] });
  const train = (await group.getDataset()).toList();
  assert.deepEqual(train.map((r) => r.task), ["math", "math"]);
  const evalRows = (await group.getEvalDataset()).toList();
  assert.deepEqual(evalRows.map((r) => r.task), ["math", "math", "held"]);
  assert.deepEqual(evalRows.map((r) => r.example_id), [0, 1, 2]);

  const allEvalOnly = new EnvGroup([evalOnly]);
  await assert.rejects(allEvalOnly.getDataset(), /train dataset/);
  assert.equal((await allEvalOnly.getEvalDataset()).length, 1);
});

Deno.test("EnvGroupRubric zero-fills every child's metric names; an unknown task is an error, never a 0", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "2" }) });
  const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 5 });
  const { math, writing } = children();
  const group = new EnvGroup([math, writing], { envNames: ["math", "writing"] });
  assert.ok(group.rubric instanceof EnvGroupRubric);
  const [first] = (await group.getDataset()).toList();
  const known = await math.rollout(first, client, "m");
  await group.rubric.scoreGroup([known]);
  assert.equal(known.reward, 2);
  assert.deepEqual(known.metrics, { exact: 1, long: 0, num_turns: 1, reward_0: 1 });

  const stray = await math.rollout({ ...first, task: "chemistry" }, client, "m");
  assert.equal(stray.task, "chemistry");
  await group.rubric.scoreRollout(stray);
  assert.ok(stray.error instanceof RewardError, String(stray.error));
  assert.match((stray.error as Error).message, /task "chemistry".*"math", "writing".*not scored/);
  const output = stateToOutput(stray);
  assert.ok(isUnscoredOutput(output), "left out of averages and pass@k");
  assert.deepEqual(stray.metrics, { exact: 0, long: 0, num_turns: 0, reward_0: 0 });
});

Deno.test("EnvGroup surfaces a child's dataset error instead of dropping its rows", async () => {
  const { math } = children();
  const broken = new SingleTurnEnv({ dataset: () => [{ text: "no question" }] });
  const group = new EnvGroup([math, broken], { envNames: ["math", "broken"] });
  await assert.rejects(group.getDataset(), ConfigError);
  await assert.rejects(group.getEvalDataset(), ConfigError);
});
