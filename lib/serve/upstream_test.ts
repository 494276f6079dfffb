import assert from "node:assert/strict";
import { serializeError } from "../errors.ts";
import { phase } from "../tasks/rollout/phase.ts";
import type { TaskTrace } from "../tasks/trace.ts";
import { upstreamEpisode2026_08, upstreamTrace } from "./upstream.ts";

/** A finished trace record as traces.jsonl holds it, failed with `error` when given. */
const record = (error: unknown): TaskTrace =>
  ({
    trace_id: "0123456789abcdef0123456789abcdef",
    model: "m",
    messages: [{ role: "user", content: "hi" }],
    model_calls: [],
    rewards: {},
    ok: error === undefined,
    error: error === undefined ? null : { ...serializeError(error), phase: "agent" },
    stop_condition: error === undefined ? "completed" : "error",
  }) as unknown as TaskTrace;

Deno.test("upstreamTrace(): is_timeout is true for a phase that ran out of time, false otherwise; payload is an empty list; the 2026-08 form has neither", async () => {
  const timedOut: Error = await phase("agent", (signal) =>
    new Promise<never>(() => {
      // The phase's own timer is unref'd; this one keeps the test alive until the abort.
      const hold = setTimeout(() => {}, 60_000);
      signal.addEventListener("abort", () => clearTimeout(hold));
    }), {
    seconds: 0.05,
  }).catch((e: Error) => e);
  assert.match(timedOut.message, /Phase "agent" timed out/);
  const late = upstreamTrace(record(timedOut), {});
  assert.equal(late.is_timeout, true);
  assert.deepEqual(late.payload, []);
  assert.equal(upstreamTrace(record(new Error("boom")), {}).is_timeout, false);
  assert.equal(upstreamTrace(record(undefined), {}).is_timeout, false);
  // A legacy environment's row that hit its timeout.
  const legacy = { prompt: [], completion: [], reward: 0, stop_condition: "timeout_reached" };
  assert.equal(upstreamTrace(legacy as unknown as TaskTrace, {}).is_timeout, true);

  const august = upstreamEpisode2026_08({ traces: [record(timedOut)] }, {});
  const [trace] = august.traces as Array<Record<string, unknown>>;
  assert.equal("is_timeout" in trace, false);
  assert.equal("payload" in trace, false);
});
