import assert from "node:assert/strict";
import { OutputTally } from "./tally.ts";
import { handleControl, RunControl } from "./control.ts";
import { latestOutputs, MetadataBuilder } from "./results.ts";
import type { RolloutOutput } from "../state.ts";

Deno.test("RunControl.status() reports a stall once rollouts in flight see none finish for stall_after_s", async () => {
  const patient = new RunControl("r1", { maxConcurrent: 2, stallAfterS: 3600 });
  const quick = new RunControl("r2", { maxConcurrent: 2, stallAfterS: 0.1 });
  for (const c of [patient, quick]) assert.equal(await c.allows(), true);
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(patient.status().stalled, false);
  const s = quick.status();
  assert.equal(s.stalled, true);
  assert.ok(s.no_progress_s! >= 0.1);
  // Nothing in flight is no stall.
  quick.finished();
  assert.equal(quick.status().stalled, false);
  assert.equal(quick.status().no_progress_s, null);
});

Deno.test("RunControl.pause('now') aborts the signal of what runs and gives what starts after a fresh one", () => {
  const c = new RunControl("r", { maxConcurrent: 1 });
  const before = c.interrupt;
  const a = c.pause("now");
  assert.equal(before.aborted, true);
  assert.equal(c.interrupt.aborted, false);
  assert.deepEqual(a.args, { mode: "now", in_flight: 0 });
  assert.equal(c.pause().args.mode, "after");
  assert.equal(c.interrupt.aborted, false, "pause after interrupts nothing");
});

Deno.test("RunControl.set() checks every value before changing any, and names the knobs a run has", () => {
  let sandboxes = 4;
  const c = new RunControl("r", { maxConcurrent: 2 });
  c.knob("max_sandboxes", { get: () => sandboxes, set: (n) => (sandboxes = n) });
  assert.throws(
    () => c.set({ max_concurrent: 8, max_sandboxes: 1.5 }),
    /max_sandboxes must be a positive integer/,
  );
  assert.equal(c.maxConcurrent, 2, "nothing changed");
  assert.throws(
    () => c.set({ "timeout.agent": 5 }),
    /Unknown setting "timeout.agent"; this run has: max_concurrent, max_sandboxes/,
  );
  c.set({ max_concurrent: 8, max_sandboxes: 1 });
  assert.deepEqual(c.knobs(), { max_concurrent: 8, max_sandboxes: 1 });
  const answer = handleControl(c, { action: "set", values: { max_concurrent: 0 } });
  assert.equal(answer.ok, false);
  assert.match(String(answer.error), /max_concurrent must be a positive number/);
  assert.equal(handleControl(c, { action: "pause", mode: "soon" }).ok, false);
  assert.equal(handleControl(c, { action: "requeue" }).ok, false, "no loop took requeues");
  assert.deepEqual(c.actions.map((a) => a.action), ["set"]);
});

function output(id: number, over: Partial<RolloutOutput>): RolloutOutput {
  return {
    example_id: id,
    prompt: [],
    completion: [],
    reward: 1,
    metrics: { m: 1 },
    trajectory_id: `t${id}`,
    ...over,
  } as unknown as RolloutOutput;
}

Deno.test("A retried rollout replaces its errored line: latestOutputs() drops it, remove() takes it out of the counts", () => {
  const bad = output(1, {
    reward: 0,
    error: { error: "ModelError", message: "HTTP 400" },
    trajectory_id: "bad",
  } as Partial<RolloutOutput>);
  const good = output(1, { retry_of: "bad", trajectory_id: "good", metrics: { m: 3 } });
  const other = output(2, { reward: 0.5, metrics: { m: 2 } });
  assert.deepEqual(latestOutputs([bad, other, good]), [other, good]);
  const plain = [other];
  assert.equal(latestOutputs(plain), plain, "nothing retried: the same array");

  const base = {
    format_version: 1,
    env_id: "e",
    env_args: {},
    model: "m",
    base_url: "u",
    num_examples: 2,
    rollouts_per_example: 1,
    sampling_args: {},
    pass_threshold: 0.5,
    vf_version: "0",
  };
  const builder = new MetadataBuilder(base);
  const tally = new OutputTally();
  builder.add([bad, other]);
  tally.add([bad, other]);
  builder.remove([bad]);
  tally.remove([bad]);
  builder.add([good]);
  tally.add([good]);
  const direct = new MetadataBuilder(base);
  direct.add([other, good]);
  const { date: _d, time_ms: _t, ...got } = builder.build();
  const { date: _d2, time_ms: _t2, ...want } = direct.build();
  assert.deepEqual(got, want);
  const fresh = OutputTally.of([other, good]);
  assert.equal(tally.count, fresh.count);
  assert.equal(tally.errors, 0);
  assert.deepEqual([...tally.errorKinds], []);
  assert.equal(tally.rewardStd, fresh.rewardStd);
  assert.equal(tally.metricStd("m"), fresh.metricStd("m"));
  assert.deepEqual(tally.rewardsByRollout(), fresh.rewardsByRollout());
});

