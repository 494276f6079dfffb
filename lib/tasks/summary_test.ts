import assert from "node:assert/strict";
import { modelRetries, renderTaskSummary, summarizeTraces } from "./summary.ts";
import type { TaskTrace } from "./trace.ts";

function trace(task: string, reward: number | null, infra = false): TaskTrace {
  return {
    task: { key: task },
    reward,
    rewards: reward === null ? {} : { correct: reward },
    metrics: {},
    error: infra
      ? { phase: "setup", error: "SandboxUnavailableError", message: "engine down", infra: true }
      : null,
    usage: { input_tokens: 0, output_tokens: 0 },
  } as unknown as TaskTrace;
}

const base = {
  run_id: "r",
  taskset: "t",
  model: "m",
  env_id: "single-agent",
  num_tasks: 2,
  rollouts_per_task: 4,
};

Deno.test("summarizeTraces(): pass@k leaves infrastructure errors out exactly as avg_reward does, and says how many", () => {
  // Task a: two solved, two lost to the engine. Task b: one solved, three lost.
  const traces = [
    trace("a", 1),
    trace("a", 1),
    trace("a", null, true),
    trace("a", null, true),
    trace("b", 1),
    trace("b", null, true),
    trace("b", null, true),
    trace("b", null, true),
  ];
  const s = summarizeTraces(traces, base);
  assert.equal(s.avg_reward, 1, "every scored rollout solved its task");
  assert.equal(s.num_infra_errors, 5);
  assert.equal(s.pass_at_k_excluded, 5);
  // Every scored rollout passed, so pass@k is 1 wherever a task has k scored rollouts.
  assert.deepEqual(s.pass_at_k, { "1": 1, "2": 1 });
});

Deno.test("summarizeTraces(): a run with nothing scored has no average, and says why", () => {
  const s = summarizeTraces([trace("a", null, true), trace("a", null, true)], {
    ...base,
    rollouts_per_task: 2,
  });
  assert.equal(s.avg_reward, null);
  assert.equal(s.no_score_reason, "every rollout (2) failed on infrastructure");
  assert.deepEqual(s.pass_at_k, {});
  const empty = summarizeTraces([], base);
  assert.equal(empty.avg_reward, null);
  assert.equal(empty.no_score_reason, "no rollout ran");
});

Deno.test("summarizeTraces(): a task's own failures still count as failures in pass@k", () => {
  const failed = { ...trace("a", 0), error: { phase: "agent", error: "TaskError", message: "x" } };
  const s = summarizeTraces([trace("a", 1), failed as unknown as TaskTrace], {
    ...base,
    rollouts_per_task: 2,
  });
  assert.equal(s.avg_reward, 0.5);
  assert.equal(s.pass_at_k["1"], 0.5);
  assert.equal(s.pass_at_k["2"], 1);
  assert.equal(s.pass_at_k_excluded, 0);
});

Deno.test("summarizeTraces(): a reward or task hook that failed leaves the rollout unscored, never a 0", () => {
  const failedIn = (phase: string) =>
    ({
      ...trace("a", null),
      error: { phase, error: "TaskError", message: `${phase} broke` },
    }) as unknown as TaskTrace;
  const s = summarizeTraces(
    [trace("a", 1), failedIn("scoring"), failedIn("setup"), failedIn("finalize")],
    { ...base, rollouts_per_task: 4 },
  );
  assert.equal(s.avg_reward, 1, "only the scored rollout is averaged");
  assert.equal(s.num_unscored, 3);
  assert.equal(s.num_infra_errors, 0);
  assert.equal(s.pass_at_k_excluded, 3);
  assert.deepEqual(s.pass_at_k, { "1": 1 });
  const none = summarizeTraces([failedIn("scoring")], { ...base, rollouts_per_task: 1 });
  assert.equal(none.avg_reward, null);
  assert.equal(
    none.no_score_reason,
    "no rollout (of 1) was scored: 0 failed on infrastructure, 1 in the task's own hooks or rewards",
  );
});

Deno.test("summarizeTraces() and modelRetries() count retried model requests, failed ones included", () => {
  const a = trace("a", 1);
  a.model_calls = [
    { turn: 0, response: { retries: 2 } },
    { turn: 1, response: {} },
  ] as unknown as TaskTrace["model_calls"];
  const b = trace("b", null, true);
  b.model_calls = [{ turn: 0, response: null, retries: 3 }] as unknown as TaskTrace["model_calls"];
  assert.equal(modelRetries(a), 2);
  assert.equal(modelRetries(b), 3);
  assert.equal(summarizeTraces([a, b], base).num_model_retries, 5);
});

