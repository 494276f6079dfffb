/**
 * End-to-end tests of sandboxed tasks: `vf validate`, `vf run`, `vf eval @ file.toml` with an
 * `[env.taskset]` table and `vf cleanup` run as real CLI subprocesses against the real Docker
 * engine and a real OpenAI-compatible model server on loopback (tests/model_server.ts), whose
 * scripted "model" drives the bash harness with tool calls. The tests assert on exit codes,
 * traces.jsonl, config.json, metadata.json and the containers left in the engine. Artifact
 * transfer between two sandboxes is also tested through the library API.
 * @module
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { basename, join } from "node:path";
import {
  cleanupContainers,
  collectArtifacts,
  createRuntime,
  loadTraces,
  restoreArtifacts,
  Task,
  TaskError,
  type TaskTrace,
} from "../mod.ts";
import {
  bashModel,
  type ModelServer,
  type Reply,
  type Responder,
  startModelServer,
  textReply,
  toolCallReply,
} from "./model_server.ts";
import { cliCommand, type CliResult, collect, MOD_URL, transcript } from "./_cli.ts";
import { EngineEvents } from "./_engine_events.ts";

const DOCKER_SOCKET = "/var/run/docker.sock";
const MODEL = "vf-test";

// ---------------------------------------------------------------------------------------
// Running the CLI

/** The CLI with a bare environment (no OPENAI_* variables leak in) plus DOCKER_HOST. */
function spawnCli(
  args: string[],
  cwd: string,
  env: Record<string, string> = {},
  stdout: "piped" | "null" = "piped",
): Deno.ChildProcess {
  return cliCommand(args, { cwd, env, stdout, registry: false, docker: true }).spawn();
}

/** The run directory a `vf run` / `vf eval @` announced on stderr. */
function announcedRunDir(stderr: string): string | null {
  return /^Saving traces to (.+)$/m.exec(stderr)?.[1] ?? null;
}

// ---------------------------------------------------------------------------------------
// Engine queries that do not go through vf's own Docker client

interface ContainerSummary {
  Id: string;
  State: string;
  Labels: Record<string, string>;
}

/** Containers labelled `vf.managed=1` (and `vf.run_id=<runId>`), straight from the Engine API. */
/** Tags of the images labelled with a run's id (fork_group snapshots). */
async function runImages(runId: string): Promise<string[]> {
  const client = Deno.createHttpClient({ proxy: { transport: "unix", path: DOCKER_SOCKET } });
  try {
    const filters = encodeURIComponent(JSON.stringify({ label: [`vf.run_id=${runId}`] }));
    const res = await fetch(`http://docker/images/json?filters=${filters}`, { client });
    assert.equal(res.status, 200, `listing images failed: ${await res.clone().text()}`);
    return (await res.json()).flatMap((i: { RepoTags?: string[] }) => i.RepoTags ?? []);
  } finally {
    client.close();
  }
}

async function managedContainers(runId: string): Promise<ContainerSummary[]> {
  const client = Deno.createHttpClient({ proxy: { transport: "unix", path: DOCKER_SOCKET } });
  try {
    const filters = encodeURIComponent(
      JSON.stringify({ label: ["vf.managed=1", `vf.run_id=${runId}`] }),
    );
    const res = await fetch(`http://docker/containers/json?all=1&filters=${filters}`, { client });
    assert.equal(res.status, 200, `listing containers failed: ${await res.clone().text()}`);
    return await res.json();
  } finally {
    client.close();
  }
}

// ---------------------------------------------------------------------------------------
// A scenario: a temp dir, CLI runs inside it, and cleanup of every run's containers

// deno-lint-ignore no-explicit-any
type Json = any;

interface TaskRun {
  dir: string;
  runId: string;
  /** The raw text of traces.jsonl. */
  text: string;
  traces: Json[];
  config: Json;
  configText: string;
  metadata: Json;
}

class Scenario implements AsyncDisposable {
  readonly path: string;
  readonly runIds = new Set<string>();

  constructor(path: string) {
    this.path = path;
  }

  /** Run the CLI in this scenario's temp dir; remembers the run id it announces. */
  async cli(args: string[], env: Record<string, string> = {}): Promise<CliResult> {
    const res = await collect(spawnCli(args, this.path, env));
    const dir = announcedRunDir(res.stderr);
    if (dir) this.runIds.add(basename(dir));
    return res;
  }

  /** Write a file into the temp dir; returns its absolute path. */
  async file(name: string, text: string): Promise<string> {
    const path = join(this.path, name);
    await Deno.writeTextFile(path, text);
    return path;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await Promise.all([...this.runIds].map((runId) => cleanupContainers({ runId })));
    await Deno.remove(this.path, { recursive: true });
  }
}

async function scenario(): Promise<Scenario> {
  return new Scenario(await Deno.makeTempDir({ prefix: "vf_tasks_" }));
}

/** Read a run directory; every traces line must be complete, newline-terminated JSON. */
async function readTaskRun(dir: string): Promise<TaskRun> {
  const text = await Deno.readTextFile(join(dir, "traces.jsonl"));
  assert.ok(text.endsWith("\n"), `traces.jsonl ends mid-line:\n${text.slice(-200)}`);
  const lines = text.split("\n").filter((l) => l !== "").map((line) => JSON.parse(line));
  // A single-agent run writes one trace per line; other Envs write episodes holding traces.
  const traces = lines.flatMap((l) => (l.kind === "episode" ? l.traces : [l]));
  const configText = await Deno.readTextFile(join(dir, "config.json"));
  return {
    dir,
    runId: basename(dir),
    text,
    traces,
    config: JSON.parse(configText),
    configText,
    metadata: JSON.parse(await Deno.readTextFile(join(dir, "metadata.json"))),
  };
}

/** The run a successful CLI invocation wrote. */
/**
 * The run a `vf run` wrote. It exits 0, or 1 exactly when every rollout errored (checked
 * against the traces and the message).
 */
async function runOf(res: CliResult): Promise<TaskRun> {
  const dir = announcedRunDir(res.stderr);
  assert.ok(dir, `no "Saving traces to" line:\n${transcript(res)}`);
  const run = await readTaskRun(dir);
  const failed = run.traces.filter((t) => t.error).length;
  if (run.traces.length > 0 && failed === run.traces.length) {
    assert.equal(res.code, 1, transcript(res));
    assert.match(
      res.stderr,
      new RegExp(`error: every rollout errored \\(${failed} of ${failed}\\)`),
    );
  } else {
    assert.equal(res.code, 0, transcript(res));
  }
  return run;
}

function byKey(traces: Json[]): Json[] {
  return [...traces].sort((a, b) =>
    a.task.key.localeCompare(b.task.key) || a.rollout_index - b.rollout_index
  );
}

function describeTrace(trace: Json): string {
  return JSON.stringify(
    { key: trace.task.key, reward: trace.reward, error: trace.error, tools: trace.tool_calls },
    null,
    1,
  );
}

// ---------------------------------------------------------------------------------------
// Scripted models

interface Turn {
  /** Assistant messages so far, i.e. the 0-based model turn of this rollout. */
  turn: number;
  /** The text of every tool result so far. */
  toolOutputs: string[];
  /** The first user message. */
  prompt: string;
}

/** A model whose reply depends on the rollout's turn and what the tools returned. */
function agentModel(step: (turn: Turn) => Reply): Responder {
  return ({ body }) => {
    const turn = body.messages.filter((m) => m.role === "assistant").length;
    const toolOutputs = body.messages.filter((m) => m.role === "tool").map((m) =>
      typeof m.content === "string" ? m.content : ""
    );
    const prompt = body.messages.find((m) => m.role === "user")?.content;
    return step({ turn, toolOutputs, prompt: typeof prompt === "string" ? prompt : "" });
  };
}

