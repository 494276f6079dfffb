import assert from "node:assert/strict";
import { Parser } from "./parser.ts";
import {
  groupReward,
  type GroupRewardContext,
  type RewardContext,
  Rubric,
  RubricGroup,
  sortHandlers,
} from "./rubric.ts";
import type { State } from "../state.ts";
import type { Messages } from "../types.ts";
import { testState, testStep } from "../../tests/_state.ts";
import { RewardError, ToolParseError } from "../errors.ts";

function answerState(completionText: string, answer = "4", extra: Partial<State> = {}): State {
  return testState({
    completion: [{ role: "assistant", content: completionText }],
    answer,
    ...extra,
  });
}

const lastText = (completion: Messages) => String(completion.at(-1)?.content ?? "");
function exact({ completion, answer }: RewardContext) {
  return lastText(completion) === answer ? 1 : 0;
}
function length({ completion }: RewardContext) {
  return lastText(completion).length;
}

// ---- construction -----------------------------------------------------------------------

Deno.test("Rubric defaults every weight to 1.0", () => {
  const rubric = new Rubric({ funcs: [exact, length] });
  assert.deepEqual(rubric.funcWeights, [1, 1]);
  assert.deepEqual(rubric.funcNames, ["exact", "length"]);
});

Deno.test("Rubric rejects a weights list whose length differs from funcs with a RangeError", () => {
  assert.throws(
    () => new Rubric({ funcs: [exact, length], weights: [1] }),
    (e: unknown) =>
      e instanceof RangeError &&
      e.message === "Rubric got 2 functions but 1 weights; give one weight per function",
  );
  assert.throws(() => new Rubric({ funcs: [], weights: [0.5] }), RangeError);
});

Deno.test("Rubric treats weights: [] as the default, 1.0 per function, as upstream does", async () => {
  const rubric = new Rubric({ funcs: [exact, length], weights: [] });
  assert.deepEqual(rubric.funcWeights, [1, 1]);
  assert.deepEqual(new Rubric({ funcs: [], weights: [] }).funcWeights, []);
  const state = answerState("4");
  await rubric.scoreRollout(state);
  assert.equal(state.reward, state.metrics!.exact + state.metrics!.length);
});

Deno.test("Rubric rejects a reward function that is not a function", () => {
  assert.throws(() => new Rubric({ funcs: [42 as never] }), TypeError);
});

Deno.test("Rubric uses a default Parser and exposes it as a class object", () => {
  const rubric = new Rubric();
  assert.ok(rubric.parser instanceof Parser);
  assert.equal(rubric.classObjects.parser, rubric.parser);
  const parser = new Parser({ extractFn: (t) => t.trim() });
  assert.equal(new Rubric({ parser }).parser, parser);
});

Deno.test("Rubric names an anonymous function reward_<index>", () => {
  const rubric = new Rubric({ funcs: [exact] });
  rubric.addRewardFunc((() => () => 1)());
  assert.deepEqual(rubric.funcNames, ["exact", "reward_1"]);
});

Deno.test("addRewardFunc() defaults to weight 1 and addMetric() to weight 0, both in order", () => {
  const rubric = new Rubric();
  rubric.addMetric(length);
  rubric.addRewardFunc(exact);
  rubric.addRewardFunc(() => 1, 0.5, "custom");
  assert.deepEqual(rubric.funcNames, ["length", "exact", "custom"]);
  assert.deepEqual(rubric.funcWeights, [0, 1, 0.5]);
});

// ---- scoreRollout -----------------------------------------------------------------------

Deno.test("scoreRollout() sets reward to the weighted sum of scores", async () => {
  const rubric = new Rubric({ funcs: [exact, length], weights: [2, 0.5] });
  const state = answerState("4");
  await rubric.scoreRollout(state);
  assert.equal(state.reward, 2 * 1 + 0.5 * 1);
  assert.deepEqual(state.metrics, { exact: 1, length: 1 });
});

