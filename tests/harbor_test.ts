/**
 * Harbor task folders end to end: a shell task on busybox and a Python task on the local
 * python image, written here in Harbor's layout. `vf validate <folder>` checks gold (1.0) and
 * no-op (0.0); `vf run <folder>` solves them with the loopback model through the bash harness,
 * and the agent never sees `tests/`; bad folders get errors naming the path, and a verifier
 * that writes no reward is an error, never a 0.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { SubprocessRuntime } from "../runtimes/subprocess.ts";
import { atifToMessages } from "../lib/harbor/atif.ts";
import { atifErrors } from "./_atif_schema.ts";
import { loadHarborTask, readHarborSettings } from "../lib/harbor/taskset.ts";
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

const HELLO = {
  "hello/instruction.md": "Write the word hello to /app/out.txt.\n",
  "hello/task.toml": `version = "1.0"
[metadata]
difficulty = "easy"
[verifier]
timeout_sec = 30.0
[agent]
timeout_sec = 120.0
[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 512
`,
  "hello/environment/Dockerfile": "FROM busybox:latest\nWORKDIR /app\nRUN mkdir -p /app\n",
  "hello/tests/test.sh":
    '#!/bin/sh\nif [ "$(cat /app/out.txt 2>/dev/null)" = hello ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n',
  "hello/solution/solve.sh": "#!/bin/sh\necho hello > /app/out.txt\n",
};

const ADD = {
  "add/instruction.md": "In /app/add.py, define add(a, b) returning a + b.\n",
  "add/task.toml": `[verifier]\ntimeout_sec = 60.0\nenv = { CASES = "3" }\n`,
  "add/environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\n",
  "add/tests/test.sh": "#!/bin/sh\npython3 /tests/check.py\n",
  "add/tests/check.py": `import json, os, sys
sys.path.insert(0, "/app")
ok = 0.0
try:
    from add import add
    cases = [(1, 2), (5, 7), (-1, 1)][: int(os.environ["CASES"])]
    ok = sum(add(a, b) == a + b for a, b in cases) / len(cases)
except Exception:
    ok = 0.0
json.dump({"tests": ok}, open("/logs/verifier/reward.json", "w"))
`,
  "add/solution/solve.sh":
    "#!/bin/sh\nprintf 'def add(a, b):\\n    return a + b\\n' > /app/add.py\n",
};

async function run(
  dir: string,
  args: string[],
): Promise<CliResult & { runId: string; runDir: string }> {
  const res = await collect(cliCommand(args, { cwd: dir, env: {}, registry: false, docker: true }));
  const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1] ?? "";
  return { ...res, runId: runDir ? basename(runDir) : "", runDir };
}

Deno.test("Harbor folders: vf validate checks gold and no-op; vf run solves them with the bash harness and the agent never sees tests/; the run exports to ATIF and a Harbor job imports back", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_" });
  const runIds: string[] = [];
  try {
    await write(join(dir, "bench"), { ...HELLO, ...ADD });
    const validate = await run(dir, ["validate", "./bench"]);
    assert.equal(validate.code, 0, transcript(validate));
    assert.match(validate.stdout + validate.stderr, /hello/);

    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        const prompt = JSON.stringify(body.messages);
        const command = turn === 0
          ? "ls /tests; ls /solution"
          : prompt.includes("add.py")
          ? "printf 'def add(a, b):\\n    return a + b\\n' > /app/add.py"
          : "echo hello > /app/out.txt";
        return turn < 2
          ? { content: null, tool_calls: [{ name: "bash", arguments: { command } }] }
          : { content: "Done." };
      },
    });
    const res = await run(dir, ["run", "./bench", "-m", "m", "-b", model.url, "-o", "out"]);
    runIds.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const traces = (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l)).sort((a: Json, b: Json) => a.task.key.localeCompare(b.task.key));
    assert.deepEqual(traces.map((t: Json) => [t.task.key, t.reward, t.rewards]), [
      ["add", 1, { tests: 1 }],
      ["hello", 1, { reward: 1 }],
    ]);
    for (const t of traces) {
      // What the agent saw of /tests and /solution: nothing.
      // (busybox and Debian word it differently)
      assert.match(t.tool_calls[0].output, /\/tests'?: No such file or directory/);
      assert.match(t.tool_calls[0].output, /\/solution'?: No such file or directory/);
      assert.equal(
        t.messages[1].content,
        t.task.key === "add"
          ? "In /app/add.py, define add(a, b) returning a + b.\n"
          : "Write the word hello to /app/out.txt.\n",
      );
    }

    // The run as ATIF trajectories, and back: a Harbor job folder of them imports into
    // vf's layout, where a trial that raised or has no verifier result is never a 0.
    const exported = await collect(cliCommand(
      ["export", "--format", "atif", res.runDir, "-o", join(dir, "atif")],
      { cwd: dir, env: {}, registry: false },
    ));
    assert.equal(exported.code, 0, transcript(exported));
    assert.match(exported.stdout, /wrote 2 ATIF trajectories/);
    const files = [...Deno.readDirSync(join(dir, "atif"))].map((e) => e.name).sort();
    assert.equal(files.length, 2);
    const job = join(dir, "job");
    for (const [i, t] of traces.entries()) {
      const file = files.find((f) => f.startsWith(`${t.task.key}-0-${t.trace_id}`))!;
      const atif = JSON.parse(await Deno.readTextFile(join(dir, "atif", file)));
      assert.equal(atif.schema_version, "ATIF-v1.7");
      assert.deepEqual(atifErrors(atif), [], "the export holds to ATIF v1.7's schema");
      assert.equal(atif.agent.model_name, "m");
      assert.deepEqual(
        atif.steps.map((s: Json) => s.step_id),
        atif.steps.map((_: Json, j: number) => j + 1),
      );
      const firstAgent = atif.steps.find((s: Json) => s.source === "agent");
      assert.deepEqual(firstAgent.tool_calls[0].arguments, { command: "ls /tests; ls /solution" });
      assert.equal(firstAgent.observation.results[0].content, t.tool_calls[0].output);
      assert.equal(atif.extra.reward, 1);
      assert.equal(atif.final_metrics.total_prompt_tokens, t.usage.input_tokens);
      assert.deepEqual(atifToMessages(atif, file), t.messages);
      await write(job, {
        [`${t.task.key}__t${i}/result.json`]: JSON.stringify({
          id: `trial-${i}`,
          task_name: t.task.key,
          agent_info: { name: "terminus-2", model_info: { name: "m", provider: "local" } },
          agent_result: { n_input_tokens: 10, n_output_tokens: 5 },
          verifier_result: { rewards: { reward: 1.0 } },
          started_at: "2026-12-01T00:00:00Z",
        }),
        [`${t.task.key}__t${i}/agent/trajectory.json`]: JSON.stringify(atif),
      });
    }
    await write(job, {
      "hello__t2/result.json": JSON.stringify({
        task_name: "hello",
        agent_info: { name: "terminus-2", model_info: { name: "m" } },
        exception_info: { exception_type: "AgentTimeoutError", exception_message: "timed out" },
        verifier_result: null,
      }),
      "hello__t3/result.json": JSON.stringify({ task_name: "hello", agent_info: {} }),
    });
    const imported = await collect(cliCommand(
      ["import", "--format", "harbor", job, "-o", join(dir, "imported")],
      { cwd: dir, env: {}, registry: false },
    ));
    assert.equal(imported.code, 0, transcript(imported));
    const importDir = /into (.+)$/m.exec(imported.stdout)![1];
    const meta = JSON.parse(await Deno.readTextFile(join(importDir, "metadata.json")));
    assert.equal(meta.num_rollouts, 4);
    assert.equal(meta.avg_reward, 1); // the two failed trials are errors, not zeros
    assert.equal(meta.num_errors, 2);
    const back = (await Deno.readTextFile(join(importDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    const timedOut = back.find((t: Json) => t.info.harbor_trial === "hello__t2");
    assert.equal(timedOut.reward, null);
    assert.equal(timedOut.error.error, "AgentTimeoutError");
    const passed = back.find((t: Json) => t.info.harbor_trial === "hello__t1") ??
      back.find((t: Json) => t.info.harbor_trial === "hello__t0");
    assert.deepEqual(passed.messages, traces.find((t: Json) => t.task.key === "hello").messages);
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor folders: bad input names the path, a failed build shows its log, and a verifier without a reward is an error, never a 0", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_bad_" });
  const runIds: string[] = [];
  try {
    await using model = await startModelServer({ responder: () => ({ content: "Done." }) });
    const args = (target: string) => ["run", target, "-m", "m", "-b", model.url, "-o", "out"];
    await write(join(dir, "no-instruction"), {
      "task.toml": "",
      "environment/Dockerfile": "FROM busybox:latest\n",
      "tests/test.sh": "exit 0\n",
    });
    const missing = await run(dir, args("./no-instruction"));
    assert.equal(missing.code, 1, transcript(missing));
    assert.match(
      missing.stderr,
      /no-instruction\/instruction\.md: missing; a Harbor task needs its instruction/,
    );

    await write(join(dir, "broken-build"), {
      "instruction.md": "x",
      "task.toml": "",
      "environment/Dockerfile": "FROM busybox:latest\nRUN echo about to fail && exit 3\n",
      "tests/test.sh": "exit 0\n",
    });
    const broken = await run(dir, args("./broken-build"));
    assert.equal(broken.code, 1, transcript(broken));
    assert.match(broken.stderr, /Building image "vf-build-harbor-broken-build:[0-9a-f]+" failed/);
    assert.match(broken.stderr, /about to fail/);

    await write(join(dir, "no-reward"), {
      "instruction.md": "x",
      "task.toml": "",
      "environment/Dockerfile": "FROM busybox:latest\n",
      "tests/test.sh": "echo checked\n",
    });
    const silent = await run(dir, args("./no-reward"));
    runIds.push(silent.runId);
    assert.equal(silent.code, 1, transcript(silent));
    const [trace] = (await Deno.readTextFile(join(silent.runDir, "traces.jsonl"))).trim()
      .split("\n").map((l) => JSON.parse(l));
    assert.equal(trace.reward, null);
    assert.equal(trace.error.phase, "scoring");
    assert.match(trace.error.message, /wrote no reward/);
    assert.match(silent.stdout, /reward n\/a/);
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor folders: a docker-compose task (main is the agent, the rest sidecars) validates, and vf's sh agent solves it through the model gateway", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_compose_" });
  const runIds: string[] = [];
  try {
    await write(join(dir, "bench"), {
      "api/instruction.md":
        "Fetch http://api:8080/secret.txt and write its content to /app/out.txt.\n",
      "api/task.toml": "[verifier]\ntimeout_sec = 30.0\n",
      "api/environment/Dockerfile": "FROM busybox:latest\nWORKDIR /app\n",
      "api/environment/seed/secret.txt": "sidecar-says-hi\n",
      "api/environment/docker-compose.yaml": `services:
  main:
    image: \${MAIN_IMAGE_NAME}
    depends_on: [api]
    environment:
      API_URL: http://api:8080
  api:
    image: busybox:latest
    command: ["httpd", "-f", "-p", "8080", "-h", "/www"]
    volumes:
      - ./seed:/www:ro
    expose: ["8080"]
    healthcheck:
      test: ["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/secret.txt"]
      interval: 200ms
      retries: 50
`,
      "api/tests/test.sh":
        '#!/bin/sh\n[ "$(cat /app/out.txt)" = sidecar-says-hi ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n',
      "api/solution/solve.sh": '#!/bin/sh\nwget -qO /app/out.txt "$API_URL/secret.txt"\n',
    });
    const validate = await run(dir, ["validate", "./bench"]);
    assert.equal(validate.code, 0, transcript(validate));

    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        return turn === 0
          ? {
            content: null,
            tool_calls: [{
              name: "bash",
              arguments: { command: "wget -qO /app/out.txt http://api:8080/secret.txt" },
            }],
          }
          : { content: "Done." };
      },
    });
    const res = await run(dir, [
      "run",
      "./bench",
      "-m",
      "m",
      "-b",
      model.url,
      "-o",
      "out",
      "--env.agent.harness.id",
      "program",
      "--env.agent.harness.agent",
      "sh",
    ]);
    runIds.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [t] = (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(t.reward, 1, JSON.stringify(t.error));
    assert.equal(t.harness, "program");
    assert.equal(t.model_calls.length, 2);
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

/** A Harbor task whose verifier writes 0 unless /app/out.txt says "right", then lingers. */
function riggable(name: string, toml: string, testSh?: string): Record<string, string> {
  return {
    [`${name}/instruction.md`]: "Write the word right to /app/out.txt.\n",
    [`${name}/task.toml`]: toml,
    [`${name}/environment/Dockerfile`]: "FROM busybox:latest\nWORKDIR /app\n",
    [`${name}/tests/test.sh`]: testSh ??
      '#!/bin/sh\nif [ "$(cat /app/out.txt 2>/dev/null)" = right ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\nsleep 0.5\n',
  };
}

