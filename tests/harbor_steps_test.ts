/**
 * Harbor `[[steps]]` tasks through the real CLI on real Docker with a scripted model: each
 * step's instruction in order in one agent sandbox, each step a fresh session of the agent
 * (its model sees none of the earlier steps' conversation; an agent CLI is run anew), each
 * step's verifier (the task's `tests/` with the step's over it, the step's verifier env) after
 * its session and out of the agent's sight during the next, `min_reward` (a number, or a
 * table by reward key) stopping the trial, and `multi_step_reward_strategy` rolling the step
 * rewards up; `vf validate` runs each step's gold answer.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { startModelServer, type WireMessage } from "./model_server.ts";
import { cliCommand, type CliResult, collect, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

async function write(root: string, files: Record<string, string>): Promise<void> {
  for (const [path, text] of Object.entries(files)) {
    const full = join(root, path);
    await Deno.mkdir(join(full, ".."), { recursive: true });
    await Deno.writeTextFile(full, text);
  }
}

async function vf(dir: string, args: string[]): Promise<CliResult & { runDir: string }> {
  const res = await collect(cliCommand(args, { cwd: dir, env: {}, registry: false, docker: true }));
  return { ...res, runDir: /^Saving traces to (.+)$/m.exec(res.stderr)?.[1] ?? "" };
}

function summary(res: CliResult): Json {
  return JSON.parse(res.stdout.trim().split("\n").at(-1)!);
}

const ONE = "Step one: write one to /app/a.txt.\n";
const TWO = "Step two: write two to /app/b.txt.\n";

/** A two-step task folder; `gated` puts min_reward = 1 on step one, else the steps just average. */
function task(name: string, gated: boolean): Record<string, string> {
  return {
    [`${name}/task.toml`]: `schema_version = "1.3"
multi_step_reward_strategy = "mean"
[environment]
network_mode = "no-network"
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 30.0
[[steps]]
name = "one"
${gated ? "min_reward = 1.0\n" : ""}[steps.verifier]
timeout_sec = 20.0
[[steps]]
name = "two"
[steps.verifier]
env = { STEP = "two" }
`,
    [`${name}/environment/Dockerfile`]: "FROM busybox:latest\nRUN mkdir -p /app\nWORKDIR /app\n",
    // The task's tests/ holds a helper every step's test.sh uses.
    [`${name}/tests/lib.sh`]:
      'score() { if eval "$1"; then echo 1; else echo 0; fi > /logs/verifier/reward.txt; }\n',
    [`${name}/steps/one/instruction.md`]: ONE,
    [`${name}/steps/one/tests/test.sh`]:
      ". /tests/lib.sh\nscore '[ \"$(cat /app/a.txt)\" = one ]'\n",
    [`${name}/steps/one/solution/solve.sh`]: "#!/bin/sh\necho one > /app/a.txt\n",
    [`${name}/steps/two/instruction.md`]: TWO,
    // Step two's workdir/: copied into the working directory before its agent, then its
    // setup.sh runs there (and removes itself, as Harbor's docs suggest).
    [`${name}/steps/two/workdir/seed.txt`]: "seed\n",
    [`${name}/steps/two/workdir/setup.sh`]: 'echo ok > from-setup\nrm -- "$0"\n',
    [`${name}/steps/two/tests/test.sh`]: ". /tests/lib.sh\nscore '" +
      '[ "$(cat /app/b.txt)" = two ] && [ "$STEP" = two ] && [ "$(cat /app/seed.txt)" = seed ] ' +
      "&& [ -e /app/from-setup ] && [ ! -e /app/setup.sh ]'\n",
    [`${name}/steps/two/solution/solve.sh`]: "#!/bin/sh\necho two > /app/b.txt\n",
  };
}

/**
 * A task whose step one writes keyed rewards (`correctness` 1, no `quality`) and is gated on
 * both keys: the missing one stops the trial after step one, though `correctness` passes.
 */
function keyed(name: string): Record<string, string> {
  const files = task(name, false);
  return {
    ...files,
    [`${name}/task.toml`]: files[`${name}/task.toml`].replace(
      'name = "one"\n',
      'name = "one"\nmin_reward = { correctness = 1.0, quality = 0.0 }\n',
    ),
    [`${name}/steps/one/tests/test.sh`]:
      'if [ "$(cat /app/a.txt)" = one ]; then c=1; else c=0; fi\necho "{\\"correctness\\": $c}" > /logs/verifier/reward.json\n',
  };
}

/**
 * A model that answers each step's instruction with one bash command (`one` for step one,
 * `two` for step two; each also lists /tests), then says it is done. Every request it gets is
 * kept in `requests`.
 */
