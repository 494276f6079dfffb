import assert from "node:assert/strict";
import { roomForOne } from "./state.ts";
import { bytesPerCall } from "./util/_allocated.ts";
import { testState } from "../tests/_state.ts";

Deno.test("roomForOne() is an empty array whose first push does not grow it", () => {
  const list = roomForOne<{ start: number }>();
  assert.equal(list.length, 0);
  const span = { start: 1 };
  list.push(span);
  assert.deepEqual(list, [span]);
  // A push onto [] reserves 17 slots: about 195 bytes with the array, against 60 here.
  const bytes = bytesPerCall(() => roomForOne().push(span));
  assert.ok(bytes < 120, `roomForOne() and a push allocated ${bytes} bytes`);
});

Deno.test("a new rollout's trajectory and model spans are empty lists of their own", () => {
  const a = testState();
  const b = testState();
  assert.deepEqual([a.trajectory, a.timing.model.spans], [[], []]);
  assert.notEqual(a.trajectory, b.trajectory);
  assert.notEqual(a.timing.model.spans, b.timing.model.spans);
});
