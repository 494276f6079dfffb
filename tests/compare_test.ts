/**
 * `vf compare` on run folders in both layouts (vf eval's results.jsonl and vf run's
 * traces.jsonl): the paired statistics it prints, unscored rollouts left out, and the exit
 * code `--fail-if-worse` gives CI.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { cliCommand, collect, tempDir, transcript } from "./_cli.ts";

async function legacyRun(dir: string, rewards: Array<[number, number | null, boolean?]>) {
  await Deno.mkdir(dir, { recursive: true });
  const rows = rewards.map(([example_id, reward, errored]) => ({
    example_id,
    reward,
    error: errored ? { error: "InfraError", message: "sandbox gone" } : null,
  }));
  await Deno.writeTextFile(
    join(dir, "results.jsonl"),
    rows.map((r) => JSON.stringify(r)).join("\n") + "\n",
  );
}

async function taskRun(dir: string, rewards: Array<[string, number]>) {
  await Deno.mkdir(dir, { recursive: true });
  const lines = rewards.map(([key, reward], i) => ({
    format_version: 2,
    trace_id: `t${i}`,
    run_id: "r",
    taskset: "s",
    task: { key, idx: 0, hash: "" },
    example_id: 0,
    rollout_index: i,
    trainable: true,
    ok: true,
    error: null,
    reward,
    rewards: { reward },
  }));
  await Deno.writeTextFile(
    join(dir, "traces.jsonl"),
    lines.map((l) => JSON.stringify(l)).join("\n") + "\n",
  );
}

Deno.test("vf compare: paired statistics for both layouts, unscored rollouts left out, --fail-if-worse as an exit code", async () => {
  await using tmp = await tempDir("vf_compare_");
  const compare = (args: string[]) =>
    collect(cliCommand(["compare", ...args], { cwd: tmp.path, env: {}, registry: false }));
  const examples = Array.from({ length: 30 }, (_, i) => i);
  await legacyRun(join(tmp.path, "a"), examples.map((i) => [i, 1]));
  // B: a third of the examples fail, and one rollout was never scored (an infra error).
  await legacyRun(join(tmp.path, "b"), [
    ...examples.map((i): [number, number] => [i, i % 3 === 0 ? 0 : 1]),
    [5, 0, true],
  ]);
  const worse = await compare(["a", "b"]);
  assert.equal(worse.code, 0, transcript(worse));
  assert.match(worse.stdout, /paired examples 30/);
  assert.match(worse.stdout, /mean reward {2}A 1\.0000 {2}B 0\.6667/); // the infra error is no 0
  assert.match(worse.stdout, /B - A -0\.3333 {2}95% CI \[-0\.\d+, -0\.\d+\]/);
  assert.match(worse.stdout, /examples better 0 {2}worse 10 {2}same 20/);
  assert.match(worse.stdout, /largest drops:\n {2}0 {2}1\.000 -> 0\.000/);

  const gated = await compare(["a", "b", "--fail-if-worse", "0.1"]);
  assert.equal(gated.code, 1, transcript(gated));
  assert.match(gated.stderr, /B is worse than A by more than 0\.1/);
  const lenient = await compare(["a", "b", "--fail-if-worse", "0.9"]);
  assert.equal(lenient.code, 0, transcript(lenient));
  const better = await compare(["b", "a", "--fail-if-worse", "0"]);
  assert.equal(better.code, 0, transcript(better));

  await taskRun(join(tmp.path, "ta"), [["x", 1], ["y", 0], ["y", 1]]);
  await taskRun(join(tmp.path, "tb"), [["x", 1], ["y", 1], ["z", 1]]);
  const tasks = await compare(["ta", "tb"]);
  assert.equal(tasks.code, 0, transcript(tasks));
  assert.match(tasks.stdout, /paired examples 2 \(left out: 0 only in A, 1 only in B\)/);
  assert.match(tasks.stdout, /B - A \+0\.2500/);

  const bad = await compare(["a", "nowhere"]);
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /nowhere: not a run folder/);
});
