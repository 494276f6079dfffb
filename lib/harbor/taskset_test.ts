/**
 * Tests of Harbor task folders beside their code: `task.toml` read into typed settings (numbers,
 * memory sizes, defaults, unknown keys), a folder read into a task (instruction, image,
 * resources, timeouts, a Compose file's `main` and sidecars), folder selection, and the verifier
 * and gold answer run in a real Docker sandbox (busybox): `tests/` arrives only at grading,
 * `reward.txt` or `reward.json` is the reward, anything else an error. End-to-end runs through
 * the CLI are in `tests/harbor_test.ts`.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import process from "node:process";
import { createRuntime, type Runtime } from "../../mod.ts";
import { ConfigError, TaskError } from "../errors.ts";
import { captureWarnings } from "../../tests/_warnings.ts";
import {
  HARBOR_DEFAULTS,
  harborFolders,
  HarborStepsTask,
  HarborTask,
  HarborTaskset,
  isHarborFolder,
  loadHarborTask,
  readHarborSettings,
  rollUp,
} from "./taskset.ts";

async function write(root: string, files: Record<string, string>): Promise<void> {
  for (const [path, text] of Object.entries(files)) {
    const full = join(root, path);
    await Deno.mkdir(join(full, ".."), { recursive: true });
    await Deno.writeTextFile(full, text);
  }
}

async function tempDir(): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ prefix: "vf_harbor_unit_" });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}

/** A task folder that names a local image, so loading it builds nothing. */
function folder(
  name: string,
  toml: string,
  extra: Record<string, string> = {},
): Record<string, string> {
  return {
    [`${name}/instruction.md`]: `Do ${name}.\n`,
    [`${name}/task.toml`]: `[environment]\ndocker_image = "busybox:latest"\n${toml}`,
    [`${name}/tests/test.sh`]: "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n",
    ...Object.fromEntries(Object.entries(extra).map(([k, v]) => [`${name}/${k}`, v])),
  };
}

const PATH = "/t/task.toml";

Deno.test("readHarborSettings(): a key vf does not know, or one it cannot honour, is an error naming the file and key", () => {
  const refused = (toml: string, re: RegExp) =>
    assert.throws(
      () => readHarborSettings(toml, PATH),
      (e: Error) => e instanceof ConfigError && re.test(e.message),
    );
  refused("extra_top = 1\n", /^\/t\/task\.toml: extra_top: not a Harbor task\.toml key vf knows/);
  refused("[verifier]\nretries = 2\n", /verifier\.retries: not a Harbor/);
  refused("[environment]\ngpus = 1\n", /environment\.gpus: vf cannot give a sandbox GPUs/);
  refused("[environment]\nmcp_servers = []\n", /environment\.mcp_servers: vf cannot honour it/);
  refused('[environment]\nos = "windows"\n', /environment\.os: vf runs linux sandboxes only/);
  refused('[verifier]\nenvironment_mode = "elsewhere"\n', /verifier\.environment_mode:/);
  refused(
    '[agent]\nnetwork_mode = "allowlist"\n',
    /agent\.allowed_hosts: network_mode = "allowlist" needs/,
  );
  refused('multi_step_reward_strategy = "max"\n', /multi_step_reward_strategy: "max" is not/);
  refused('[[steps]]\nname = "a"\n[[steps]]\nname = "a"\n', /steps: two steps are named "a"/);
  // min_reward: a number, or a table of numbers keyed by reward name; nothing else.
  refused(
    '[[steps]]\nname = "a"\nmin_reward = "1"\n',
    /steps\[0\]\.min_reward: "1" is not a number or a table of reward keys/,
  );
  refused(
    '[[steps]]\nname = "a"\nmin_reward = { correctness = "high" }\n',
    /steps\[0\]\.min_reward\.correctness: "high" is not a number/,
  );
  // Not a key of Harbor's schema: an error naming it, never a reward quietly kept or dropped.
  refused(
    "[verifier]\ncontributes_to_reward = false\n",
    /verifier\.contributes_to_reward: not a Harbor task\.toml key/,
  );
  // Harbor's 1.3 keys are read.
  const s = readHarborSettings(
    `schema_version = "1.3"\nartifacts = ["/app/a"]\nmulti_step_reward_strategy = "final"\n[task]\nname = "o/n"\n[environment]\nworkdir = "/w"\nnetwork_mode = "public"\n[verifier]\nenvironment_mode = "separate"\n[verifier.environment]\ncpus = 2\n[[steps]]\nname = "one"\nmin_reward = 1.0\n[steps.agent]\ntimeout_sec = 5\n`,
    PATH,
  );
  assert.equal(s.schemaVersion, "1.3");
  assert.deepEqual({ ...s.task }, { name: "o/n" });
  assert.deepEqual(s.artifacts, ["/app/a"]);
  assert.equal(s.rewardStrategy, "final");
  assert.equal(s.environment.workdir, "/w");
  assert.deepEqual(s.environment.network, { mode: "public", hosts: [] });
  assert.equal(s.verifier.mode, "separate");
  assert.equal(s.verifier.environment.cpus, 2);
  assert.equal(s.steps[0].name, "one");
  assert.deepEqual(s.steps[0].minReward, { reward: 1 }, "a number is the reward key's threshold");
  assert.equal(s.steps[0].agent.timeout, 5);
  assert.equal(s.steps[0].verifier.mode, "separate", "a step's verifier falls back to the task's");
});