Deno.test("scoreRollout() records weight-0 functions in metrics but not in the reward", async () => {
  const rubric = new Rubric({ funcs: [exact] });
  rubric.addMetric(length);
  const state = answerState("four");
  await rubric.scoreRollout(state);
  assert.equal(state.reward, 0);
  assert.deepEqual(state.metrics, { exact: 0, length: 4 });
});

Deno.test("scoreRollout() passes the rollout's fields and class objects to reward functions", async () => {
  const seen: RewardContext[] = [];
  const rubric = new Rubric({ funcs: [(ctx) => (seen.push(ctx), 1)] });
  const helper = { name: "helper" };
  rubric.addClassObject("helper", helper);
  const state = answerState("4", "4", { task: "math", info: { level: 2 }, example_id: 9 });
  await rubric.scoreRollout(state);
  const ctx = seen[0];
  assert.equal(ctx.prompt, state.prompt);
  assert.equal(ctx.completion, state.completion);
  assert.equal(ctx.answer, "4");
  assert.equal(ctx.state, state);
  assert.equal(ctx.task, "math");
  assert.deepEqual(ctx.info, { level: 2 });
  assert.equal(ctx.example_id, 9);
  assert.equal(ctx.parser, rubric.parser);
  assert.equal(ctx.helper, helper);
});

Deno.test("scoreRollout() defaults a missing answer to '' and a missing info to {}", async () => {
  const seen: RewardContext[] = [];
  const rubric = new Rubric({ funcs: [(ctx) => (seen.push(ctx), 1)] });
  await rubric.scoreRollout(testState({ answer: undefined as never, info: undefined as never }));
  assert.equal(seen[0].answer, "");
  assert.deepEqual(seen[0].info, {});
});

Deno.test("scoreRollout() awaits async reward functions", async () => {
  const slow = async ({ answer }: RewardContext) => {
    await new Promise((r) => setTimeout(r, 5));
    return answer === "4" ? 0.75 : 0;
  };
  const rubric = new Rubric({ funcs: [slow] });
  const state = answerState("x");
  await rubric.scoreRollout(state);
  assert.equal(state.reward, 0.75);
  assert.deepEqual(state.metrics, { slow: 0.75 });
});

Deno.test("scoreRollout() coerces boolean results to 1 and 0", async () => {
  const yes = () => true;
  const no = () => Promise.resolve(false);
  const rubric = new Rubric({ funcs: [yes, no] });
  const state = testState();
  await rubric.scoreRollout(state);
  assert.deepEqual(state.metrics, { yes: 1, no: 0 });
  assert.equal(state.reward, 1);
});

Deno.test("scoreRollout() records a throwing reward function as the rollout's error, never a 0", async () => {
  function broken(): number {
    throw new Error("boom");
  }
  const rubric = new Rubric({ funcs: [broken, exact] });
  const state = answerState("4");
  await rubric.scoreRollout(state);
  assert.deepEqual(state.metrics, { exact: 1 }, "no broken: 0 in the metrics");
  assert.ok(state.error instanceof RewardError);
  assert.match((state.error as Error).message, /Reward function "broken" failed: boom/);
  assert.equal(((state.error as Error).cause as Error).message, "boom");
});

Deno.test("scoreRollout() records a rejected async reward function as the error", async () => {
  const rejects = () => Promise.reject(new Error("late boom"));
  const rubric = new Rubric({ funcs: [rejects] });
  const state = testState();
  await rubric.scoreRollout(state);
  assert.deepEqual(state.metrics, {});
  assert.match(String(state.error), /RewardError: Reward function "rejects" failed: late boom/);
});

