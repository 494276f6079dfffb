import assert from "node:assert/strict";
import { groupAdvantages } from "./advantages.ts";

Deno.test("groupAdvantages() subtracts the group mean", () => {
  assert.deepEqual(groupAdvantages([1, 0, 0, 1]), [0.5, -0.5, -0.5, 0.5]);
});

Deno.test("groupAdvantages() leaves unscored rollouts out of the mean and gives them null", () => {
  assert.deepEqual(groupAdvantages([1, null, 0]), [0.5, null, -0.5]);
  assert.deepEqual(groupAdvantages([null, null]), [null, null]);
});

Deno.test("groupAdvantages() divides by the standard deviation when asked; a uniform group gives 0", () => {
  const out = groupAdvantages([3, 1], { normalizeStd: true, epsilon: 0 });
  assert.deepEqual(out, [1, -1]);
  assert.deepEqual(groupAdvantages([2, 2, 2], { normalizeStd: true }), [0, 0, 0]);
});

Deno.test("groupAdvantages() of a group allocates only its result: no filtered copy, closures or options", () => {
  // generate calls it once per group; filter, reduce and map made three arrays and closures.
  const rewards = [1, null, 0, 0.5];
  const options = { normalizeStd: true };
  assert.deepEqual(groupAdvantages(rewards, options).map((a) => a?.toFixed(3) ?? null), [
    "1.225",
    null,
    "-1.225",
    "0.000",
  ]);
});