Deno.test("readHarborSettings(): the verifier's env and user, the solution's env (values as strings), the image and internet access", () => {
  const s = readHarborSettings(
    [
      "[verifier]",
      'env = { CASES = 3, MODE = "strict" }',
      'user = "tester"',
      "[agent]",
      'user = "agent"',
      "[solution]",
      "env = { FAST = true }",
      "[environment]",
      'docker_image = "python:3.11-slim"',
      "allow_internet = true",
    ].join("\n"),
    PATH,
  );
  assert.deepEqual(s.verifier.env, { CASES: "3", MODE: "strict" });
  assert.equal(s.verifier.user, "tester");
  assert.equal(s.agent.user, "agent");
  assert.deepEqual(s.solution.env, { FAST: "true" });
  assert.equal(s.environment.image, "python:3.11-slim");
  assert.equal(s.environment.network.mode, "public");
  // Only a TOML boolean is read; no key leaves the network off.
  assert.throws(
    () => readHarborSettings('[environment]\nallow_internet = "yes"\n', PATH),
    /environment\.allow_internet: "yes" is not true or false/,
  );
  assert.equal(readHarborSettings("", PATH).environment.network.mode, "no-network");
});

Deno.test("readHarborSettings(): memory as '2G' or '512M' is megabytes, memory_mb wins over it, and a missing key gets Harbor's default", () => {
  const mem = (toml: string) =>
    readHarborSettings(`[environment]\n${toml}\n`, PATH).environment.memoryMb;
  assert.equal(mem('memory = "2G"'), 2048);
  assert.equal(mem('memory = "512M"'), 512);
  assert.equal(mem('memory = "1g"'), 1024);
  assert.equal(mem('memory_mb = 300\nmemory = "2G"'), 300);
  assert.throws(() => mem('memory = "lots"'), /environment\.memory: "lots" is not a size/);
  const bare = readHarborSettings("", PATH);
  assert.equal(bare.verifier.timeout, HARBOR_DEFAULTS.verifierTimeout);
  assert.equal(bare.environment.buildTimeout, HARBOR_DEFAULTS.buildTimeout);
  assert.deepEqual(bare.verifier.env, {});
  assert.equal(bare.environment.cpus, undefined);
  assert.deepEqual(bare.unknown, []);
});

