import assert from "node:assert/strict";
import { join } from "node:path";
import { z } from "npm:zod@^4.6.0";
import { MissingTokenDataError, OpenAIChatClient } from "../model/client.ts";
import {
  lastUserText,
  type ModelServer,
  type Responder,
  startModelServer,
  textReply,
  toolCallReply,
} from "../../tests/model_server.ts";
import { TOY_TOKENS, toyLogprob, toyPromptTokens } from "../model/local_server.ts";
import { defineTool, ToolEnv } from "../legacy/tool_env.ts";
import { MessageGraph } from "../graph.ts";
import { echoEnv } from "../../tests/_echo_env.ts";
import { evaluate } from "./evaluate.ts";
import { isUnscoredOutput, loadOutputs } from "./results.ts";
import { startEnvServer } from "../serve/server.ts";
import { ServerEnvironment } from "../serve/client.ts";

function clientFor(server: ModelServer): OpenAIChatClient {
  return new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 5 });
}

const add = defineTool({
  name: "add",
  description: "Add two integers",
  parameters: z.object({ a: z.number().int(), b: z.number().int() }),
  fn: ({ a, b }) => a + b,
});

/** Three turns: add(2, 3), add(5, 4), then the answer. */
const threeTurns: Responder = ({ body }) => {
  const turn = body.messages.filter((m) => m.role === "assistant").length;
  if (turn === 0) return toolCallReply("add", { a: 2, b: 3 }, { id: "call_1" });
  if (turn === 1) return toolCallReply("add", { a: 5, b: 4 }, { id: "call_2" });
  return textReply("The answer is 9.");
};

/** The toy tokenizer's completion ids of a reply as the server rendered it. */
function completionIds(text: string): number[] {
  return [...new TextEncoder().encode(text), TOY_TOKENS.end];
}

Deno.test("a 3-turn tool rollout keeps each call's tokens in the message graph: joined, they are the last prompt plus its completion", async () => {
  await using server = await startModelServer({ responder: threeTurns });
  const env = new ToolEnv({
    envId: "adder",
    evalDataset: [{ question: "What is 2+3+4?", answer: "9" }],
    tools: [add],
  });
  const { outputs } = await evaluate(env, clientFor(server), "m", {
    samplingArgs: { return_token_ids: true },
  });
  assert.equal(outputs.length, 1);
  const [out] = outputs;
  assert.equal(out.error, null);
  assert.equal(server.requests.length, 3);
  for (const r of server.requests) {
    assert.equal(r.body.return_token_ids, true);
    assert.equal(r.body.logprobs, true);
  }
  assert.ok(out.nodes, "the output carries the message graph with token data");
  const graph = new MessageGraph(out.nodes);
  assert.equal(graph.leaves().length, 1, "the prefix held, so one branch");

  // The turns' completions as the server tokenized them.
  const completions = [
    completionIds('<tool_call>add {"a":2,"b":3}</tool_call>'),
    completionIds('<tool_call>add {"a":5,"b":4}</tool_call>'),
    completionIds("The answer is 9."),
  ];
  const lastPrompt = toyPromptTokens(server.requests[2].body);
  const seq = graph.tokens();
  assert.deepEqual(seq.token_ids, [...lastPrompt, ...completions[2]]);

  // Each sampled node holds the prompt tokens new to it (unmasked), then its completion (masked).
  const sampled = graph.nodes.filter((n) => n.sampled);
  assert.equal(sampled.length, 3);
  let before = 0;
  sampled.forEach((node, t) => {
    const prompt = toyPromptTokens(server.requests[t].body);
    const added = prompt.length - before;
    assert.deepEqual(node.token_ids, [...prompt.slice(before), ...completions[t]]);
    assert.deepEqual(node.mask, [
      ...Array(added).fill(false),
      ...Array(completions[t].length).fill(true),
    ]);
    assert.deepEqual(node.logprobs, completions[t].map((id, i) => toyLogprob(id, i)));
    before = prompt.length + completions[t].length;
  });
  // Prompt messages add no tokens of their own; masks cover only sampled tokens.
  assert.ok(graph.nodes.filter((n) => !n.sampled).every((n) => n.token_ids?.length === 0));
  const sampledCount = completions.reduce((a, c) => a + c.length, 0);
  assert.equal(seq.mask.filter(Boolean).length, sampledCount);
  assert.equal(seq.logprobs.length, sampledCount);
  // The masked positions of the joined sequence are exactly the three completions, in order.
  assert.deepEqual(
    seq.token_ids.filter((_, i) => seq.mask[i]),
    completions.flat(),
  );
});

