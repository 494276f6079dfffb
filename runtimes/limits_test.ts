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

Deno.test("SandboxLimiter.reserve() takes its slots all at once, in turn, never more than the limit", async () => {
  const limiter = new SandboxLimiter({ maxLive: 3 });
  const one = await limiter.acquire();
  const order: string[] = [];
  // Three at once cannot fit beside one held: it waits, and a later single waits behind it.
  const three = limiter.reserve(3).then((s) => (order.push("three"), s));
  const single = limiter.acquire().then((s) => (order.push("single"), s));
  await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(order, [], "a part of the reservation, or the single behind it, was granted");
  assert.equal(limiter.live, 1);
  one.release();
  const slots = await three;
  assert.equal(slots.length, 3);
  assert.equal(limiter.live, 3);
  assert.deepEqual(order, ["three"]);
  // Each slot goes back on its own; the single waiter gets the first one freed.
  slots[0].release();
  (await single).release();
  assert.deepEqual(order, ["three", "single"]);
  slots[1].release();
  slots[2].release();
  slots[2].release(); // idempotent
  assert.equal(limiter.live, 0);
  assert.equal(limiter.peak, 3);
  await assert.rejects(limiter.reserve(4), RangeError);
});

Deno.test("SandboxLimiter: a reservation that gives up waiting lets the smaller waiters behind it in", async () => {
  const limiter = new SandboxLimiter({ maxLive: 2 });
  const held = await limiter.acquire();
  const controller = new AbortController();
  const pair = limiter.reserve(2, { signal: controller.signal });
  let served = false;
  const single = limiter.acquire().then((s) => ((served = true), s));
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(served, false);
  controller.abort(new Error("gave up"));
  await assert.rejects(pair, /gave up/);
  (await single).release();
  held.release();
  assert.equal(limiter.live, 0);
  assert.equal(limiter.waiting, 0);
});

Deno.test("SandboxLimits.wrap() with a reserved slot starts without waiting for another and gives it back on stop", async () => {
  const limits = new SandboxLimits({ maxLive: 2 });
  const limiter = limits.for("subprocess");
  const [own, beside] = await limiter.reserve(2);
  const rt = limits.wrap(new SubprocessRuntime({ type: "subprocess" }), { slot: own });
  await rt.start(); // the limit is full: a start that waited for a slot of its own would hang
  assert.equal(limiter.live, 2);
  assert.equal((await rt.run(["echo", "x"])).stdout, "x\n");
  await rt.stop();
  assert.equal(limiter.live, 1);
  beside.release();
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

Deno.test("SandboxLimits.setMaxLive() and setCreateRate() change the limits of a running run, waiters included", async () => {
  const limits = new SandboxLimits({ maxLive: 2, createRate: 0.001 }, { ssh: { maxLive: 5 } });
  const docker = limits.for("docker");
  const first = await docker.acquire(); // the burst's one token
  // The next creation waits about 1000 s at this rate, the third a live slot as well.
  const second = docker.acquire();
  limits.setCreateRate(1000);
  (await second).release();
  const held = [first, await docker.acquire()];
  const third = docker.acquire();
  let served = false;
  third.then(() => (served = true));
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(served, false, "two live is the limit");
  limits.setMaxLive(3);
  const slot = await third;
  assert.deepEqual([limits.maxLive, limits.createRate], [3, 1000]);
  // Per-type limits and limiters made later take the new values too.
  assert.equal(limits.for("ssh").limit.maxLive, 3);
  assert.equal(limits.for("k8s").limit.createRate, 1000);
  for (const s of [...held, slot]) s.release();
});
