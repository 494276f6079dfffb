/**
 * Tests of running a taskset beside their code: {@link runTaskset} on the subprocess runtime
 * against a loopback OpenAI-compatible model server (`lib/model/local_server.ts`): what it
 * writes (a flat trace line per single-agent episode, an episode line otherwise,
 * `metadata.json`, `record.jsonl`), how it resumes, which failures stop a run, what it checks
 * before anything starts, and how saved runs are read back and averaged.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  type Agents,
  ConfigError,
  Env,
  type Episode,
  loadEpisodes,
  loadTraces,
  NullHarness,
  OpenAIChatClient,
  reward,
  runTaskset,
  Task,
  Taskset,
  type TaskTrace,
} from "../../mod.ts";
import { captureWarnings } from "../../tests/_warnings.ts";
import {
  type ChatRequest,
  lastUserText,
  type ModelServer,
  type Responder,
  startModelServer,
} from "../model/local_server.ts";
import { scoredTraces } from "./run.ts";

/** Scores 1 when the reply is the task's answer. */
class AnswerTask extends Task {
  correct = reward(({ trace }) =>
    String(trace.messages.at(-1)?.content ?? "").trim() === this.data.answer ? 1 : 0
  );
}

class Capitals extends Taskset {
  get id() {
    return "capitals";
  }
  load() {
    return [
      new AnswerTask({ id: "fr", prompt: "France?", answer: "Paris" }, this.config.task as never),
      new AnswerTask({ id: "de", prompt: "Germany?", answer: "Berlin" }, this.config.task as never),
      new AnswerTask({ id: "it", prompt: "Italy?", answer: "Rome" }, this.config.task as never),
    ];
  }
}

const ANSWERS: Record<string, string> = {
  "France?": "Paris",
  "Germany?": "Berlin",
  "Italy?": "Rome",
};

/** Answers each capital right. */
const RIGHT: Responder = (req: ChatRequest) => ({ content: ANSWERS[lastUserText(req)] ?? "?" });

function client(server: ModelServer): OpenAIChatClient {
  return new OpenAIChatClient({ base_url: server.url, api_key_var: "VF_NO_KEY", max_retries: 0 });
}

async function tempDir(): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ prefix: "vf_agents_run_" });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}

function options(server: ModelServer, extra: Partial<Parameters<typeof runTaskset>[0]> = {}) {
  return {
    taskset: new Capitals(),
    policy: { runtime: { type: "subprocess" as const }, harness: new NullHarness() },
    client: client(server),
    model: "m",
    runId: `run-${crypto.randomUUID().slice(0, 8)}`,
    ...extra,
  };
}

async function lines(runDir: string, file = "traces.jsonl"): Promise<Record<string, unknown>[]> {
  const text = await Deno.readTextFile(join(runDir, file));
  return text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
}

Deno.test("runTaskset(): a single-agent run writes one trace line per rollout, a summary in metadata.json, and returns the traces by example with group advantages", async () => {
  // The second rollout of each task answers wrong: the group's advantages are ±0.5.
  const seen = new Map<string, number>();
  await using model = await startModelServer({
    responder: (req, ctx) => {
      const n = seen.get(lastUserText(req)) ?? 0;
      seen.set(lastUserText(req), n + 1);
      return n === 0 ? RIGHT(req, ctx) : { content: "no idea" };
    },
  });
  await using dir = await tempDir();
  const runDir = join(dir.path, "run");
  const progress: string[] = [];
  const { traces, episodes, summary } = await runTaskset(options(model, {
    runDir,
    rolloutsPerTask: 2,
    maxConcurrent: 1,
    onEpisode: (_e, done, total) => progress.push(`${done}/${total}`),
  }));
  assert.deepEqual(progress, ["1/6", "2/6", "3/6", "4/6", "5/6", "6/6"]);
  assert.equal(episodes.length, 6);
  assert.deepEqual(
    traces.map((t) => [t.task.key, t.rollout_index, t.reward, t.advantage]),
    [
      ["fr", 0, 1, 0.5],
      ["fr", 1, 0, -0.5],
      ["de", 0, 1, 0.5],
      ["de", 1, 0, -0.5],
      ["it", 0, 1, 0.5],
      ["it", 1, 0, -0.5],
    ],
  );
  const written = await lines(runDir);
  assert.equal(written.length, 6);
  assert.ok(
    written.every((l) => typeof l.trace_id === "string" && l.kind === undefined),
    "flat traces",
  );
  // What a replay needs of each rollout's sandboxes, beside its trace.
  const records = await lines(runDir, "record.jsonl");
  assert.deepEqual(
    records.map((r) => r.trace_id).sort(),
    written.map((l) => l.trace_id).sort(),
  );
  assert.ok(records.every((r) => r.format_version === 1 && r.role === "agent"));
  assert.deepEqual(
    (records[0].sandboxes as Array<{ role: string; type: string }>).map((b) => [b.role, b.type]),
    [["agent", "subprocess"]],
  );
  const metadata = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
  assert.deepEqual(metadata, summary);
  assert.equal(summary.num_tasks, 3);
  assert.equal(summary.rollouts_per_task, 2);
  assert.equal(summary.num_rollouts, 6);
  assert.equal(summary.avg_reward, 0.5);
  assert.equal(summary.env_id, "single-agent");
  assert.equal(summary.num_episodes, 6);
  assert.equal(summary.num_failed_episodes, 0);
  assert.equal(summary.usage_by_role, undefined, "one role: no per-role usage");
});

