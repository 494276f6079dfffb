import assert from "node:assert/strict";
import { TaskError } from "../../errors.ts";
import { inPhase, phase, PhaseError, settledWithin } from "./phase.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A test body with the event loop held open: the phase's timers are unref'd (they never keep
 * a process alive), so a test awaiting only them would end early.
 */
function held(fn: () => Promise<void>): () => Promise<void> {
  return async () => {
    const keep = setInterval(() => {}, 1_000);
    try {
      await fn();
    } finally {
      clearInterval(keep);
    }
  };
}

/** Work that ends only when its signal aborts. */
function untilAborted(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)));
}

Deno.test(
  "phase(): work that outlasts its timeout fails with a TaskError naming the phase and the limit",
  held(async () => {
    let seen: AbortSignal | undefined;
    const error = await phase("finalize", (s) => {
      seen = s;
      return untilAborted(s);
    }, { seconds: 0.05 }).catch((e) => e);
    assert.ok(error instanceof TaskError, String(error));
    assert.equal(error.message, 'Phase "finalize" timed out after 0.05s');
    assert.equal(seen?.aborted, true, "the work's signal aborts with the timeout");
  }),
);

Deno.test(
  "phase(): the limit it names is the stated one when seconds is what was left of it",
  held(async () => {
    const error = await phase("scoring", untilAborted, { seconds: 0.02, stated: 30 })
      .catch((e) => e);
    assert.equal(error.message, 'Phase "scoring" timed out after 30s');
  }),
);

Deno.test("phase(): waiting for a slot stops the clock, and being served starts it afresh", async () => {
  const value = await phase("setup", async (_s, queued) => {
    queued(true);
    await sleep(120); // past the 80 ms limit, but queued
    queued(false);
    await sleep(40); // within a fresh 80 ms
    return "ready";
  }, { seconds: 0.08 });
  assert.equal(value, "ready");
});

Deno.test("phase(): the run's signal ends it with the signal's reason; no limit means none", async () => {
  const run = new AbortController();
  const reason = new Error("interrupted");
  setTimeout(() => run.abort(reason), 20);
  const error = await phase("agent", untilAborted, { signal: run.signal }).catch((e) => e);
  assert.equal(error, reason);
  assert.equal(await phase("agent", () => sleep(30).then(() => 7)), 7);
});

Deno.test("inPhase(): a failure is tagged with its phase once; an inner phase's tag is kept", async () => {
  const error = await inPhase("setup", () => Promise.reject(new RangeError("bad"))).catch((e) => e);
  assert.ok(error instanceof PhaseError);
  assert.equal(error.phase, "setup");
  assert.ok(error.error instanceof RangeError);
  const nested = await inPhase("scoring", () => inPhase("artifacts", () => Promise.reject(1)))
    .catch((e) => e);
  assert.equal(nested.phase, "artifacts");
});

Deno.test(
  "settledWithin(): resolves when the work settles, or after the wait when it never does",
  held(async () => {
    const t0 = performance.now();
    await settledWithin(Promise.reject(new Error("x")), 5_000);
    await settledWithin(new Promise(() => {}), 30);
    assert.ok(performance.now() - t0 < 2_000);
  }),
);
