import assert from "node:assert/strict";
import { OpenAIChatClient } from "../model/client.ts";
import { generate } from "./evaluate.ts";
import { renderSummary } from "./progress.ts";
import { MAX_LISTED_EXAMPLES, OutputTally } from "./tally.ts";
import { lastUserText, startModelServer } from "../../tests/model_server.ts";
import { echoEnv } from "../../tests/_echo_env.ts";
import type { RunMetadata } from "./results.ts";
import type { RolloutOutput } from "../state.ts";

function output(exampleId: number, reward: number, extra: Partial<RolloutOutput> = {}) {
  return {
    example_id: exampleId,
    reward,
    metrics: {},
    stop_condition: null,
    error: null,
    ...extra,
  } as unknown as RolloutOutput;
}

function metadata(extra: Partial<RunMetadata> = {}): RunMetadata {
  return {
    env_id: "e",
    model: "m",
    num_examples: 3,
    rollouts_per_example: 2,
    num_rollouts: 6,
    time_ms: 1000,
    avg_reward: 0.35,
    avg_metrics: {},
    avg_error: 0,
    pass_at_k: {},
    pass_all_k: {},
    usage: null,
    num_unscored: 0,
    num_model_retries: 0,
    ...extra,
  } as unknown as RunMetadata;
}

Deno.test("renderSummary() prints upstream's per-rollout reward lines: r1 holds each example's first rollout", () => {
  // Sorted by example, as upstream's test has them: ex0 r0, ex0 r1, ex1 r0, ...
  const outputs = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6].map((r, i) => output(Math.floor(i / 2), r));
  const text = renderSummary(metadata(), outputs);
  assert.ok(text.includes("\nr1: [0.1, 0.3, 0.5]\nr2: [0.2, 0.4, 0.6]\n"), text);
  // Whole rewards print as Python does (1.0), and the order of arrival does not matter.
  const tally = new OutputTally();
  tally.add([output(1, 1), output(0, 0), output(0, 1), output(1, 0.33333)]);
  assert.match(
    renderSummary(metadata({ num_examples: 2 }), tally),
    /\nr1: \[0\.0, 1\.0\]\nr2: \[1\.0, 0\.333\]\n/,
  );
});

Deno.test("renderSummary() shows a rollout that was never scored as n/a in its line, never 0", () => {
  const unscored = output(1, 0, {
    error: { error: "SandboxError", message: "engine gone" } as never,
    stop_condition: "has_error",
  });
  const text = renderSummary(metadata({ num_examples: 2, rollouts_per_example: 1 }), [
    output(0, 1),
    unscored,
  ]);
  assert.match(text, /\nr1: \[1\.0, n\/a\]/);
});

Deno.test("OutputTally lists the lowest example ids only, however many examples run", () => {
  const tally = new OutputTally();
  const n = MAX_LISTED_EXAMPLES + 50;
  // Highest ids first: the listed ones must still be 0..99.
  for (let id = n - 1; id >= 0; id--) tally.add([output(id, id % 2)]);
  const { rollouts, examples } = tally.rewardsByRollout();
  assert.equal(examples, MAX_LISTED_EXAMPLES);
  assert.deepEqual(rollouts[0], Array.from({ length: MAX_LISTED_EXAMPLES }, (_, id) => id % 2));
  const text = renderSummary(metadata({ num_examples: n, rollouts_per_example: 1 }), tally);
  assert.match(text, new RegExp(`\\]\\s\\(first ${MAX_LISTED_EXAMPLES} of ${n} examples\\)`));
});

Deno.test("a run's summary from its tally (no outputs kept) has the per-rollout reward lines", async () => {
  // Example 1 is answered wrong on both of its rollouts.
  await using server = await startModelServer({
    responder: (request) => {
      const q = lastUserText(request);
      return { content: q === "q1" ? "wrong" : q.replace("q", "a") };
    },
  });
  const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 5 });
  const env = echoEnv(3);
  const rows = (await env.getEvalDataset()).toList();
  const inputs = rows.flatMap((r) => [r, r]);
  const result = await generate(env, inputs, client, "m", { keepOutputs: false });
  const text = renderSummary(result.metadata, result.tally);
  assert.ok(text.includes("\nr1: [1.0, 0.0, 1.0]\nr2: [1.0, 0.0, 1.0]\n"), text);
});
