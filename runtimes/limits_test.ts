import assert from "node:assert/strict";
import { SandboxLimiter, SandboxLimits, sandboxLimitsFromConfig, TokenBucket } from "./limits.ts";
import { SubprocessRuntime } from "./subprocess.ts";

Deno.test("TokenBucket spaces takes by 1/rate after the burst", async () => {
  const bucket = new TokenBucket(20, 2); // 50 ms per token, two at once
  const t0 = performance.now();
  const times: number[] = [];
  await Promise.all(
    Array.from({ length: 5 }, () => bucket.take().then(() => times.push(performance.now() - t0))),
  );
  times.sort((a, b) => a - b);
  assert.ok(times[1] < 25, `burst: ${times}`);
  assert.ok(times[4] >= 3 * 50 * 0.8, `rate: ${times}`);
});

Deno.test("SandboxLimiter holds at most maxLive slots and serves normal priority before low", async () => {
  const limiter = new SandboxLimiter({ maxLive: 1 });
  const first = await limiter.acquire();
  const order: string[] = [];
  const low = limiter.acquire({ priority: "low" }).then((s) => (order.push("low"), s));
  const normal = limiter.acquire().then((s) => (order.push("normal"), s));
  assert.equal(limiter.waiting, 2);
  first.release();
  first.release(); // idempotent
  (await normal).release();
  (await low).release();
  assert.deepEqual(order, ["normal", "low"]);
  assert.equal(limiter.peak, 1);
  assert.equal(limiter.live, 0);
});

Deno.test("SandboxLimiter.acquire() rejects with the signal's reason and leaves the queue", async () => {
  const limiter = new SandboxLimiter({ maxLive: 1 });
  const held = await limiter.acquire();
  const controller = new AbortController();
  const waiting = limiter.acquire({ signal: controller.signal });
  controller.abort(new Error("stop waiting"));
  await assert.rejects(waiting, /stop waiting/);
  assert.equal(limiter.waiting, 0);
  held.release();
  assert.equal(limiter.live, 0);
});

Deno.test("SandboxLimits.wrap() holds a slot from start() until stop() on a real runtime", async () => {
  const limits = new SandboxLimits({ maxLive: 1 });
  const a = limits.wrap(new SubprocessRuntime({ type: "subprocess" }));
  const b = limits.wrap(new SubprocessRuntime({ type: "subprocess" }));
  await a.start();
  assert.equal((await a.run(["echo", "a"])).stdout, "a\n");
  let bStarted = false;
  const startingB = b.start().then(() => (bStarted = true));
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(bStarted, false, "b started while a held the only slot");
  await a.stop();
  await startingB;
  assert.equal(limits.for("subprocess").live, 1);
  await b.stop();
  assert.equal(limits.for("subprocess").live, 0);
  assert.equal(limits.for("subprocess").peak, 1);
});

Deno.test("sandboxLimitsFromConfig() maps [limits] keys and per-type overrides", () => {
  assert.equal(sandboxLimitsFromConfig(undefined), undefined);
  assert.equal(sandboxLimitsFromConfig({}), undefined);
  const limits = sandboxLimitsFromConfig({
    max_sandboxes: 8,
    sandbox_create_rate: 2,
    runtime: { ssh: { max_sandboxes: 2 } },
  })!;
  assert.deepEqual(limits.for("docker").limit, { maxLive: 8, createRate: 2 });
  assert.deepEqual(limits.for("ssh").limit, { maxLive: 2, createRate: 2 });
});