/** `vf run <target>` against `server`, writing under `./out`, plus `flags`. */
function vfRun(target: string, server: ModelServer, ...flags: string[]): string[] {
  return ["run", target, "-m", MODEL, "-b", server.url, "-o", "out", ...flags];
}

const CAT_INPUT = "cat /app/input.txt";
const WRITE_SUM = "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt";

/** Solves file-sum: reads the input, then computes and writes the sum with awk. */
const fileSumModel = () => bashModel(CAT_INPUT, WRITE_SUM);

async function modelServer(responder: Responder, apiKey?: string): Promise<ModelServer> {
  return await startModelServer({ responder, apiKey });
}

// ---------------------------------------------------------------------------------------
// Tasksets written by the tests

/** A taskset whose gold answer scores 0, so `vf validate` must fail it. */
const BAD_GOLD_TASKSET = `
import { readText, reward, Task, type TaskHookContext, Taskset } from "${MOD_URL}";

class BadGoldTask extends Task {
  static override NEEDS_CONTAINER = true;
  override async setup({ runtime }: TaskHookContext) {
    await runtime.write("/app/answer.txt", "");
  }
  correct = reward(async ({ runtime }) =>
    (await readText(runtime, "/app/answer.txt")).trim() === "42" ? 1 : 0
  );
  override async validate({ runtime }: TaskHookContext) {
    await runtime.write("/app/answer.txt", "41\\n"); // off by one
  }
}

class BadGoldTaskset extends Taskset {
  get id() {
    return "bad-gold";
  }
  load() {
    return [new BadGoldTask({ id: "bad-gold-0", prompt: "Write 42 to /app/answer.txt", image: "busybox:latest", workdir: "/app" })];
  }
}

export function loadTaskset(config: Record<string, unknown>) {
  return new BadGoldTaskset(config);
}
`;

/** A grader that trusts an exit code: a script that exits 0 passes whatever it does. */
const GAMEABLE_TASKSET = `
import { readText, reward, Task, type TaskHookContext, Taskset } from "${MOD_URL}";

class ExitCodeTask extends Task {
  static override NEEDS_CONTAINER = true;
  override async setup({ runtime }: TaskHookContext) {
    await runtime.write("/app/solve.sh", "exit 1\\n", { mode: 0o755 });
  }
  correct = reward(async ({ runtime }) =>
    (await runtime.run(["sh", "/app/solve.sh"])).exit_code === 0 ? 1 : 0
  );
  override async validate({ runtime }: TaskHookContext) {
    await runtime.write("/app/solve.sh", "echo 42 > /app/answer.txt\\n", { mode: 0o755 });
  }
}

class GameableTaskset extends Taskset {
  get id() {
    return "gameable";
  }
  load() {
    return [new ExitCodeTask({
      id: "exit-code-0",
      prompt: "Write /app/solve.sh so that it writes 42 to /app/answer.txt",
      image: "busybox:latest",
      workdir: "/app",
      scoring: { mode: "isolated" },
      artifacts: [{ source: "/app/solve.sh" }],
    })];
  }
}

export function loadTaskset(config: Record<string, unknown>) {
  return new GameableTaskset(config);
}
`;

/** A reward written as a plain method: nothing would ever score these tasks above 0. */
const METHOD_REWARD_TASKSET = `
import { Task, type TaskHookContext, Taskset } from "${MOD_URL}";

class MethodRewardTask extends Task {
  async correct(_ctx: TaskHookContext) {
    return 1;
  }
}

class MethodRewardTaskset extends Taskset {
  get id() {
    return "method-reward";
  }
  load() {
    return [new MethodRewardTask({ id: "m-0", prompt: "Say hi" })];
  }
}

export function loadTaskset(config: Record<string, unknown>) {
  return new MethodRewardTaskset(config);
}
`;

/**
 * Tasks for artifacts, agent_user, scoring env and the subprocess runtime; `[env.taskset]
 * variant` picks which.
 */
const CUSTOM_TASKSET = `
import { metric, readText, reward, type Runtime, Task, type TaskHookContext, Taskset } from "${MOD_URL}";

async function exists(runtime: Runtime, path: string) {
  return (await runtime.run(["test", "-e", path])).exit_code === 0;
}

async function sha256(text: string) {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Writes /app/out in finalize, i.e. only in the agent sandbox: the grader gets it as an artifact. */
class OutputsTask extends Task {
  static override NEEDS_CONTAINER = true;
  override async finalize({ runtime }: TaskHookContext) {
    await runtime.write("/app/out/keep.txt", "kept\\n");
    await runtime.write("/app/out/debug.log", "log\\n");
    await runtime.write("/app/out/cache/blob.bin", "x".repeat(Number(this.data.blob_bytes ?? 16)));
    await runtime.write("/logs/artifacts/note.txt", "collected without being declared\\n");
  }
  kept = reward(async ({ runtime }) => (await exists(runtime, "/app/out/keep.txt")) ? 1 : 0);
  cache_present = metric(async ({ runtime }) => (await exists(runtime, "/app/out/cache")) ? 1 : 0);
  log_present = metric(async ({ runtime }) => (await exists(runtime, "/app/out/debug.log")) ? 1 : 0);
  nope_present = metric(async ({ runtime }) => (await exists(runtime, "/app/nope")) ? 1 : 0);
  logs_note = metric(async ({ runtime }) => (await exists(runtime, "/logs/artifacts/note.txt")) ? 1 : 0);
}

class AgentUserTask extends Task {
  static override NEEDS_CONTAINER = true;
  wrote = reward(async ({ runtime }) =>
    (await readText(runtime, "/app/output/x.txt")).trim() === "hello" ? 1 : 0
  );
}

/** Scores 1 when the grading sandbox sees $SECRET_X with the sha256 given as task config. */
class SecretTask extends Task {
  static override NEEDS_CONTAINER = true;
  #seen = async (runtime: Runtime) =>
    (await runtime.run(["sh", "-c", 'printf %s "$SECRET_X"'])).stdout;
  saw_secret = reward(async ({ runtime }) =>
    (await sha256(await this.#seen(runtime))) === this.config.expect_sha ? 1 : 0
  );
  used_fallback = metric(async ({ runtime }) => (await this.#seen(runtime)) === "fallback" ? 1 : 0);
}

/** No image, no NEEDS_CONTAINER: the subprocess runtime may run it. */
class PlainTask extends Task {
  override async setup({ runtime }: TaskHookContext) {
    await runtime.write("/app/input.txt", "1\\n2\\n3\\n");
  }
  correct = reward(async ({ runtime }) =>
    (await readText(runtime, "/app/answer.txt")).trim() === "6" ? 1 : 0
  );
}

const base = { prompt: "Do the task.", image: "busybox:latest", workdir: "/app" };

class CustomTaskset extends Taskset {
  get id() {
    return "custom-" + String(this.config.variant);
  }
  load(): Task[] {
    const isolated = { mode: "isolated" as const };
    switch (this.config.variant) {
      case "artifacts":
        return [
          new OutputsTask({ ...base, id: "required-missing", scoring: isolated,
            artifacts: [{ source: "/app/out" }, { source: "/app/nope" }] }),
          new OutputsTask({ ...base, id: "optional-missing", scoring: isolated,
            artifacts: [{ source: "/app/out" }, { source: "/app/nope", required: false }] }),
          new OutputsTask({ ...base, id: "excluded", scoring: isolated,
            artifacts: [{ source: "/app/out", exclude: ["cache", "*.log"] }] }),
          new OutputsTask({ ...base, id: "too-big", scoring: isolated, blob_bytes: 8192,
            artifact_max_bytes: 4096, artifacts: [{ source: "/app/out" }] }),
        ];
      case "relative":
        return [new OutputsTask({ ...base, id: "relative", scoring: isolated, artifacts: [{ source: "out" }] })];
      case "agent-user":
        return [new AgentUserTask({ ...base, id: "agent-user", agent_user: "nobody",
          artifacts: [{ source: "/app/output" }] })];
      case "secret":
        return [new SecretTask({ ...base, id: "secret", scoring: isolated },
          { expect_sha: this.config.expect_sha })];
      case "plain":
        return [new PlainTask({ id: "plain", prompt: "Sum input.txt into answer.txt.", workdir: "/app" })];
      default:
        throw new Error("unknown variant " + String(this.config.variant));
    }
  }
}

export function loadTaskset(config: Record<string, unknown>) {
  return new CustomTaskset(config);
}
`;