Deno.test("group advantages are reward minus the example's mean, divided by its deviation when asked", async () => {
  // q0 is answered right on its 1st, 2nd and 4th rollout; q1 only on its 4th.
  const right: Record<string, boolean[]> = {
    q0: [true, true, false, true],
    q1: [false, false, false, true],
  };
  const seen = new Map<string, number>();
  const responder: Responder = (request) => {
    const q = lastUserText(request);
    const n = seen.get(q) ?? 0;
    seen.set(q, n + 1);
    return { content: right[q][n] ? q.replace("q", "a") : "wrong" };
  };
  for (const advantageStd of [false, true]) {
    seen.clear();
    await using server = await startModelServer({ responder });
    const { outputs } = await evaluate(echoEnv(2), clientFor(server), "m", {
      rolloutsPerExample: 4,
      maxConcurrent: 1,
      advantageStd,
    });
    assert.equal(outputs.length, 8);
    // By hand: q0 rewards 1,1,0,1 have mean 0.75 and deviation sqrt(0.1875) ≈ 0.4330127;
    // q1 rewards 0,0,0,1 have mean 0.25 and the same deviation.
    const sd = Math.sqrt(0.1875) + 1e-6;
    const expected: Record<number, Record<number, number>> = advantageStd
      ? { 0: { 1: 0.25 / sd, 0: -0.75 / sd }, 1: { 1: 0.75 / sd, 0: -0.25 / sd } }
      : { 0: { 1: 0.25, 0: -0.75 }, 1: { 1: 0.75, 0: -0.25 } };
    for (const o of outputs) {
      assert.ok(
        Math.abs((o.advantage as number) - expected[o.example_id][o.reward]) < 1e-9,
        `example ${o.example_id} reward ${o.reward}: advantage ${o.advantage}`,
      );
    }
    assert.deepEqual(outputs.map((o) => o.reward), [1, 1, 0, 1, 0, 0, 0, 1]);
  }
});

Deno.test('return_token_ids = "required" against an endpoint without token data fails the rollout with one clear model error, never a reward', async () => {
  await using server = await startModelServer({
    responder: (request) => ({ content: lastUserText(request).replace("q", "a") }),
    tokenIds: false,
  });
  const { outputs, metadata } = await evaluate(echoEnv(2), clientFor(server), "m", {
    samplingArgs: { return_token_ids: "required" },
  });
  assert.equal(outputs.length, 2);
  for (const o of outputs) {
    assert.equal(o.error?.error, MissingTokenDataError.name);
    assert.equal(
      o.error?.message,
      `Model endpoint "${server.url}/chat/completions" returned no token data: the response ` +
        `has no "prompt_token_ids" although return_token_ids = "required"; serve the model ` +
        "with vLLM 0.10.2 or newer, or set return_token_ids = true to record token data only " +
        "when the endpoint returns it",
    );
    assert.ok(isUnscoredOutput(o), "the rollout is not counted as scored");
    assert.equal(o.advantage, null);
    assert.equal(o.nodes, undefined);
  }
  assert.equal(metadata.avg_reward, null);
  assert.equal(metadata.num_unscored, 2);
});

Deno.test("return_token_ids = true against an endpoint without token data records none and scores normally", async () => {
  await using server = await startModelServer({
    responder: (request) => ({ content: lastUserText(request).replace("q", "a") }),
    tokenIds: false,
  });
  const { outputs } = await evaluate(echoEnv(1), clientFor(server), "m", {
    samplingArgs: { return_token_ids: true },
  });
  assert.equal(outputs[0].error, null);
  assert.equal(outputs[0].reward, 1);
  assert.equal(outputs[0].nodes, undefined);
});

Deno.test("token data reaches results.jsonl only with saveTokens; the returned outputs keep it either way", async () => {
  await using server = await startModelServer({
    responder: (request) => ({ content: lastUserText(request).replace("q", "a") }),
  });
  const root = await Deno.makeTempDir();
  try {
    for (const saveTokens of [false, true]) {
      const dir = join(root, String(saveTokens));
      const { outputs } = await evaluate(echoEnv(2), clientFor(server), "m", {
        samplingArgs: { return_token_ids: true },
        resultsDir: dir,
        saveTokens,
      });
      assert.ok(outputs.every((o) => o.nodes && o.nodes.length > 0));
      const saved = await loadOutputs(dir);
      assert.equal(saved.length, 2);
      for (const o of saved) {
        if (!saveTokens) {
          assert.equal(o.nodes, undefined);
          continue;
        }
        const prompt = toyPromptTokens(
          server.requests.find((r) => lastUserText(r) === `q${o.example_id}`)!.body,
        );
        const seq = new MessageGraph(o.nodes).tokens();
        assert.deepEqual(seq.token_ids.slice(0, prompt.length), prompt);
        assert.deepEqual(seq.token_ids.slice(prompt.length), completionIds(`a${o.example_id}`));
      }
    }
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("an env server's replies carry the token graph, the same as a local run's", async () => {
  await using model = await startModelServer({ responder: threeTurns });
  const makeEnv = () =>
    new ToolEnv({
      envId: "adder",
      evalDataset: [{ question: "What is 2+3+4?", answer: "9" }],
      tools: [add],
    });
  await using server = await startEnvServer(makeEnv());
  const served = await ServerEnvironment.connect(server.url);
  const options = { samplingArgs: { return_token_ids: "required" } };
  const remote = await evaluate(served, clientFor(model), "m", options);
  const local = await evaluate(makeEnv(), clientFor(model), "m", options);
  const joined = (o: typeof remote.outputs[number]) => new MessageGraph(o.nodes).tokens();
  assert.equal(remote.outputs[0].error, null);
  assert.ok(joined(remote.outputs[0]).token_ids.length > 0);
  assert.deepEqual(joined(remote.outputs[0]), joined(local.outputs[0]));
});