Deno.test("scoreRollout() records non-numeric results as errors naming the value", async () => {
  const values: unknown[] = ["abc", undefined, null, {}, [], "", NaN, Infinity, 1n];
  for (const value of values) {
    const rubric = new Rubric({ funcs: [() => value as number] });
    const state = testState();
    await rubric.scoreRollout(state);
    assert.deepEqual(state.metrics, {}, `metrics for ${String(value)}`);
    assert.ok(state.error instanceof RewardError, `error for ${String(value)}`);
    assert.match((state.error as Error).message, /not a number/);
  }
});

Deno.test("scoreRollout() replaces a tool-call error with the reward failure (the rollout was not scored)", async () => {
  const rubric = new Rubric({ funcs: [() => NaN] });
  const state = testState();
  state.error = new ToolParseError("bad arguments");
  await rubric.scoreRollout(state);
  assert.ok(state.error instanceof RewardError);
});

Deno.test("scoreRollout() keeps an earlier error (the model's) over a reward failure", async () => {
  const rubric = new Rubric({ funcs: [() => NaN] });
  const state = testState();
  const first = new Error("model went away");
  state.error = first;
  await rubric.scoreRollout(state);
  assert.equal(state.error, first);
});

Deno.test("scoreRollout() accepts a numeric string, as float() does", async () => {
  const rubric = new Rubric({ funcs: [() => "0.5" as unknown as number] });
  const state = testState();
  await rubric.scoreRollout(state);
  assert.equal(state.reward, 0.5);
});

Deno.test("scoreRollout() runs functions sequentially, so a later one sees state set by an earlier one", async () => {
  const order: string[] = [];
  async function first({ state }: RewardContext) {
    order.push("first:start");
    await new Promise((r) => setTimeout(r, 10));
    state.parsed = 42;
    order.push("first:end");
    return 1;
  }
  function second({ state }: RewardContext) {
    order.push("second");
    return state.parsed === 42 ? 1 : 0;
  }
  const rubric = new Rubric({ funcs: [first, second] });
  const state = testState();
  await rubric.scoreRollout(state);
  assert.deepEqual(order, ["first:start", "first:end", "second"]);
  assert.deepEqual(state.metrics, { first: 1, second: 1 });
});

Deno.test("scoreRollout() keeps the last score for duplicate names but sums both into the reward", async () => {
  const rubric = new Rubric();
  rubric.addRewardFunc(() => 1, 1, "dup");
  rubric.addRewardFunc(() => 0.25, 1, "dup");
  const state = testState();
  await rubric.scoreRollout(state);
  assert.deepEqual(state.metrics, { dup: 0.25 });
  assert.equal(state.reward, 1.25);
});

Deno.test("scoreRollout() rejects a rubric holding a group reward function", async () => {
  const rubric = new Rubric({ funcs: [exact, groupReward(({ states }) => states.map(() => 1))] });
  const state = testState();
  await assert.rejects(() => rubric.scoreRollout(state), TypeError);
  assert.equal(state.reward, null);
});

Deno.test("scoreRollout() with no functions sets reward 0 and empty metrics", async () => {
  const state = testState();
  await new Rubric().scoreRollout(state);
  assert.equal(state.reward, 0);
  assert.deepEqual(state.metrics, {});
});

// ---- scoreGroup -------------------------------------------------------------------------

Deno.test("groupReward() flags a function and can name it", () => {
  const fn = groupReward(({ states }) => states.map(() => 1), "diversity");
  const rubric = new Rubric({ funcs: [fn] });
  assert.deepEqual(rubric.funcNames, ["diversity"]);
  assert.equal(rubric.entries[0].group, true);
  assert.equal(new Rubric({ funcs: [exact] }).entries[0].group, false);
});

Deno.test("scoreGroup() runs an individual function once per state", async () => {
  const calls: number[] = [];
  const rubric = new Rubric({
    funcs: [({ example_id }) => (calls.push(example_id), example_id / 10)],
  });
  const states = [0, 1, 2].map((i) => testState({ example_id: i }));
  await rubric.scoreGroup(states);
  assert.deepEqual(calls.sort(), [0, 1, 2]);
  assert.deepEqual(states.map((s) => s.reward), [0, 0.1, 0.2]);
});

