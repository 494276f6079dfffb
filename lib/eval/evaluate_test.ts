import assert from "node:assert/strict";
import { join } from "node:path";
import { EndpointUnreachableError, OpenAIChatClient } from "../model/client.ts";
import { AuthenticationError, ConfigError } from "../errors.ts";
import { evaluate, generate, type Progress } from "./evaluate.ts";
import {
  lastUserText,
  type ModelServer,
  type Responder,
  startModelServer,
} from "../../tests/model_server.ts";
import { loadMetadata, loadOutputs } from "./results.ts";
import { echoEnv } from "../../tests/_echo_env.ts";
import { captureWarnings } from "../../tests/_warnings.ts";
import { groupReward, Rubric } from "../scoring/rubric.ts";

/** Answers `qN` with `aN`: always right. */
const rightAnswer: Responder = (request) => ({ content: lastUserText(request).replace("q", "a") });

function clientFor(server: ModelServer, maxRetries = 0): OpenAIChatClient {
  return new OpenAIChatClient({ base_url: server.url, max_retries: maxRetries, timeout: 5 });
}

function readLines(path: string): unknown[] {
  try {
    return Deno.readTextFileSync(path).split("\n").filter((l) => l.trim()).map((l) =>
      JSON.parse(l)
    );
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return [];
    throw error;
  }
}