Deno.test("RunControl.set() refuses a max_concurrent the run cannot serve, as its start did", () => {
  const c = new RunControl("r", {
    maxConcurrent: 1,
    checkConcurrency: (n) => {
      if (n > 1) throw new Error(`ssh host "h" is dedicated; run with -c 1, got ${n}`);
    },
  });
  assert.throws(() => c.set({ max_concurrent: 4 }), /dedicated; run with -c 1, got 4/);
  assert.equal(c.maxConcurrent, 1);
  assert.deepEqual(c.actions, []);
});

Deno.test("RunControl.track(): status lists the tracked rollouts idle past the threshold with what they last did, and handleControl checks the threshold", async () => {
  const { noteActivity } = await import("../util/activity.ts");
  const c = new RunControl("r", { maxConcurrent: 4 });
  assert.equal(c.status().stalled_rollouts, undefined, "an untracked run lists no rollouts");
  let openIdle!: () => void;
  const idleGate = new Promise<void>((r) => (openIdle = r));
  let openBusy!: () => void;
  const busyGate = new Promise<void>((r) => (openBusy = r));
  let poke!: () => void;
  const poked = new Promise<void>((r) => (poke = r));
  let noted!: () => void;
  const notedTool = new Promise<void>((r) => (noted = r));
  const idle = c.track("task-a#0", async () => {
    noteActivity("model call");
    await idleGate;
    return "a";
  });
  const active = c.track("task-b#1", async () => {
    noteActivity("phase setup");
    await poked;
    noteActivity("tool bash");
    noted();
    await busyGate;
    return "b";
  });
  // Outside a tracked rollout nothing is noted.
  noteActivity("stray");
  await new Promise((r) => setTimeout(r, 400));
  // Both idle for 0.4 s or more; then one makes progress.
  assert.deepEqual(c.status({ stallAfterS: 0.3 }).stalled_rollouts!.map((r) => r.last), [
    "model call",
    "phase setup",
  ]);
  poke();
  await notedTool;
  const s = c.status({ stallAfterS: 0.3 });
  assert.equal(s.tracked, 2);
  assert.equal(s.stall_after_s, 0.3);
  assert.deepEqual(s.stalled_rollouts!.map((r) => [r.id, r.last]), [["task-a#0", "model call"]]);
  assert.ok(s.stalled_rollouts![0].idle_s >= 0.3);
  assert.ok(s.stalled_rollouts![0].running_s >= s.stalled_rollouts![0].idle_s);
  // The run's default threshold (60 s): none.
  assert.deepEqual(c.status().stalled_rollouts, []);
  const answered = handleControl(c, { action: "status", stall: 0.3 }) as {
    ok: boolean;
    status: { stalled_rollouts: Array<{ id: string }> };
  };
  assert.equal(answered.ok, true);
  assert.deepEqual(answered.status.stalled_rollouts.map((r) => r.id), ["task-a#0"]);
  assert.match(
    String(handleControl(c, { action: "status", stall: -1 }).error),
    /status stall must be a number of seconds ≥ 0, got -1/,
  );
  openIdle();
  openBusy();
  assert.deepEqual(await Promise.all([idle, active]), ["a", "b"]);
  assert.equal(c.status().tracked, 0);
});

Deno.test("RunControl.track() with members: a group's rollouts run through withRolloutActivity are listed one by one, the group itself only once none runs", async () => {
  const { noteActivity, withRolloutActivity } = await import("../util/activity.ts");
  const c = new RunControl("r", { maxConcurrent: 4 });
  let open!: () => void;
  const held = new Promise<void>((r) => (open = r));
  let scored!: () => void;
  const scoring = new Promise<void>((r) => (scored = r));
  let closeGroup!: () => void;
  const groupDone = new Promise<void>((r) => (closeGroup = r));
  // Rollouts 3, 4 and 5 of example 7 (a resumed group, say); the second is held at the model.
  const group = c.track("example 7", async () => {
    await Promise.all([0, 1, 2].map((i) =>
      withRolloutActivity(i, async () => {
        noteActivity("model call");
        if (i === 1) await held;
        noteActivity("model reply");
      })
    ));
    scored();
    await groupDone;
  }, { exampleId: 7, members: (i) => i + 3 });
  await new Promise((r) => setTimeout(r, 300));
  let s = c.status({ stallAfterS: 0.2 });
  assert.equal(s.tracked, 1);
  assert.deepEqual(s.stalled_rollouts!.map((r) => [r.id, r.example_id, r.rollout_index, r.last]), [
    ["example 7 rollout 4", 7, 4, "model call"],
  ]);
  open();
  await scoring;
  // Its rollouts done, the group is listed itself (scoring them), idle from when they ended.
  s = c.status({ stallAfterS: 0 });
  assert.deepEqual(s.stalled_rollouts!.map((r) => [r.id, r.rollout_index, r.last]), [
    ["example 7", undefined, "rollouts done"],
  ]);
  assert.ok(s.stalled_rollouts![0].idle_s < s.stalled_rollouts![0].running_s);
  closeGroup();
  await group;
  assert.deepEqual(c.status({ stallAfterS: 0 }).stalled_rollouts, []);
  // Outside a tracked group, withRolloutActivity only runs its function.
  assert.equal(await withRolloutActivity(0, () => Promise.resolve(42)), 42);
});