// ---------------------------------------------------------------------------------------
// vf validate

Deno.test("vf validate passes file-sum and py-grader, fails a wrong gold answer, and refuses the subprocess runtime for container tasks", async () => {
  await using s = await scenario();
  const badGold = await s.file("bad_gold.ts", BAD_GOLD_TASKSET);
  const [fileSum, pyGrader, bad, subprocess] = await Promise.all([
    s.cli(["validate", "file-sum"]),
    s.cli(["validate", "py-grader"]),
    s.cli(["validate", badGold]),
    s.cli(["validate", "file-sum", "--runtime.type", "subprocess"]),
  ]);
  const summaryOf = (res: CliResult) => JSON.parse(res.stdout.trim().split("\n").at(-1)!);

  for (
    const [res, prefix, count] of [[fileSum, "file-sum", 5], [pyGrader, "py-grader", 4]] as const
  ) {
    assert.equal(res.code, 0, transcript(res));
    assert.match(res.stdout, /^task\s+gold\s+untouched\s+result$/m);
    const rows = res.stdout.split("\n").filter((l) => l.startsWith(`${prefix}-`));
    assert.equal(rows.length, count, res.stdout);
    for (const row of rows) assert.match(row, /^\S+\s+1\.00\s+0\.00\s+ok$/, row);
    const summary = summaryOf(res);
    assert.deepEqual(
      [summary.taskset, summary.runtime, summary.tasks, summary.passed, summary.failed],
      [prefix, "docker", count, count, 0],
    );
  }

  assert.equal(bad.code, 1, transcript(bad));
  assert.match(bad.stdout, /^bad-gold-0\s+0\.00\s+0\.00\s+FAIL gold scored 0 \(expected 1\.0\)/m);
  assert.deepEqual([summaryOf(bad).passed, summaryOf(bad).failed], [0, 1]);

  assert.equal(subprocess.code, 1, transcript(subprocess));
  const results = summaryOf(subprocess).results as Json[];
  assert.equal(results.length, 5);
  for (const r of results) {
    assert.equal(r.ok, false);
    assert.match(r.error, /needs a container runtime/, r.error);
  }
  assert.equal(
    subprocess.stdout.split("\n").filter((l) => / FAIL .*needs a container runtime/.test(l)).length,
    5,
  );
});

Deno.test("vf validate under --limits.max_sandboxes: every sandbox it starts counts, gold graders beside their agents never deadlock, and a limit too small for a grader is named", async () => {
  await using s = await scenario();
  const events = new EngineEvents();
  let runs: CliResult[];
  try {
    await events.ready();
    runs = await Promise.all([
      s.cli(["validate", "file-sum", "-n", "2", "-c", "2", "--limits.max_sandboxes", "1"]),
      // Four checks at once would each hold an agent while two gradeSubmission graders wait.
      s.cli([
        "validate",
        "py-grader",
        "-n",
        "2",
        "-c",
        "2",
        "--probe",
        "--limits.max_sandboxes",
        "2",
      ]),
      s.cli(["validate", "py-grader", "-n", "1", "--limits.max_sandboxes", "1"]),
    ]);
  } finally {
    await events[Symbol.asyncDispose](); // the last events in, before they are read
  }
  const [fileSum, pyGrader, tooSmall] = runs;
  const summaryOf = (res: CliResult) => JSON.parse(res.stdout.trim().split("\n").at(-1)!);

  assert.equal(fileSum.code, 0, transcript(fileSum));
  const fileSumRun = summaryOf(fileSum).run_id;
  assert.match(fileSumRun, /^validate-/);
  // Two tasks, a gold and an untouched check each: four sandboxes, one at a time.
  assert.equal(events.of(fileSumRun).filter((e) => e.action === "create").length, 4);
  assert.equal(events.maxLive(fileSumRun), 1);

  assert.equal(pyGrader.code, 0, transcript(pyGrader));
  const pyRun = summaryOf(pyGrader).run_id;
  assert.deepEqual([summaryOf(pyGrader).passed, summaryOf(pyGrader).failed], [2, 0]);
  // Per task: gold agent + its grader, untouched agent, and an agent and a grader per probe.
  const probes = (summaryOf(pyGrader).results[0].probes as Json[]).length;
  assert.equal(
    events.of(pyRun).filter((e) => e.action === "create").length,
    2 * (3 + 2 * probes),
  );
  // The gold check's agent and grader are alive together, and nothing beyond them.
  assert.equal(events.maxLive(pyRun), 2);

  assert.equal(tooSmall.code, 1, transcript(tooSmall));
  const [result] = summaryOf(tooSmall).results as Json[];
  assert.match(
    result.error,
    /^ConfigError: limits\.max_sandboxes: grading task "py-grader-add"'s gold answer .* needs 2 docker sandboxes at once .* limit of 1/,
  );
  assert.deepEqual(await managedContainers(summaryOf(tooSmall).run_id), []);
});

const GRADED_ANYWAY_TASKSET = `
import { gradeSubmission, reward, Task, Taskset } from "${MOD_URL}";
class T extends Task {
  static override NEEDS_CONTAINER = true;
  override deploymentSpec() { return this.data.id === "broken" ? "missing-compose.yaml" : null; }
  ok = reward(async ({ runtime }) => {
    const r = await runtime.run(["cat", "/app/x"]);
    return r.stdout.trim() === "gold" ? 1 : 0;
  });
  // Shared scoring by default, yet the gold answer is graded in a fresh sandbox.
  override async validate(ctx) {
    await ctx.runtime.write("/app/x", "gold");
    await ctx.runtime.run(["sleep", "1"]);
    return await gradeSubmission(ctx);
  }
}
class S extends Taskset {
  get id() { return "graded-anyway"; }
  *load() {
    for (const id of ["a", "b", "broken"]) {
      yield new T({ id, prompt: "x", image: "busybox:latest", workdir: "/app", artifacts: [{ source: "/app/x" }] });
    }
  }
}
export function loadTaskset(config) { return new S(config); }
`;