Deno.test("evaluate() repeats each example rolloutsPerExample times and scores per group", async () => {
  await using server = await startModelServer({ responder: rightAnswer });
  const groupSizes: number[] = [];
  const rubric = new Rubric({
    funcs: [groupReward(({ states, answers }) => {
      groupSizes.push(states.length);
      assert.equal(new Set(states.map((s) => s.example_id)).size, 1);
      return answers.map(() => 1);
    }, "group_fn")],
  });
  const env = echoEnv(3, { rubric });
  const { outputs, metadata } = await evaluate(env, clientFor(server), "m", {
    rolloutsPerExample: 4,
  });
  assert.deepEqual(groupSizes, [4, 4, 4]);
  assert.equal(outputs.length, 12);
  assert.equal(server.requests.length, 12);
  assert.deepEqual(outputs.map((o) => o.example_id), [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
  assert.equal(metadata.num_examples, 3);
  assert.equal(metadata.rollouts_per_example, 4);
  assert.equal(metadata.num_rollouts, 12);
  assert.equal(metadata.avg_reward, 1);
  assert.equal(metadata.env_id, "echo-test");
  assert.equal(metadata.model, "m");
  assert.equal(metadata.base_url, server.url);
});

Deno.test("evaluate() records pass@k and pass^k when only some answers are right", async () => {
  // q0 always right, q1 right once in two, q2 never right.
  const seen = new Map<string, number>();
  await using server = await startModelServer({
    responder: (request) => {
      const q = lastUserText(request);
      const n = seen.get(q) ?? 0;
      seen.set(q, n + 1);
      const right = q === "q0" || (q === "q1" && n === 0);
      return { content: right ? q.replace("q", "a") : "wrong" };
    },
  });
  const { metadata, outputs } = await evaluate(echoEnv(3), clientFor(server), "m", {
    rolloutsPerExample: 2,
  });
  assert.equal(outputs.length, 6);
  assert.equal(metadata.avg_reward, 0.5);
  assert.deepEqual(Object.keys(metadata.pass_at_k), ["1", "2"]);
  assert.ok(Math.abs(metadata.pass_at_k["1"] - 0.5) < 1e-9);
  assert.ok(Math.abs(metadata.pass_at_k["2"] - 2 / 3) < 1e-9);
  assert.ok(Math.abs(metadata.pass_all_k["1"] - 0.5) < 1e-9);
  assert.ok(Math.abs(metadata.pass_all_k["2"] - 1 / 3) < 1e-9);
  assert.equal(metadata.avg_metrics.correct, 0.5);
});

Deno.test("generate() appends results.jsonl as groups finish and writes metadata.json", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_eval_test_" });
  try {
    await using server = await startModelServer({ responder: rightAnswer });
    const env = echoEnv(3);
    const resultsPath = join(dir, "results.jsonl");
    const linesAtProgress: number[] = [];
    const progress: Progress[] = [];
    const { metadata } = await evaluate(env, clientFor(server), "m", {
      rolloutsPerExample: 2,
      maxConcurrent: 1,
      resultsDir: dir,
      onProgress: (p) => {
        progress.push(p);
        linesAtProgress.push(readLines(resultsPath).length);
      },
    });
    assert.deepEqual(progress.map((p) => [p.done, p.total]), [[2, 6], [4, 6], [6, 6]]);
    // Progress is told once a group's lines are on disk; the next group's may be there too
    // (appends that meet are written together).
    progress.forEach((p, i) => assert.ok(linesAtProgress[i] >= p.done, `${linesAtProgress}`));
    assert.equal(linesAtProgress.at(-1), 6);
    assert.equal(progress.at(-1)!.newOutputs.length, 2);
    const saved = await loadOutputs(dir);
    assert.equal(saved.length, 6);
    assert.equal(saved[0].format_version, 1);
    assert.deepEqual(saved[0].completion, [{ role: "assistant", content: saved[0].answer }]);
    const onDisk = await loadMetadata(dir);
    assert.equal(onDisk.num_rollouts, 6);
    assert.equal(onDisk.avg_reward, 1);
    assert.equal(onDisk.model, "m");
    assert.equal(onDisk.rollouts_per_example, 2);
    assert.deepEqual(onDisk.pass_at_k, metadata.pass_at_k);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("generate() records a failing rollout's error while the others succeed", async () => {
  await using server = await startModelServer({
    responder: (request) =>
      lastUserText(request) === "q1"
        ? { status: 500, headers: { "retry-after": "0" }, body: "upstream exploded" }
        : rightAnswer(request, { index: 0 }),
  });
  const { outputs, metadata } = await evaluate(echoEnv(3), clientFor(server, 1), "m");
  assert.equal(outputs.length, 3);
  const [ok0, failed, ok2] = outputs;
  assert.equal(ok0.error, null);
  assert.equal(ok2.error, null);
  assert.equal(ok0.reward, 1);
  assert.equal(failed.error?.error, "ModelError");
  assert.match(failed.error!.message, /HTTP 500/);
  assert.equal(failed.stop_condition, "has_error");
  assert.equal(failed.reward, 0);
  assert.ok(Math.abs(metadata.avg_error - 1 / 3) < 1e-9);
  // q1 was tried twice (max_retries 1), the others once.
  assert.equal(server.requests.length, 4);
});

Deno.test("generate() aborts on an AuthenticationError and keeps what was written", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_eval_test_" });
  try {
    await using server = await startModelServer({
      responder: (request, ctx) =>
        lastUserText(request) === "q0" ? rightAnswer(request, ctx) : { status: 401 },
    });
    const error = await evaluate(echoEnv(4), clientFor(server), "m", {
      maxConcurrent: 1,
      resultsDir: dir,
    }).catch((e) => e);
    assert.ok(error instanceof AuthenticationError);
    assert.equal(server.requests.length, 2); // nothing ran after the 401
    const saved = await loadOutputs(dir);
    assert.deepEqual(saved.map((o) => o.example_id), [0]);
    assert.equal((await loadMetadata(dir)).num_rollouts, 1);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("generate() stops when its signal aborts and keeps the finished rollouts on disk", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_eval_test_" });
  try {
    const controller = new AbortController();
    await using server = await startModelServer({
      responder: (request, ctx) => {
        if (ctx.index === 0) return rightAnswer(request, ctx);
        setTimeout(() => controller.abort(new Error("stopped by the user")), 20);
        return { hang: true };
      },
    });
    const started = Date.now();
    const error = await evaluate(echoEnv(4), clientFor(server), "m", {
      maxConcurrent: 1,
      resultsDir: dir,
      signal: controller.signal,
    }).catch((e) => e);
    assert.ok(Date.now() - started < 3_000);
    assert.match(String(error?.message), /stopped by the user/);
    assert.equal(server.requests.length, 2);
    const saved = await loadOutputs(dir);
    assert.deepEqual(saved.map((o) => o.example_id), [0]);
    assert.equal((await loadMetadata(dir)).num_rollouts, 1);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("generate() ends the run with the write error when results.jsonl cannot be written", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_eval_test_" });
  try {
    await Deno.mkdir(join(dir, "results.jsonl")); // a directory where the file should be
    await using server = await startModelServer({ responder: rightAnswer });
    let reported = 0;
    const error = await evaluate(echoEnv(50), clientFor(server), "m", {
      maxConcurrent: 1,
      resultsDir: dir,
      onProgress: () => reported++,
    }).catch((e) => e);
    assert.equal((error as { code?: string })?.code, "EISDIR", String(error));
    assert.equal(reported, 0); // progress only counts outputs that reached the disk
    assert.ok(server.requests.length < 50, `${server.requests.length} requests after the error`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("resume completes only the missing rollouts", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_eval_test_" });
  try {
    await using server = await startModelServer({ responder: rightAnswer });
    const client = clientFor(server);
    await evaluate(echoEnv(3), client, "m", {
      numExamples: 2,
      rolloutsPerExample: 2,
      resultsDir: dir,
    });
    assert.equal(server.requests.length, 4);
    // Lose the last saved rollout, as if the run had been killed mid-group.
    const resultsPath = join(dir, "results.jsonl");
    const lines = Deno.readTextFileSync(resultsPath).trimEnd().split("\n");
    const lostId = JSON.parse(lines.at(-1)!).example_id;
    Deno.writeTextFileSync(resultsPath, lines.slice(0, -1).join("\n") + "\n");

    const { outputs, metadata } = await evaluate(echoEnv(3), client, "m", {
      rolloutsPerExample: 2,
      resultsDir: dir,
      resume: true,
    });
    // One rollout for the example that lost one, two for the new third example.
    assert.equal(server.requests.length, 4 + 3);
    const resumedQuestions = server.requests.slice(4).map(lastUserText).sort();
    assert.deepEqual(resumedQuestions, [`q${lostId}`, "q2", "q2"]);
    assert.deepEqual(outputs.map((o) => o.example_id), [0, 0, 1, 1, 2, 2]);
    assert.equal(metadata.num_rollouts, 6);
    assert.equal((await loadOutputs(dir)).length, 6);
    assert.equal((await loadMetadata(dir)).num_examples, 3);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("resume gives a group cut short advantages over all its rollouts, the saved ones too", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_eval_test_" });
  try {
    await using right = await startModelServer({ responder: rightAnswer });
    await evaluate(echoEnv(1), clientFor(right), "m", {
      rolloutsPerExample: 2,
      resultsDir: dir,
    });
    // Lose one of the two saved rollouts (both scored 1).
    const resultsPath = join(dir, "results.jsonl");
    const lines = Deno.readTextFileSync(resultsPath).trimEnd().split("\n");
    Deno.writeTextFileSync(resultsPath, lines[0] + "\n");

    // The resumed rollout answers wrong: reward 0 beside the saved 1, so its advantage is
    // 0 - mean(1, 0) = -0.5 (alone in its group it would have been 0).
    await using wrong = await startModelServer({ responder: () => ({ content: "nope" }) });
    const { outputs } = await evaluate(echoEnv(1), clientFor(wrong), "m", {
      rolloutsPerExample: 2,
      resultsDir: dir,
      resume: true,
    });
    assert.deepEqual(outputs.map((o) => [o.reward, o.advantage]), [[1, 0], [0, -0.5]]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("resume rejects a run saved with another model, listing the mismatch", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_eval_test_" });
  try {
    await using server = await startModelServer({ responder: rightAnswer });
    const client = clientFor(server);
    await evaluate(echoEnv(2), client, "model-a", { resultsDir: dir });
    const error = await evaluate(echoEnv(2), client, "model-b", {
      rolloutsPerExample: 2,
      resultsDir: dir,
      resume: true,
    }).catch((e) => e);
    assert.ok(error instanceof ConfigError);
    assert.match(error.message, /model "model-a" != "model-b"/);
    assert.match(error.message, /rollouts_per_example 1 != 2/);
    assert.equal(server.requests.length, 2);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("maxConcurrent bounds the requests in flight at the server", async () => {
  const live: { server?: ModelServer } = {};
  let maxInFlight = 0;
  const responder: Responder = (request, ctx) => {
    maxInFlight = Math.max(maxInFlight, live.server!.inFlight);
    return { ...rightAnswer(request, ctx), delay_ms: 40 };
  };
  await using started = await startModelServer({ responder });
  live.server = started;
  const { outputs } = await evaluate(echoEnv(6), clientFor(started), "m", { maxConcurrent: 2 });
  assert.equal(outputs.length, 6);
  assert.equal(maxInFlight, 2);

  maxInFlight = 0;
  await evaluate(echoEnv(6), clientFor(started), "m", { maxConcurrent: 4, rolloutsPerExample: 2 });
  assert.equal(maxInFlight, 4); // two groups of two
});

Deno.test("maxRetries re-runs a group hit by an InvalidModelResponseError", async () => {
  const malformedOnce: Responder = (request, ctx) =>
    ctx.index === 0 ? { raw: "{not json" } : rightAnswer(request, ctx);
  const env = echoEnv(1);

  await using once = await startModelServer({ responder: malformedOnce });
  const kept = await evaluate(env, clientFor(once), "m");
  assert.equal(once.requests.length, 1); // the client does not retry malformed JSON itself
  assert.equal(kept.outputs[0].error?.error, "InvalidModelResponseError");

  await using flaky = await startModelServer({ responder: malformedOnce });
  const { outputs } = await evaluate(env, clientFor(flaky), "m", { maxRetries: 1 });
  assert.equal(flaky.requests.length, 2);
  assert.equal(outputs.length, 1);
  assert.equal(outputs[0].error, null);
  assert.equal(outputs[0].reward, 1);

  await using broken = await startModelServer({ responder: () => ({ raw: "{not json" }) });
  const exhausted = await evaluate(env, clientFor(broken), "m", { maxRetries: 1 });
  assert.equal(broken.requests.length, 2);
  assert.equal(exhausted.outputs[0].error?.error, "InvalidModelResponseError");
});

Deno.test("maxRetries does not re-run a group hit by a plain ModelError", async () => {
  await using server = await startModelServer({ responder: () => ({ status: 500 }) });
  const { outputs } = await evaluate(echoEnv(1), clientFor(server), "m", { maxRetries: 2 });
  assert.equal(server.requests.length, 1);
  assert.equal(outputs[0].error?.error, "ModelError");
});

Deno.test("generate() returns outputs sorted by example_id whatever the finishing order", async () => {
  await using server = await startModelServer({
    responder: (request, ctx) => {
      const q = lastUserText(request);
      return { ...rightAnswer(request, ctx), delay_ms: q === "q0" ? 150 : q === "q1" ? 75 : 0 };
    },
  });
  const { outputs } = await evaluate(echoEnv(4), clientFor(server), "m", { rolloutsPerExample: 2 });
  assert.deepEqual(outputs.map((o) => o.example_id), [0, 0, 1, 1, 2, 2, 3, 3]);
});

Deno.test("generate() rejects inputs without example_id", async () => {
  await using server = await startModelServer({ responder: rightAnswer });
  await assert.rejects(
    generate(echoEnv(1), [{ prompt: [{ role: "user", content: "q0" }] }], clientFor(server), "m"),
    ConfigError,
  );
});

Deno.test("generate() ends the run when the endpoint is unreachable", async () => {
  const closed = await startModelServer({ responder: rightAnswer });
  await closed.close();
  const error = await evaluate(echoEnv(3), clientFor(closed), "m").catch((e) => e);
  assert.ok(error instanceof EndpointUnreachableError);
});

Deno.test("resume rejects another shuffle seed, or saved examples this run would not select, naming them", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_eval_test_" });
  try {
    await using server = await startModelServer({ responder: rightAnswer });
    const client = clientFor(server);
    await evaluate(echoEnv(6), client, "m", { numExamples: 3, shuffleSeed: 7, resultsDir: dir });
    assert.equal((await loadMetadata(dir)).shuffle_seed, 7);
    const seeded = await evaluate(echoEnv(6), client, "m", {
      numExamples: 3,
      shuffleSeed: 8,
      resultsDir: dir,
      resume: true,
    }).catch((e) => e);
    assert.ok(seeded instanceof ConfigError, String(seeded));
    assert.match(seeded.message, /shuffle_seed 7 != 8/);
    // Without a seed the first three examples run: the saved ones are not all among them.
    const unseeded = await evaluate(echoEnv(6), client, "m", {
      numExamples: 3,
      resultsDir: dir,
      resume: true,
    }).catch((e) => e);
    assert.ok(unseeded instanceof ConfigError, String(unseeded));
    assert.match(unseeded.message, /shuffle_seed 7 != null/);
    assert.match(
      unseeded.message,
      /saved rollouts of example_id [\d, ]+ are not among this run's examples/,
    );
    assert.equal(server.requests.length, 3, "nothing ran after the refusals");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("resume counts at most rollouts_per_example saved rollouts per example", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_eval_test_" });
  try {
    await using server = await startModelServer({ responder: rightAnswer });
    const client = clientFor(server);
    await evaluate(echoEnv(2), client, "m", { rolloutsPerExample: 2, resultsDir: dir });
    // A third copy of example 0's rollouts, as a crash between two writes could leave.
    const resultsPath = join(dir, "results.jsonl");
    const lines = Deno.readTextFileSync(resultsPath).trimEnd().split("\n");
    const zero = lines.filter((l) => JSON.parse(l).example_id === 0);
    Deno.writeTextFileSync(resultsPath, [...lines, ...zero].join("\n") + "\n");
    let result: Awaited<ReturnType<typeof evaluate>> | undefined;
    const warnings = await captureWarnings(async () => {
      result = await evaluate(echoEnv(2), client, "m", {
        rolloutsPerExample: 2,
        resultsDir: dir,
        resume: true,
      });
    });
    assert.deepEqual(result!.outputs.map((o) => o.example_id).sort(), [0, 0, 1, 1]);
    assert.equal(result!.metadata.num_rollouts, 4);
    assert.equal(server.requests.length, 4, "nothing was missing");
    assert.match(warnings.join("\n"), /2 saved rollouts beyond rollouts_per_example 2 left out/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
