/**
 * Harbor task folders written to schema 1.3, one per feature, through the real CLI on real
 * Docker with a scripted model: `[environment] workdir`, `[agent] user` (in `vf validate`'s
 * gold answer too), a separate verifier environment (`tests/Dockerfile`, only the declared
 * artifacts, tampering left behind in the agent's sandbox), a dataset with one broken folder
 * (that task's error, the rest validated and run) and its selectors. Multi-step tasks
 * (`[[steps]]`) are in harbor_steps_test.ts.
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

async function vf(
  dir: string,
  args: string[],
): Promise<CliResult & { runId: string; runDir: string }> {
  const res = await collect(cliCommand(args, { cwd: dir, env: {}, registry: false, docker: true }));
  const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1] ?? "";
  return { ...res, runId: runDir ? basename(runDir) : "", runDir };
}

/** The JSON summary `vf validate` prints last. */
function summary(res: CliResult): Json {
  return JSON.parse(res.stdout.trim().split("\n").at(-1)!);
}

async function traces(runDir: string): Promise<Json[]> {
  return (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
}

/** A model that runs `command` once through the bash tool, then stops. */
function scripted(command: string) {
  return startModelServer({
    responder: ({ body }) => {
      const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
      return turn === 0
        ? { content: null, tool_calls: [{ name: "bash", arguments: { command } }] }
        : { content: "Done." };
    },
  });
}

const CHECK = (cond: string) =>
  `#!/bin/sh\nif ${cond}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n`;

const WORKDIR = {
  "wd/instruction.md": "Write hello to out.txt in your working directory.\n",
  "wd/task.toml": `schema_version = "1.3"
[task]
name = "vf/wd"
description = "workdir"
keywords = ["workdir"]
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 30.0
[environment]
workdir = "/work"
network_mode = "no-network"
`,
  // The image's own WORKDIR is /app: the task's workdir wins, as in Harbor.
  "wd/environment/Dockerfile": "FROM busybox:latest\nWORKDIR /app\n",
  "wd/tests/test.sh": CHECK('[ "$(cat /work/out.txt 2>/dev/null)" = hello ]'),
  "wd/solution/solve.sh": "#!/bin/sh\necho hello > out.txt\n",
};

const USER = {
  "owner/instruction.md": "Write hi to /app/out.txt.\n",
  "owner/task.toml": `schema_version = "1.3"
[agent]
timeout_sec = 120.0
user = "agent"
[verifier]
timeout_sec = 30.0
user = "root"
`,
  "owner/environment/Dockerfile":
    "FROM busybox:latest\nRUN echo 'agent:x:1234:1234::/tmp:/bin/sh' >> /etc/passwd && mkdir -p /app && chown 1234 /app\nWORKDIR /app\n",
  "owner/tests/test.sh": CHECK(
    '[ "$(cat /app/out.txt 2>/dev/null)" = hi ] && [ "$(stat -c %u /app/out.txt)" = 1234 ]',
  ),
  "owner/solution/solve.sh": "#!/bin/sh\necho hi > /app/out.txt\n",
};

/**
 * A separate verifier: its image (tests/Dockerfile) carries a marker the agent's lacks; it
 * sees /app/answer.txt (the artifact) and must not see /app/leak.txt (not one).
 */
const SEPARATE = {
  "sep/instruction.md": "Write 42 to /app/answer.txt.\n",
  "sep/task.toml": `schema_version = "1.3"
artifacts = ["/app/answer.txt"]
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 60.0
environment_mode = "separate"
[verifier.environment]
network_mode = "no-network"
`,
  "sep/environment/Dockerfile": "FROM busybox:latest\nRUN mkdir -p /app\nWORKDIR /app\n",
  "sep/tests/Dockerfile":
    "FROM busybox:latest\nRUN mkdir -p /app && echo verifier > /etc/verifier-marker\n",
  "sep/tests/test.sh": CHECK(
    '[ "$(cat /app/answer.txt 2>/dev/null)" = 42 ] && [ ! -e /app/leak.txt ] && [ -e /etc/verifier-marker ]',
  ),
  "sep/solution/solve.sh": "#!/bin/sh\necho 42 > /app/answer.txt\n",
};

Deno.test("Harbor 1.3: [environment] workdir is the agent's and the gold answer's working directory; the schema version and [task] are kept on the trace", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor13_wd_" });
  const ids: string[] = [];
  try {
    await write(dir, WORKDIR);
    const v = await vf(dir, ["validate", "./wd"]);
    assert.equal(v.code, 0, transcript(v));
    const [r] = summary(v).results;
    assert.equal(r.gold_reward, 1);
    assert.equal(r.empty_reward, 0);
    await using model = await scripted("pwd; echo hello > out.txt");
    const res = await vf(dir, ["run", "./wd", "-m", "m", "-b", model.url, "-o", "out"]);
    ids.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [t] = await traces(res.runDir);
    assert.equal(t.error, null, JSON.stringify(t.error));
    assert.match(t.tool_calls[0].output, /\/work/);
    assert.equal(t.reward, 1);
    assert.equal(t.info.harbor.schema_version, "1.3");
    assert.deepEqual(t.info.harbor.task, {
      name: "vf/wd",
      description: "workdir",
      keywords: ["workdir"],
    });
  } finally {
    for (const id of ids.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor 1.3: [agent] user runs the agent's commands and vf validate's solve.sh, so output the agent user must own scores 1", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor13_user_" });
  const ids: string[] = [];
  try {
    await write(dir, USER);
    const v = await vf(dir, ["validate", "./owner"]);
    assert.equal(v.code, 0, transcript(v));
    const [r] = summary(v).results;
    assert.equal(r.gold_reward, 1);
    assert.equal(r.empty_reward, 0);
    await using model = await scripted("id -u; echo hi > /app/out.txt");
    const res = await vf(dir, ["run", "./owner", "-m", "m", "-b", model.url, "-o", "out"]);
    ids.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [t] = await traces(res.runDir);
    assert.equal(t.error, null, JSON.stringify(t.error));
    assert.match(t.tool_calls[0].output, /1234/);
    assert.equal(t.reward, 1);
  } finally {
    for (const id of ids.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor 1.3: a separate verifier runs in another container from tests/Dockerfile, sees only the declared artifacts, and what the agent tampered with stays behind", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor13_sep_" });
  const ids: string[] = [];
  try {
    await write(dir, SEPARATE);
    const v = await vf(dir, ["validate", "./sep"]);
    assert.equal(v.code, 0, transcript(v));
    const [r] = summary(v).results;
    assert.equal(r.gold_reward, 1);
    assert.equal(r.empty_reward, 0);
    // The right answer, and a file outside the artifacts the verifier must not see: 1 only
    // when the verifier is in its own image without the agent's files.
    {
      await using model = await scripted(
        "echo 42 > /app/answer.txt; echo x > /app/leak.txt; hostname",
      );
      const res = await vf(dir, ["run", "./sep", "-m", "m", "-b", model.url, "-o", "out"]);
      ids.push(res.runId);
      assert.equal(res.code, 0, transcript(res));
      const [t] = await traces(res.runDir);
      assert.equal(t.error, null, JSON.stringify(t.error));
      assert.equal(t.reward, 1);
      assert.equal(t.scoring.mode, "isolated");
    }
    // A wrong answer, a reward file written ahead, fake tests and a daemon rewriting both:
    // none of it reaches the verifier.
    {
      await using model = await scripted(
        "echo 41 > /app/answer.txt; mkdir -p /logs/verifier /tests; " +
          "echo 1 > /logs/verifier/reward.txt; printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; " +
          "(while true; do echo 1 > /logs/verifier/reward.txt; sleep 0.2; done) >/dev/null 2>&1 &",
      );
      const res = await vf(dir, ["run", "./sep", "-m", "m", "-b", model.url, "-o", "out"]);
      ids.push(res.runId);
      assert.equal(res.code, 0, transcript(res));
      const [t] = await traces(res.runDir);
      assert.equal(t.error, null, JSON.stringify(t.error));
      assert.equal(t.reward, 0);
    }
  } finally {
    for (const id of ids.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Harbor 1.3 datasets: a broken folder is that task's error, named with file and key, the rest validates and runs; include/exclude globs and n_tasks select folders", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor13_set_" });
  const ids: string[] = [];
  try {
    const ok = Object.fromEntries(
      Object.entries(WORKDIR).map(([k, v]) => [k.replace(/^wd\//, "tasks/a-ok/"), v]),
    );
    await write(dir, {
      ...ok,
      "tasks/b-broken/instruction.md": "x\n",
      "tasks/b-broken/task.toml":
        `schema_version = "1.3"\n[environment]\ndocker_image = "busybox:latest"\nmcp_servers = []\n`,
      "tasks/b-broken/tests/test.sh": CHECK("true"),
      "tasks/b-broken/solution/solve.sh": "#!/bin/sh\n",
    });
    const v = await vf(dir, ["validate", "./tasks"]);
    assert.equal(v.code, 1, transcript(v));
    const s = summary(v);
    assert.equal(s.tasks, 2);
    assert.equal(s.passed, 1);
    const good = s.results.find((r: Json) => r.task === "a-ok");
    assert.equal(good.ok, true);
    const bad = s.results.find((r: Json) => r.task === "b-broken");
    assert.equal(bad.ok, false);
    assert.match(bad.error, /b-broken\/task\.toml: environment\.mcp_servers: vf cannot honour/);

    const only = await vf(dir, ["validate", "./tasks", "--env.taskset.exclude", "b-*"]);
    assert.equal(only.code, 0, transcript(only));
    assert.deepEqual(summary(only).results.map((r: Json) => r.task), ["a-ok"]);
    const first = await vf(dir, ["validate", "./tasks", "--env.taskset.n_tasks", "1"]);
    assert.equal(first.code, 0, transcript(first));
    assert.deepEqual(summary(first).results.map((r: Json) => r.task), ["a-ok"]);
    // Only the broken one left: loading itself fails, naming it.
    const none = await vf(dir, ["validate", "./tasks", "--env.taskset.include", "*-broken"]);
    assert.equal(none.code, 1, transcript(none));
    assert.match(none.stderr, /environment\.mcp_servers/);

    await using model = await scripted("echo hello > out.txt");
    const res = await vf(dir, ["run", "./tasks", "-m", "m", "-b", model.url, "-o", "out"]);
    ids.push(res.runId);
    const ts = await traces(res.runDir);
    const a = ts.find((t) => t.task === "a-ok" || t.info?.task === "a-ok" || t.example_id === 0);
    assert.ok(a, transcript(res));
    const byError = ts.filter((t) => t.error !== null);
    assert.equal(byError.length, 1, JSON.stringify(ts.map((t) => t.error)));
    assert.match(JSON.stringify(byError[0].error), /environment\.mcp_servers/);
    assert.equal(ts.filter((t) => t.reward === 1).length, 1);
  } finally {
    for (const id of ids.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * Several named rewards (schema 1.3): reward.json carries a "reward" key beside others, and the
 * verifier writes reward.txt too; a second task writes reward.json without a "reward" key.
 */
const NAMED = {
  "named/instruction.md": "Write ok to /app/out.txt.\n",
  "named/task.toml": `schema_version = "1.3"\n[verifier]\ntimeout_sec = 30.0\n`,
  "named/environment/Dockerfile": "FROM busybox:latest\nWORKDIR /app\n",
  "named/tests/test.sh": `#!/bin/sh
if [ "$(cat /app/out.txt 2>/dev/null)" = ok ]; then r=1; else r=0; fi
echo "$r" > /logs/verifier/reward.txt
echo "{\\"reward\\": $r, \\"style\\": 0.5, \\"lint\\": 0.25}" > /logs/verifier/reward.json
`,
  "parts/instruction.md": "Write ok to /app/out.txt.\n",
  "parts/task.toml": `schema_version = "1.3"\n[verifier]\ntimeout_sec = 30.0\n`,
  "parts/environment/Dockerfile": "FROM busybox:latest\nWORKDIR /app\n",
  "parts/tests/test.sh":
    `#!/bin/sh\necho '{"correctness": 0.5, "speed": 0.25}' > /logs/verifier/reward.json\n`,
};

Deno.test("Harbor 1.3 named rewards: reward.json wins over reward.txt and its reward key is the reward, once in the summary; the other keys are recorded with weight 0, and a file without the key sums its keys", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor13_named_" });
  const ids: string[] = [];
  try {
    await write(dir, NAMED);
    await using model = await scripted("echo ok > /app/out.txt");
    const res = await vf(dir, ["run", "./named", "-m", "m", "-b", model.url, "-o", "out"]);
    ids.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [t] = await traces(res.runDir);
    assert.equal(t.error, null, JSON.stringify(t.error));
    assert.equal(t.reward, 1, "the reward key, not the sum of the keys (1.75)");
    assert.deepEqual(t.rewards, { reward: 1, style: 0.5, lint: 0.25 });
    assert.deepEqual(t.reward_weights, { style: 0, lint: 0 });
    assert.equal(t.info.verifier.reward_file, "reward.json");
    assert.equal(t.info.verifier.unread_reward_file, "reward.txt");
    assert.match(res.stdout, /^reward 1\.0000 /m);
    assert.doesNotMatch(res.stdout, /reward "?reward"?:/, res.stdout);
    assert.match(
      res.stdout,
      /^ {2}reward "style": 0\.5000 \(weight 0: beside the reward, not in it\)$/m,
    );
    assert.match(
      res.stdout,
      /^ {2}reward "lint": 0\.2500 \(weight 0: beside the reward, not in it\)$/m,
    );
    const summary = JSON.parse(await Deno.readTextFile(join(res.runDir, "metadata.json")));
    assert.deepEqual(summary.reward_weights, { style: 0, lint: 0 });

    const parts = await vf(dir, ["run", "./parts", "-m", "m", "-b", model.url, "-o", "out"]);
    ids.push(parts.runId);
    assert.equal(parts.code, 0, transcript(parts));
    const [p] = await traces(parts.runDir);
    assert.equal(p.reward, 0.75);
    assert.deepEqual(p.rewards, { correctness: 0.5, speed: 0.25 });
    assert.equal(p.reward_weights, undefined);
    assert.match(parts.stdout, /^reward 0\.7500 /m);
    assert.match(parts.stdout, /^ {2}reward "correctness": 0\.5000$/m);
  } finally {
    for (const id of ids.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});
