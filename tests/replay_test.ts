/**
 * `vf replay` and `vf rescore` on a finished `vf eval` run with the model server stopped:
 * replay reproduces every reward from the record; rescore re-applies an environment's changed
 * reward to the saved completions; both write a new run naming its source, and neither asks
 * the model anything.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { lastUserText, startModelServer } from "./model_server.ts";
import { cliCommand, collect, MOD_URL, tempDir, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const ANSWERS = new Map(
  (loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
    { question: string; answer: string }
  >).map((r) => [r.question, r.answer]),
);

async function rows(dir: string): Promise<Json[]> {
  return (await Deno.readTextFile(join(dir, "results.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
}

/** Rewards by example and place in its group. */
function rewards(list: Json[]): Map<string, number> {
  const seen = new Map<number, number>();
  return new Map(list.map((o) => {
    const n = seen.get(o.example_id) ?? 0;
    seen.set(o.example_id, n + 1);
    return [`${o.example_id}#${n}`, o.reward];
  }));
}

const ENV = (scoring: string) => `
import { Rubric, SingleTurnEnv } from "${MOD_URL}";
export function loadEnvironment() {
  return new SingleTurnEnv({
    envId: "words",
    evalDataset: ["alpha", "beta", "gamma"].map((w) => ({ question: "Say " + w, answer: w })),
    rubric: new Rubric({ funcs: [function score({ completion, answer }) {
      const text = String(completion.at(-1)?.content ?? "");
      return ${scoring};
    }] }),
  });
}
`;

Deno.test("vf replay reproduces a run's rewards offline; vf rescore applies a changed reward to the saved completions", async () => {
  await using tmp = await tempDir("vf_replay_");
  const run = (args: string[]) =>
    collect(cliCommand(args, { cwd: tmp.path, env: {}, registry: false }));
  const saving = (stderr: string) => /^Saving results to (.+)$/m.exec(stderr)![1];

  // A run whose answers are right or wrong by question and attempt: varied rewards.
  let source: string;
  let words: string;
  {
    let n = 0;
    await using model = await startModelServer({
      responder: (request) => {
        const q = lastUserText(request);
        const answer = ANSWERS.get(q);
        n++;
        if (answer === undefined) return { content: q.replace("Say ", n % 2 ? "" : "maybe ") };
        return { content: `\\boxed{${n % 3 === 0 ? "0" : answer}}` };
      },
    });
    const first = await run([
      "eval",
      "gsm8k",
      "-m",
      "m",
      "-b",
      model.url,
      "-n",
      "4",
      "-r",
      "2",
      "-o",
      "out",
    ]);
    assert.equal(first.code, 0, transcript(first));
    source = saving(first.stderr);
    await Deno.writeTextFile(join(tmp.path, "words.ts"), ENV("text === answer ? 1 : 0"));
    const second = await run([
      "eval",
      "./words.ts",
      "-m",
      "m",
      "-b",
      model.url,
      "-n",
      "3",
      "-r",
      "2",
      "-o",
      "out",
    ]);
    assert.equal(second.code, 0, transcript(second));
    words = saving(second.stderr);
  } // the model server is gone from here on

  const original = await rows(source);
  assert.ok(new Set(original.map((r) => r.reward)).size > 1, "the run has varied rewards");
  const replay = await run(["replay", source]);
  assert.equal(replay.code, 0, transcript(replay));
  assert.match(
    replay.stdout,
    /replayed 8 rollouts .*: 8 of 8 rewards as before; 8 replies from the record, 0 missing/,
  );
  const replayed = saving(replay.stderr);
  assert.deepEqual(rewards(await rows(replayed)), rewards(original));
  assert.deepEqual(
    (await rows(replayed)).map((r) => r.completion[0].content).sort(),
    original.map((r) => r.completion[0].content).sort(),
  );
  const meta = JSON.parse(await Deno.readTextFile(join(replayed, "metadata.json")));
  assert.equal(meta.replayed_from, source);

  // The reward changes: now any answer that names the word counts.
  const before = await rows(words);
  assert.deepEqual(before.map((r) => r.reward).sort(), [0, 0, 0, 1, 1, 1]);
  await Deno.writeTextFile(join(tmp.path, "words.ts"), ENV("text.includes(answer) ? 1 : 0"));
  const rescore = await run(["rescore", words]);
  assert.equal(rescore.code, 0, transcript(rescore));
  const rescored = saving(rescore.stderr);
  const after = await rows(rescored);
  assert.deepEqual(after.map((r) => r.reward), after.map(() => 1));
  assert.equal(
    JSON.parse(await Deno.readTextFile(join(rescored, "metadata.json"))).rescored_from,
    words,
  );

  const bad = await run(["replay", join(tmp.path, "nowhere")]);
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /nowhere: not a run folder/);
});