Deno.test("scoreGroup() runs an individual function concurrently across states", async () => {
  let active = 0;
  let peak = 0;
  const rubric = new Rubric({
    funcs: [async () => {
      active++;
      peak = Math.max(peak, active);
      await new Promise((r) => setTimeout(r, 10));
      active--;
      return 1;
    }],
  });
  await rubric.scoreGroup([testState(), testState(), testState()]);
  assert.equal(peak, 3);
});

Deno.test("scoreGroup() calls a group function once with the plural lists", async () => {
  const contexts: GroupRewardContext[] = [];
  const fn = groupReward((ctx) => {
    contexts.push(ctx);
    return ctx.completions.map((c, i) => (lastText(c) === ctx.answers[i] ? 1 : 0));
  }, "group_exact");
  const rubric = new Rubric({ funcs: [fn] });
  rubric.addClassObject("helper", "h");
  const states = [
    answerState("4", "4", { task: "a", info: { n: 1 } }),
    answerState("5", "4", { task: "b" }),
  ];
  await rubric.scoreGroup(states);
  assert.equal(contexts.length, 1);
  const ctx = contexts[0];
  assert.deepEqual(ctx.prompts, states.map((s) => s.prompt));
  assert.deepEqual(ctx.completions, states.map((s) => s.completion));
  assert.deepEqual(ctx.answers, ["4", "4"]);
  assert.equal(ctx.states[0], states[0]);
  assert.equal(ctx.states[1], states[1]);
  assert.deepEqual(ctx.tasks, ["a", "b"]);
  assert.deepEqual(ctx.infos, [{ n: 1 }, {}]);
  assert.equal(ctx.parser, rubric.parser);
  assert.equal(ctx.helper, "h");
  assert.deepEqual(states.map((s) => s.metrics), [{ group_exact: 1 }, { group_exact: 0 }]);
});

Deno.test("scoreGroup() mixes group and individual functions with weights", async () => {
  const rubric = new Rubric({
    funcs: [exact, groupReward(({ states }) => states.map((_, i) => i), "rank")],
    weights: [1, 0.5],
  });
  const states = [answerState("4"), answerState("x"), answerState("4")];
  await rubric.scoreGroup(states);
  assert.deepEqual(states.map((s) => s.reward), [1, 0.5, 2]);
  assert.deepEqual(states.map((s) => s.metrics), [
    { exact: 1, rank: 0 },
    { exact: 0, rank: 1 },
    { exact: 1, rank: 2 },
  ]);
});

Deno.test("scoreGroup() records a throwing group function on every state, never a 0", async () => {
  const rubric = new Rubric({
    funcs: [
      exact,
      groupReward(() => {
        throw new Error("group boom");
      }, "bad_group"),
    ],
  });
  const states = [answerState("4"), answerState("4")];
  await rubric.scoreGroup(states);
  assert.deepEqual(states.map((s) => s.metrics), [{ exact: 1 }, { exact: 1 }]);
  for (const s of states) {
    assert.match(String(s.error), /RewardError: Reward function "bad_group" failed: group boom/);
  }
});

Deno.test("scoreGroup() records an error when a group function returns the wrong number of scores", async () => {
  const rubric = new Rubric({ funcs: [groupReward(() => [1], "short")] });
  const states = [testState(), testState()];
  await rubric.scoreGroup(states);
  for (const s of states) {
    assert.match(String(s.error), /"short" failed: returned 1 scores for a group of 2/);
    assert.deepEqual(s.metrics, {});
  }
});

Deno.test("scoreGroup() sets advantage to reward minus the group mean", async () => {
  const rubric = new Rubric({ funcs: [({ state }) => state.example_id] });
  const states = [1, 2, 6].map((i) => testState({ example_id: i }));
  await rubric.scoreGroup(states);
  assert.deepEqual(states.map((s) => s.advantage), [-2, -1, 3]);
});