Deno.test("readHarborSettings(): a file that is not TOML, or an env that is not a table, is a ConfigError naming the file", () => {
  assert.throws(
    () => readHarborSettings("[verifier\n", PATH),
    (e: Error) => e instanceof ConfigError && e.message.startsWith(`${PATH}: not valid TOML: `),
  );
  assert.throws(
    () => readHarborSettings('[verifier]\nenv = "A=1"\n', PATH),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message === `${PATH}: verifier.env: "A=1" is not a table`,
  );
  assert.throws(
    () => readHarborSettings("[solution]\nenv = [1]\n", PATH),
    /solution\.env: \[1\] is not a table/,
  );
  // The remedy suggests a value of the key's kind.
  assert.throws(() => readHarborSettings("[environment]\ncpus = 0\n", PATH), /e\.g\. cpus = 2$/);
  assert.throws(
    () => readHarborSettings("[environment]\nmemory_mb = -1\n", PATH),
    /e\.g\. memory_mb = 2048$/,
  );
});

Deno.test("loadHarborTask(): the folder becomes a task: its name, the instruction as prompt, image, network, resources, the agent's limit and the verifier's plus a minute", async () => {
  await using dir = await tempDir();
  await write(
    dir.path,
    folder(
      "fix-bug",
      `cpus = "2"\nmemory = "1G"\nallow_internet = true\n[agent]\ntimeout_sec = 90\nuser = "dev"\n[verifier]\ntimeout_sec = 30\n`,
    ),
  );
  const task = await loadHarborTask(join(dir.path, "fix-bug"));
  assert.ok(task instanceof HarborTask);
  assert.equal(task.key, "fix-bug");
  assert.equal(task.data.prompt, "Do fix-bug.\n");
  assert.equal(task.data.image, "busybox:latest");
  assert.equal(task.data.network, true);
  assert.equal(task.data.agent_user, "dev");
  assert.deepEqual(task.data.resources, { cpu: 2, memory: "1024m" });
  assert.deepEqual(task.data.timeout, { agent: 90, scoring: 90 });
  assert.deepEqual(task.data.scoring, { mode: "shared" });
  assert.equal(task.folder, join(dir.path, "fix-bug"));
  assert.equal(task.deploymentSpec(), null, "no Compose file: no sidecars");
  assert.equal((task.constructor as typeof HarborTask).NEEDS_CONTAINER, true);
});

Deno.test("loadHarborTask(): an unknown task.toml key is an error naming the file and key", async () => {
  await using dir = await tempDir();
  await write(dir.path, folder("refused", ""));
  await write(dir.path, {
    "refused/task.toml": `wibble = 1\n[environment]\ndocker_image = "busybox:latest"\n`,
  });
  await assert.rejects(
    () => loadHarborTask(join(dir.path, "refused")),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message.startsWith(`${join(dir.path, "refused", "task.toml")}: wibble: not a Harbor`),
  );
});

Deno.test("loadHarborTask(): a missing instruction, test.sh or Dockerfile (with no docker_image) is a ConfigError naming the path", async () => {
  await using dir = await tempDir();
  await write(dir.path, {
    "no-instr/task.toml": "",
    "no-tests/instruction.md": "x",
    "no-tests/task.toml": "",
    "no-image/instruction.md": "x",
    "no-image/task.toml": "",
    "no-image/tests/test.sh": "exit 0\n",
  });
  const cases: Array<[string, string]> = [
    [
      "no-instr",
      `${
        join(dir.path, "no-instr", "instruction.md")
      }: missing; a Harbor task needs its instruction`,
    ],
    [
      "no-tests",
      `${join(dir.path, "no-tests", "tests", "test.sh")}: missing; the verifier runs it`,
    ],
    [
      "no-image",
      `${
        join(dir.path, "no-image", "environment", "Dockerfile")
      }: missing, and task.toml names no docker_image`,
    ],
  ];
  for (const [name, message] of cases) {
    await assert.rejects(
      loadHarborTask(join(dir.path, name)),
      (e: Error) => e instanceof ConfigError && e.message === message,
      name,
    );
  }
});