Deno.test("vf validate under --limits: a gold check of a shared-scoring task that calls gradeSubmission never deadlocks, and a task with a broken Compose file fails alone", async () => {
  await using s = await scenario();
  const module = await s.file("graded_anyway.ts", GRADED_ANYWAY_TASKSET);
  const events = new EngineEvents();
  let res: CliResult;
  try {
    await events.ready();
    res = await s.cli(["validate", module, "-c", "3", "--limits.max_sandboxes", "2"]);
  } finally {
    await events[Symbol.asyncDispose]();
  }
  assert.equal(res.code, 1, transcript(res));
  const summary = JSON.parse(res.stdout.trim().split("\n").at(-1)!);
  const byTask = Object.fromEntries((summary.results as Json[]).map((r) => [r.task, r]));
  for (const ok of ["a", "b"]) {
    assert.deepEqual(
      [byTask[ok].gold_reward, byTask[ok].empty_reward, byTask[ok].ok],
      [1, 0, true],
      JSON.stringify(byTask[ok]),
    );
  }
  assert.equal(byTask.broken.ok, false);
  assert.match(byTask.broken.error, /Compose file "missing-compose\.yaml" cannot be read/);
  // Two gold checks each holding an agent while waiting for a grader would never end; each
  // took room for both first, and the run stayed within the limit.
  assert.equal(events.maxLive(summary.run_id), 2);
  assert.deepEqual(await managedContainers(summary.run_id), []);
});

// ---------------------------------------------------------------------------------------
// vf run

Deno.test("vf run file-sum with a grading warm pool: graders come started and unused, every reward is 1, the pool is in metadata", async () => {
  await using s = await scenario();
  await using server = await modelServer(fileSumModel());
  const res = await s.cli(vfRun(
    "file-sum",
    server,
    "-n",
    "2",
    "-r",
    "1",
    "--env.agent.scoring.runtime.warm_pool",
    "1",
  ));
  const run = await runOf(res);
  assert.match(res.stdout, /reward 1\.0000 {2}errors 0 of 2/);
  for (const t of run.traces) assert.deepEqual(t.scoring, { mode: "isolated", attempts: 1 });
  const pool = run.metadata.sandbox_pool;
  assert.equal(pool.grader_size, 1, JSON.stringify(pool));
  assert.equal(pool.fresh_graders, 0, JSON.stringify(pool));
  // Two agents started on demand (no agent pool) and two graders, at least one pre-started.
  assert.equal(pool.hits + pool.misses, 4, JSON.stringify(pool));
  assert.ok(pool.hits >= 1, JSON.stringify(pool));
  assert.deepEqual(await managedContainers(run.runId), []);
});

Deno.test("vf run file-sum --env.fork_group with a warm pool: one setup per task, the other rollouts start from its snapshot, isolated grading still scores 1, and no snapshot or container outlives the run", async () => {
  await using s = await scenario();
  await using server = await modelServer(fileSumModel());
  // With a warm pool too: members start unpooled, so no pool of the snapshot's shape is left.
  const res = await s.cli(
    vfRun(
      "file-sum",
      server,
      "-n",
      "2",
      "-r",
      "3",
      "--env.fork_group",
      "--env.agent.runtime.warm_pool",
      "1",
    ),
  );
  const run = await runOf(res);
  assert.match(res.stdout, /reward 1\.0000 {2}errors 0 of 6/);
  for (const key of new Set(run.traces.map((t: Json) => t.task.key))) {
    const group = run.traces.filter((t: Json) => t.task.key === key);
    const leaders = group.filter((t: Json) => !t.runtime.forked_from);
    assert.equal(leaders.length, 1, JSON.stringify(group.map((t: Json) => t.runtime)));
    for (const t of group) {
      if (t !== leaders[0]) assert.equal(t.runtime.forked_from, leaders[0].trace_id);
      assert.deepEqual(t.scoring, { mode: "isolated", attempts: 1 });
    }
  }
  assert.deepEqual(await managedContainers(run.runId), []);
  assert.deepEqual(await runImages(run.runId), []);
  // The record replays: members answer from their own records, setup from the leader's.
  const replay = await s.cli(["replay", announcedRunDir(res.stderr)!]);
  assert.equal(replay.code, 0, transcript(replay));
  assert.match(replay.stdout, /replayed 6 rollouts .*: 6 of 6 rewards as before/);
});

Deno.test("vf run file-sum: a model that sums with the bash tool scores 1 per task and every trace records the rollout", async () => {
  await using s = await scenario();
  await using server = await modelServer(fileSumModel());
  const res = await s.cli(vfRun("file-sum", server, "-n", "2", "-r", "1"));
  const run = await runOf(res);
  assert.equal(run.dir, join(s.path, "out", "evals", `file-sum--${MODEL}`, run.runId));
  assert.match(res.stdout, /reward 1\.0000 {2}errors 0 of 2/);

  const traces = byKey(run.traces);
  assert.deepEqual(traces.map((t) => t.task.key), ["file-sum-0", "file-sum-1"]);
  traces.forEach((t, i) => {
    assert.equal(t.reward, 1, describeTrace(t));
    assert.deepEqual(t.rewards, { correct: 1 });
    assert.equal(t.ok, true);
    assert.equal(t.error, null);
    assert.equal(t.run_id, run.runId);
    assert.equal(t.taskset, "file-sum");
    assert.equal(t.harness, "bash");
    assert.deepEqual(t.runtime, { type: "docker", image: "python:3.11-slim" });
    assert.deepEqual(t.scoring, { mode: "isolated", attempts: 1 });
    assert.equal(t.stop_condition, "no_tools_called");

    assert.deepEqual(
      t.messages.map((m: Json) => m.role),
      ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"],
    );
    assert.match(t.messages[1].content, /Sum the integers in \/app\/input\.txt/);
    assert.equal(t.messages.at(-1).content, "done");

    assert.equal(t.model_calls.length, 3);
    for (const call of t.model_calls) {
      assert.ok(call.response.usage.prompt_tokens > 0, JSON.stringify(call));
      assert.ok(call.response.usage.completion_tokens > 0, JSON.stringify(call));
      assert.equal(typeof call.duration_ms, "number");
    }
    assert.ok(t.usage.input_tokens > 0 && t.usage.output_tokens > 0, JSON.stringify(t.usage));

    assert.equal(t.tool_calls.length, 2);
    const [cat, awk] = t.tool_calls;
    assert.deepEqual([cat.name, JSON.parse(cat.arguments).command], ["bash", CAT_INPUT]);
    assert.deepEqual([awk.name, JSON.parse(awk.arguments).command], ["bash", WRITE_SUM]);
    assert.equal(cat.exit_code, 0);
    assert.equal(awk.exit_code, 0);
    const numbers = i === 0 ? "1\n2\n3\n" : "10\n20\n30\n40\n";
    assert.equal(cat.output, `exit code: 0\nstdout:\n${numbers}`);
    assert.equal(awk.output, "exit code: 0");

    for (
      const key of ["setup_ms", "agent_ms", "finalize_ms", "artifacts_ms", "scoring_ms", "total_ms"]
    ) {
      assert.equal(typeof t.timing[key], "number", `${key} in ${JSON.stringify(t.timing)}`);
    }
    assert.ok(t.timing.total_ms >= t.timing.setup_ms + t.timing.agent_ms + t.timing.scoring_ms);
  });

  // The model saw the bash and edit tools on every request.
  assert.equal(server.requests.length, 6);
  for (const req of server.requests) {
    assert.deepEqual(req.body.tools?.map((t) => t.function?.name), ["bash", "edit"]);
  }
  assert.equal(run.config.env.taskset.id, "file-sum");
  assert.equal(run.config.model, MODEL);
  assert.equal(run.config.client.base_url, server.url);
  assert.deepEqual(
    [
      run.metadata.run_id,
      run.metadata.num_rollouts,
      run.metadata.num_errors,
      run.metadata.avg_reward,
    ],
    [run.runId, 2, 0, 1],
  );
  assert.deepEqual(await managedContainers(run.runId), []);
});

