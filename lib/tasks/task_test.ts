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

Deno.test("Task.promptText reads text parts as the exported promptText() does, as upstream's prompt_text", async () => {
  const { promptText } = await import("../scoring/judges/reference.ts");
  const prompt = [
    { role: "system" as const, content: "Be brief." },
    {
      role: "user" as const,
      content: [
        { type: "text" as const, text: "What is in" },
        { type: "image_url" as const, image_url: { url: "data:image/png;base64,AAAA" } },
        { type: "text" as const, text: "this picture?" },
      ],
    },
    { role: "user" as const, content: [] },
  ];
  const task = new Task({ prompt });
  assert.equal(task.promptText, "Be brief.\n\nWhat is in\nthis picture?");
  assert.equal(task.promptText, promptText(prompt));
  assert.equal(new Task({ prompt: "plain" }).promptText, "plain");
});

Deno.test("Taskset.tasks(n) builds no more than n tasks from a lazy load()", async () => {
  const { Taskset } = await import("./task.ts");
  let built = 0;
  class Counting extends Taskset {
    get id() {
      return "counting";
    }
    *load() {
      for (let i = 0; i < 100; i++) {
        built++;
        yield new Task({ prompt: `task ${i}` });
      }
    }
  }
  const set = new Counting();
  const three = await set.tasks(3);
  assert.deepEqual(three.map((t) => t.data.idx), [0, 1, 2]);
  assert.equal(built, 3, "the fourth task was never built");
  built = 0;
  assert.deepEqual(await set.tasks(0), []);
  assert.equal(built, 0);
  assert.equal((await set.tasks(-1)).length, 100);
});

Deno.test("Taskset.head(n) is a lazy view of the first n tasks, as upstream's head(n): the taskset is unchanged", async () => {
  const { Taskset } = await import("./task.ts");
  let built = 0;
  class Private extends Taskset {
    #name = "private";
    get id() {
      return this.#name;
    }
    *load() {
      for (let i = 0; i < 50; i++) {
        built++;
        yield new Task({ prompt: `task ${i}` });
      }
    }
  }
  const set = new Private();
  const view = set.head(3);
  assert.equal(built, 0, "a view builds nothing until read");
  assert.equal(view.id, "private", "the view answers as the taskset, #private fields too");
  assert.ok(view instanceof Private);
  assert.deepEqual((await view.tasks()).map((t) => t.data.prompt), ["task 0", "task 1", "task 2"]);
  assert.equal(built, 3, "the fourth task was never built");
  assert.equal((await view.tasks(2)).length, 2);
  assert.equal((await set.head(10).head(2).tasks()).length, 2);
  assert.deepEqual(await set.head(0).tasks(), []);
  assert.equal((await set.tasks()).length, 50, "the taskset itself is not bounded");
  assert.throws(() => set.head(-1), RangeError);
  assert.throws(() => set.head(1.5), /whole number of tasks, got 1.5/);
});
