/**
 * `vf export --format messages|sharegpt` through the real CLI: a real `vf eval` run
 * (results.jsonl) and a `vf run` layout (traces.jsonl, with trace lines and a multi-agent
 * episode line) become fine-tuning JSONL; reward and success filters never pass an errored or
 * unscored rollout; hostile rows are skipped with a warning naming file and line.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { lastUserText, startModelServer, textReply } from "./model_server.ts";
import { runCli, tempDir, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const GSM8K = loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
  { question: string; answer: string }
>;

async function readJsonl(path: string): Promise<Json[]> {
  const text = await Deno.readTextFile(path);
  return text.split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
}

Deno.test("vf export --format messages|sharegpt: a vf eval run's results.jsonl as fine-tuning rows, --min-reward and --success keeping only the rollouts that scored", async () => {
  await using tmp = await tempDir("vf_export_ft_eval_");
  // The first two questions answered right, the others wrong.
  await using server = await startModelServer({
    responder: (request) => {
      const q = lastUserText(request);
      const i = GSM8K.findIndex((r) => r.question === q);
      const answer = i >= 0 && i < 2 ? GSM8K[i].answer : "-1";
      return textReply(`Let me think.\n\n\\boxed{${answer}}`);
    },
  });
  const evalRes = await runCli(
    ["eval", "gsm8k", "-m", "ft", "-b", server.url, "-n", "4", "-r", "1", "-o", "out"],
    { cwd: tmp.path },
  );
  assert.equal(evalRes.code, 0, transcript(evalRes));
  const base = join(tmp.path, "out", "evals", "gsm8k--ft");
  const runDir = join(base, [...Deno.readDirSync(base)][0].name);

  const all = await runCli(["export", "--format", "messages", runDir], { cwd: tmp.path });
  assert.equal(all.code, 0, transcript(all));
  assert.match(all.stdout, /wrote 4 of 4 rollouts to .*messages\.jsonl \(messages\)/);
  const rows = await readJsonl(join(runDir, "messages.jsonl"));
  assert.equal(rows.length, 4);
  for (const row of rows) {
    assert.deepEqual(row.messages.map((m: Json) => m.role).slice(-2), ["user", "assistant"]);
    assert.match(row.messages.at(-1).content, /\\boxed\{/);
    assert.equal(typeof row.metadata.example_id, "number");
    assert.match(row.metadata.source, /results\.jsonl:\d+$/);
  }

  const out = join(tmp.path, "good.jsonl");
  const good = await runCli(
    ["export", "--format", "sharegpt", runDir, "--success", "-o", out],
    { cwd: tmp.path },
  );
  assert.equal(good.code, 0, transcript(good));
  assert.match(good.stdout, /wrote 2 of 4 rollouts .*; 2 left out by the filter/);
  const shared = await readJsonl(out);
  assert.deepEqual(shared.map((r) => r.metadata.reward), [1, 1]);
  for (const row of shared) {
    assert.deepEqual(row.conversations.map((t: Json) => t.from), ["human", "gpt"]);
    assert.equal(typeof row.system, "string", "the system prompt is ShareGPT's system");
    assert.equal(
      row.conversations[1].value.includes(
        GSM8K[GSM8K.findIndex((g) => g.question === row.conversations[0].value)].answer,
      ),
      true,
    );
  }
  const none = await runCli(
    ["export", "--format", "messages", runDir, "--min-reward", "2", "-o", out],
    { cwd: tmp.path },
  );
  assert.equal(none.code, 0, transcript(none));
  assert.match(none.stdout, /wrote 0 of 4/);
});

function trace(over: Json): Json {
  return {
    format_version: 2,
    trace_id: "t",
    run_id: "r",
    taskset: "ts",
    task: { key: "k", idx: 0, hash: "" },
    example_id: 0,
    rollout_index: 0,
    model: "m",
    harness: "bash",
    role: "agent",
    trainable: true,
    attempt: 0,
    messages: [
      { role: "system", content: "You are in a sandbox." },
      { role: "user", content: "Fix it." },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "c1", name: "bash", arguments: '{"command":"make"}' }],
      },
      { role: "tool", tool_call_id: "c1", content: "ok" },
      { role: "assistant", content: "Fixed." },
    ],
    model_calls: [],
    tool_calls: [],
    stop_condition: null,
    reward: 1,
    rewards: { reward: 1 },
    metrics: {},
    ok: true,
    error: null,
    usage: { input_tokens: 0, output_tokens: 0 },
    timing: {},
    info: {},
    ...over,
  };
}

Deno.test("vf export --format messages|sharegpt: a vf run's traces.jsonl; errored and unscored rollouts never pass a reward filter, judges are not training data, a retried episode's last line wins, and every hostile row is skipped with a warning naming file and line", async () => {
  await using tmp = await tempDir("vf_export_ft_run_");
  const runDir = join(tmp.path, "run");
  await Deno.mkdir(runDir);
  const lines = [
    JSON.stringify(trace({ trace_id: "good", task: { key: "a", idx: 0, hash: "" } })),
    JSON.stringify(trace({
      trace_id: "errored",
      task: { key: "b", idx: 1, hash: "" },
      reward: 1,
      ok: false,
      error: { error: "SandboxError", message: "gone", phase: "agent" },
    })),
    JSON.stringify(
      trace({ trace_id: "unscored", task: { key: "c", idx: 2, hash: "" }, reward: null }),
    ),
    "{not json",
    JSON.stringify(
      trace({
        trace_id: "badrole",
        task: { key: "d", idx: 3, hash: "" },
        messages: [{ role: "hacker", content: "x" }],
      }),
    ),
    JSON.stringify(
      trace({ trace_id: "badreward", task: { key: "e", idx: 4, hash: "" }, reward: "1" }),
    ),
    JSON.stringify(trace({
      trace_id: "badcall",
      task: { key: "f", idx: 5, hash: "" },
      messages: [{ role: "assistant", content: "", tool_calls: [{ id: 1, name: "x" }] }],
    })),
    "[1, 2]",
    // A multi-agent episode, first written failed, then retried: the retry's line wins.
    JSON.stringify({
      kind: "episode",
      task: { key: "g", idx: 6, hash: "" },
      episode_index: 0,
      errors: [{ error: "EnvError", message: "x" }],
      traces: [trace({ trace_id: "ep-old", task: { key: "g", idx: 6, hash: "" } })],
    }),
    JSON.stringify({
      kind: "episode",
      task: { key: "g", idx: 6, hash: "" },
      episode_index: 0,
      errors: [],
      traces: [
        trace({ trace_id: "ep-solver", task: { key: "g", idx: 6, hash: "" }, role: "solver" }),
        trace({
          trace_id: "ep-judge",
          task: { key: "g", idx: 6, hash: "" },
          role: "judge",
          trainable: false,
        }),
      ],
    }),
  ];
  await Deno.writeTextFile(join(runDir, "traces.jsonl"), lines.join("\n") + "\n");
  const file = join(runDir, "traces.jsonl");

  const all = await runCli(["export", "--format", "messages", runDir], { cwd: tmp.path });
  assert.equal(all.code, 0, transcript(all));
  for (
    const [line, why] of [
      [4, "malformed line"],
      [5, 'messages[0].role "hacker" is not system, user, assistant or tool'],
      [6, 'reward "1" is not a number'],
      [7, "tool_calls[0] needs a string id, name and arguments"],
      [8, "not a JSON object"],
    ] as const
  ) {
    assert.ok(all.stderr.includes(`${file}:${line}: skipping`), `line ${line}\n${all.stderr}`);
    assert.ok(all.stderr.includes(why), `${why}\n${all.stderr}`);
  }
  const rows = await readJsonl(join(runDir, "messages.jsonl"));
  assert.deepEqual(rows.map((r) => r.metadata.trace_id), [
    "good",
    "errored",
    "unscored",
    "ep-solver",
  ]);
  assert.deepEqual(rows[0].messages[2], {
    role: "assistant",
    content: null,
    tool_calls: [{
      id: "c1",
      type: "function",
      function: { name: "bash", arguments: '{"command":"make"}' },
    }],
  });
  assert.deepEqual(rows[0].messages[3], { role: "tool", content: "ok", tool_call_id: "c1" });

  const out = join(tmp.path, "sg.jsonl");
  const filtered = await runCli(
    ["export", "--format", "sharegpt", "--min-reward", "0", runDir, "-o", out],
    { cwd: tmp.path },
  );
  assert.equal(filtered.code, 0, transcript(filtered));
  const sg = await readJsonl(out);
  assert.deepEqual(
    sg.map((r) => r.metadata.trace_id),
    ["good", "ep-solver"],
    "errored and unscored never pass",
  );
  assert.equal(sg[0].system, "You are in a sandbox.");
  assert.deepEqual(sg[0].conversations, [
    { from: "human", value: "Fix it." },
    { from: "function_call", value: '{"name":"bash","arguments":{"command":"make"}}' },
    { from: "observation", value: "ok" },
    { from: "gpt", value: "Fixed." },
  ]);

  const bad = await runCli(["export", "--format", "csv", runDir], { cwd: tmp.path });
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /unknown --format "csv" \(atif, messages or sharegpt\)/);
  const badNum = await runCli(
    ["export", "--format", "messages", runDir, "--min-reward", "high"],
    { cwd: tmp.path },
  );
  assert.equal(badNum.code, 1);
  assert.match(badNum.stderr, /--min-reward: "high" is not a number/);
  const empty = join(tmp.path, "empty");
  await Deno.mkdir(empty);
  const noRun = await runCli(["export", "--format", "messages", empty], { cwd: tmp.path });
  assert.equal(noRun.code, 1);
  assert.match(noRun.stderr, /neither traces\.jsonl \(vf run\) nor results\.jsonl \(vf eval\)/);
});
