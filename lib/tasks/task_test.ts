import assert from "node:assert/strict";
import { ConfigError } from "../errors.ts";
import { metric, requireRewards, reward, Task, type TaskHookContext } from "./task.ts";

const ctx = {} as TaskHookContext;

class MethodRewardTask extends Task {
  // A reward written as a plain method: not a reward, and nothing else scores the task.
  correct(_ctx: TaskHookContext) {
    return Promise.resolve(1);
  }
}

class DecoratedTask extends Task {
  @reward
  correct(_ctx: TaskHookContext) {
    return Promise.resolve(this.data.answer === "4" ? 1 : 0);
  }
  @metric
  turns(_ctx: TaskHookContext) {
    return 3;
  }
  helper() {
    return "not a hook";
  }
}

class FieldTask extends Task {
  correct = reward(() => 1, { weight: 2 });
}

class OwnScoreTask extends Task {
  override score() {
    return Promise.resolve({ reward: 1, rewards: { own: 1 }, metrics: {} });
  }
}

Deno.test("requireRewards() fails a task whose reward is a plain method, naming the class and the method", () => {
  const task = new MethodRewardTask({ prompt: "2+2?" });
  assert.throws(
    () => requireRewards(task),
    (error: unknown) =>
      error instanceof ConfigError &&
      /Task class "MethodRewardTask" has no rewards, so every rollout would score 0/.test(
        error.message,
      ) &&
      /its method correct\(\) is not a reward: declare a field \(correct = reward\(/.test(
        error.message,
      ) && /or mark the method @reward/.test(error.message),
  );
  // A judge from the run's config supplies the reward instead.
  requireRewards(task, { judges: 1 });
});

Deno.test("@reward and @metric methods are discovered, bound to the task and scored", async () => {
  const task = new DecoratedTask({ prompt: "2+2?", answer: "4" });
  requireRewards(task);
  assert.deepEqual(task.scoreHooks().map((h) => [h.name, h.kind]), [
    ["correct", "reward"],
    ["turns", "metric"],
  ]);
  assert.deepEqual(await task.score(ctx), {
    reward: 1,
    rewards: { correct: 1 },
    metrics: { turns: 3 },
    weights: { correct: 1 },
  });
});

Deno.test("reward fields and tasks with their own score() need nothing more", async () => {
  const field = new FieldTask({ prompt: "x" });
  requireRewards(field);
  assert.equal((await field.score(ctx)).reward, 2);
  requireRewards(new OwnScoreTask({ prompt: "x" }));
});
