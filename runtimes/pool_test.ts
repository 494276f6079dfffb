import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { SandboxLimits } from "./limits.ts";
import { poolKey, WarmPool } from "./pool.ts";
import type { Runtime, RuntimeSpec } from "./runtime.ts";
import { SubprocessRuntime } from "./subprocess.ts";

Deno.test("poolKey() ignores labels and key order", () => {
  const a: RuntimeSpec = {
    type: "docker",
    image: "x",
    env: { A: "1", B: "2" },
    labels: { r: "1" },
  };
  const b: RuntimeSpec = {
    labels: { r: "2" },
    env: { B: "2", A: "1" },
    image: "x",
    type: "docker",
  };
  assert.equal(poolKey(a), poolKey(b));
  assert.notEqual(poolKey(a), poolKey({ ...a, cpu: 2 }));
});

Deno.test("WarmPool serves started sandboxes, refills, keeps graders fresh (evicting idle ones for a slot) and stops what it holds on close", async () => {
  const started: Runtime[] = [];
  const pool = new WarmPool({
    size: 2,
    limits: new SandboxLimits({ maxLive: 3 }),
    create: (spec) => {
      const rt = new SubprocessRuntime(spec as never);
      started.push(rt);
      return rt;
    },
  });
  const spec: RuntimeSpec = { type: "subprocess" };
  await pool.prewarm(spec);
  assert.equal(pool.stats.ready, 2);
  const agent = await pool.acquire(spec);
  assert.ok(agent.id, "the pooled runtime is started");
  assert.equal(pool.stats.hits, 1);
  // The refill starts a moment after the hand-out; wait for it to be ready.
  await pool.prewarm(spec);
  assert.equal(pool.stats.ready, 2);
  // The agent and two pooled sandboxes (one a refill) hold all 3 slots: the grader, which
  // never takes a pooled sandbox, gets its slot by evicting an idle pooled one.
  const grader = await pool.acquire(spec, { role: "grader" });
  assert.equal(pool.stats.fresh, 1);
  assert.equal(pool.stats.evicted, 1);
  assert.equal((await agent.run(["echo", "ok"])).stdout, "ok\n");
  await agent.stop();
  await grader.stop();
  await pool.prewarm(spec);
  assert.equal(pool.stats.ready, 2);
  await pool.close();
  assert.equal(pool.stats.ready, 0);
  for (const rt of started) await assert.rejects(() => rt.run(["true"]), /stopped|not started/);
  await assert.rejects(() => pool.acquire(spec), /closed/);
});

Deno.test("WarmPool.reserve() takes slots for a sandbox and what surrounds it at once, evicting idle pooled ones, and the sandbox starts on its own slot", async () => {
  const limits = new SandboxLimits({}, { subprocess: { maxLive: 3 } });
  const pool = new WarmPool({
    size: 2,
    limits,
    create: (spec) => new SubprocessRuntime(spec as never),
  });
  const spec: RuntimeSpec = { type: "subprocess" };
  await pool.prewarm(spec);
  const limiter = limits.for("subprocess");
  assert.equal(limiter.live, 2, "two idle pooled sandboxes hold two of the three slots");
  // A sandbox with two containers beside it needs all three: the idle ones make way.
  const slots = await pool.reserve("subprocess", 3);
  assert.ok(slots);
  assert.equal(slots.length, 3);
  assert.equal(pool.stats.evicted, 2);
  const own = await pool.acquire(spec, { slot: slots[0] });
  assert.equal(pool.stats.hits, 0, "a reserved slot starts a fresh sandbox, never a pooled one");
  assert.equal((await own.run(["echo", "ok"])).stdout, "ok\n");
  assert.equal(limiter.live, 3);
  await own.stop();
  assert.equal(limiter.live, 2);
  for (const slot of slots) slot.release();
  assert.equal(limiter.live, 0);
  assert.equal(limiter.peak, 3);
  await assert.rejects(pool.reserve("subprocess", 4), RangeError);
  assert.equal(await pool.reserve("docker", 2), null, "no limit of that type: nothing to take");
  await pool.close();
});

