import assert from "node:assert/strict";
import { MAX_TIMER_MS, untilInterrupted } from "./_util.ts";
import { SubprocessRuntime } from "./subprocess.ts";

// A timer longer than setTimeout holds (2^31 - 1 ms, about 24.8 days) fires at once; a task
// that asks for such a limit (a Harbor timeout_sec of 3e6, say) means no limit, not an instant
// timeout.
Deno.test("untilInterrupted() treats a timeout past what a timer holds as no limit", async () => {
  const done = new Promise<string>((resolve) => setTimeout(() => resolve("finished"), 50));
  const got = await untilInterrupted(done, { timeoutMs: MAX_TIMER_MS + 1 });
  assert.deepEqual(got, { outcome: "done", value: "finished" });
});

Deno.test("a subprocess command with a timeout of 30 days runs to its end", async () => {
  await using runtime = new SubprocessRuntime({ type: "subprocess" });
  await runtime.start();
  const r = await runtime.run(["sh", "-c", "sleep 0.1; echo ok"], {
    timeoutMs: 30 * 24 * 3600 * 1000,
  });
  assert.equal(r.exit_code, 0);
  assert.equal(r.stdout.trim(), "ok");
});
