import assert from "node:assert/strict";
import { MessageGraph } from "./graph.ts";
import type { Message, ResponseTokens } from "./types.ts";

function tokens(prompt: number[], completion: number[]): ResponseTokens {
  return {
    prompt_ids: prompt,
    prompt_mask: prompt.map(() => 0),
    completion_ids: completion,
    completion_mask: completion.map(() => 1),
    completion_logprobs: completion.map((id) => -id / 100),
  };
}

const user: Message = { role: "user", content: "hi" };
const a1: Message = { role: "assistant", content: "one" };
const u2: Message = { role: "user", content: "more" };
const a2: Message = { role: "assistant", content: "two" };

Deno.test("MessageGraph.commit() with tokens: each reply adds only what is new, and a branch joins to the last call's sequence", () => {
  const graph = new MessageGraph();
  graph.commit([user], a1, tokens([1, 2, 3], [10, 11]));
  graph.commit([user, a1, u2], a2, tokens([1, 2, 3, 10, 11, 4, 5], [12]));
  assert.equal(graph.leaves().length, 1);
  assert.deepEqual(graph.nodes.map((n) => n.token_ids), [[], [1, 2, 3, 10, 11], [], [4, 5, 12]]);
  assert.deepEqual(graph.tokens(), {
    token_ids: [1, 2, 3, 10, 11, 4, 5, 12],
    mask: [false, false, false, true, true, false, false, true],
    logprobs: [-0.1, -0.11, -0.12],
  });
  assert.equal(graph.hasTokens, true);
});

Deno.test("MessageGraph.commit() starts a new branch when a prompt's tokens do not continue its branch's", () => {
  const graph = new MessageGraph();
  graph.commit([user], a1, tokens([1, 2, 3], [10, 11]));
  // The template re-rendered the first reply (say, without its reasoning): 10 became 9.
  graph.commit([user, a1, u2], a2, tokens([1, 2, 3, 9, 11, 4, 5], [12]));
  assert.equal(graph.leaves().length, 2);
  assert.deepEqual(graph.tokens().token_ids, [1, 2, 3, 9, 11, 4, 5, 12]);
  assert.deepEqual(graph.tokens(graph.leaves()[0]).token_ids, [1, 2, 3, 10, 11]);
  assert.deepEqual(graph.branches().at(-1), [user, a1, u2, a2]);
});

Deno.test("MessageGraph.commit() without tokens leaves the token fields out (an eval's graph is unchanged)", () => {
  const graph = new MessageGraph();
  graph.commit([user], a1);
  assert.ok(graph.nodes.every((n) => !("token_ids" in n) && !("mask" in n)));
  assert.equal(graph.hasTokens, false);
  assert.deepEqual(graph.tokens(), { token_ids: [], mask: [], logprobs: [] });
});
