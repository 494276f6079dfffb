import assert from "node:assert/strict";
import { OutputTally } from "./tally.ts";
import type { RolloutOutput } from "../state.ts";

function output(
  reward: number,
  extra: Partial<RolloutOutput> = {},
): RolloutOutput {
  return {
    example_id: 0,
    reward,
    metrics: {},
    stop_condition: "max_turns_reached",
    error: null,
    ...extra,
  } as unknown as RolloutOutput;
}

const error = (type: string, message: string) =>
  ({ error: type, message, error_chain_repr: "", error_chain_str: "" }) as never;

Deno.test("OutputTally counts errors by kind, stops and retries, and takes the reward and metric spread over scored outputs only", () => {
  const tally = new OutputTally();
  tally.add([
    output(1, { metrics: { turns: 2 } }),
    output(0, { metrics: { turns: 4 }, model_retries: 2 }),
    output(0.5, { metrics: { turns: 3, note: "x" as never } }),
  ]);
  tally.add([
    // An infrastructure error: unscored, so out of the spreads.
    output(0, { error: error("SandboxError", "engine gone"), stop_condition: "has_error" }),
    output(0, { error: error("SandboxError", "engine gone"), stop_condition: null }),
  ]);
  assert.equal(tally.count, 5);
  assert.equal(tally.errors, 2);
  assert.equal(tally.retried, 1);
  assert.deepEqual([...tally.stops], [["max_turns_reached", 3], ["has_error", 1], ["none", 1]]);
  assert.deepEqual([...tally.errorKinds], [["SandboxError: engine gone", 2]]);
  // Population std of [1, 0, 0.5] and of [2, 4, 3], by hand: sqrt(1/6) and sqrt(2/3).
  assert.ok(Math.abs(tally.rewardStd! - Math.sqrt(1 / 6)) < 1e-12, `${tally.rewardStd}`);
  assert.ok(Math.abs(tally.metricStd("turns") - Math.sqrt(2 / 3)) < 1e-12);
  assert.equal(tally.metricStd("note"), 0);
});

Deno.test("OutputTally has no reward spread before a scored output, and a spread of 0 for one or for identical rewards", () => {
  const tally = new OutputTally();
  assert.equal(tally.rewardStd, null);
  tally.add([output(0.7)]);
  assert.equal(tally.rewardStd, 0);
  tally.add(Array.from({ length: 1000 }, () => output(0.7)));
  assert.equal(tally.rewardStd, 0);
});