Deno.test("scoreGroup() fills null step rewards and advantages and keeps preset ones", async () => {
  const rubric = new Rubric({ funcs: [({ state }) => state.example_id] });
  const a = testState({
    example_id: 0,
    trajectory: [testStep(), testStep({ reward: 0.5 }), testStep({ advantage: 9 })],
  });
  const b = testState({ example_id: 2, trajectory: [testStep()] });
  await rubric.scoreGroup([a, b]);
  assert.deepEqual(a.trajectory.map((s) => [s.reward, s.advantage]), [
    [0, -1],
    [0.5, -1],
    [0, 9],
  ]);
  assert.deepEqual(b.trajectory.map((s) => [s.reward, s.advantage]), [[2, 1]]);
});

Deno.test("scoreGroup() of an empty list calls nothing", async () => {
  let called = false;
  const rubric = new Rubric({ funcs: [() => (called = true, 1)] });
  await rubric.scoreGroup([]);
  assert.equal(called, false);
});

Deno.test("scoreGroup() of one state gives advantage 0", async () => {
  const state = testState();
  await new Rubric({ funcs: [() => 0.7] }).scoreGroup([state]);
  assert.equal(state.reward, 0.7);
  assert.equal(state.advantage, 0);
});

// ---- RubricGroup ------------------------------------------------------------------------

Deno.test("RubricGroup rejects an empty list of rubrics", () => {
  assert.throws(() => new RubricGroup([]), RangeError);
});

Deno.test("RubricGroup concatenates names and weights and shares the first parser", () => {
  const a = new Rubric({ funcs: [exact], weights: [2] });
  const b = new Rubric({ funcs: [length], weights: [0] });
  const group = new RubricGroup([a, b]);
  assert.deepEqual(group.funcNames, ["exact", "length"]);
  assert.deepEqual(group.funcWeights, [2, 0]);
  assert.equal(group.parser, a.parser);
});

Deno.test("RubricGroup.scoreRollout() sums rewards and metrics across members", async () => {
  const a = new Rubric({ funcs: [exact, length], weights: [1, 0] });
  const b = new Rubric({ funcs: [() => 0.5], weights: [2] });
  const group = new RubricGroup([a, b]);
  const state = answerState("4");
  await group.scoreRollout(state);
  assert.equal(state.reward, 1 + 0 + 1);
  assert.deepEqual(state.metrics, { exact: 1, length: 1, reward_0: 0.5 });
});

Deno.test("RubricGroup sums a metric name that appears in several members", async () => {
  const a = new Rubric();
  a.addRewardFunc(() => 0.25, 1, "shared");
  const b = new Rubric();
  b.addMetric(() => 0.5, 0, "shared");
  const group = new RubricGroup([a, b]);
  const state = testState();
  await group.scoreRollout(state);
  assert.deepEqual(state.metrics, { shared: 0.75 });
  assert.equal(state.reward, 0.25);
  const states = [testState(), testState()];
  await group.scoreGroup(states);
  assert.deepEqual(states.map((s) => s.metrics), [{ shared: 0.75 }, { shared: 0.75 }]);
});

Deno.test("RubricGroup.scoreRollout() runs members sequentially in order", async () => {
  const order: string[] = [];
  const a = new Rubric({
    funcs: [async ({ state }) => {
      await new Promise((r) => setTimeout(r, 10));
      state.note = "from a";
      order.push("a");
      return 1;
    }],
  });
  const b = new Rubric({
    funcs: [({ state }) => (order.push("b"), state.note === "from a" ? 1 : 0)],
  });
  const state = testState();
  await new RubricGroup([a, b]).scoreRollout(state);
  assert.deepEqual(order, ["a", "b"]);
  assert.equal(state.reward, 2);
});