/**
 * What a cheating agent leaves behind: daemons (one detached, one as a child of the
 * container's init) that keep writing a reward of 1 and a passing test script, wherever the
 * verifier will look, then the agent says it is done without doing the task.
 */
const CHEAT = [
  "mkdir -p /logs/verifier",
  "(while :; do echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > /logs/verifier/reward.json;" +
  " [ -d /tests ] && printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh;" +
  " sleep 0.05; done) </dev/null >/dev/null 2>&1 &",
  "setsid sh -c 'while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.05; done' </dev/null >/dev/null 2>&1 &",
  "echo planted",
].join("\n");

Deno.test("Harbor grading in the agent's sandbox: daemons the agent left rewriting reward.txt and the tests are killed before the verifier runs, so the reward is the verifier's 0", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_rig_" });
  const runIds: string[] = [];
  try {
    await write(dir, riggable("rig", "[verifier]\ntimeout_sec = 30.0\n"));
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        return turn === 0
          ? { content: null, tool_calls: [{ name: "bash", arguments: { command: CHEAT } }] }
          : { content: "Done." };
      },
    });
    const res = await run(dir, ["run", "./rig", "-m", "m", "-b", model.url, "-o", "out"]);
    runIds.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [t] = (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.match(t.tool_calls[0].output, /planted/);
    assert.equal(t.error, null, JSON.stringify(t.error));
    assert.equal(t.reward, 0);
    assert.deepEqual(t.rewards, { reward: 0 });
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor task.toml: numeric strings are numbers, anything else is an error naming the file and key, and Harbor's defaults apply when a key is missing", async () => {
  const path = "/x/task.toml";
  const typed = readHarborSettings(
    `[verifier]\ntimeout_sec = "3"\n[agent]\ntimeout_sec = " 45.5 "\n[environment]\ncpus = "2"\nmemory_mb = "512"\nbuild_timeout_sec = 90\n`,
    path,
  );
  assert.equal(typed.verifier.timeout, 3);
  assert.equal(typed.agent.timeout, 45.5);
  assert.equal(typed.environment.cpus, 2);
  assert.equal(typed.environment.memoryMb, 512);
  assert.equal(typed.environment.buildTimeout, 90);

  const bare = readHarborSettings("", path);
  assert.equal(bare.verifier.timeout, 600); // Harbor's VerifierConfig.timeout_sec
  assert.equal(bare.environment.buildTimeout, 600); // Harbor's build_timeout_sec
  assert.equal(bare.agent.timeout, undefined); // Harbor's AgentConfig.timeout_sec is None

  for (
    const [toml, key, shown] of [
      ['[verifier]\ntimeout_sec = "soon"\n', "verifier.timeout_sec", '"soon"'],
      ["[agent]\ntimeout_sec = true\n", "agent.timeout_sec", "true"],
      ["[verifier]\ntimeout_sec = -5\n", "verifier.timeout_sec", "-5"],
      ['[environment]\nbuild_timeout_sec = ""\n', "environment.build_timeout_sec", '""'],
      ['[environment]\ncpus = "two"\n', "environment.cpus", '"two"'],
      ["[environment]\nmemory_mb = [512]\n", "environment.memory_mb", "[512]"],
    ] as const
  ) {
    assert.throws(
      () => readHarborSettings(toml, path),
      (e: Error) => {
        assert.equal(e.name, "ConfigError");
        assert.ok(
          e.message.startsWith(`${path}: ${key}: ${shown} is not a positive number`),
          e.message,
        );
        return true;
      },
    );
  }

  // The loaded task carries them: the verifier's limit bounds the scoring phase.
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_toml_" });
  try {
    await write(dir, riggable("plain", "", "exit 0\n"));
    const task = await loadHarborTask(join(dir, "plain"));
    assert.equal(task.settings.verifier.timeout, 600);
    assert.equal(task.data.timeout?.scoring, 660);
    await write(dir, riggable("bad", '[verifier]\ntimeout_sec = "soon"\n', "exit 0\n"));
    await assert.rejects(
      () => loadHarborTask(join(dir, "bad")),
      new RegExp(
        `${join(dir, "bad", "task.toml")}: verifier\\.timeout_sec: "soon" is not a positive number`,
      ),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test('Harbor task.toml: timeout_sec = "3" bounds the verifier; one that sleeps past it is killed and the rollout is an error, never a 0', async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_slow_" });
  const runIds: string[] = [];
  try {
    await write(
      dir,
      riggable(
        "slow",
        '[verifier]\ntimeout_sec = "3"\n',
        "#!/bin/sh\necho 0 > /logs/verifier/reward.txt\nsleep 60\n",
      ),
    );
    await using model = await startModelServer({ responder: () => ({ content: "Done." }) });
    const started = performance.now();
    const res = await run(dir, ["run", "./slow", "-m", "m", "-b", model.url, "-o", "out"]);
    runIds.push(res.runId);
    assert.ok(performance.now() - started < 50_000, "the verifier ran past its 3 s limit");
    assert.equal(res.code, 1, transcript(res));
    const [t] = (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(t.reward, null);
    assert.equal(t.error.phase, "scoring");
    assert.equal(t.error.error, "CommandTimeoutError");
    assert.match(t.error.message, /did not finish within 3000 ms/);
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor grading refuses a runtime that cannot kill the agent's processes: a ConfigError naming the task, and the verifier never runs", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_nokill_" });
  try {
    await write(dir, riggable("nokill", "", "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n"));
    const task = await loadHarborTask(join(dir, "nokill"));
    await using runtime = new SubprocessRuntime({ type: "subprocess" });
    await runtime.start();
    assert.ok(!runtime.capabilities.kill_processes);
    await assert.rejects(
      () =>
        task.score({
          runtime,
          task,
          data: task.data,
          trace: { info: {}, messages: [], artifacts: new Map() },
          state: {},
        }),
      (e: Error) => {
        assert.equal(e.name, "ConfigError");
        assert.match(
          e.message,
          /^Harbor task "nokill": a "subprocess" runtime cannot kill the processes the agent left running \(capabilities\.kill_processes is false\), so a reward file in its sandbox could be the agent's and is not trusted; run Harbor tasks on the docker runtime$/,
        );
        return true;
      },
    );
    await assert.rejects(() => runtime.read("/tests/test.sh"), /does not exist/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
