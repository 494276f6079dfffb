/**
 * Judge plugins end to end: a Docker taskset run by `vf eval @ run.toml` with a reference
 * judge at `[[env.judges]]` and a rubric judge at `[env.taskset.task] judges`, each on its
 * own loopback endpoint and model (never the agent's key), after the task's own reward; and
 * the config errors a user gets for bad judge entries.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { type ModelServer, startModelServer } from "./model_server.ts";
import { cliCommand, type CliResult, collect, MOD_URL, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const TASKSET = `
import { readText, reward, Task, type TaskHookContext, Taskset } from "${MOD_URL}";
class CapitalTask extends Task {
  static override NEEDS_CONTAINER = true;
  override async setup({ runtime }: TaskHookContext) {
    await runtime.run(["mkdir", "-p", "/app"]);
  }
  // The task's own reward: the agent wrote a note in the sandbox.
  noted = reward(async ({ runtime }) =>
    (await readText(runtime, "/app/note.txt").catch(() => "")).trim() ? 1 : 0
  , { weight: 2 });
}
class Capitals extends Taskset {
  get id() { return "capitals"; }
  *load() {
    yield new CapitalTask({ id: "fr", prompt: "Capital of France?", answer: ["Paris", "Lutetia"], image: "busybox:latest" });
    yield new CapitalTask({ id: "de", prompt: "Capital of Germany?", answer: "Berlin", image: "busybox:latest" });
  }
}
export function loadTaskset(config) { return new Capitals(config); }
`;

const RUBRIC = `
[[criteria]]
name = "named"
text = "The reply names a city."
weight = 3

[[criteria]]
name = "brief"
text = "The reply is one sentence."
choices = ["no", "partly", "yes"]
`;

async function runIn(
  dir: string,
  args: string[],
  env: Record<string, string> = {},
): Promise<CliResult> {
  return await collect(cliCommand(args, { cwd: dir, env, registry: false, docker: true }));
}

Deno.test("judges at [[env.judges]] and [env.taskset.task] judges score a Docker taskset run from TOML, each on its own endpoint and model", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_judges_" });
  let runId = "";
  try {
    // The agent: writes a note, then answers (right for France, wrong for Germany).
    await using agent = await startModelServer({
      apiKey: "agent-secret",
      responder: ({ body }) => {
        const turn = body.messages.filter((m) => m.role === "assistant").length;
        if (turn === 0) {
          return {
            content: null,
            tool_calls: [{ name: "bash", arguments: { command: "echo x > /app/note.txt" } }],
          };
        }
        const q = String(body.messages.find((m) => m.role === "user")?.content);
        return { content: q.includes("France") ? "It is Paris." : "It is Munich." };
      },
    });
    await using judge: ModelServer = await startModelServer({
      apiKey: "judge-secret",
      responder: ({ body }) => {
        const text = String(body.messages[0].content);
        if (text.includes("Criteria:")) {
          return {
            content: '{"verdicts": [{"name": "named", "reason": "a city", "verdict": "yes"},' +
              ' {"name": "brief", "reason": "short", "verdict": "partly"}]}',
            usage: { prompt_tokens: 100, completion_tokens: 20 },
          };
        }
        const right = text.includes("Paris\nLutetia") && text.includes("It is Paris.");
        return {
          content: right ? "yes" : "no",
          usage: { prompt_tokens: 10, completion_tokens: 1 },
        };
      },
    });
    await Deno.writeTextFile(join(dir, "capitals.ts"), TASKSET);
    await Deno.writeTextFile(join(dir, "rubric.toml"), RUBRIC);
    await Deno.writeTextFile(
      join(dir, "run.toml"),
      `model = "agent-m"
api_key_var = "AGENT_KEY"
[client]
base_url = "${agent.url}"
[[env.judges]]
id = "reference"
model = "judge-m"
base_url = "${judge.url}"
api_key_var = "JUDGE_KEY"
weight = 0.5
[env.taskset]
id = "./capitals.ts"
[[env.taskset.task.judges]]
id = "rubric"
name = "quality"
path = "rubric.toml"
view = "last_reply"
model = "judge-m"
base_url = "${judge.url}"
api_key_var = "JUDGE_KEY"
[models."judge-m"]
input_per_mtok = 1000000
output_per_mtok = 0
`,
    );
    const res = await runIn(dir, ["eval", "@", "run.toml", "-o", "out"], {
      AGENT_KEY: "agent-secret",
      JUDGE_KEY: "judge-secret",
    });
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
    if (runDir) runId = basename(runDir);
    assert.equal(res.code, 0, transcript(res));
    const traces = (await Deno.readTextFile(join(runDir!, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l)).sort((a: Json, b: Json) => a.task.key.localeCompare(b.task.key));
    const [de, fr] = traces;
    const quality = (3 * 1 + 1 * 0.5) / 4;
    assert.deepEqual(fr.rewards, { noted: 1, reference: 1, quality });
    assert.deepEqual(fr.reward_weights, { noted: 2, reference: 0.5 });
    assert.equal(fr.reward, 2 * 1 + 0.5 * 1 + quality);
    assert.deepEqual(de.rewards, { noted: 1, reference: 0, quality });
    assert.equal(de.reward, 2 + 0 + quality);
    assert.deepEqual(fr.metrics, { "quality/named": 1, "quality/brief": 0.5 });
    // Every judge reply is on the trace, and judge tokens are counted apart from the agent's.
    assert.deepEqual(fr.info.judge.map((r: Json) => [r.judge, r.text.slice(0, 3)]).sort(), [
      ["quality", '{"v'],
      ["reference", "yes"],
    ]);
    assert.deepEqual(fr.judge_usage, { input_tokens: 110, output_tokens: 21 });
    const metadata = JSON.parse(await Deno.readTextFile(join(runDir!, "metadata.json")));
    assert.deepEqual(metadata.judge_usage, { input_tokens: 220, output_tokens: 42 });
    // The judges' calls are in the run's spend ($1 per judge input token; the agent's model
    // has no price): the summary and --max-cost see them.
    const agentCalls = agent.requests.length;
    assert.deepEqual(
      [metadata.cost.usd, metadata.cost.calls, metadata.cost.unpriced_calls],
      [220, agentCalls + 4, agentCalls],
    );
    assert.match(
      res.stdout,
      new RegExp(`cost: \\$220\\.0000 over ${agentCalls + 4} model calls \\(${agentCalls} of a`),
    );
    // The judges called their own endpoint with their own model and key, the agent never did.
    assert.equal(judge.requests.length, 4);
    assert.ok(judge.requests.every((r) => r.body.model === "judge-m"));
    assert.ok(judge.requests.every((r) => r.headers.authorization === "Bearer judge-secret"));
    assert.ok(agent.requests.every((r) => r.body.model === "agent-m"));
  } finally {
    if (runId) await cleanupContainers({ runId });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bad judge config names the entry: unknown id, duplicate names, a non-finite weight, no endpoint, a missing or malformed criteria file", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_judges_bad_" });
  try {
    await Deno.writeTextFile(join(dir, "capitals.ts"), TASKSET);
    await Deno.writeTextFile(join(dir, "broken.json"), '{"criteria": [{"name": "a"');
    const head =
      `model = "m"\n[client]\nbase_url = "http://127.0.0.1:9/v1"\n[env.taskset]\nid = "./capitals.ts"\n`;
    const cases: Array<[string, RegExp]> = [
      [
        `[[env.judges]]\nid = "refrence"\n`,
        /run\.toml: env\.judges\[0\]\.id: unknown judge "refrence"; known: "reference", "rubric"/,
      ],
      [
        `[[env.judges]]\nid = "reference"\nuse_agent_endpoint = true\n[[env.taskset.task.judges]]\nid = "reference"\nuse_agent_endpoint = true\n`,
        /env\.taskset\.task\.judges\[0\]\.name: judges env\.judges\[0\] and env\.taskset\.task\.judges\[0\] share the reward key "reference"/,
      ],
      [
        `[[env.judges]]\nid = "reference"\nuse_agent_endpoint = true\nweight = inf\n`,
        /env\.judges\[0\]\.weight: must be a finite number/,
      ],
      [
        `[[env.judges]]\nid = "reference"\n`,
        /env\.judges\[0\]: judge "reference" has no endpoint; set base_url/,
      ],
      [
        `[[env.judges]]\nid = "rubric"\npath = "missing.toml"\nuse_agent_endpoint = true\n`,
        /env\.judges\[0\]\.path: criteria file "missing\.toml" does not exist/,
      ],
      [
        `[[env.judges]]\nid = "rubric"\npath = "broken.json"\nuse_agent_endpoint = true\n`,
        /env\.judges\[0\]\.path: criteria file "broken\.json" is not valid JSON/,
      ],
    ];
    for (const [judges, pattern] of cases) {
      await Deno.writeTextFile(join(dir, "run.toml"), head + judges);
      const res = await runIn(dir, ["eval", "@", "run.toml", "-o", "out"]);
      assert.equal(res.code, 1, `${judges}\n${transcript(res)}`);
      assert.match(res.stderr, pattern, judges);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
