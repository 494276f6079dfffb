import assert from "node:assert/strict";
import { stepSegments } from "./segments.ts";

const info = (steps: unknown[]) => ({ harbor: { steps } });

Deno.test("stepSegments(): each step's range in order, what follows the last one unnamed, and no ranges for a trace without them", () => {
  assert.deepEqual(
    stepSegments(
      info([
        { name: "one", reward: 0, messages: [0, 3] },
        { name: "two", reward: 1, messages: [3, 5] },
      ]),
      7,
    ),
    [
      { index: 0, name: "one", reward: 0, from: 0, to: 3 },
      { index: 1, name: "two", reward: 1, from: 3, to: 5 },
      { index: 2, name: null, reward: null, from: 5, to: 7 },
    ],
  );
  assert.equal(stepSegments({}, 3), null);
  assert.equal(stepSegments(info([{ name: "one", reward: 1 }]), 3), null, "written before ranges");
});

Deno.test("stepSegments(): a range out of order or past the messages, or a step without a name or reward, says which", () => {
  assert.match(
    String(stepSegments(info([{ name: "one", reward: 1, messages: [1, 2] }]), 3)),
    /info\.harbor\.steps\[0\]\.messages \[1,2\] is not \[0, n\] with n up to 3/,
  );
  assert.match(
    String(stepSegments(info([{ name: "one", reward: 1, messages: [0, 9] }]), 3)),
    /steps\[0\]\.messages/,
  );
  assert.match(
    String(
      stepSegments(
        info([
          { name: "one", reward: 1, messages: [0, 2] },
          { name: "two", reward: 1, messages: [1, 3] },
        ]),
        3,
      ),
    ),
    /steps\[1\]\.messages \[1,3\] is not \[2, n\]/,
  );
  assert.match(
    String(stepSegments(info([{ name: 1, reward: 1, messages: [0, 1] }]), 3)),
    /steps\[0\]\.name is not a string/,
  );
  assert.match(
    String(stepSegments(info([{ name: "one", reward: "1", messages: [0, 1] }]), 3)),
    /steps\[0\]\.reward is not a number/,
  );
});