Deno.test("loadHarborTask(): docker-compose.yaml's service main gives the agent's image and env (list or map, ${VAR:-default} filled); the rest become sidecars that no longer wait for main", async () => {
  await using dir = await tempDir();
  const compose = [
    "services:",
    "  main:",
    "    image: busybox:latest",
    "    environment:",
    "      - DB_HOST=db",
    "      - LEVEL=${VF_HARBOR_UNIT_UNSET:-info}",
    "    depends_on: [db]",
    "  db:",
    "    image: ${VF_HARBOR_UNIT_IMAGE}",
    "    depends_on: [main]",
    "  cache:",
    "    image: busybox:latest",
    "    depends_on:",
    "      main: { condition: service_started }",
    "      db: { condition: service_started }",
  ].join("\n");
  await write(dir.path, {
    "svc/instruction.md": "x",
    "svc/task.toml": "",
    "svc/tests/test.sh": "exit 0\n",
    "svc/environment/docker-compose.yaml": compose,
  });
  process.env.VF_HARBOR_UNIT_IMAGE = "busybox:1";
  let task!: HarborTask;
  try {
    task = await loadHarborTask(join(dir.path, "svc"));
  } finally {
    delete process.env.VF_HARBOR_UNIT_IMAGE;
  }
  assert.equal(task.data.image, "busybox:latest");
  assert.deepEqual(task.data.env, { DB_HOST: "db", LEVEL: "info" });
  const spec = task.deploymentSpec() as {
    services: Record<string, { image: string; depends_on: unknown }>;
    "x-vf-dir": string;
    "x-vf-source": string;
  };
  assert.deepEqual(Object.keys(spec.services), ["db", "cache"], "main is the agent, not a sidecar");
  assert.equal(spec.services.db.image, "busybox:1");
  assert.deepEqual(spec.services.db.depends_on, []);
  assert.deepEqual(spec.services.cache.depends_on, { db: { condition: "service_started" } });
  assert.equal(spec["x-vf-dir"], join(dir.path, "svc", "environment"));
  assert.equal(spec["x-vf-source"], join(dir.path, "svc", "environment", "docker-compose.yaml"));

  // A map environment, and a main that only names the default image: task.toml's applies.
  await write(dir.path, {
    "svc/task.toml": '[environment]\ndocker_image = "python:3.11-slim"\n',
    "svc/environment/docker-compose.yaml":
      "services:\n  main:\n    image: ${MAIN_IMAGE_NAME}\n    environment: { A: 1, EMPTY: null }\n    ports: ['80']\n",
  });
  const warned = await captureWarnings(
    async () => (task = await loadHarborTask(join(dir.path, "svc"))),
  );
  assert.equal(task.data.image, "python:3.11-slim");
  assert.deepEqual(task.data.env, { A: "1", EMPTY: "" });
  assert.equal(task.deploymentSpec(), null, "main alone: no sidecars");
  assert.match(
    warned.join("\n"),
    /docker-compose\.yaml: services\.main\.ports is not read by vf \(ignored\)/,
  );
});

Deno.test("loadHarborTask(): a Compose file that is not YAML, or a main build without a folder, is a ConfigError naming the file", async () => {
  await using dir = await tempDir();
  await write(dir.path, folder("c", "", { "environment/docker-compose.yml": "services: [\n" }));
  const path = join(dir.path, "c", "environment", "docker-compose.yml");
  await assert.rejects(
    loadHarborTask(join(dir.path, "c")),
    (e: Error) => e instanceof ConfigError && e.message.startsWith(`${path}: not valid YAML: `),
  );
  await write(dir.path, {
    "c/environment/docker-compose.yml": "services:\n  main:\n    build: { dockerfile: D }\n",
  });
  await assert.rejects(
    loadHarborTask(join(dir.path, "c")),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message === `${path}: services.main.build: give the folder to build from`,
  );
});

