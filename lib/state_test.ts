import assert from "node:assert/strict";
import { releasedStateToOutput, roomForOne, stateToOutput } from "./state.ts";
import type { Messages } from "./types.ts";
import { testState } from "../tests/_state.ts";

Deno.test("roomForOne() is an empty array whose first push does not grow it", () => {
  const list = roomForOne<{ start: number }>();
  assert.equal(list.length, 0);
  const span = { start: 1 };
  list.push(span);
  assert.deepEqual(list, [span]);
  assert.notEqual(roomForOne(), roomForOne());
});

Deno.test("a new rollout's trajectory and model spans are empty lists of their own", () => {
  const a = testState();
  const b = testState();
  assert.deepEqual([a.trajectory, a.timing.model.spans], [[], []]);
  assert.notEqual(a.trajectory, b.trajectory);
  assert.notEqual(a.timing.model.spans, b.timing.model.spans);
});

Deno.test("releasedStateToOutput() shares a plain prompt and completion, copies others, and writes what stateToOutput() does", () => {
  const state = testState({ reward: 1, metrics: {} });
  state.timing.scoring.end = state.timing.generation.start + 1;
  const kept = releasedStateToOutput(state);
  assert.equal(kept.prompt, state.prompt);
  assert.equal(kept.completion, state.completion);
  assert.deepStrictEqual(kept, stateToOutput(state));
  // Not plain JSON (an undefined value a line would drop): copied, as stateToOutput() does.
  const odd = testState({
    completion: [{ role: "assistant", content: "4", reasoning_content: undefined }] as Messages,
  });
  const copied = releasedStateToOutput(odd);
  assert.notEqual(copied.completion, odd.completion);
  assert.deepStrictEqual(copied.completion, [{ role: "assistant", content: "4" }]);
  assert.deepStrictEqual(copied, stateToOutput(odd));
});