Deno.test("RubricGroup.scoreGroup() sums rewards and recomputes advantage from the sum", async () => {
  const a = new Rubric({ funcs: [({ state }) => state.example_id] });
  const monitor = new Rubric();
  monitor.addMetric(() => 3, 0, "num_turns");
  const group = new RubricGroup([a, monitor]);
  const states = [0, 4].map((i) => testState({ example_id: i, trajectory: [testStep()] }));
  await group.scoreGroup(states);
  assert.deepEqual(states.map((s) => s.reward), [0, 4]);
  assert.deepEqual(states.map((s) => s.advantage), [-2, 2]);
  assert.deepEqual(states.map((s) => s.metrics), [
    { reward_0: 0, num_turns: 3 },
    { reward_0: 4, num_turns: 3 },
  ]);
  assert.deepEqual(states.map((s) => [s.trajectory[0].reward, s.trajectory[0].advantage]), [
    [0, -2],
    [4, 2],
  ]);
});

Deno.test("scoreGroup() keeps function order and sums when a function in the middle goes async", async () => {
  // Synchronous functions are scored without an async step; the first async one hands the rest
  // to an async continuation. Both paths, in one rubric and across a RubricGroup's members.
  const calls: string[] = [];
  const sync = (name: string, v: number) => {
    const fn = () => (calls.push(name), v);
    Object.defineProperty(fn, "name", { value: name });
    return fn;
  };
  const later = async ({ state }: RewardContext) => {
    calls.push("async");
    await new Promise((r) => setTimeout(r, 5));
    return state.example_id;
  };
  const first = new Rubric({ funcs: [sync("a", 1), later, sync("b", 2)], weights: [1, 1, 10] });
  const second = new Rubric({ funcs: [sync("c", 100)] });
  const third = new Rubric();
  third.addMetric(sync("d", 7), 0, "d");
  const group = new RubricGroup([third, first, second]);
  const states = [0, 2].map((i) => testState({ example_id: i, trajectory: [testStep()] }));
  await group.scoreGroup(states);
  assert.deepEqual(calls, ["d", "d", "a", "a", "async", "async", "b", "b", "c", "c"]);
  assert.deepEqual(states.map((s) => s.reward), [121, 123]);
  assert.deepEqual(states.map((s) => s.metrics), [
    { d: 7, a: 1, later: 0, b: 2, c: 100 },
    { d: 7, a: 1, later: 2, b: 2, c: 100 },
  ]);
  assert.deepEqual(states.map((s) => s.advantage), [-1, 1]);
  assert.deepEqual(states.map((s) => s.trajectory[0].reward), [121, 123]);
});

Deno.test("RubricGroup.scoreGroup() fills steps from the summed reward and keeps preset step values", async () => {
  const a = new Rubric({ funcs: [() => 1] });
  const b = new Rubric({ funcs: [({ state }) => state.example_id] });
  const states = [
    testState({
      example_id: 0,
      trajectory: [testStep(), testStep({ reward: 0.25, advantage: 0.5 })],
    }),
    testState({ example_id: 2, trajectory: [testStep()] }),
  ];
  await new RubricGroup([a, b]).scoreGroup(states);
  assert.deepEqual(states[0].trajectory.map((s) => [s.reward, s.advantage]), [
    [1, -1],
    [0.25, 0.5],
  ]);
  assert.deepEqual(states[1].trajectory.map((s) => [s.reward, s.advantage]), [[3, 1]]);
});

Deno.test("RubricGroup delegates addRewardFunc, addMetric and addClassObject to the first rubric", async () => {
  const a = new Rubric();
  const b = new Rubric();
  const group = new RubricGroup([a, b]);
  group.addRewardFunc(exact, 2);
  group.addMetric(length);
  group.addClassObject("helper", 7);
  assert.deepEqual(a.funcNames, ["exact", "length"]);
  assert.deepEqual(a.funcWeights, [2, 0]);
  assert.deepEqual(b.funcNames, []);
  assert.equal(a.classObjects.helper, 7);
  assert.equal(b.classObjects.helper, undefined);
  assert.deepEqual(group.funcNames, ["exact", "length"]);
  const state = answerState("4");
  await group.scoreRollout(state);
  assert.equal(state.reward, 2);
});