Deno.test("vf replay re-runs a vf run (file-sum in Docker) from its record with the model and the Docker engine both out of reach, and gets the same rewards", async () => {
  await using tmp = await tempDir("vf_replay_tasks_");
  let source: string;
  {
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m) => m.role === "assistant").length;
        const commands = [
          "cat /app/input.txt",
          // A wrong sum for one task, so the rewards differ between tasks.
          "if grep -q '^1$' /app/input.txt; then echo 0; else awk '{ s += $1 } END { print s }' /app/input.txt; fi > /app/output/answer.txt",
        ];
        return turn < commands.length
          ? {
            content: null,
            tool_calls: [{ name: "bash", arguments: { command: commands[turn] } }],
          }
          : { content: "Done." };
      },
    });
    const first = await collect(cliCommand(
      ["run", "file-sum", "-m", "m", "-b", model.url, "-n", "3", "-r", "2", "-o", "out"],
      { cwd: tmp.path, env: {}, registry: false, docker: true },
    ));
    assert.equal(first.code, 0, transcript(first));
    source = /^Saving traces to (.+)$/m.exec(first.stderr)![1];
  }
  const traces = (await Deno.readTextFile(join(source, "traces.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
  const records = (await Deno.readTextFile(join(source, "record.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
  assert.equal(records.length, traces.length);
  assert.ok(
    records.every((r) => r.sandboxes.some((s: Json) => s.ops.some((o: Json) => o.op === "run"))),
  );

  // Neither the model nor a Docker engine can be reached now.
  const replay = await collect(cliCommand(["replay", source], {
    cwd: tmp.path,
    env: { DOCKER_HOST: `unix://${join(tmp.path, "no-engine.sock")}` },
    registry: false,
  }));
  assert.equal(replay.code, 0, transcript(replay));
  assert.match(
    replay.stdout,
    /replayed 6 rollouts .*: 6 of 6 rewards as before; 18 replies from the record, 0 missing/,
  );
  const target = /^Saving traces to (.+)$/m.exec(replay.stderr)![1];
  const again = (await Deno.readTextFile(join(target, "traces.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
  const byKey = (list: Json[]) =>
    new Map(list.map((t) => [`${t.task.key}#${t.rollout_index}`, t.reward]));
  assert.deepEqual(byKey(again), byKey(traces));
  assert.ok(new Set(traces.map((t) => t.reward)).size > 1, "the run has varied rewards");
  // Each progress line counts the episodes written so far, and the replay spent the tokens
  // the original did (its replies carry their usage).
  const counts = [...replay.stderr.matchAll(/^file-sum (\d+)\/6 /gm)].map((m) => Number(m[1]));
  assert.deepEqual(counts, [1, 2, 3, 4, 5, 6], replay.stderr);
  const tokens = (t: Json[]) => t.reduce((n, x) => n + x.usage.input_tokens, 0);
  assert.ok(tokens(traces) > 0);
  assert.equal(tokens(again), tokens(traces));
  assert.match(replay.stdout, new RegExp(`tokens: input ${tokens(traces)},`));
  assert.equal(
    JSON.parse(await Deno.readTextFile(join(target, "metadata.json"))).replayed_from,
    source,
  );
});

const CAPITALS = (check: string) => `
import { metric, reward, Task, Taskset } from "${MOD_URL}";
class Capital extends Task {
  static override HARNESS = "null";
  said = reward(({ trace }) => {
    const text = String(trace.messages.at(-1)?.content ?? "");
    return ${check} ? 1 : 0;
  }, { offline: true });
  // Hooks that need the sandbox: a rescore cannot run them again.
  looked = reward(() => 1, { weight: 0 });
  probed = metric(() => 1);
}
class Capitals extends Taskset {
  get id() { return "capitals"; }
  *load() {
    yield new Capital({ id: "fr", prompt: "Capital of France?" });
    yield new Capital({ id: "it", prompt: "Capital of Italy?" });
  }
}
export function loadTaskset(config) { return new Capitals(config); }
`;

Deno.test("vf rescore re-applies a task run's changed offline reward to its saved traces, with the model stopped", async () => {
  await using tmp = await tempDir("vf_rescore_tasks_");
  await Deno.writeTextFile(
    join(tmp.path, "capitals.ts"),
    CAPITALS('text.includes("Paris") || text.includes("Rome")'),
  );
  let source: string;
  {
    await using model = await startModelServer({
      responder: ({ body }) => ({
        content: JSON.stringify(body.messages).includes("France") ? "It is PARIS." : "It is Rome.",
      }),
    });
    const first = await collect(cliCommand(
      [
        "run",
        "./capitals.ts",
        "-m",
        "m",
        "-b",
        model.url,
        "-o",
        "out",
        "--env.agent.runtime.type",
        "subprocess",
      ],
      { cwd: tmp.path, env: {}, registry: false },
    ));
    assert.equal(first.code, 0, transcript(first));
    source = /^Saving traces to (.+)$/m.exec(first.stderr)![1];
  }
  const rewards = async (dir: string) =>
    new Map(
      (await Deno.readTextFile(join(dir, "traces.jsonl"))).trim().split("\n")
        .map((l) => JSON.parse(l)).map((t: Json) => [t.task.key, t.reward]),
    );
  assert.deepEqual(await rewards(source), new Map([["fr", 0], ["it", 1]]));

  // The reward changes: case no longer matters.
  await Deno.writeTextFile(join(tmp.path, "capitals.ts"), CAPITALS("/paris|rome/i.test(text)"));
  const rescore = await collect(
    cliCommand(["rescore", source], { cwd: tmp.path, env: {}, registry: false }),
  );
  assert.equal(rescore.code, 0, transcript(rescore));
  const target = /^Saving traces to (.+)$/m.exec(rescore.stderr)![1];
  assert.deepEqual(await rewards(target), new Map([["fr", 1], ["it", 1]]));
  // A reward and a metric that could not run again are both dropped, and named on the trace.
  const before: Json = JSON.parse(
    (await Deno.readTextFile(join(source, "traces.jsonl"))).split("\n")[0],
  );
  assert.equal(before.rewards.looked, 1);
  assert.equal(before.metrics.probed, 1);
  for (const line of (await Deno.readTextFile(join(target, "traces.jsonl"))).trim().split("\n")) {
    const t = JSON.parse(line);
    assert.deepEqual(Object.keys(t.rewards), ["said"]);
    assert.equal(t.metrics.probed, undefined, "a skipped metric kept its old value");
    assert.deepEqual(t.info.rescore_skipped.sort(), ["looked", "probed"]);
  }
  const meta = JSON.parse(await Deno.readTextFile(join(target, "metadata.json")));
  assert.equal(meta.rescored_from, source);
  assert.equal(meta.avg_reward, 1);
});

const COUNTER_SERVER = `
import { McpServer } from "npm:@modelcontextprotocol/sdk@^1.32.0/server/mcp.js";
import { StdioServerTransport } from "npm:@modelcontextprotocol/sdk@^1.32.0/server/stdio.js";
import { z } from "npm:zod@^4.6.0";
const server = new McpServer({ name: "counter", version: "1" });
let count = 0;
server.registerTool("inc", { description: "Add", inputSchema: { by: z.number() } },
  ({ by }) => ({ content: [{ type: "text", text: String(count += by) }] }));
server.registerTool("get", { description: "Read", inputSchema: {} },
  () => ({ content: [{ type: "text", text: String(count) }] }));
await server.connect(new StdioServerTransport());
`;

const COUNTS = `
import { defineToolset, reward, Task, Taskset } from "${MOD_URL}";
import { z } from "npm:zod@^4.6.0";
class CountTask extends Task {
  static override HARNESS = "null";
  override initialState() { return { notes: [] }; }
  override toolsets() {
    return [defineToolset({
      name: "notes",
      tools: { add: { description: "Note", parameters: { text: z.string() },
        run: ({ text }, { state }) => { state.notes.push(text); return "noted"; } } },
    })];
  }
  counted = reward(async ({ tools }) => (await tools.call("counter_get", {})).text === "5" ? 1 : 0);
  noted = reward(({ state }) => (state.notes[0] === "five" ? 1 : 0));
}
class Counts extends Taskset {
  get id() { return "counts"; }
  *load() { yield new CountTask({ id: "c", prompt: "Count to five." }); }
}
export function loadTaskset(config) { return new Counts(config); }
`;

Deno.test("vf replay answers a stdio MCP toolset from the record (its server is gone) and runs TypeScript tools again", async () => {
  await using tmp = await tempDir("vf_replay_tools_");
  await Deno.writeTextFile(join(tmp.path, "server.ts"), COUNTER_SERVER);
  await Deno.writeTextFile(join(tmp.path, "counts.ts"), COUNTS);
  await Deno.writeTextFile(
    join(tmp.path, "run.toml"),
    `model = "m"\n[env.taskset]\nid = "./counts.ts"\n[env.agent.runtime]\ntype = "subprocess"\n` +
      `[[env.toolsets]]\nname = "counter"\ncommand = "${Deno.execPath()}"\n` +
      `args = ["run", "-A", "server.ts"]\ncwd = "."\n`,
  );
  const plan = [["counter_inc", { by: 2 }], ["counter_inc", { by: 3 }], ["notes_add", {
    text: "five",
  }]] as const;
  let source: string;
  {
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m) => m.role === "assistant").length;
        if (turn < plan.length) {
          const [name, args] = plan[turn];
          return { content: null, tool_calls: [{ name, arguments: args }] };
        }
        return { content: "Counted." };
      },
    });
    const first = await collect(cliCommand(
      ["eval", "@", "run.toml", "-b", model.url, "-o", "out"],
      { cwd: tmp.path, env: {}, registry: false },
    ));
    assert.equal(first.code, 0, transcript(first));
    source = /^Saving traces to (.+)$/m.exec(first.stderr)![1];
  }
  const [t] = (await Deno.readTextFile(join(source, "traces.jsonl"))).trim().split("\n").map((l) =>
    JSON.parse(l)
  );
  assert.deepEqual(t.rewards, { counted: 1, noted: 1 });
  const [record] = (await Deno.readTextFile(join(source, "record.jsonl"))).trim().split("\n").map((
    l,
  ) => JSON.parse(l));
  assert.deepEqual(record.tools.calls.map((c: Json) => c.name), [
    "counter_inc",
    "counter_inc",
    "counter_get",
  ]);

  // The server is gone: a live toolset could not start. The replay needs only the record.
  await Deno.remove(join(tmp.path, "server.ts"));
  const replay = await collect(
    cliCommand(["replay", source], { cwd: tmp.path, env: {}, registry: false }),
  );
  assert.equal(replay.code, 0, transcript(replay));
  assert.match(replay.stdout, /1 of 1 rewards as before/);
  const target = /^Saving traces to (.+)$/m.exec(replay.stderr)![1];
  const [u] = (await Deno.readTextFile(join(target, "traces.jsonl"))).trim().split("\n").map((l) =>
    JSON.parse(l)
  );
  assert.deepEqual(u.rewards, { counted: 1, noted: 1 });
});

const ECHOES = `
import { reward, Task, Taskset } from "${MOD_URL}";
class Echo extends Task {
  answered = reward(async ({ runtime }) => {
    const r = await runtime.run(["sh", "-c", "cat answer.txt"]);
    return r.stdout.trim() === this.data.id ? 1 : 0;
  });
}
class Echoes extends Taskset {
  get id() { return "echoes"; }
  *load() {
    for (const id of ["a", "b", "c"]) yield new Echo({ id, prompt: "Write " + id + " to answer.txt" });
  }
}
export function loadTaskset(config) { return new Echoes(config); }
`;

Deno.test("vf replay of a run whose record.jsonl ends in a torn line replays the complete lines and names the file and line; a resume mends the torn line before appending", async () => {
  await using tmp = await tempDir("vf_replay_torn_");
  await Deno.writeTextFile(join(tmp.path, "echoes.ts"), ECHOES);
  await using model = await startModelServer({
    responder: ({ body }) => {
      const turn = body.messages.filter((m) => m.role === "assistant").length;
      const id = /Write (\w)/.exec(JSON.stringify(body.messages))![1];
      // Task "c" gets a wrong answer, so the rewards differ between tasks.
      return turn === 0
        ? {
          content: null,
          tool_calls: [{
            name: "bash",
            arguments: { command: `echo ${id === "c" ? "x" : id} > answer.txt` },
          }],
        }
        : { content: "Done." };
    },
  });
  const cli = (args: string[]) =>
    collect(cliCommand(args, { cwd: tmp.path, env: {}, registry: false }));
  const flags = ["-m", "m", "-b", model.url, "-c", "1", "--env.agent.runtime.type", "subprocess"];
  const first = await cli(["run", "./echoes.ts", ...flags, "-o", "out"]);
  assert.equal(first.code, 0, transcript(first));
  const source = /^Saving traces to (.+)$/m.exec(first.stderr)![1];
  const tracesPath = join(source, "traces.jsonl");
  const recordPath = join(source, "record.jsonl");
  const traceLines = (await Deno.readTextFile(tracesPath)).trim().split("\n");
  const recordLines = (await Deno.readTextFile(recordPath)).trim().split("\n");
  assert.equal(traceLines.length, 3);
  assert.equal(recordLines.length, 3);
  const reward = (line: string) => [JSON.parse(line).task.key, JSON.parse(line).reward];
  assert.deepEqual(traceLines.map(reward).sort(), [["a", 1], ["b", 1], ["c", 0]]);

  // A crash while the last rollout's record was written: its trace never was (a record goes
  // to disk before its trace), and the record's line is cut short.
  const last = recordLines[2];
  const lastKey = JSON.parse(last).task;
  await Deno.writeTextFile(
    tracesPath,
    traceLines.filter((l) => JSON.parse(l).task.key !== lastKey).join("\n") + "\n",
  );
  await Deno.writeTextFile(
    recordPath,
    recordLines.slice(0, 2).join("\n") + "\n" + last.slice(0, last.length >> 1),
  );
  // The complete lines replay; the torn one is named by file and line. The rollout it belonged
  // to never finished, so the replay cannot reproduce it and says so (exit 1).
  const replay = await cli(["replay", source]);
  assert.ok(
    replay.stderr.includes(`${recordPath}:3: skipping a corrupt line (malformed JSON`),
    transcript(replay),
  );
  assert.doesNotMatch(replay.stderr, /SyntaxError/);
  assert.match(
    replay.stdout,
    /replayed 3 rollouts .*: 2 of 2 rewards as before; 1 rollouts the source run never finished/,
  );
  assert.ok(
    replay.stderr.includes(
      `(0 rewards differ; 1 rollouts were never finished in "${source}": finish it with ` +
        `vf run ... --resume ${source}, then replay it)`,
    ),
    transcript(replay),
  );
  assert.equal(replay.code, 1, transcript(replay));

  // Resuming runs the lost rollout again; its record starts a line of its own.
  const before = model.requests.length;
  const resumed = await cli(["run", "./echoes.ts", ...flags, "--resume", source]);
  assert.equal(resumed.code, 0, transcript(resumed));
  assert.equal(model.requests.length, before + 2, transcript(resumed));
  const mended = (await Deno.readTextFile(recordPath)).trim().split("\n");
  assert.deepEqual(mended.map((l) => JSON.parse(l).task).sort(), ["a", "b", "c"]);
  const full = await cli(["replay", source]);
  assert.equal(full.code, 0, transcript(full));
  assert.doesNotMatch(full.stderr, /corrupt line/);
  assert.match(full.stdout, /replayed 3 rollouts .*: 3 of 3 rewards as before/);
});
