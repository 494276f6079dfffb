/**
 * Errors that say where, end to end through the real CLI against a real model server on
 * loopback: a module that does not load is called what it is (vf eval takes environments and
 * tasksets alike, so a taskset is never called an "Environment module"), and a legacy reward
 * that throws is named with the user's file and line while the rows already written stay.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startModelServer, textReply } from "./model_server.ts";
import { MOD_URL, runCli, tempDir, transcript } from "./_cli.ts";

const ANSWERED = `
import { reward, Task, Taskset } from "${MOD_URL}";
class Answered extends Task {
  said = reward(({ trace }) => (trace.messages.length > 0 ? 1 : 0));
}
class Capitals extends Taskset {
  get id() {
    return "where-capitals";
  }
  load() {
    return [new Answered({ id: "fr", prompt: "Capital of France?", answer: "Paris", workdir: "/app" })];
  }
}
export function loadTaskset(config: Record<string, unknown>) {
  return new Capitals(config);
}
`;

/** The lines of stderr that report a fatal error (the CLI prefixes them with "error: "). */
function errorLines(stderr: string): string[] {
  return stderr.split("\n").filter((l) => l.startsWith("error: "));
}

Deno.test("vf eval names a taskset module that throws at import a taskset, with file and line; one exporting neither entry names both", async () => {
  await using dir = await tempDir("vf_where_");
  const write = async (name: string, text: string) => {
    await Deno.writeTextFile(join(dir.path, name), text);
    return join(dir.path, name);
  };
  const taskset = await write(
    "tasks.ts",
    `import { Taskset } from "${MOD_URL}";\n` +
      `function boom(): never {\n  throw new Error("the task list is missing");\n}\n` +
      `if (Taskset) boom();\nexport function loadTaskset() {}\n`,
  );
  const env = await write(
    "env.ts",
    `import { SingleTurnEnv } from "${MOD_URL}";\n` +
      `if (SingleTurnEnv) throw new Error("the data is missing");\n` +
      `export function loadEnvironment() {}\n`,
  );
  const neither = await write("neither.ts", `export const answer = 42;\n`);
  const run = (args: string[]) => runCli(args, { cwd: dir.path });
  const [evalTaskset, runTaskset, evalEnv, evalNeither, runNeither] = await Promise.all([
    run(["eval", taskset, "-m", "m", "-b", "http://127.0.0.1:9/v1"]),
    run(["run", taskset, "-m", "m", "-b", "http://127.0.0.1:9/v1"]),
    run(["eval", env, "-m", "m", "-b", "http://127.0.0.1:9/v1"]),
    run(["eval", neither, "-m", "m", "-b", "http://127.0.0.1:9/v1"]),
    run(["run", neither, "-m", "m", "-b", "http://127.0.0.1:9/v1"]),
  ]);
  for (
    const [res, kind, file, line] of [
      [evalTaskset, "Taskset", taskset, 3],
      [runTaskset, "Taskset", taskset, 3],
      [evalEnv, "Environment", env, 2],
    ] as const
  ) {
    assert.equal(res.code, 1, transcript(res));
    const lines = errorLines(res.stderr);
    assert.equal(lines.length, 1, transcript(res));
    assert.ok(
      lines[0].startsWith(`error: ${kind} module "${file}" failed to load: Error: `),
      transcript(res),
    );
    assert.ok(lines[0].includes(` (at ${file}:${line}:`), transcript(res));
  }
  for (const res of [evalNeither, runNeither]) {
    assert.equal(res.code, 1, transcript(res));
    assert.deepEqual(errorLines(res.stderr), [
      `error: Module "${neither}" exports neither loadEnvironment() (an environment, for vf eval) ` +
      `nor loadTaskset() (a taskset, for vf run or vf eval)`,
    ], transcript(res));
  }
});

Deno.test("a legacy reward that throws is named with its file and line; the run exits 1 past --max-error-rate and keeps every row it wrote", async () => {
  await using dir = await tempDir("vf_where_");
  const module = join(dir.path, "shaky_env.ts");
  // The reward throws on the second example only; the first is scored 1.
  await Deno.writeTextFile(
    module,
    `import { Rubric, SingleTurnEnv } from "${MOD_URL}";\n` +
      `function exactAnswer({ answer }: { answer: string }) {\n` +
      `  if (answer === "2") return (undefined as unknown as { n: number }).n;\n` +
      `  return 1;\n}\n` +
      `export function loadEnvironment() {\n` +
      `  return new SingleTurnEnv({\n` +
      `    evalDataset: [{ question: "one", answer: "1" }, { question: "two", answer: "2" }],\n` +
      `    rubric: new Rubric({ funcs: [exactAnswer] }),\n  });\n}\n`,
  );
  await using server = await startModelServer({ responder: () => textReply("an answer") });
  const res = await runCli([
    "eval",
    module,
    "-m",
    "m",
    "-b",
    server.url,
    "-n",
    "2",
    "-r",
    "1",
    "--max-error-rate",
    "0",
    "-o",
    join(dir.path, "out"),
  ], { cwd: dir.path });
  assert.equal(res.code, 1, transcript(res));
  const where = `Reward function "exactAnswer" failed (at ${module}:3:`;
  // The summary (stdout) names it; the failure line (stderr) gives the rate.
  assert.ok(res.stdout.includes(`RewardError: ${where}`), transcript(res));
  assert.match(res.stderr, /^error: 1 of 2 rollouts errored/m, transcript(res));
  const resultsPath = /^results: (.+)$/m.exec(res.stdout + res.stderr)?.[1];
  assert.ok(resultsPath, transcript(res));
  const rows = (await Deno.readTextFile(resultsPath)).trim().split("\n").map((l) => JSON.parse(l));
  assert.equal(rows.length, 2, "both rollouts were written");
  const byAnswer = new Map(rows.map((r) => [r.answer, r]));
  assert.equal(byAnswer.get("1").reward, 1);
  assert.equal(byAnswer.get("1").error ?? null, null);
  const failed = byAnswer.get("2");
  assert.equal(failed.error.error, "RewardError");
  assert.ok(failed.error.message.startsWith(where), failed.error.message);
  assert.match(failed.error.message, /Cannot read properties of undefined \(reading 'n'\)/);
});

