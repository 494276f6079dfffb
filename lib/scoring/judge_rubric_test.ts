import assert from "node:assert/strict";
import { startModelServer } from "../../tests/model_server.ts";
import { OpenAIChatClient } from "../model/client.ts";
import { JudgeRubric } from "./judge_rubric.ts";
import { SingleTurnEnv } from "../legacy/multi_turn.ts";
import type { State } from "../state.ts";
import type { RewardFunc } from "./rubric.ts";
import { RewardError } from "../errors.ts";

Deno.test("JudgeRubric.judge() fills the template, calls the judge model and caches per state", async () => {
  await using judge = await startModelServer({
    responder: (req) => {
      const text = String(req.body.messages.at(-1)?.content ?? "");
      return { content: text.includes("Response:\n```\n4\n```") ? "yes" : "no" };
    },
  });
  const client = new OpenAIChatClient({ base_url: judge.url, max_retries: 0 });
  const rubric = new JudgeRubric({ judgeClient: client, judgeModel: "judge-1" });
  const state = { judge_response: undefined } as unknown as State;
  const args = {
    prompt: [{ role: "user" as const, content: "What is 2+2?" }],
    completion: [{ role: "assistant" as const, content: "4" }],
    answer: "4",
    state,
  };
  assert.equal(await rubric.judge(args), "yes");
  assert.equal(await rubric.judge(args), "yes");
  assert.equal(judge.requests.length, 1, "the second verdict comes from the state's cache");
  const sent = String(judge.requests[0].body.messages[0].content);
  assert.match(sent, /Question:\n```\nWhat is 2\+2\?\n```/);
  assert.match(sent, /Ground truth answer:\n```\n4\n```/);
  assert.equal(judge.requests[0].body.model, "judge-1");
  assert.equal(
    await rubric.judge({
      ...args,
      completion: [{ role: "assistant", content: "5" }],
      state: undefined,
    }),
    "no",
  );
});

Deno.test("JudgeRubric scores rollouts through a reward function that asks the judge", async () => {
  await using judge = await startModelServer({
    responder: (req) => ({
      content: String(req.body.messages[0].content).includes("Response:\n```\nParis\n```")
        ? "yes"
        : "no",
    }),
  });
  await using model = await startModelServer({
    responder: (req) => ({
      content: String(req.body.messages.at(-1)?.content).includes("France") ? "Paris" : "Rome",
    }),
  });
  const rubric = new JudgeRubric({
    judgeClient: new OpenAIChatClient({ base_url: judge.url, max_retries: 0 }),
    funcs: [
      async ({ prompt, completion, answer, state, judge }) =>
        (await judge({ prompt, completion, answer, state })).startsWith("yes") ? 1 : 0,
    ],
  });
  const env = new SingleTurnEnv({
    evalDataset: [
      { question: "Capital of France?", answer: "Paris" },
      { question: "Capital of Spain?", answer: "Madrid" },
    ],
    rubric,
  });
  const client = new OpenAIChatClient({ base_url: model.url, max_retries: 0 });
  const rows = (await env.getEvalDataset()).toList();
  const states = [
    ...(await env.runGroup([rows[0]], client, "m")),
    ...(await env.runGroup([rows[1]], client, "m")),
  ];
  assert.deepEqual(states.map((s) => s.reward), [1, 0]);
  assert.equal(judge.requests.length, 2);
});

Deno.test("JudgeRubric fills its template as the judges do: only its own fields, in one pass", async () => {
  await using judge = await startModelServer({ responder: () => ({ content: "yes" }) });
  const rubric = new JudgeRubric({
    judgeClient: new OpenAIChatClient({ base_url: judge.url, max_retries: 0 }),
    judgePrompt: "Q:{question} A:{answer} R:{response} {constructor} {toString} {other}",
  });
  await rubric.judge({
    prompt: "{answer}?",
    completion: [{ role: "assistant", content: "{question}" }],
    answer: "4",
  });
  assert.equal(
    judge.requests[0].body.messages[0].content,
    "Q:{answer}? A:4 R:{question} {constructor} {toString} {other}",
  );
});

Deno.test("a JudgeRubric whose judge endpoint fails leaves the rollout unscored, blamed on the judge by model and on the reward by name", async () => {
  await using judge = await startModelServer({
    responder: () => ({ status: 500, body: { error: { message: "judge overloaded" } } }),
  });
  await using model = await startModelServer({ responder: () => ({ content: "Paris" }) });
  async function judgedCorrect(
    { prompt, completion, answer, state, judge }: Parameters<RewardFunc>[0],
  ) {
    return (await judge({ prompt, completion, answer, state })).startsWith("yes") ? 1 : 0;
  }
  const rubric = new JudgeRubric({
    judgeClient: new OpenAIChatClient({ base_url: judge.url, max_retries: 0 }),
    judgeModel: "judge-7",
    funcs: [judgedCorrect],
  });
  const env = new SingleTurnEnv({
    evalDataset: [{ question: "Capital of France?", answer: "Paris" }],
    rubric,
  });
  const client = new OpenAIChatClient({ base_url: model.url, max_retries: 0 });
  const [state] = await env.runGroup((await env.getEvalDataset()).toList(), client, "m");
  assert.ok(state.error instanceof RewardError, String(state.error));
  assert.match(
    (state.error as Error).message,
    /^Reward function "judgedCorrect" failed: Judge model "judge-7" failed: .*judge overloaded/,
  );
  assert.equal(judge.requests.length, 1);
});