Deno.test("harborFolders() and HarborTaskset: one folder is itself, a parent lists its task folders sorted, tasks picks a subset, and bad paths or names are ConfigErrors", async () => {
  await using dir = await tempDir();
  await write(dir.path, {
    ...folder("b-task", ""),
    ...folder("a-task", ""),
    "notes/readme.md": "x",
  });
  assert.ok(isHarborFolder(dir.path));
  assert.ok(isHarborFolder(join(dir.path, "a-task")));
  assert.ok(!isHarborFolder(join(dir.path, "notes")));
  assert.ok(!isHarborFolder(join(dir.path, "absent")));
  assert.deepEqual(await harborFolders(dir.path), [
    join(dir.path, "a-task"),
    join(dir.path, "b-task"),
  ]);
  assert.deepEqual(await harborFolders(join(dir.path, "b-task")), [join(dir.path, "b-task")]);
  assert.deepEqual(await harborFolders(dir.path, ["b-task"]), [join(dir.path, "b-task")]);
  await assert.rejects(
    harborFolders(dir.path, ["b-task", "c-task", "d-task"]),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message === `${dir.path}: no Harbor task named "c-task", "d-task"`,
  );
  await assert.rejects(
    harborFolders(join(dir.path, "notes")),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message === `${join(dir.path, "notes")}: no Harbor task folder (with task.toml) here`,
  );

  const taskset = new HarborTaskset({ path: dir.path, tasks: ["a-task"] });
  assert.equal(taskset.id, dir.path.split("/").at(-1));
  const tasks = await taskset.load();
  assert.deepEqual(tasks.map((t) => t.key), ["a-task"]);
  await assert.rejects(
    new HarborTaskset({}).load(),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message === "env.taskset.path: the Harbor task folder (or a folder of them)",
  );
});

// ---------------------------------------------------------------------------------------
// The verifier and the gold answer in a real Docker sandbox

/** A started busybox container, stopped on dispose. */
async function sandbox(): Promise<Runtime & AsyncDisposable> {
  const runtime = createRuntime({ type: "docker", image: "busybox:latest", workdir: "/app" }, {
    runId: `harbor-unit-${crypto.randomUUID().slice(0, 8)}`,
  });
  await runtime.start();
  return runtime as Runtime & AsyncDisposable;
}

function hookContext(task: HarborTask, runtime: Runtime) {
  return {
    runtime,
    task,
    data: task.data,
    trace: { info: {} as Record<string, unknown>, messages: [], artifacts: new Map() },
    state: {},
  };
}

Deno.test("HarborTask.score() in Docker: tests/ arrives only when grading starts, test.sh runs with the verifier's env, reward.json's named rewards without a reward key are summed", async () => {
  await using dir = await tempDir();
  await write(
    dir.path,
    folder("json", '[verifier]\nenv = { BONUS = "0.25" }\n', {
      "tests/test.sh":
        '#!/bin/sh\necho "graded with $BONUS"\nprintf \'{"correct": 1, "style": %s}\' "$BONUS" > /logs/verifier/reward.json\n',
      "tests/data/case.txt": "case\n",
    }),
  );
  const task = await loadHarborTask(join(dir.path, "json"));
  await using runtime = await sandbox();
  assert.notEqual(
    (await runtime.run(["test", "-e", "/tests"])).exit_code,
    0,
    "the agent's sandbox has no tests",
  );
  const ctx = hookContext(task, runtime);
  const scores = await task.score(ctx);
  assert.equal(scores.reward, 1.25);
  assert.deepEqual(scores.rewards, { correct: 1, style: 0.25 });
  assert.deepEqual(ctx.trace.info.verifier, {
    exit_code: 0,
    output: "graded with 0.25\n",
    reward_file: "reward.json",
  });
  assert.equal((await runtime.run(["cat", "/tests/data/case.txt"])).stdout, "case\n");
});