Deno.test("runTaskset(): ids and numTasks select tasks; onTrace sees each scored trace as its episode is written", async () => {
  await using model = await startModelServer({ responder: RIGHT });
  const seen: string[] = [];
  const picked = await runTaskset(options(model, {
    ids: ["it", "fr"],
    onTrace: (t, done, total) => seen.push(`${t.task.key} ${done}/${total}`),
    maxConcurrent: 1,
  }));
  assert.deepEqual(picked.traces.map((t) => t.task.key).sort(), ["fr", "it"]);
  assert.deepEqual(seen, ["fr 1/2", "it 2/2"], "in the taskset's order, one at a time");
  const first = await runTaskset(options(model, { numTasks: 1 }));
  assert.deepEqual(first.traces.map((t) => t.task.key), ["fr"]);
  assert.equal(first.summary.num_tasks, 1);
});

Deno.test("runTaskset(): resume keeps the complete episodes and runs only the others, appending to traces.jsonl", async () => {
  let failGermany = true;
  await using model = await startModelServer({
    responder: (req, ctx) =>
      failGermany && lastUserText(req) === "Germany?"
        ? { status: 500, body: "overloaded" }
        : RIGHT(req, ctx),
  });
  await using dir = await tempDir();
  const runDir = join(dir.path, "run");
  const first = await runTaskset(options(model, { runDir, runId: "resumable" }));
  const failed = first.traces.find((t) => t.task.key === "de")!;
  assert.ok(failed.error, "the 500 is recorded on the trace");
  assert.equal(model.requests.length, 3);

  failGermany = false;
  const second = await runTaskset(options(model, { runDir, runId: "resumable", resume: true }));
  assert.equal(model.requests.length, 4, "only Germany ran again");
  assert.deepEqual(second.traces.map((t) => [t.task.key, t.reward]), [["fr", 1], ["de", 1], [
    "it",
    1,
  ]]);
  assert.equal((await lines(runDir)).length, 4, "the retry was appended");
  const latest = await loadTraces(runDir);
  assert.deepEqual(latest.map((t) => [t.task.key, t.reward]).sort(), [["de", 1], ["fr", 1], [
    "it",
    1,
  ]]);
  assert.equal(second.summary.avg_reward, 1);
});

Deno.test("runTaskset(): a model that refuses the key stops the run with a ConfigError, after writing what finished", async () => {
  await using model = await startModelServer({
    responder: () => ({ status: 401, body: "Incorrect API key provided" }),
  });
  await using dir = await tempDir();
  const runDir = join(dir.path, "run");
  const error = await runTaskset(options(model, { runDir, maxConcurrent: 1 })).catch((e) => e);
  assert.ok(error instanceof ConfigError, `${error}`);
  assert.match(error.message, /Incorrect API key provided/);
  assert.equal(model.requests.length, 1, "no later rollout started");
  assert.equal((await lines(runDir)).length, 1);
  const metadata = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
  assert.equal(metadata.num_rollouts, 1);
});

Deno.test("runTaskset(): what it checks before any rollout: an env or a policy and client, tasks that received the task config, and tasks that can be scored", async () => {
  await using model = await startModelServer({ responder: RIGHT });
  await assert.rejects(
    runTaskset({ taskset: new Capitals(), model: "m", runId: "r" }),
    (e: Error) =>
      e instanceof TypeError &&
      e.message === "runTaskset() needs an env, or a policy and a client for a single agent",
  );
  class Forgetful extends Capitals {
    override load() {
      return [new AnswerTask({ id: "fr", prompt: "France?", answer: "Paris" })];
    }
  }
  await assert.rejects(
    runTaskset(options(model, {
      taskset: new Forgetful({ task: { rewards: {} } }),
      requireTaskConfig: ["rewards"],
    })),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message ===
        'env.taskset.task.rewards: task "fr" of taskset "capitals" did not receive the task config, so its plugged rewards would be ignored; the taskset must pass this.config.task to each Task',
  );
  class Unscored extends Taskset {
    get id() {
      return "unscored";
    }
    load() {
      return [new Task({ id: "bare", prompt: "p" })];
    }
  }
  await assert.rejects(
    runTaskset(options(model, { taskset: new Unscored() })),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message.startsWith('Task class "Task" has no rewards, so every rollout would score 0; '),
  );
  assert.equal(model.requests.length, 0, "nothing ran");
});

