import assert from "node:assert/strict";
import { EpisodeAssembly, type NdArray } from "./delta.ts";
import { tokenCounts } from "./upstream.ts";

const nd = (dtype: "uint8" | "uint16", shape: number[], values: number[]): NdArray => ({
  __nd__: true,
  dtype,
  shape,
  data: new Uint8Array(
    (dtype === "uint8" ? Uint8Array.from(values) : Uint16Array.from(values)).buffer,
  ),
});
const values = (
  a: NdArray,
) => [
  ...(a.dtype === "uint8" ? new Uint8Array(a.data.slice().buffer) : new Uint16Array(
    a.data.slice().buffer,
  )),
];

Deno.test("EpisodeAssembly applies routing_repairs: the node's last routing row replaced, widened to the repair's dtype, the delta untouched", () => {
  const assembly = new EpisodeAssembly();
  const open = {
    trace: "t",
    open: { version: 1, id: "t", verifiers: {}, task: {} },
    nodes: [
      { parent: null, message: { role: "user", content: "q" }, semantic_parents: [] },
      {
        parent: 0,
        message: { role: "assistant", content: "a" },
        routed_experts: nd("uint8", [3, 2, 1], [0, 1, 2, 3, 4, 5]),
        semantic_parents: [],
      },
    ],
  };
  const repair = { trace: "t", routing_repairs: { 1: nd("uint16", [1, 2, 1], [100, 65535]) } };
  const before = structuredClone(repair);
  assembly.apply(open);
  assembly.apply(repair);
  const node = assembly.traces.get("t")!.nodes[1] as { routed_experts: NdArray };
  assert.equal(node.routed_experts.dtype, "uint16");
  assert.deepEqual(node.routed_experts.shape, [3, 2, 1]);
  assert.deepEqual(values(node.routed_experts), [0, 1, 2, 3, 100, 65535]);
  assert.deepEqual(repair, before);
  // The node the first delta carried keeps its own array.
  assert.deepEqual(values(open.nodes[1].routed_experts!), [0, 1, 2, 3, 4, 5]);
  // A narrower repair keeps the wider dtype, as numpy's concatenation does.
  assembly.apply({ trace: "t", routing_repairs: { 1: nd("uint8", [1, 2, 1], [7, 8]) } });
  const again = assembly.traces.get("t")!.nodes[1] as { routed_experts: NdArray };
  assert.equal(again.routed_experts.dtype, "uint16");
  assert.deepEqual(values(again.routed_experts), [0, 1, 2, 3, 7, 8]);
});

Deno.test("tokenCounts follows upstream's Trace over branches: inputs counted once per call, outputs and final sequences summed per branch", () => {
  const usage = (prompt: number, completion: number, cached: number | null = null) => ({
    prompt_tokens: prompt,
    completion_tokens: completion,
    cached_input_tokens: cached,
  });
  // 0 user → 1 assistant → 2 user → 3 assistant; a fork at 1: 4 user → 5 assistant.
  const nodes = [null, 0, 1, 2, 1, 4].map((parent) => ({ parent }));
  const calls = [
    { node: 1, usage: usage(10, 5) },
    { node: 3, usage: usage(8, 4, 12) }, // sees 20 in: 15 of them were the first call's
    { node: 5, usage: usage(18, 6) }, // 18 in: 3 new past the shared first call
    { node: null, usage: usage(100, 100) }, // a call that committed no turn: on no branch
  ];
  assert.deepEqual(tokenCounts(nodes, calls), {
    num_input_tokens: 10 + 5 + 3,
    num_output_tokens: (5 + 4) + (5 + 6),
    num_total_tokens: (20 + 4) + (18 + 6),
  });
  assert.deepEqual(tokenCounts([], []), {
    num_input_tokens: 0,
    num_output_tokens: 0,
    num_total_tokens: 0,
  });
});