Deno.test('HarborTask.score() in Docker: reward.json wins over reward.txt, as Harbor reads them, and its "reward" key is the reward; a stale reward from before grading is cleared; a reward that is not a number, bad JSON or no reward file is a TaskError', async () => {
  await using dir = await tempDir();
  const verifier = (body: string) => ({ "tests/test.sh": `#!/bin/sh\n${body}\n` });
  await write(
    dir.path,
    folder(
      "r",
      "",
      verifier(
        "echo 0.5 > /logs/verifier/reward.txt; echo '{\"x\":1}' > /logs/verifier/reward.json",
      ),
    ),
  );
  await using runtime = await sandbox();
  const score = async () => {
    const task = await loadHarborTask(join(dir.path, "r"));
    return await task.score(hookContext(task, runtime));
  };
  assert.deepEqual(await score(), { reward: 1, rewards: { x: 1 }, metrics: {}, weights: {} });

  // Named rewards beside a "reward" key (Harbor 1.3), and a reward.txt too: the trial's reward is
  // reward.json's "reward" key, the other keys are kept with weight 0, and the trace says which
  // file was read and which was not.
  await write(
    dir.path,
    folder(
      "r",
      "",
      verifier(
        "echo 1 > /logs/verifier/reward.txt; " +
          'echo \'{"reward": 0.5, "style": 1, "lint": 0.25}\' > /logs/verifier/reward.json',
      ),
    ),
  );
  {
    const task = await loadHarborTask(join(dir.path, "r"));
    const ctx = hookContext(task, runtime);
    assert.deepEqual(await task.score(ctx), {
      reward: 0.5,
      rewards: { reward: 0.5, style: 1, lint: 0.25 },
      metrics: {},
      weights: { reward: 1, style: 0, lint: 0 },
    });
    const info = ctx.trace.info.verifier as Record<string, unknown>;
    assert.equal(info.reward_file, "reward.json");
    assert.equal(info.unread_reward_file, "reward.txt");
  }
  // reward.txt alone: one reward, named "reward".
  await write(dir.path, folder("r", "", verifier("echo 0.75 > /logs/verifier/reward.txt")));
  {
    const task = await loadHarborTask(join(dir.path, "r"));
    const ctx = hookContext(task, runtime);
    assert.deepEqual(await task.score(ctx), {
      reward: 0.75,
      rewards: { reward: 0.75 },
      metrics: {},
      weights: { reward: 1 },
    });
    const info = ctx.trace.info.verifier as Record<string, unknown>;
    assert.equal(info.reward_file, "reward.txt");
    assert.equal(info.unread_reward_file, undefined);
  }

  // The agent wrote a reward of its own; the verifier writes none.
  await runtime.run(["sh", "-c", "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"]);
  await write(dir.path, folder("r", "", verifier("exit 4")));
  await assert.rejects(
    score(),
    (e: Error) =>
      e instanceof TaskError &&
      e.message ===
        "The verifier (tests/test.sh, exit 4) wrote no reward: neither /logs/verifier/reward.txt nor reward.json",
  );
  await write(dir.path, folder("r", "", verifier("echo passed > /logs/verifier/reward.txt")));
  await assert.rejects(
    score(),
    (e: Error) =>
      e instanceof TaskError &&
      e.message === '/logs/verifier/reward.txt holds "passed", not a number',
  );
  await write(dir.path, folder("r", "", verifier("echo '{oops' > /logs/verifier/reward.json")));
  await assert.rejects(score(), /reward\.json is not JSON/);
  await write(
    dir.path,
    folder("r", "", verifier('echo \'{"a": "1"}\' > /logs/verifier/reward.json')),
  );
  await assert.rejects(score(), /reward\.json: "a" is not a number/);
  // Never a reward of 0 made up from a file that names none.
  await write(dir.path, folder("r", "", verifier("echo 0.7 > /logs/verifier/reward.json")));
  await assert.rejects(score(), /reward\.json holds 0\.7, not an object of named rewards/);
  await write(dir.path, folder("r", "", verifier("echo '{}' > /logs/verifier/reward.json")));
  await assert.rejects(score(), /reward\.json holds no rewards/);
});