Deno.test("a taskset judge that gives no verdict fails the rollout in phase judge, and the summary counts it in judges, not in the task's own code", async () => {
  await using dir = await tempDir("vf_where_");
  await Deno.writeTextFile(join(dir.path, "capitals.ts"), ANSWERED);
  await using agent = await startModelServer({ responder: () => textReply("It is Paris.") });
  await using judge = await startModelServer({ responder: () => textReply("maybe") });
  await Deno.writeTextFile(
    join(dir.path, "run.toml"),
    `model = "agent-m"\n[client]\nbase_url = "${agent.url}"\n` +
      `[[env.judges]]\nid = "reference"\nmodel = "judge-m"\nbase_url = "${judge.url}"\n` +
      `max_retries = 1\n` +
      `[env.taskset]\nid = "./capitals.ts"\n[env.agent.runtime]\ntype = "subprocess"\n`,
  );
  const res = await runCli(["run", "@", "run.toml", "-o", "out"], { cwd: dir.path });
  assert.equal(res.code, 1, transcript(res));
  assert.equal(judge.requests.length, 2, "asked once and again after a reply with no verdict");
  const tracesPath = /traces: (\S+)/.exec(res.stdout)?.[1];
  assert.ok(tracesPath, transcript(res));
  const [trace] = (await Deno.readTextFile(tracesPath)).trim().split("\n")
    .map((l) => JSON.parse(l));
  assert.equal(trace.reward, null, "a judge's failure never scores the rollout");
  assert.equal(trace.error.phase, "judge", JSON.stringify(trace.error));
  assert.equal(trace.error.error, "JudgeVerdictError", JSON.stringify(trace.error));
  assert.match(trace.error.message, /reference/, "the message names the judge");
  assert.match(res.stdout, /1 in judges/, transcript(res));
  assert.match(res.stdout, /0 in the task's own hooks or rewards/, transcript(res));
});

Deno.test("vf eval of a taskset at a URL runs it as vf run does (here its load fails as the taskset's); vf run of an environment at a URL calls it a taskset load", async () => {
  await using dir = await tempDir("vf_where_");
  const modules: Record<string, string> = {
    "/tasks.ts": "export function loadTaskset() {\n  return null;\n}\n",
    "/env.ts": "export function loadEnvironment() {\n  return null;\n}\n",
  };
  const listening = Promise.withResolvers<number>();
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: ({ port }) => listening.resolve(port) },
    (request) => {
      const text = modules[new URL(request.url).pathname];
      return text === undefined
        ? new Response("not found", { status: 404 })
        : new Response(text, { headers: { "content-type": "application/typescript" } });
    },
  );
  try {
    const origin = `http://127.0.0.1:${await listening.promise}`;
    const common = ["-m", "m", "-b", "http://127.0.0.1:9/v1", "-n", "1"];
    const [evalTasks, runEnv] = await Promise.all([
      runCli(["eval", `${origin}/tasks.ts`, ...common], { cwd: dir.path }),
      runCli(["run", `${origin}/env.ts`, ...common], { cwd: dir.path }),
    ]);
    assert.equal(evalTasks.code, 1, transcript(evalTasks));
    // Tried as an environment, then run as the taskset it is: its loadTaskset() returned null.
    assert.match(
      errorLines(evalTasks.stderr)[0] ?? "",
      new RegExp(
        `^error: Taskset "${origin}/tasks\\.ts" failed to load in the sandbox: .*null`,
      ),
      transcript(evalTasks),
    );
    assert.equal(runEnv.code, 1, transcript(runEnv));
    assert.match(
      errorLines(runEnv.stderr)[0] ?? "",
      new RegExp(`^error: Taskset "${origin}/env\\.ts" failed to load in the sandbox: `),
      transcript(runEnv),
    );
  } finally {
    await server.shutdown();
  }
});