// ---- cleanup and teardown ---------------------------------------------------------------

Deno.test("cleanup() runs hooks by descending priority, then by name", async () => {
  const order: string[] = [];
  const rubric = new Rubric();
  rubric.addCleanup(() => void order.push("b0"), { name: "b" });
  rubric.addCleanup(() => void order.push("a0"), { name: "a" });
  rubric.addCleanup(() => void order.push("z5"), { name: "z", priority: 5 });
  rubric.addCleanup(() => void order.push("low"), { name: "c", priority: -1 });
  const state = testState();
  await rubric.cleanup(state);
  assert.deepEqual(order, ["z5", "a0", "b0", "low"]);
});

Deno.test("cleanup() hands the state to each hook and awaits async hooks in turn", async () => {
  const order: string[] = [];
  const rubric = new Rubric();
  rubric.addCleanup(async function first(state) {
    await new Promise((r) => setTimeout(r, 10));
    state.cleaned = true;
    order.push("first");
  }, { priority: 1 });
  rubric.addCleanup(function second(state) {
    order.push(`second:${state.cleaned}`);
  });
  await rubric.cleanup(testState());
  assert.deepEqual(order, ["first", "second:true"]);
});

Deno.test("teardown() runs hooks by descending priority, then by function name", async () => {
  const order: string[] = [];
  const rubric = new Rubric();
  function beta() {
    order.push("beta");
  }
  function alpha() {
    order.push("alpha");
  }
  function urgent() {
    order.push("urgent");
  }
  rubric.addTeardown(beta);
  rubric.addTeardown(alpha);
  rubric.addTeardown(urgent, { priority: 10 });
  await rubric.teardown();
  assert.deepEqual(order, ["urgent", "alpha", "beta"]);
});

Deno.test("RubricGroup runs its own cleanup and teardown hooks, then each member's", async () => {
  const order: string[] = [];
  const a = new Rubric();
  const b = new Rubric();
  a.addCleanup(() => void order.push("a:cleanup"));
  b.addCleanup(() => void order.push("b:cleanup"));
  a.addTeardown(() => void order.push("a:teardown"));
  b.addTeardown(() => void order.push("b:teardown"));
  const group = new RubricGroup([a, b]);
  group.addCleanup(() => void order.push("group:cleanup"));
  group.addTeardown(() => void order.push("group:teardown"));
  await group.cleanup(testState());
  await group.teardown();
  assert.deepEqual(order, [
    "group:cleanup",
    "a:cleanup",
    "b:cleanup",
    "group:teardown",
    "a:teardown",
    "b:teardown",
  ]);
});

Deno.test("sortHandlers() orders by priority descending, then name ascending", () => {
  const list = [
    { name: "b", priority: 0 },
    { name: "a", priority: 0 },
    { name: "c", priority: 2 },
    { name: "d", priority: -3 },
  ];
  sortHandlers(list);
  assert.deepEqual(list.map((h) => h.name), ["c", "a", "b", "d"]);
});

Deno.test("scoreGroup() of a group of one, scored again, sums a function and a metric rubric afresh", () => {
  const rubric = new RubricGroup([
    new Rubric({ funcs: [exact] }),
    new Rubric({ funcs: [length], weights: [0] }),
  ]);
  const states = [answerState("4")];
  for (let i = 0; i < 3; i++) rubric.scoreGroup(states);
  assert.equal(states[0].reward, 1);
  assert.deepEqual(states[0].metrics, { exact: 1, length: 1 });
});