Deno.test("renderTaskSummary() does not repeat a lone reward named reward, and lists named ones", () => {
  const harbor = summarizeTraces(
    [{ ...trace("a", 1), rewards: { reward: 1 } } as unknown as TaskTrace],
    { ...base, num_tasks: 1, rollouts_per_task: 1 },
  );
  const text = renderTaskSummary(harbor);
  assert.match(text, /^reward 1\.0000/m);
  assert.doesNotMatch(text, /reward reward/);
  const named = renderTaskSummary(
    summarizeTraces([trace("a", 1)], { ...base, rollouts_per_task: 1 }),
  );
  assert.match(named, /^ {2}reward "correct": 1\.0000$/m);
});

Deno.test("renderTaskSummary(): a Harbor reward key beside named ones is the headline, once; the others say they are not in it", () => {
  const harbor = (reward: number, style: number) =>
    ({
      ...trace("a", reward),
      rewards: { reward, style },
      reward_weights: { style: 0 },
    }) as unknown as TaskTrace;
  const s = summarizeTraces([harbor(1, 0.5), harbor(0, 0)], { ...base, rollouts_per_task: 2 });
  assert.equal(s.avg_reward, 0.5);
  assert.deepEqual(s.reward_weights, { style: 0 });
  const text = renderTaskSummary(s);
  assert.match(text, /^reward 0\.5000 /m);
  assert.doesNotMatch(text, /reward "?reward"?:/);
  assert.match(text, /^ {2}reward "style": 0\.2500 \(weight 0: beside the reward, not in it\)$/m);

  // A judge's reward on top: "reward" is one part of the headline now, listed and quoted.
  const judged = { ...harbor(1, 1), reward: 1.5, rewards: { reward: 1, style: 1, tone: 1 } };
  (judged as { reward_weights: Record<string, number> }).reward_weights = { style: 0, tone: 0.5 };
  const both = renderTaskSummary(
    summarizeTraces([judged as unknown as TaskTrace], { ...base, rollouts_per_task: 1 }),
  );
  assert.match(both, /^ {2}reward "reward": 1\.0000$/m);
  assert.match(both, /^ {2}reward "tone": 1\.0000 \(weight 0\.5\)$/m);
});

Deno.test("summarizeTraces(): a reward weighed differently by two tasks, or a weight on disk that is not a number, has no one weight", () => {
  const t = (task: string, weights: unknown) =>
    ({ ...trace(task, 1), reward_weights: weights }) as unknown as TaskTrace;
  const s = summarizeTraces([t("a", { correct: 0 }), t("b", undefined)], base);
  assert.deepEqual(s.reward_weights, { correct: null });
  assert.match(
    renderTaskSummary(s),
    /reward "correct": 1\.0000 \(weight differs between rollouts\)/,
  );
  const hostile = summarizeTraces([t("a", { correct: "0" }), t("b", { toString: 0 })], base);
  assert.deepEqual(hostile.reward_weights, { correct: null });
});

Deno.test("summarizeTraces(): a run lost to its judges says so, not that the task's hooks failed", () => {
  const judged = (t: TaskTrace) =>
    ({
      ...t,
      error: { phase: "judge", error: "JudgeVerdictError", message: "no verdict" },
    }) as unknown as TaskTrace;
  const s = summarizeTraces([judged(trace("a", null)), judged(trace("b", null))], {
    ...base,
    rollouts_per_task: 1,
  });
  assert.equal(s.avg_reward, null);
  assert.match(s.no_score_reason!, /0 in the task's own hooks or rewards, 2 in judges/);
});

Deno.test("summarizeTraces(): pass@k counts a rollout passed at the run's pass threshold", () => {
  const traces = [trace("a", 0.75), trace("a", 0.75), trace("b", 1), trace("b", 0.25)];
  const runBase = { ...base, rollouts_per_task: 2 };
  assert.equal(summarizeTraces(traces, runBase).pass_at_k["1"], 0.75);
  const strict = summarizeTraces(traces, runBase, { passThreshold: 1 });
  assert.equal(strict.pass_threshold, 1);
  assert.equal(strict.pass_at_k["1"], 0.25);
  assert.equal(strict.pass_at_k["2"], 0.5);
});
