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