Deno.test("WarmPool.reserve() evicts nothing while its slots are free, and a refill that finishes while a reservation waits makes way instead of idling", async () => {
  const limits = new SandboxLimits({}, { subprocess: { maxLive: 3 } });
  // Pooled starts wait for the test's word, so a refill can be caught under way.
  let gate: () => void = () => {};
  let gated = false;
  const pool = new WarmPool({
    size: 1,
    limits,
    create: (spec) => {
      const rt = new SubprocessRuntime(spec as never);
      if (!gated) return rt;
      const start = rt.start.bind(rt);
      rt.start = (o) => new Promise<void>((r) => (gate = r)).then(() => start(o));
      return rt;
    },
  });
  const spec: RuntimeSpec = { type: "subprocess" };
  const limiter = limits.for("subprocess");
  await pool.prewarm(spec);
  // Two free beside the pooled one: nothing is evicted for them.
  const free = (await pool.reserve("subprocess", 2))!;
  assert.equal(pool.stats.evicted, 0);
  assert.equal(pool.stats.ready, 1);
  for (const slot of free) slot.release();

  // Hand the pooled one out; its refill takes a slot and is held mid-start.
  gated = true;
  const agent = await pool.acquire(spec);
  // The refill starts 25 ms after a hand-out (longer on a loaded machine).
  for (let i = 0; i < 500 && pool.stats.starting === 0; i++) {
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.equal(pool.stats.starting, 1);
  assert.equal(limiter.live, 2);
  // Two slots wanted, one free: the refill holds the other and nothing is idle to evict.
  const reserving = pool.reserve("subprocess", 2);
  let reserved = false;
  reserving.then(() => (reserved = true), () => {});
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(reserved, false);
  gate(); // the refill finishes starting: it must give its slot up, not sit in the pool
  const slots = (await reserving)!;
  assert.equal(slots.length, 2);
  assert.equal(pool.stats.ready, 0);
  assert.equal(pool.stats.evicted, 1);
  for (const slot of slots) slot.release();
  await agent.stop();
  assert.equal(limiter.live, 0);
  await pool.close();
});

Deno.test("WarmPool with graderSize keeps never-used grading sandboxes apart from the agents' and hands each out once", async () => {
  const started: Runtime[] = [];
  const pool = new WarmPool({
    size: 0,
    graderSize: 1,
    create: (spec) => {
      const rt = new SubprocessRuntime(spec as never);
      started.push(rt);
      return rt;
    },
  });
  const spec: RuntimeSpec = { type: "subprocess" };
  // Agents are not pooled here: each is started on demand.
  const agent = await pool.acquire(spec);
  assert.equal(pool.stats.misses, 1);
  const first = await pool.acquire(spec, { role: "grader" });
  // Its replacement starts at once, ahead of the next grader.
  for (let i = 0; i < 100 && pool.stats.ready < 1; i++) {
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(pool.stats.ready, 1);
  const second = await pool.acquire(spec, { role: "grader" });
  assert.equal(pool.stats.fresh, 0, "no grader waited for a start");
  const ids = new Set([agent.id, first.id, second.id]);
  assert.equal(ids.size, 3, "every sandbox is its own, none reused");
  // The pooled grader was never touched: its workspace is empty.
  assert.equal((await second.run(["sh", "-c", "ls -A . | wc -l"])).stdout.trim(), "0");
  for (const rt of [agent, first, second]) await rt.stop();
  // The spare that replaces the second comes a moment after its hand-out: wait for it.
  for (let i = 0; i < 100 && pool.stats.ready < 1; i++) {
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(pool.stats.ready, 1);
  await pool.close();
  // Everything it started is gone, the spare it still held included.
  assert.equal(started.length, 4);
  assert.deepEqual(started.filter((rt) => existsSync(rt.id)), []);
});

Deno.test("WarmPool refills a moment after a hand-out, by itself, and not at all once closed", async () => {
  let created = 0;
  const pool = new WarmPool({
    size: 1,
    create: (spec) => {
      created++;
      return new SubprocessRuntime(spec as never);
    },
  });
  const spec: RuntimeSpec = { type: "subprocess" };
  await pool.prewarm(spec);
  assert.equal(created, 1);
  const first = await pool.acquire(spec);
  // Not at once: the borrower's first command has the event loop to itself.
  assert.equal(created, 1);
  assert.equal(pool.stats.starting, 0);
  // Then by itself, with no prewarm() or acquire() to prompt it.
  for (let i = 0; i < 200 && pool.stats.ready < 1; i++) {
    await new Promise((r) => setTimeout(r, 25));
  }
  assert.equal(created, 2);
  assert.equal(pool.stats.ready, 1);
  const second = await pool.acquire(spec);
  await pool.close(); // within the refill's delay
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(created, 2, "a refill after close() would start a sandbox nobody stops");
  await first.stop();
  await second.stop();
});