Deno.test("HarborTask.validate() in Docker: solution/ is copied to /solution and solve.sh runs with the solution's env; a failing or missing solve.sh is an error", async () => {
  await using dir = await tempDir();
  await write(
    dir.path,
    folder("gold", '[solution]\nenv = { WORD = "right" }\n', {
      "solution/solve.sh":
        '#!/bin/sh\necho "$WORD" > /app/out.txt\ncat /solution/extra.txt >> /app/out.txt\n',
      "solution/extra.txt": "extra\n",
    }),
  );
  await using runtime = await sandbox();
  const task = await loadHarborTask(join(dir.path, "gold"));
  assert.equal(await task.validate(hookContext(task, runtime)), true);
  assert.equal((await runtime.run(["cat", "/app/out.txt"])).stdout, "right\nextra\n");

  await write(dir.path, { "gold/solution/solve.sh": "#!/bin/sh\necho broken >&2\nexit 2\n" });
  await assert.rejects(
    task.validate(hookContext(task, runtime)),
    (e: Error) => e instanceof TaskError && /^solution\/solve\.sh exited 2: broken/.test(e.message),
  );
  await Deno.remove(join(dir.path, "gold", "solution"), { recursive: true });
  await assert.rejects(
    task.validate(hookContext(task, runtime)),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message === `${task.folder}: solution/solve.sh is missing; vf validate needs it`,
  );
});