Deno.test("runTaskset(): a multi-agent Env writes each episode as one line holding every trace, with token usage by role", async () => {
  await using model = await startModelServer({ responder: RIGHT });
  await using dir = await tempDir();
  const runDir = join(dir.path, "run");
  const roleOf = (name: string, trainable: boolean) => ({
    name,
    client: client(model),
    model: "m",
    harness: new NullHarness(),
    trainable,
    policy: { runtime: { type: "subprocess" as const } },
  });
  class Pair extends Env {
    static override roles = { solver: {}, checker: {} };
    async run(task: Task, agents: Agents) {
      await agents.solver.run(task);
      await agents.checker.run(task);
    }
  }
  const env = new Pair({
    id: "pair",
    roles: { solver: roleOf("solver", true), checker: roleOf("checker", false) },
  });
  const { traces, summary } = await runTaskset({
    taskset: new Capitals(),
    env,
    model: "m",
    runId: "pair-run",
    runDir,
    ids: ["fr"],
  });
  assert.deepEqual(traces.map((t) => [t.role, t.trainable]), [["solver", true], [
    "checker",
    false,
  ]]);
  const [line] = await lines(runDir);
  assert.equal(line.kind, "episode");
  assert.equal(line.env_id, "pair");
  assert.equal((line.traces as unknown[]).length, 2);
  assert.equal(summary.num_rollouts, 1, "averages are over trainable traces");
  assert.deepEqual(Object.keys(summary.usage_by_role ?? {}).sort(), ["checker", "solver"]);
  const [episode] = await loadEpisodes(runDir);
  assert.deepEqual(episode.traces.map((t) => t.role), ["solver", "checker"]);
});

Deno.test("loadEpisodes(): the latest line per task and episode index wins; single-agent lines come back as one-trace episodes; corrupt lines are skipped with a warning naming the line", async () => {
  await using dir = await tempDir();
  const trace = (key: string, index: number, reward: number) => ({
    trace_id: `${key}-${index}-${reward}`,
    task: { key, idx: 0, hash: "h" },
    example_id: 0,
    rollout_index: index,
    reward,
    ok: true,
    error: null,
  });
  await Deno.writeTextFile(
    join(dir.path, "traces.jsonl"),
    [
      JSON.stringify(trace("a", 0, 0)),
      "{not json",
      JSON.stringify(trace("a", 1, 1)),
      JSON.stringify(trace("a", 0, 1)),
      JSON.stringify({
        kind: "episode",
        task: { key: "b", idx: 1, hash: "h" },
        episode_index: 0,
        traces: [trace("b", 0, 1)],
        errors: [],
      }),
      JSON.stringify({ unrelated: true }),
    ].join("\n") + "\n",
  );
  let episodes: Episode[] = [];
  const warned = await captureWarnings(async () => (episodes = await loadEpisodes(dir.path)));
  assert.match(warned.join("\n"), /traces\.jsonl:2: skipping a corrupt line/);
  assert.deepEqual(
    episodes.map((e) => [e.task.key, e.episode_index, e.traces.map((t) => t.reward)]),
    [["a", 0, [1]], ["a", 1, [1]], ["b", 0, [1]]],
  );
});

Deno.test("scoredTraces(): an episode that failed as a whole leaves its trainable traces unscored; one with no trainable trace counts as one unscored rollout", () => {
  const t = (role: string, trainable: boolean, reward: number): TaskTrace =>
    ({
      trace_id: role,
      role,
      trainable,
      reward,
      ok: true,
      error: null,
      task: { key: "k" },
    }) as unknown as TaskTrace;
  const envError = { error: "EnvError", message: "finalize broke", phase: "env" };
  const scored = scoredTraces([
    { task: { key: "k" }, errors: [], traces: [t("solver", true, 1), t("judge", false, 0)] },
    { task: { key: "k" }, errors: [envError], traces: [t("solver", true, 1)] },
    {
      task: { key: "j", idx: 0, hash: "h" },
      example_id: 7,
      episode_index: 2,
      errors: [],
      traces: [t("judge", false, 1)],
    },
  ] as unknown as Episode[]);
  assert.equal(scored.length, 3);
  assert.deepEqual([scored[0].role, scored[0].reward, scored[0].error], ["solver", 1, null]);
  assert.deepEqual([scored[1].reward, scored[1].error?.message], [null, "finalize broke"]);
  assert.equal(scored[2].reward, null);
  assert.equal(scored[2].example_id, 7);
  assert.equal(scored[2].rollout_index, 2);
  assert.equal(scored[2].error?.message, 'Episode of "j" has no trainable trace');
});
