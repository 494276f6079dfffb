/**
 * Grading through lib/tasks/rollout/grading.ts. Isolation is the point of the isolated mode, so
 * those tests run on the real Docker engine (busybox): the grader must see the declared
 * artifacts and the privately staged tests, and nothing else the agent left behind.
 */
import assert from "node:assert/strict";
import { OpenAIChatClient } from "../../model/client.ts";
import { startModelServer } from "../../model/local_server.ts";
import { Judge, type JudgedTrace } from "../../scoring/judges/judge.ts";
import type { Harness, HarnessContext } from "../harness.ts";
import { readText, reward, Task, type TaskHookContext, type TaskScores } from "../task.ts";
import { acquireSandbox } from "../sandbox.ts";
import { gradeSubmission, judgeScores } from "./grading.ts";
import { TaskRollout } from "./mod.ts";

/** An agent that writes its answer and a scratch file nobody declared. */
const writer: Harness = {
  id: "writer",
  executesCode: true,
  async run(ctx: HarnessContext) {
    await ctx.runtime.write("/app/answer.txt", "42\n");
    await ctx.runtime.write("/app/scratch.txt", "agent only\n");
    ctx.recorder.stop_condition = "done";
  },
};

class AnswerTask extends Task {
  static override NEEDS_CONTAINER = true;
  override async stageVerifier({ runtime }: TaskHookContext) {
    await runtime.write("/app/tests/expected.txt", "42\n");
  }
  correct = reward(async ({ runtime }) =>
    (await readText(runtime, "/app/answer.txt")) ===
        (await readText(runtime, "/app/tests/expected.txt"))
      ? 1
      : 0
  );
  /** 1 when the agent's undeclared file did not follow it into the grader. */
  isolated = reward(async ({ runtime }) =>
    (await runtime.run(["test", "-e", "/app/scratch.txt"])).exit_code === 0 ? 0 : 1
  );
}

const data = {
  id: "answer",
  prompt: "Write 42 to /app/answer.txt",
  image: "busybox:latest",
  workdir: "/app",
  artifacts: [{ source: "answer.txt" }],
  scoring: { mode: "isolated" as const },
};

Deno.test("isolated grading on Docker: the grader gets only the declared artifacts plus staged tests; both sandboxes are recorded and removed", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "unused" }) });
  const rollout = new TaskRollout({
    task: new AnswerTask(data),
    tasksetId: "answers",
    policy: { runtime: { type: "docker" }, harness: writer },
    client: new OpenAIChatClient({ base_url: server.url }),
    model: "m",
    runId: "grading-test",
  });
  const trace = await rollout.run();
  assert.equal(trace.ok, true, JSON.stringify(trace.error));
  assert.deepEqual(trace.rewards, { correct: 1, isolated: 1 });
  assert.deepEqual(trace.scoring, { mode: "isolated", attempts: 1 });
  assert.deepEqual([...rollout.view.artifacts.keys()], ["/app/answer.txt", "/logs/artifacts"]);
  assert.equal(rollout.view.artifacts.get("/logs/artifacts"), null, "optional and absent");
  assert.deepEqual(rollout.record?.sandboxes.map((s) => s.role), ["agent", "grader"]);
  assert.equal(typeof trace.timing.artifacts_ms, "number");
  assert.equal(rollout.runtime, null);
});

Deno.test("gradeSubmission(): a validate hook's work is graded in a fresh Docker sandbox, which sees only the artifacts", async () => {
  const task = new AnswerTask(data);
  const runtime = await acquireSandbox(
    { type: "docker", image: "busybox:latest", workdir: "/app", labels: { "vf.role": "agent" } },
    { runId: "grading-test", task: task.key },
  );
  try {
    const view = { info: {}, messages: [], artifacts: new Map() };
    const ctx: TaskHookContext = { runtime, task, data: task.data, trace: view, state: {} };
    await runtime.write("/app/answer.txt", "42\n");
    await runtime.write("/app/scratch.txt", "validate only\n");
    const scores = await gradeSubmission(ctx);
    assert.deepEqual(scores.rewards, { correct: 1, isolated: 1 });
    assert.ok(view.artifacts.get("/app/answer.txt"), "the collected artifacts are on the view");
    // A wrong answer scores 0 in the same fresh way.
    await runtime.write("/app/answer.txt", "41\n");
    assert.equal((await gradeSubmission(ctx)).rewards.correct, 0);
  } finally {
    await runtime.stop();
  }
});

/** A judge with a fixed verdict (its endpoint is never called). */
class FixedJudge extends Judge<number> {
  constructor(name: string, weight: number, readonly verdict: number | Record<string, number>) {
    super({ id: name, weight }, {
      client: new OpenAIChatClient({ base_url: "http://127.0.0.1:9" }),
      model: "none",
    }, "");
  }
  parse(text: string): number {
    return Number(text);
  }
  score(_data: Record<string, unknown>, trace: JudgedTrace) {
    trace.metrics!.judged = 1;
    return Promise.resolve(this.verdict);
  }
}

Deno.test("judgeScores(): each judge's rewards join the total at its weight; its metrics join the task's", async () => {
  const scores: TaskScores = { reward: 1, rewards: { correct: 1 }, metrics: { n: 3 }, weights: {} };
  const out = await judgeScores(
    scores,
    [new FixedJudge("style", 0.5, 0.8), new FixedJudge("facts", 2, { cited: 1, recent: 0 })],
    { prompt: "q" },
    { info: {}, messages: [], artifacts: new Map() },
    new AbortController().signal,
  );
  assert.deepEqual(out.rewards, { correct: 1, style: 0.8, cited: 1, recent: 0 });
  assert.deepEqual(out.weights, { style: 0.5, cited: 2, recent: 2 });
  assert.equal(out.reward, 1 + 0.4 + 2);
  assert.deepEqual(out.metrics, { n: 3, judged: 1 });
  assert.deepEqual(scores.rewards, { correct: 1 }, "the task's scores are not changed");
  await assert.rejects(
    judgeScores(scores, [new FixedJudge("bad", 1, NaN)], { prompt: "q" }, {
      info: {},
      messages: [],
      artifacts: new Map(),
    }, new AbortController().signal),
    /Judge "bad" returned NaN/,
  );
});