Deno.test("py-grader: the agent cannot read the private tests, which score a correct solution 1 and a wrong one 0", async () => {
  await using s = await scenario();
  const solutions: Record<string, string> = {
    // A correct add(); a reverse_words() that does not reverse.
    "add(a, b)": "def add(a, b):\n    return a + b\n",
    "reverse_words(s)": "def reverse_words(s):\n    return s\n",
  };
  await using server = await modelServer(agentModel(({ turn, prompt }) => {
    const signature = Object.keys(solutions).find((sig) => prompt.includes(sig));
    if (turn === 0) return toolCallReply("bash", { command: "ls -la /tests; cat /tests/check.py" });
    if (turn === 1 && signature) {
      return toolCallReply("edit", {
        path: "/app/solution.py",
        old_str: "",
        new_str: solutions[signature],
      });
    }
    return textReply("done");
  }));
  const run = await runOf(
    await s.cli(vfRun("py-grader", server, "-n", "2")),
  );
  const [add, reverse] = byKey(run.traces);
  assert.equal(add.task.key, "py-grader-add");
  assert.equal(reverse.task.key, "py-grader-reverse_words");
  for (const t of [add, reverse]) {
    assert.equal(t.ok, true, describeTrace(t));
    assert.equal(t.scoring.mode, "isolated");
    const [peek, edit] = t.tool_calls;
    assert.notEqual(peek.exit_code, 0);
    assert.match(peek.output, /ls: cannot access '\/tests': No such file or directory/);
    assert.match(peek.output, /cat: \/tests\/check\.py: No such file or directory/);
    assert.equal(edit.name, "edit");
    assert.equal(edit.output, "edited /app/solution.py");
    assert.equal(edit.error, undefined);
  }
  assert.equal(add.reward, 1, describeTrace(add));
  assert.match(add.info.grader_output, /3\/3 passed/);
  assert.equal(reverse.reward, 0, describeTrace(reverse));
  assert.deepEqual(reverse.rewards, { tests_pass: 0 });
  assert.match(
    reverse.info.grader_output,
    /reverse_words\('hello world',\): got 'hello world', want 'world hello'/,
  );
  // The grader's script never reached the model.
  for (const req of server.requests) {
    assert.doesNotMatch(JSON.stringify(req.body), /CASES|spec_from_file_location/);
  }
});

Deno.test("scoring mode: --env.agent.scoring.mode shared overrides the task's isolated default, and vf eval @ reads the seed's file-sum.toml", async () => {
  await using s = await scenario();
  await using server = await modelServer(fileSumModel(), "test-key");
  const toml = await s.file(
    "file-sum.toml",
    `model = "z-ai/glm-5.2"

[env.taskset]
id = "file-sum"

[env.agent.harness]
id = "bash"

[env.agent.runtime]
type = "docker"
cpu = 1
memory = 1

[env.agent.scoring]
mode = "isolated"

[env.agent.scoring.runtime]
type = "docker"
image = "python:3.11-slim"
cpu = 1
memory = 1

[client]
base_url = "${server.url}"
api_key_var = "VF_TEST_KEY"
`,
  );
  const env = { VF_TEST_KEY: "test-key" };
  const [shared, fromToml] = await Promise.all([
    s.cli(
      vfRun(
        "file-sum",
        server,
        "-n",
        "1",
        "-k",
        "VF_TEST_KEY",
        "--env.agent.scoring.mode",
        "shared",
      ),
      env,
    ),
    s.cli(["eval", "@", toml, "-n", "1", "-r", "2", "-o", "out"], env),
  ]);

  const sharedRun = await runOf(shared);
  assert.equal(sharedRun.traces.length, 1);
  const [t] = sharedRun.traces;
  assert.equal(t.reward, 1, describeTrace(t));
  assert.deepEqual(t.scoring, { mode: "shared", attempts: 1 });
  assert.equal(t.timing.artifacts_ms, undefined, "shared scoring collects no artifacts");
  assert.equal(sharedRun.config.env.agent.scoring.mode, "shared");

  const tomlRun = await runOf(fromToml);
  assert.equal(tomlRun.dir, join(s.path, "out", "evals", "file-sum--z-ai--glm-5.2", tomlRun.runId));
  const traces = byKey(tomlRun.traces);
  assert.deepEqual(traces.map((x) => [x.task.key, x.rollout_index]), [["file-sum-0", 0], [
    "file-sum-0",
    1,
  ]]);
  for (const x of traces) {
    assert.equal(x.reward, 1, describeTrace(x));
    assert.equal(x.model, "z-ai/glm-5.2");
    assert.deepEqual(x.scoring, { mode: "isolated", attempts: 1 });
  }
  assert.deepEqual(tomlRun.config.env.agent.scoring.runtime, {
    type: "docker",
    image: "python:3.11-slim",
    cpu: 1,
    memory: 1,
  });
  assert.deepEqual(tomlRun.config.env.agent.runtime, { type: "docker", cpu: 1, memory: 1 });
  assert.equal(tomlRun.metadata.rollouts_per_task, 2);
  assert.deepEqual(Object.keys(tomlRun.metadata.pass_at_k), ["1", "2"]);
  // Every request carried the key from api_key_var; the TOML model went out on the wire.
  const models = new Set(server.requests.map((r) => r.body.model));
  assert.deepEqual(models, new Set([MODEL, "z-ai/glm-5.2"]));
  for (const r of server.requests) assert.equal(r.headers.authorization, "Bearer test-key");
});

Deno.test("a grading sandbox that cannot start is retried in fresh sandboxes and recorded as an infrastructure error, never reward 0", async () => {
  await using s = await scenario();
  await using server = await modelServer(fileSumModel());
  const args = vfRun(
    "file-sum",
    server,
    "-n",
    "1",
    "--env.agent.scoring.runtime.image",
    "does-not-exist:latest",
  );
  const [retried, once] = await Promise.all([
    s.cli(args),
    s.cli([...args, "--env.agent.scoring.retries", "0"]),
  ]);
  for (const [res, attempts] of [[retried, 3], [once, 1]] as const) {
    const run = await runOf(res);
    assert.match(res.stdout, /errors 1 of 1/);
    const [t] = run.traces;
    assert.equal(t.scoring.attempts, attempts, describeTrace(t));
    assert.equal(t.ok, false);
    assert.equal(t.reward, null);
    assert.deepEqual(t.rewards, {});
    assert.equal(t.error.error, "InfraError");
    assert.equal(t.error.phase, "scoring");
    assert.match(t.error.message, new RegExp(`Grading failed in ${attempts} fresh sandbox`));
    assert.match(t.error.message, /does-not-exist:latest/);
    // The agent did its work; only grading infrastructure failed.
    assert.deepEqual(t.tool_calls.map((c: Json) => c.exit_code), [0, 0]);
    assert.equal(run.metadata.num_errors, 1);
    assert.deepEqual(await managedContainers(run.runId), []);
  }
});

// ---------------------------------------------------------------------------------------
// Artifacts