Deno.test("loadHarborTask(): a [[steps]] task loads as a multi-step task (step one's instruction is the prompt, the agent limit the steps' summed), each step's instruction checked, and what vf cannot keep per step refused by key", async () => {
  await using dir = await tempDir();
  // `step` goes into step two's table, `agent` into its [steps.agent].
  const toml = (step = "", agent = "") =>
    `schema_version = "1.3"\n[environment]\ndocker_image = "busybox:latest"\n[[steps]]\nname = "one"\n[steps.agent]\ntimeout_sec = 10\n[[steps]]\nname = "two"\n${step}[steps.agent]\ntimeout_sec = 20\n${agent}`;
  await write(dir.path, {
    "multi/task.toml": toml(),
    "multi/steps/one/instruction.md": "first\n",
    "multi/tests/test.sh": "exit 0\n",
  });
  const folder = join(dir.path, "multi");
  await assert.rejects(
    () => loadHarborTask(folder),
    (e: Error) =>
      e.message === `${join(folder, "steps", "two", "instruction.md")}: missing; ` +
          `step "two" needs its instruction`,
  );
  await write(dir.path, { "multi/steps/two/instruction.md": "second\n" });
  const task = await loadHarborTask(folder);
  assert.ok(task instanceof HarborStepsTask);
  assert.equal(task.scriptsUser, true, "its steps are the user's turns");
  assert.equal(task.data.prompt, "first\n");
  assert.deepEqual(task.steps.map((s) => [s.name, s.instruction]), [["one", "first\n"], [
    "two",
    "second\n",
  ]]);
  assert.equal(task.data.timeout?.agent, 30);
  const refusals: Array<[string, string, RegExp]> = [
    [
      'artifacts = ["/app/x"]\n',
      "",
      /steps\[1\]\.artifacts: vf collects artifacts once, after the last step/,
    ],
    [
      '[steps.verifier]\nenvironment_mode = "separate"\n',
      "",
      /steps\[1\]\.verifier\.environment_mode: vf runs a multi-step task's verifiers in the agent's sandbox/,
    ],
    ["", 'user = "bob"\n', /steps\[1\]\.agent\.user: vf runs every step as the task's agent user/],
    [
      "",
      'network_mode = "public"\n',
      /steps\[1\]\.agent\.network_mode: vf keeps one agent network/,
    ],
  ];
  for (const [step, agent, want] of refusals) {
    await write(dir.path, { "multi/task.toml": toml(step, agent) });
    await assert.rejects(() => loadHarborTask(folder), want, `${step}${agent}`);
  }
});

Deno.test("rollUp(): mean takes each reward key's mean over the verified steps (a key a step lacks counts 0), final the last verified step's rewards as they are", () => {
  const steps: Parameters<typeof rollUp>[0] = [
    { name: "a", reward: 1, rewards: { reward: 1, style: 1 }, messages: [0, 2] },
    { name: "b", reward: 0, rewards: { reward: 0 }, messages: [2, 4] },
  ];
  assert.deepEqual(rollUp(steps, "mean"), {
    reward: 0.5,
    rewards: { reward: 0.5, style: 0.5 },
    metrics: { steps_verified: 2 },
    // The reward is the "reward" key; style is kept beside it, not added to it.
    weights: { reward: 1, style: 0 },
  });
  assert.deepEqual(rollUp(steps, "final").rewards, { reward: 0 });
  assert.equal(
    rollUp([{ name: "a", reward: 3, rewards: { x: 1, y: 2 }, messages: [0, 2] }], "final").reward,
    3,
  );
  assert.throws(() => rollUp([], "mean"), (e: Error) => e instanceof TaskError);
});

Deno.test("readHarborSettings(): a step's timeouts are typed as the task's: numeric strings (also with an exponent) are numbers, anything else names the step's key, and a step without one takes the task's, else Harbor's 600 s verifier default", () => {
  const steps = (one: string, two = "") =>
    `[[steps]]\nname = "one"\n${one}[[steps]]\nname = "two"\n${two}`;
  const typed = readHarborSettings(
    steps(
      '[steps.agent]\ntimeout_sec = "5"\n[steps.verifier]\ntimeout_sec = " 7.5 "\n',
      '[steps.agent]\ntimeout_sec = "1.5e2"\n',
    ),
    PATH,
  );
  assert.deepEqual(typed.steps.map((s) => [s.agent.timeout, s.verifier.timeout]), [
    [5, 7.5],
    [150, HARBOR_DEFAULTS.verifierTimeout],
  ]);
  const inherited = readHarborSettings(
    `[agent]\ntimeout_sec = "40"\n[verifier]\ntimeout_sec = 30\n${steps("")}`,
    PATH,
  );
  assert.deepEqual(inherited.steps.map((s) => [s.agent.timeout, s.verifier.timeout]), [
    [40, 30],
    [40, 30],
  ]);
  for (
    const [one, two, key, shown] of [
      ['[steps.agent]\ntimeout_sec = "soon"\n', "", "steps[0].agent.timeout_sec", '"soon"'],
      ["", "[steps.verifier]\ntimeout_sec = 0\n", "steps[1].verifier.timeout_sec", "0"],
      ["", "[steps.agent]\ntimeout_sec = [5]\n", "steps[1].agent.timeout_sec", "[5]"],
      ['[steps.verifier]\ntimeout_sec = "inf"\n', "", "steps[0].verifier.timeout_sec", '"inf"'],
      ['[steps.agent]\ntimeout_sec = "5s"\n', "", "steps[0].agent.timeout_sec", '"5s"'],
    ] as const
  ) {
    assert.throws(
      () => readHarborSettings(steps(one, two), PATH),
      (e: Error) =>
        e instanceof ConfigError &&
        e.message.startsWith(`${PATH}: ${key}: ${shown} is not a positive number`),
    );
  }
});
