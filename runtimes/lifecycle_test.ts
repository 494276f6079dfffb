/**
 * The backends' shared lifecycle on its own: start once, stop once after a start in flight,
 * the state errors, the sweep's answer, and the leftover labels.
 */
import assert from "node:assert/strict";
import { SandboxStateError } from "./errors.ts";
import {
  awaitSweep,
  commandTimeout,
  leftoverSelector,
  Lifecycle,
  missingWorkdir,
  sandboxLabels,
  sweepFailure,
} from "./lifecycle.ts";
import { liveRuntimes, type Tracked } from "./registry.ts";

/** A stand-in for what `trackRuntime` registers: only its identity is used. */
const runtime = (): Tracked => ({ type: "test", id: "t", stop: () => Promise.resolve() });

Deno.test("Lifecycle: concurrent starts share one, stop waits for it, tears down once and untracks", async () => {
  const rt = runtime();
  const life = new Lifecycle(rt, "docker");
  const events: string[] = [];
  let finish!: () => void;
  const launch = () => {
    events.push("launch");
    return new Promise<void>((resolve) => (finish = resolve));
  };
  const stop = () =>
    life.stop(() => Promise.resolve(void events.push("teardown")), {
      halt: () => events.push("halt"),
      release: () => events.push("release"),
    });
  const first = life.start(launch, stop);
  assert.equal(life.start(launch, stop), first);
  assert.equal(life.state, "starting");
  assert.ok(liveRuntimes().includes(rt));
  const stopped = stop();
  assert.equal(stop(), stopped);
  assert.equal(life.state, "stopped");
  assert.throws(
    () => life.checkNotStopped(),
    /The docker runtime was stopped while it was starting/,
  );
  finish();
  await first;
  await stopped;
  assert.deepEqual(events, ["launch", "halt", "teardown", "release"]);
  assert.equal(liveRuntimes().includes(rt), false);
  await assert.rejects(life.start(launch, stop), /Cannot start a stopped docker runtime/);
});

Deno.test("Lifecycle: a failed start stops the runtime and rethrows; require says where it stands", async () => {
  const life = new Lifecycle(runtime(), "ssh");
  assert.throws(
    () => life.require("conn", () => "unused"),
    (e) => e instanceof SandboxStateError && /not started; call start\(\) first/.test(e.message),
  );
  let tornDown = 0;
  const stop = () => life.stop(() => Promise.resolve(void tornDown++));
  await assert.rejects(life.start(() => Promise.reject(new Error("boom")), stop), /boom/);
  assert.equal(life.state, "stopped");
  assert.equal(tornDown, 1);
  assert.throws(() => life.require("conn", () => "SSH runtime x is stopped"), /x is stopped/);
  const running = new Lifecycle(runtime(), "prime");
  await running.start(() => Promise.resolve(), () => Promise.resolve());
  assert.equal(running.require("handle", () => "unused"), "handle");
});

Deno.test("the sweep's answer, its timeout, and the command errors name the sandbox", async () => {
  const where = `in container "vf-1"`;
  assert.equal(await sweepFailure("0", { where, cannotRun: () => "x" }), undefined);
  const survivors = await sweepFailure("2", { where, survivors: " (why)", cannotRun: () => "x" });
  assert.equal(
    survivors?.message,
    `Cannot kill the processes left in container "vf-1": 2 process(es) survived SIGKILL (why)`,
  );
  assert.match(
    (await sweepFailure("noproc", { where, cannotRun: () => "x" }))!.message,
    /no \/proc/,
  );
  assert.match(
    (await sweepFailure("sh: not found", { where, cannotRun: () => Promise.resolve("no shell") }))!
      .message,
    /: no shell$/,
  );
  const aborted = new AbortController();
  let closed = false;
  const pending = awaitSweep(new Promise<number>(() => {}), {
    where,
    close: () => (closed = true),
    signal: aborted.signal,
  });
  aborted.abort(new Error("cancelled"));
  await assert.rejects(pending, /cancelled/);
  assert.equal(closed, true);
  assert.equal(await awaitSweep(Promise.resolve(0), { where, close: () => {} }), 0);
  assert.equal(
    commandTimeout(["sleep", "9"], 50, where).message,
    `Command "sleep 9" did not finish within 50 ms in container "vf-1"; its process tree was ` +
      `killed (raise timeoutMs if it needs longer)`,
  );
  assert.equal(
    missingWorkdir("/w/x", "x", where).message,
    `Working directory "x" does not exist in container "vf-1"`,
  );
});

Deno.test("leftover labels: managed always, run and task when known, values fitted", () => {
  assert.deepEqual(sandboxLabels({}), { "vf.managed": "1" });
  assert.deepEqual(sandboxLabels({ runId: "r", task: "T" }, (v) => v.toLowerCase()), {
    "vf.managed": "1",
    "vf.run_id": "r",
    "vf.task": "t",
  });
  assert.deepEqual(leftoverSelector(undefined), ["vf.managed=1"]);
  assert.deepEqual(leftoverSelector("R", (v) => v.toLowerCase()), ["vf.managed=1", "vf.run_id=r"]);
});