Deno.test("artifacts: a missing required artifact fails the rollout, a missing optional one does not, exclude globs stay out of the grader, /logs/artifacts travels, relative paths need a shared workdir, and artifact_max_bytes is enforced", async () => {
  await using s = await scenario();
  const module = await s.file("custom_tasks.ts", CUSTOM_TASKSET);
  await using server = await modelServer(() => textReply("done"));
  const args = vfRun(module, server, "--env.taskset.variant");
  const [artifacts, relative, relativeElsewhere, noGrader] = await Promise.all([
    s.cli([...args, "artifacts"]),
    s.cli([...args, "relative"]),
    s.cli([...args, "relative", "--env.agent.scoring.runtime.workdir", "/elsewhere"]),
    // Graders that cannot start, while the artifacts are being collected.
    s.cli([...args, "artifacts", "--env.agent.scoring.runtime.image", "vf-no-such-image:1"]),
  ]);
  const run = await runOf(artifacts);
  const traces = Object.fromEntries(run.traces.map((t: Json) => [t.task.key, t]));
  assert.deepEqual(Object.keys(traces).sort(), [
    "excluded",
    "optional-missing",
    "required-missing",
    "too-big",
  ]);

  const required = traces["required-missing"];
  assert.equal(required.ok, false);
  assert.equal(required.reward, null);
  assert.deepEqual(
    [required.error.error, required.error.phase, required.error.message],
    ["TaskError", "artifacts", 'Required artifact "/app/nope" is missing in the agent sandbox'],
  );
  // The grader started while the artifacts were being collected is removed with the rest.
  assert.deepEqual(await managedContainers(run.runId), []);
  // A missing required artifact is the rollout's error even when every grader failed too
  // (the collection's failure outranks the grader's), and nothing is left behind.
  const noGraderRun = await runOf(noGrader);
  const unstarted = noGraderRun.traces.find((t: Json) => t.task.key === "required-missing");
  assert.deepEqual(
    [unstarted.error.error, unstarted.error.phase],
    ["TaskError", "artifacts"],
    describeTrace(unstarted),
  );
  const present = noGraderRun.traces.find((t: Json) => t.task.key === "optional-missing");
  assert.equal(present.reward, null);
  assert.equal(present.error.phase, "scoring", describeTrace(present));
  assert.deepEqual(await managedContainers(noGraderRun.runId), []);

  const optional = traces["optional-missing"];
  assert.equal(optional.ok, true, describeTrace(optional));
  assert.equal(optional.reward, 1);
  assert.deepEqual(optional.metrics, {
    cache_present: 1,
    log_present: 1,
    logs_note: 1,
    nope_present: 0,
  });

  const excluded = traces["excluded"];
  assert.equal(excluded.ok, true, describeTrace(excluded));
  assert.equal(excluded.reward, 1);
  assert.deepEqual(excluded.metrics, {
    cache_present: 0,
    log_present: 0,
    logs_note: 1,
    nope_present: 0,
  });

  const tooBig = traces["too-big"];
  assert.equal(tooBig.ok, false);
  assert.equal(tooBig.reward, null);
  assert.equal(tooBig.error.phase, "artifacts");
  assert.match(
    tooBig.error.message,
    /^Artifacts exceed artifact_max_bytes \(4096 bytes\) at "\/app\/out"; exclude files or raise TaskData\.artifact_max_bytes$/,
  );
  assert.equal(run.metadata.num_errors, 2);

  const [sameWorkdir] = (await runOf(relative)).traces;
  assert.equal(sameWorkdir.reward, 1, describeTrace(sameWorkdir));
  const [otherWorkdir] = (await runOf(relativeElsewhere)).traces;
  assert.equal(otherWorkdir.reward, null);
  assert.deepEqual([otherWorkdir.error.error, otherWorkdir.error.phase], [
    "ConfigError",
    "scoring",
  ]);
  assert.match(
    otherWorkdir.error.message,
    /^Relative artifact path "out" requires the agent and grading sandboxes to share a workdir \("\/app" vs "\/elsewhere"\); use an absolute path$/,
  );
});

Deno.test("collectArtifacts() of a 100 MB artifact with a 1 MB limit fails without holding it (peak RSS measured)", async () => {
  const runId = `tasks-test-${crypto.randomUUID().slice(0, 8)}`;
  const spec = { type: "docker" as const, image: "busybox:latest", workdir: "/app" };
  const task = new Task({
    id: "big-artifact",
    prompt: "-",
    workdir: "/app",
    artifacts: [{ source: "out" }],
    artifact_max_bytes: 1 << 20,
  });
  try {
    await using agent = createRuntime(spec, { runId, task: "agent" });
    await agent.start();
    const made = await agent.run([
      "sh",
      "-c",
      "mkdir -p out && dd if=/dev/urandom of=out/big bs=1M count=100 2>&1",
    ]);
    assert.equal(made.exit_code, 0, made.stdout);
    // Sampled every 5 ms while the archive streams: the peak, not what GC leaves afterwards.
    const before = Deno.memoryUsage().rss;
    let peak = before;
    const sampler = setInterval(() => peak = Math.max(peak, Deno.memoryUsage().rss), 5);
    const error = await collectArtifacts(agent, task).then(() => undefined, (e) => e);
    clearInterval(sampler);
    peak = Math.max(peak, Deno.memoryUsage().rss);
    assert.ok(error instanceof Error, `expected a failure, got ${error}`);
    assert.match(error.message, /Artifacts exceed artifact_max_bytes \(1048576 bytes\) at "out"/);
    const grewMiB = (peak - before) / 2 ** 20;
    console.log(`peak RSS growth while refusing a 100 MB artifact: ${grewMiB.toFixed(1)} MiB`);
    assert.ok(grewMiB < 40, `the evaluator's RSS grew ${grewMiB.toFixed(1)} MiB`);
  } finally {
    await cleanupContainers({ runId });
  }
});

Deno.test("collectArtifacts() leaves excluded files out and restoreArtifacts() replaces the grader's copy", async () => {
  const runId = `tasks-test-${crypto.randomUUID().slice(0, 8)}`;
  const spec = { type: "docker" as const, image: "busybox:latest", workdir: "/app" };
  const task = new Task({
    id: "artifacts",
    prompt: "-",
    workdir: "/app",
    artifacts: [
      { source: "out", exclude: ["cache", "*.log", "**/*.pyc"] },
      { source: "/app/notes.txt" },
    ],
  });
  try {
    await using agent = createRuntime(spec, { runId, task: "agent" });
    await using grader = createRuntime(spec, { runId, task: "grader" });
    await Promise.all([agent.start(), grader.start()]);
    for (
      const path of [
        "out/keep.txt",
        "out/sub/deep.txt",
        "out/sub/mod.pyc",
        "out/cache/blob.bin",
        "out/debug.log",
        "notes.txt",
      ]
    ) {
      await agent.write(path, `${path}\n`);
    }
    await grader.write("out/stale.txt", "from the grader's own setup\n");

    const artifacts = await collectArtifacts(agent, task);
    assert.deepEqual([...artifacts.keys()], ["/app/out", "/app/notes.txt", "/logs/artifacts"]);
    assert.equal(
      artifacts.get("/logs/artifacts"),
      null,
      "the implicit /logs/artifacts is optional",
    );
    await restoreArtifacts(grader, artifacts);
    const listing = await grader.run(["sh", "-c", "find out notes.txt | sort"]);
    assert.equal(listing.stdout, "notes.txt\nout\nout/keep.txt\nout/sub\nout/sub/deep.txt\n");
    assert.equal(
      new TextDecoder().decode(await grader.read("out/sub/deep.txt")),
      "out/sub/deep.txt\n",
    );

    await agent.write("out/keep.txt", "k".repeat(4096));
    const bounded = new Task({ ...task.data, artifact_max_bytes: 2048 });
    await assert.rejects(collectArtifacts(agent, bounded), (error: unknown) => {
      assert.ok(error instanceof TaskError);
      assert.match(error.message, /^Artifacts exceed artifact_max_bytes \(2048 bytes\) at "out"/);
      return true;
    });
  } finally {
    await cleanupContainers({ runId });
  }
});