function scripted(one: string, two: string, requests: WireMessage[][] = []) {
  return startModelServer({
    responder: ({ body }) => {
      const msgs = body.messages as WireMessage[];
      requests.push(msgs);
      const lastUser = msgs.map((m) => m.role).lastIndexOf("user");
      const text = String(msgs[lastUser].content);
      const acted = msgs.slice(lastUser).some((m) => m.role === "assistant");
      if (acted) return { content: "Done." };
      const command = `ls /tests /app; ${text.startsWith("Step one") ? one : two}`;
      return { content: null, tool_calls: [{ name: "bash", arguments: { command } }] };
    },
  });
}

Deno.test("Harbor [[steps]]: vf validate runs each step's gold answer and verifier (gold 1, untouched 0); vf run gives the agent each step's instruction in order in one sandbox, verifies each step, hides the tests between steps, and rolls up by multi_step_reward_strategy, with min_reward stopping the trial", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_steps_" });
  const runDirs: string[] = [];
  try {
    await write(dir, {
      ...task("tasks/gated", true),
      ...task("tasks/mean", false),
      ...keyed("tasks/keyed"),
    });
    const v = await vf(dir, ["validate", "./tasks"]);
    assert.equal(v.code, 0, transcript(v));
    const s = summary(v);
    assert.deepEqual(
      s.results.map((r: Json) => [r.task, r.gold_reward, r.empty_reward, r.ok]),
      // The keyed task's gold answer stops at step one (no quality key): 1 (correctness).
      [["gated", 1, 0, true], ["keyed", 1, 0, true], ["mean", 1, 0, true]],
    );

    // Every step done right: both tasks score 1, each step verified on the trace.
    {
      const requests: WireMessage[][] = [];
      await using model = await scripted(
        "echo one > /app/a.txt",
        "echo two > /app/b.txt",
        requests,
      );
      const res = await vf(dir, ["run", "./tasks", "-m", "m", "-b", model.url, "-o", "out"]);
      runDirs.push(res.runDir);
      assert.equal(res.code, 0, transcript(res));
      const all = (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim().split("\n")
        .map((l) => JSON.parse(l)).sort((a: Json, b: Json) => a.task.key.localeCompare(b.task.key));
      const ts = all.filter((t: Json) => t.task.key !== "keyed");
      // Step two is a fresh session: its model requests hold its instruction and nothing of
      // step one's conversation (neither step one's instruction nor its tool call).
      const second = requests.filter((r) => r.some((m) => m.content === TWO));
      assert.equal(second.length, 4, "two requests of step two per task");
      for (const r of second) {
        assert.ok(
          !r.some((m) => m.content === ONE || JSON.stringify(m).includes("echo one")),
          `step two's request holds step one's messages: ${JSON.stringify(r)}`,
        );
        assert.equal(r.filter((m) => m.role === "user").length, 1, JSON.stringify(r));
      }
      // Per-key min_reward: the keyed task lacks "quality", so it stops after step one.
      const k = all.find((t: Json) => t.task.key === "keyed");
      assert.equal(k.error, null, JSON.stringify(k.error));
      assert.deepEqual(k.info.harbor.steps.map((st: Json) => st.name), ["one"]);
      assert.deepEqual(k.info.harbor.steps[0].rewards, { correctness: 1 });
      assert.deepEqual(
        k.messages.filter((m: Json) => m.role === "user").map((m: Json) => m.content),
        [ONE],
      );
      for (const t of ts) {
        assert.equal(t.error, null, JSON.stringify(t.error));
        assert.equal(t.reward, 1, t.task.key);
        assert.deepEqual(
          t.info.harbor.steps.map((st: Json) => [st.name, st.reward]),
          [["one", 1], ["two", 1]],
        );
        const users = t.messages.filter((m: Json) => m.role === "user").map((m: Json) => m.content);
        assert.deepEqual(users, [ONE, TWO], "each step's instruction, in order");
        // Neither step's agent saw the tests: not before step one, and not after its verifier.
        assert.equal(t.tool_calls.length, 2);
        for (const call of t.tool_calls) {
          assert.match(call.output, /\/tests'?: No such file or directory/);
        }
        // Step two's workdir/ arrived before step two's agent, not before step one's.
        assert.doesNotMatch(t.tool_calls[0].output, /seed\.txt/);
        assert.match(t.tool_calls[1].output, /from-setup/);
        assert.match(t.tool_calls[1].output, /seed\.txt/);
      }
    }

    // Step one done wrong: the gated task stops after it (reward 0, step two never given);
    // the ungated one goes on and averages 0 and 1.
    {
      await using model = await scripted("echo uno > /app/a.txt", "echo two > /app/b.txt");
      const res = await vf(dir, ["run", "./tasks", "-m", "m", "-b", model.url, "-o", "out2"]);
      runDirs.push(res.runDir);
      assert.equal(res.code, 0, transcript(res));
      const ts = Object.fromEntries(
        (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim().split("\n")
          .map((l) => JSON.parse(l)).map((t: Json) => [t.task.key, t]),
      );
      assert.equal(ts.gated.reward, 0);
      assert.deepEqual(ts.gated.info.harbor.steps.map((st: Json) => st.name), ["one"]);
      assert.deepEqual(
        ts.gated.messages.filter((m: Json) => m.role === "user").map((m: Json) => m.content),
        [ONE],
        "below min_reward the next step's instruction is never given",
      );
      assert.equal(ts.mean.reward, 0.5);
      assert.deepEqual(
        ts.mean.info.harbor.steps.map((st: Json) => [st.name, st.reward]),
        [["one", 0], ["two", 1]],
      );
    }
  } finally {
    for (const d of runDirs.filter(Boolean)) await cleanupContainers({ runId: basename(d) });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor [[steps]] with an agent CLI: pi is run anew for each step in the same sandbox, its second run given only step two's instruction, and both steps are verified", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_steps_pi_" });
  let runDir = "";
  try {
    const files = task("cli", false);
    // No CLI and no Node.js in the image: vf brings them.
    files["cli/environment/Dockerfile"] =
      "FROM python:3.11-slim\nRUN mkdir -p /app\nWORKDIR /app\n";
    await write(dir, files);
    const requests: WireMessage[][] = [];
    await using model = await startModelServer({
      responder: ({ body }) => {
        const msgs = body.messages as WireMessage[];
        const names = (body.tools ?? []).map((t: Json) => t.function.name);
        // Side calls (titles, summaries) have no tools: a plain answer.
        if (!names.includes("bash")) return { content: "ok" };
        requests.push(msgs);
        if (msgs.some((m) => m.role === "tool")) return { content: "Done." };
        const users = msgs.filter((m) => m.role === "user").map((m) => JSON.stringify(m.content));
        const command = users.some((u) => u.includes("Step two"))
          ? "echo two > /app/b.txt; ls /app"
          : "echo one > /app/a.txt";
        return { content: null, tool_calls: [{ name: "bash", arguments: { command } }] };
      },
    });
    const res = await vf(dir, [
      "run",
      "./cli",
      "-m",
      "pi-model",
      "-b",
      model.url,
      "-o",
      "out",
      "--env.agent.harness.id",
      "pi",
    ]);
    runDir = res.runDir;
    assert.equal(res.code, 0, transcript(res));
    const [t] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(t.error, null, JSON.stringify(t.error));
    assert.deepEqual(
      t.info.harbor.steps.map((st: Json) => [st.name, st.reward]),
      [["one", 1], ["two", 1]],
    );
    assert.equal(t.reward, 1);
    // Two runs of the CLI, one per step; the second saw the first's file (same sandbox).
    const runs = t.tool_calls.filter((c: Json) => c.name === "pi");
    assert.equal(runs.length, 2, JSON.stringify(t.tool_calls.map((c: Json) => c.name)));
    // pi's own report of each run, summed: one shell command per step.
    assert.equal(t.metrics["pi/tool_calls"], 2, JSON.stringify(t.metrics));
    const toolResults = JSON.stringify(t.messages.filter((m: Json) => m.role === "tool"));
    assert.match(toolResults, /a\.txt/, "step two's ls shows step one's file");
    // Step two's requests: its instruction only, nothing of step one's conversation.
    const second = requests.filter((r) => JSON.stringify(r).includes("Step two"));
    assert.ok(second.length >= 2, `${second.length} requests of step two`);
    for (const r of second) {
      const text = JSON.stringify(r);
      assert.ok(!text.includes("Step one") && !text.includes("echo one"), text.slice(0, 2000));
    }
  } finally {
    if (runDir) await cleanupContainers({ runId: basename(runDir) });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor [[steps]]: a step whose workdir/setup.sh fails does not run, nor do later ones; the reward is the earlier steps' and the failure is on the trace", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_steps_setup_" });
  let runDir = "";
  try {
    await write(dir, {
      ...task("broken", false),
      "broken/steps/two/workdir/setup.sh": "echo cannot seed >&2\nexit 3\n",
    });
    const requests: WireMessage[][] = [];
    await using model = await scripted("echo one > /app/a.txt", "echo two > /app/b.txt", requests);
    const res = await vf(dir, ["run", "./broken", "-m", "m", "-b", model.url, "-o", "out"]);
    runDir = res.runDir;
    assert.equal(res.code, 0, transcript(res));
    const [t] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(t.error, null, JSON.stringify(t.error));
    assert.deepEqual(t.info.harbor.steps.map((st: Json) => [st.name, st.reward]), [["one", 1]]);
    assert.equal(t.info.harbor.stopped.step, "two");
    assert.match(
      t.info.harbor.stopped.error,
      /steps\/two\/workdir\/setup\.sh exited 3: cannot seed/,
    );
    assert.equal(t.reward, 1);
    assert.ok(!requests.some((r) => r.some((m) => m.content === TWO)), "step two's agent ran");
  } finally {
    if (runDir) await cleanupContainers({ runId: basename(runDir) });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor [[steps]]: each step's agent has its own limit (times the agent timeout multiplier); a step whose agent outlasts it is stopped, still verified (its verifier's score, the timeout on its result), and the trial goes on to the next step", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_steps_timeout_" });
  let runDir = "";
  try {
    const files = task("slow", false);
    // Step one's agent: 10 s, times 2; step two keeps the task's 60 s (times 2).
    files["slow/task.toml"] = files["slow/task.toml"]
      .replace("timeout_sec = 120.0", "timeout_sec = 60.0")
      .replace('name = "one"\n', 'name = "one"\n[steps.agent]\ntimeout_sec = 10.0\n');
    await write(dir, files);
    const requests: WireMessage[][] = [];
    // Step one's agent writes its answer, then hangs past its limit.
    await using model = await scripted(
      "echo one > /app/a.txt; sleep 600",
      "echo two > /app/b.txt",
      requests,
    );
    const t0 = performance.now();
    const res = await vf(dir, [
      "run",
      "./slow",
      "-m",
      "m",
      "-b",
      model.url,
      "-o",
      "out",
      "--env.taskset.agent_timeout_multiplier",
      "2",
    ]);
    runDir = res.runDir;
    assert.equal(res.code, 0, transcript(res));
    const [t] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(t.error, null, JSON.stringify(t.error));
    // Step one was verified after its agent was stopped: its verifier saw a.txt (1), and the
    // timeout is on its result; step two ran in full.
    assert.deepEqual(
      t.info.harbor.steps.map((st: Json) => [st.name, st.reward, st.agent_timeout?.seconds]),
      [["one", 1, 20], ["two", 1, undefined]],
    );
    assert.match(t.info.harbor.steps[0].agent_timeout.message, /timed out after 20s/);
    assert.equal(t.reward, 1);
    assert.ok(requests.some((r) => r.some((m) => m.content === TWO)), "step two's agent never ran");
    // Not the whole budget (60 s more, times 2) nor the sleep: stopped at step one's limit.
    assert.ok(t.timing.agent_ms >= 20_000 && t.timing.agent_ms < 140_000, `${t.timing.agent_ms}`);
    assert.ok(performance.now() - t0 < 400_000);
  } finally {
    if (runDir) await cleanupContainers({ runId: basename(runDir) });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor [[steps]]: vf export writes each step's session as its own conversation (messages and ShareGPT a row per step, ATIF a document per step), each naming its step and reward", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_steps_export_" });
  let runDir = "";
  try {
    await write(dir, task("exp", false));
    await using model = await scripted("echo uno > /app/a.txt", "echo two > /app/b.txt");
    const res = await vf(dir, ["run", "./exp", "-m", "m", "-b", model.url, "-o", "out"]);
    runDir = res.runDir;
    assert.equal(res.code, 0, transcript(res));
    const [t] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(t.error, null, JSON.stringify(t.error));
    assert.equal(t.reward, 0.5);
    // Each step's session is a range of the trace's messages, one after the other.
    const [one, two] = t.info.harbor.steps;
    assert.deepEqual([one.messages[0], one.messages[1]], [0, two.messages[0]]);
    assert.equal(two.messages[1], t.messages.length);

    const rows = async (format: string) => {
      const r = await vf(dir, ["export", "--format", format, runDir]);
      assert.equal(r.code, 0, transcript(r));
      assert.match(r.stdout, /wrote 2 of 2 rollouts/);
      return (await Deno.readTextFile(join(runDir, `${format}.jsonl`))).trim().split("\n")
        .map((l) => JSON.parse(l));
    };
    const msgs = await rows("messages");
    assert.deepEqual(
      msgs.map((r: Json) => [r.metadata.step, r.metadata.step_index, r.metadata.step_reward]),
      [["one", 0, 0], ["two", 1, 1]],
    );
    for (const [i, r] of msgs.entries()) {
      assert.equal(r.metadata.reward, 0.5, "the trial's reward");
      const users = r.messages.filter((m: Json) => m.role === "user").map((m: Json) => m.content);
      assert.deepEqual(users, [[ONE, TWO][i]], "the step's instruction only");
      // One system prompt at most, at the start: not one per step in a run-on conversation.
      const systems = r.messages.flatMap((m: Json, j: number) => m.role === "system" ? [j] : []);
      assert.ok(systems.length <= 1 && (systems[0] ?? 0) === 0, JSON.stringify(r.messages));
      assert.ok(r.messages.some((m: Json) => m.role === "assistant" && m.tool_calls), "its reply");
    }
    assert.match(JSON.stringify(msgs[0].messages), /echo uno/);
    assert.doesNotMatch(JSON.stringify(msgs[1].messages), /echo uno/);

    const share = await rows("sharegpt");
    assert.deepEqual(share.map((r: Json) => r.metadata.step), ["one", "two"]);
    for (const [i, r] of share.entries()) {
      const humans = r.conversations.filter((c: Json) => c.from === "human");
      assert.deepEqual(humans.map((c: Json) => c.value), [[ONE, TWO][i]]);
      assert.ok(!r.conversations.some((c: Json) => c.from === "system"), JSON.stringify(r));
    }

    const a = await vf(dir, ["export", "--format", "atif", runDir]);
    assert.equal(a.code, 0, transcript(a));
    assert.match(a.stdout, /wrote 2 ATIF trajectories/);
    const files = [...Deno.readDirSync(join(runDir, "atif"))].map((e) => e.name).sort();
    assert.equal(files.length, 2, files.join(", "));
    const docs = files.map((f) => JSON.parse(Deno.readTextFileSync(join(runDir, "atif", f))));
    assert.deepEqual(
      docs.map((d: Json) => [d.trajectory_id, d.extra.step, d.extra.step_reward, d.extra.reward]),
      [[`${t.trace_id}-step-1`, "one", 0, 0.5], [`${t.trace_id}-step-2`, "two", 1, 0.5]],
    );
    for (const [i, d] of docs.entries()) {
      const users = d.steps.filter((s: Json) => s.source === "user").map((s: Json) => s.message);
      assert.deepEqual(users, [[ONE, TWO][i]]);
      assert.deepEqual(
        d.steps.map((s: Json) => s.step_id),
        d.steps.map((_: Json, j: number) => j + 1),
      );
      const agent = d.steps.filter((s: Json) => s.source === "agent");
      assert.equal(agent.length, 2, "the step's two replies");
      assert.equal(agent.every((s: Json) => s.llm_call_count === 1), true, "its own model calls");
    }
  } finally {
    if (runDir) await cleanupContainers({ runId: basename(runDir) });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor [[steps]]: a step's verifier has its own limit (times the verifier timeout multiplier); one that outlasts it fails the rollout, never a 0", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_steps_vtimeout_" });
  let runDir = "";
  try {
    const files = task("vslow", false);
    // Step one's verifier: 3 s (from [steps.verifier]), times 2; its test.sh hangs.
    files["vslow/task.toml"] = files["vslow/task.toml"].replace(
      "[steps.verifier]\ntimeout_sec = 20.0",
      "[steps.verifier]\ntimeout_sec = 3.0",
    );
    files["vslow/steps/one/tests/test.sh"] = "sleep 300\necho 1 > /logs/verifier/reward.txt\n";
    await write(dir, files);
    const requests: WireMessage[][] = [];
    await using model = await scripted("echo one > /app/a.txt", "echo two > /app/b.txt", requests);
    const t0 = performance.now();
    const res = await vf(dir, [
      "run",
      "./vslow",
      "-m",
      "m",
      "-b",
      model.url,
      "-o",
      "out",
      "--env.taskset.verifier_timeout_multiplier",
      "2",
    ]);
    runDir = res.runDir;
    const [t] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.notEqual(t.error, null, "a step verifier past its limit scored the rollout");
    assert.equal(t.reward, null);
    assert.match(
      t.error.message,
      /The verifier \(tests\/test\.sh\) outlasted its limit of 6s \(steps\[0\]\.verifier\.timeout_sec \(step "one"/,
    );
    assert.ok(!requests.some((r) => r.some((m) => m.content === TWO)), "step two ran");
    assert.ok(performance.now() - t0 < 200_000, "the verifier ran past its limit");
  } finally {
    if (runDir) await cleanupContainers({ runId: basename(runDir) });
    await Deno.remove(dir, { recursive: true });
  }
});
