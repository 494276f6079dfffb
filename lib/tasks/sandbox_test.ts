import assert from "node:assert/strict";
import { SandboxLimits } from "../../runtimes/limits.ts";
import { WarmPool } from "../../runtimes/pool.ts";
import type { Runtime } from "../../runtimes/runtime.ts";
import type { SandboxRecord } from "./record.ts";
import { acquireSandbox } from "./sandbox.ts";

Deno.test("acquireSandbox(): made here, the caller holds it before it starts, and its records list every operation", async () => {
  const records: SandboxRecord[] = [];
  const held: Runtime[] = [];
  let released = 0;
  const runtime = await acquireSandbox({ type: "subprocess" }, {
    runId: "sandbox-test",
    task: "t",
    role: "grader",
    records,
    hold: (rt) => held.push(rt),
    // A slot taken for it goes back: a sandbox made here is not counted against a source.
    slot: { release: () => void released++ },
  });
  try {
    assert.equal(released, 1);
    assert.equal(held.length, 2, "held once before the start, then as the recording wrapper");
    assert.equal(held[1], runtime);
    const r = await runtime.run(["sh", "-c", "echo hi"]);
    assert.equal(r.stdout, "hi\n");
    assert.equal(records.length, 1);
    assert.equal(records[0].role, "grader");
    assert.equal(records[0].type, "subprocess");
    assert.deepEqual(records[0].ops.map((op) => op.op), ["run"]);
  } finally {
    await runtime.stop();
  }
});

Deno.test("acquireSandbox(): from a sandbox source its limits count it until it stops; without records it is the source's runtime", async () => {
  const limits = new SandboxLimits({ maxLive: 1 });
  await using pool = {
    source: new WarmPool({ limits }),
    [Symbol.asyncDispose]: () => pool.source.close(),
  };
  const first = await acquireSandbox({ type: "subprocess" }, {
    runId: "sandbox-test",
    task: "t",
    sandboxes: pool.source,
  });
  // The limit is full: a second one waits until the first is stopped.
  let second = undefined as Runtime | undefined;
  const waiting = acquireSandbox({ type: "subprocess" }, {
    runId: "sandbox-test",
    task: "t",
    sandboxes: pool.source,
  }).then((rt) => (second = rt));
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(second, undefined);
  assert.equal((await first.run(["true"])).exit_code, 0);
  await first.stop();
  const next = await waiting;
  assert.equal(second, next);
  await next.stop();
});

Deno.test("acquireSandbox(): a signal aborted before the source answers stops what it gave and throws the abort's reason", async () => {
  const run = new AbortController();
  const reason = new Error("phase over");
  let given: Runtime | undefined;
  const source = new WarmPool();
  const late = {
    acquire: async (...args: Parameters<WarmPool["acquire"]>) => {
      given = await source.acquire(args[0], { ...args[1], signal: undefined });
      run.abort(reason);
      return given;
    },
    close: () => source.close(),
  };
  await assert.rejects(
    acquireSandbox({ type: "subprocess" }, {
      runId: "sandbox-test",
      task: "t",
      sandboxes: late,
      signal: run.signal,
    }),
    (e) => e === reason,
  );
  assert.ok(given);
  // Stopped: it cannot run anything any more.
  await assert.rejects(given.run(["true"]));
  await source.close();
});