// ---------------------------------------------------------------------------------------
// Execution users and scoring secrets

Deno.test("agent_user: the bash tool runs as nobody (uid 65534) and can write the prepared output directory", async () => {
  await using s = await scenario();
  const module = await s.file("custom_tasks.ts", CUSTOM_TASKSET);
  await using server = await modelServer(
    bashModel("id -u; echo hello > /app/output/x.txt && cat /app/output/x.txt; touch /root/x"),
  );
  const run = await runOf(
    await s.cli(vfRun(module, server, "--env.taskset.variant", "agent-user")),
  );
  const [t] = run.traces;
  assert.equal(t.reward, 1, describeTrace(t));
  const [call] = t.tool_calls;
  assert.match(
    call.output,
    /^exit code: 1\nstdout:\n65534\nhello\n\nstderr:\ntouch: \/root\/x: Permission denied\n$/,
  );
});

Deno.test("scoring.env: a ${VAR:-default} template resolves inside the grading sandbox only and the secret is never saved", async () => {
  await using s = await scenario();
  const module = await s.file("custom_tasks.ts", CUSTOM_TASKSET);
  const secret = `vf-secret-${crypto.randomUUID()}`;
  const expectSha = createHash("sha256").update(secret).digest("hex");
  await using server = await modelServer(bashModel('echo "agent sees [$SECRET_X]"'));
  const template = "${VF_TEST_SECRET:-fallback}";
  const args = vfRun(
    module,
    server,
    "--env.taskset.variant",
    "secret",
    "--env.taskset.expect_sha",
    expectSha,
    "--env.agent.scoring.env.SECRET_X",
    template,
  );
  const [withSecret, withoutSecret] = await Promise.all([
    s.cli(args, { VF_TEST_SECRET: secret }),
    s.cli(args),
  ]);

  const run = await runOf(withSecret);
  const [t] = run.traces;
  assert.equal(t.reward, 1, describeTrace(t));
  assert.deepEqual(t.metrics, { used_fallback: 0 });
  assert.equal(t.tool_calls[0].output, "exit code: 0\nstdout:\nagent sees []\n");
  assert.equal(run.config.env.agent.scoring.env.SECRET_X, template);
  assert.ok(run.configText.includes(template));
  for (
    const [name, text] of [
      ["traces.jsonl", run.text],
      ["config.json", run.configText],
      ["metadata.json", JSON.stringify(run.metadata)],
      ["stdout", withSecret.stdout],
      ["stderr", withSecret.stderr],
    ]
  ) {
    assert.ok(!text.includes(secret), `the secret leaked into ${name}`);
  }

  const fallback = (await runOf(withoutSecret)).traces[0];
  assert.equal(fallback.reward, 0, describeTrace(fallback));
  assert.deepEqual(fallback.metrics, { used_fallback: 1 });
});

// ---------------------------------------------------------------------------------------
// Leftovers, resume, runtimes and best-of-n

Deno.test("vf cleanup --run removes the containers of an evaluator that was killed mid-rollout", async () => {
  await using s = await scenario();
  await using server = await modelServer(bashModel("sleep 30"));
  const child = spawnCli(
    vfRun("file-sum", server, "-n", "1"),
    s.path,
    {},
    "null",
  );
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let stderr = "";
  let runId: string | undefined;
  let exited = false;
  try {
    while (!announcedRunDir(stderr)) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`the CLI ended before announcing its run:\n${stderr}`);
      stderr += value;
    }
    runId = basename(announcedRunDir(stderr)!);
    s.runIds.add(runId);
    const draining = (async () => {
      for (let r = await reader.read(); !r.done; r = await reader.read()) stderr += r.value;
    })();

    // Wait until the agent's container exists and the model has asked for `sleep 30`.
    const deadline = Date.now() + 20_000;
    let containers: ContainerSummary[] = [];
    while (server.requests.length === 0 || containers.length === 0) {
      assert.ok(Date.now() < deadline, `no running rollout after 20s:\n${stderr}`);
      await new Promise((r) => setTimeout(r, 100));
      containers = await managedContainers(runId);
    }
    await new Promise((r) => setTimeout(r, 300)); // let the exec of `sleep 30` start
    child.kill("SIGKILL");
    const status = await child.status;
    exited = true;
    await draining;
    assert.equal(status.signal, "SIGKILL");

    const left = await managedContainers(runId);
    assert.equal(left.length, 1, "a killed evaluator cannot stop its container");
    assert.equal(left[0].State, "running");
    assert.equal(left[0].Labels["vf.task"], "file-sum-0");
    assert.equal(left[0].Labels["vf.role"], "agent");

    const cleanup = await s.cli(["cleanup", "--run", runId]);
    assert.equal(cleanup.code, 0, transcript(cleanup));
    assert.match(cleanup.stdout, /^removed 1 container\n {2}[0-9a-f]{12}\n$/);
    assert.deepEqual(await managedContainers(runId), []);
  } finally {
    if (!exited) {
      child.kill("SIGKILL");
      await child.status;
    }
  }
});

Deno.test("--resume <run dir> re-runs only the failed rollout and keeps the latest trace per task", async () => {
  await using s = await scenario();
  // Fails file-sum-0 (input 1 2 3) with an HTTP 500 on its second model call.
  await using flaky = await modelServer(agentModel(({ turn, toolOutputs }) => {
    if (turn === 1 && toolOutputs[0]?.endsWith("stdout:\n1\n2\n3\n")) {
      return { status: 500, body: "The server is overloaded" };
    }
    return turn === 0
      ? toolCallReply("bash", { command: CAT_INPUT })
      : turn === 1
      ? toolCallReply("bash", { command: WRITE_SUM })
      : textReply("done");
  }));
  const first = await runOf(
    await s.cli(vfRun("file-sum", flaky, "-n", "2", "--client.max_retries", "0")),
  );
  const failed = first.traces.find((t: Json) => t.task.key === "file-sum-0");
  assert.equal(failed.ok, false, describeTrace(failed));
  assert.equal(failed.error.error, "ModelError");
  assert.equal(failed.error.phase, "agent");
  assert.match(failed.error.message, /HTTP 500/);
  assert.equal(first.traces.find((t: Json) => t.task.key === "file-sum-1").reward, 1);
  assert.equal(first.metadata.num_errors, 1);

  await using healthy = await modelServer(fileSumModel());
  const resumed = await s.cli(vfRun("file-sum", healthy, "-n", "2", "--resume", first.dir));
  const second = await runOf(resumed);
  assert.equal(second.dir, first.dir);
  // One rollout (three model turns), all of them for file-sum-0.
  assert.equal(healthy.requests.length, 3);
  for (const req of healthy.requests.slice(1)) {
    assert.match(JSON.stringify(req.body.messages), /stdout:\\n1\\n2\\n3\\n/);
  }
  assert.equal(second.traces.length, 3, "resume appends; it never rewrites traces.jsonl");
  assert.equal(second.traces.at(-1).task.key, "file-sum-0");
  assert.equal(second.traces.at(-1).reward, 1);
  const latest = byKey(await loadTraces(first.dir) as TaskTrace[]);
  assert.deepEqual(latest.map((t) => [t.task.key, t.reward, t.ok]), [["file-sum-0", 1, true], [
    "file-sum-1",
    1,
    true,
  ]]);
  assert.deepEqual([
    second.metadata.num_rollouts,
    second.metadata.num_errors,
    second.metadata.avg_reward,
  ], [2, 0, 1]);
});

Deno.test("--resume <run dir> without -n/-r keeps the run's original size from its config.json", async () => {
  await using s = await scenario();
  await using model = await modelServer(fileSumModel());
  const first = await runOf(await s.cli(vfRun("file-sum", model, "-n", "1")));
  assert.equal(first.metadata.num_tasks, 1);
  const before = model.requests.length;
  const second = await runOf(await s.cli(vfRun("file-sum", model, "--resume", first.dir)));
  assert.equal(second.dir, first.dir);
  assert.equal(second.metadata.num_tasks, 1, "not the whole taskset");
  assert.equal(second.metadata.num_rollouts, 1);
  assert.equal(model.requests.length, before, "nothing left to run");
});

Deno.test("vf validate --probe flags a grader an exit-0 script games, and py-grader passes its own probes", async () => {
  await using s = await scenario();
  const module = await s.file("gameable.ts", GAMEABLE_TASKSET);
  const [gamed, pyGrader] = await Promise.all([
    s.cli(["validate", module, "--probe"]),
    s.cli(["validate", "py-grader", "-n", "1", "--probe"]),
  ]);
  assert.equal(gamed.code, 1, transcript(gamed));
  assert.match(gamed.stdout, /exit-code-0 +1\.00 +0\.00 +FAIL gameable: exit-0-os-exit scored 1/);
  const summary = JSON.parse(gamed.stdout.trim().split("\n").at(-1)!);
  const probes = Object.fromEntries(
    summary.results[0].probes.map((p: Json) => [p.probe, p.flagged]),
  );
  assert.equal(probes["exit-0-os-exit"], true);
  assert.equal(probes["prewritten-verdict"], false);

  assert.equal(pyGrader.code, 0, transcript(pyGrader));
  const py = JSON.parse(pyGrader.stdout.trim().split("\n").at(-1)!);
  assert.equal(py.results[0].ok, true);
  for (const p of py.results[0].probes) {
    assert.equal(p.flagged, false, JSON.stringify(p));
    assert.ok(p.reward === 0 || p.reward === null, JSON.stringify(p));
  }
  assert.equal(py.results[0].probes.length, 6);
});

Deno.test("vf run refuses rollouts at once on a dedicated ssh host before anything starts", async () => {
  await using s = await scenario();
  await using server = await modelServer(fileSumModel());
  const ssh = ["--env.agent.runtime.type", "ssh", "--env.agent.runtime.host", "10.213.255.1"];
  const [concurrent, pooled] = await Promise.all([
    s.cli(vfRun("file-sum", server, "-c", "4", ...ssh, "--env.agent.runtime.dedicated", "true")),
    s.cli(vfRun(
      "file-sum",
      server,
      "-c",
      "1",
      ...ssh,
      "--env.agent.runtime.dedicated",
      "true",
      "--env.agent.runtime.warm_pool",
      "2",
    )),
  ]);
  assert.equal(concurrent.code, 1, transcript(concurrent));
  assert.match(
    concurrent.stderr,
    /error: env\.agent\.runtime: ssh host "10\.213\.255\.1" is dedicated, so it holds one sandbox at a time .*run with -c 1 \(max_concurrent = 1\), got 4/,
  );
  assert.equal(pooled.code, 1, transcript(pooled));
  assert.match(pooled.stderr, /cannot keep warm sandboxes beside the one in use; remove warm_pool/);
  assert.equal(server.requests.length, 0, "refused before any rollout");
});

Deno.test("a reward written as a plain method fails vf validate and vf run at load, naming the class and method", async () => {
  await using s = await scenario();
  const module = await s.file("method_reward.ts", METHOD_REWARD_TASKSET);
  await using server = await modelServer(bashModel("true"));
  const [validate, run] = await Promise.all([
    s.cli(["validate", module, "--runtime.type", "subprocess"]),
    s.cli(vfRun(module, server, "--env.agent.runtime.type", "subprocess")),
  ]);
  for (const res of [validate, run]) {
    assert.equal(res.code, 1, transcript(res));
    assert.match(
      res.stderr,
      /error: Task class "MethodRewardTask" has no rewards, so every rollout would score 0; its method correct\(\) is not a reward/,
      transcript(res),
    );
  }
  assert.equal(server.requests.length, 0, "refused before any rollout");
});

Deno.test("subprocess runtime: isolated scoring is refused with a clear error, shared scoring works for a task that needs no container", async () => {
  await using s = await scenario();
  const module = await s.file("custom_tasks.ts", CUSTOM_TASKSET);
  await using server = await modelServer(
    bashModel("awk '{ s += $1 } END { print s }' input.txt > answer.txt"),
  );
  const args = vfRun(
    module,
    server,
    "--env.taskset.variant",
    "plain",
    "--env.agent.runtime.type",
    "subprocess",
  );
  const [isolated, shared] = await Promise.all([
    s.cli([...args, "--env.agent.scoring.mode", "isolated"]),
    s.cli([...args, "--env.agent.scoring.mode", "shared"]),
  ]);

  const [refused] = (await runOf(isolated)).traces;
  assert.equal(refused.ok, false);
  assert.equal(refused.reward, null);
  assert.deepEqual([refused.error.error, refused.error.phase], ["ConfigError", "config"]);
  assert.match(refused.error.message, /^Isolated scoring needs a container runtime/);
  assert.deepEqual(refused.model_calls, [], "refused before the model was called");

  const [ok] = (await runOf(shared)).traces;
  assert.equal(ok.reward, 1, describeTrace(ok));
  assert.deepEqual(ok.runtime, { type: "subprocess" });
  assert.deepEqual(ok.scoring, { mode: "shared", attempts: 1 });
  assert.match(
    shared.stderr,
    /Harness "bash" runs agent commands on the host \(subprocess runtime\)/,
  );
  assert.equal(server.requests.length, 2);
});

Deno.test("best-of-n: --env.id best-of-n --env.n 3 runs three rollouts per task and marks the best and pass_at_n", async () => {
  await using s = await scenario();
  let wrongAnswers = 0;
  // The first rollout to write its answer writes a wrong one.
  await using server = await modelServer(agentModel(({ turn }) => {
    if (turn === 0) return toolCallReply("bash", { command: CAT_INPUT });
    if (turn === 1) {
      const command = wrongAnswers++ === 0 ? "echo 0 > /app/output/answer.txt" : WRITE_SUM;
      return toolCallReply("bash", { command });
    }
    return textReply("done");
  }));
  const res = await s.cli(
    vfRun("file-sum", server, "-n", "1", "--env.id", "best-of-n", "--env.n", "3"),
  );
  const run = await runOf(res);
  // One episode holding the three attempts.
  assert.equal(run.text.trim().split("\n").length, 1);
  const traces = [...run.traces].sort((a, b) => a.attempt - b.attempt);
  assert.deepEqual(traces.map((t) => [t.task.key, t.role, t.attempt]), [
    ["file-sum-0", "agent", 0],
    ["file-sum-0", "agent", 1],
    ["file-sum-0", "agent", 2],
  ]);
  assert.deepEqual(traces.map((t) => t.reward).sort(), [0, 1, 1]);
  for (const t of traces) {
    assert.equal(t.ok, true, describeTrace(t));
    assert.deepEqual(t.metrics, { best: t.reward === 1 ? 1 : 0, pass_at_n: 1 });
  }
  assert.equal(run.metadata.env_id, "best-of-n");
  assert.equal(run.metadata.rollouts_per_task, 3);
  assert.match(res.stdout, /metric best: 0\.6667/);
  assert.match(res.stdout, /metric pass_at_n: 1\.0000/);
});
