/**
 * A role on an endpoint of its own (`[env.<role>.client]`) takes the keys `[client]` takes
 * for the run's endpoint: `max_output_tokens` clamps that role's caps, and `reasoning = true`
 * lets a gateway program's thinking reach it as `reasoning_effort`. Checked with the request
 * bodies each loopback endpoint received, through `vf eval`; a bad value is named by its path.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { type ChatRequest, startModelServer } from "./model_server.ts";
import { cliCommand, type CliResult, collect, MOD_URL, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const TASKSET = `
import { reward, Task, Taskset } from "${MOD_URL}";
class Chat extends Task {
  static override HARNESS = "null";
  // Scored from the conversation: the assistant answered.
  answered = reward(({ trace }) =>
    trace.messages.some((m) => m.role === "assistant" && String(m.content).length > 0) ? 1 : 0
  );
}
class Chats extends Taskset {
  get id() { return "chats"; }
  *load() { yield new Chat({ id: "hi", prompt: "Say hi to the assistant once." }); }
}
export function loadTaskset(config) { return new Chats(config); }
`;

/** A program that asks the gateway (Messages dialect) for a long answer with thinking. */
const THINKER = `
import json, os, urllib.request
body = {"model": "any", "max_tokens": 32000, "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [{"role": "user", "content": "think, then answer"}]}
req = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages",
    data=json.dumps(body).encode(), headers={"content-type": "application/json",
    "x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01"})
print(json.loads(urllib.request.urlopen(req, timeout=120).read())["content"][-1]["text"])
`;

class Scenario implements AsyncDisposable {
  runIds = new Set<string>();
  constructor(readonly path: string) {}

  async cli(args: string[]): Promise<CliResult> {
    const res = await collect(
      cliCommand(args, { cwd: this.path, env: {}, registry: false, docker: true }),
    );
    const dir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
    if (dir) this.runIds.add(basename(dir));
    return res;
  }

  async file(name: string, text: string): Promise<void> {
    await Deno.writeTextFile(join(this.path, name), text);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await Promise.all([...this.runIds].map((runId) => cleanupContainers({ runId })));
    await Deno.remove(this.path, { recursive: true });
  }
}

async function linesOf(res: CliResult): Promise<Json[]> {
  const dir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
  assert.ok(dir, transcript(res));
  return (await Deno.readTextFile(join(dir, "traces.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
}

function capOf(req: ChatRequest): number | undefined {
  return (req.body.max_completion_tokens ?? req.body.max_tokens) as number | undefined;
}

Deno.test("user-sim: the user role's own endpoint clamps its caps to its max_output_tokens; the assistant's endpoint keeps the run's", async () => {
  await using s = await scenario();
  await using run = await startModelServer({ responder: () => ({ content: "Hi! Glad to help." }) });
  await using user = await startModelServer({
    // One line to the assistant, then the done marker.
    responder: ({ body }) => ({
      content: body.messages.some((m: Json) => m.role === "assistant") ? "###DONE###" : "Hi.",
    }),
  });
  await s.file("chats.ts", TASKSET);
  await s.file(
    "run.toml",
    `model = "assistant-m"
[client]
base_url = "${run.url}"
[sampling_args]
max_tokens = 300
[env]
id = "user-sim"
[env.taskset]
id = "./chats.ts"
[env.assistant.runtime]
type = "subprocess"
[env.user]
model = "user-m"
[env.user.client]
base_url = "${user.url}"
max_output_tokens = 7
reasoning = true
`,
  );
  const res = await s.cli(["eval", "@", "run.toml", "-o", "out"]);
  assert.equal(res.code, 0, transcript(res));
  const [episode] = await linesOf(res);
  assert.equal(episode.ok, true, JSON.stringify(episode.errors));
  assert.ok(user.requests.length >= 1 && run.requests.length >= 1);
  assert.deepEqual(user.requests.map((r) => [r.body.model, capOf(r)]), [
    ["user-m", 7],
    ["user-m", 7],
  ]);
  for (const r of run.requests) assert.deepEqual([r.body.model, capOf(r)], ["assistant-m", 300]);
  const userTrace = episode.traces.find((t: Json) => t.role === "user");
  assert.deepEqual(userTrace.model_calls[0].response.output_cap, {
    requested: 300,
    sent: 7,
    reason: "max_output_tokens",
  });
  const assistant = episode.traces.find((t: Json) => t.role === "assistant");
  assert.equal(assistant.reward, 1);
  assert.equal(assistant.model_calls[0].response.output_cap, undefined);

  // Checked as [client]'s keys are: a bad value is named by its path.
  await s.file(
    "bad.toml",
    (await Deno.readTextFile(join(s.path, "run.toml"))).replace(
      "reasoning = true",
      'reasoning = "yes"',
    ),
  );
  const bad = await s.cli(["eval", "@", "bad.toml", "-o", "out"]);
  assert.equal(bad.code, 1, transcript(bad));
  assert.match(bad.stderr, /bad\.toml: env\.user\.client\.reasoning: /);
  const unknown = await s.cli([
    "eval",
    "@",
    "run.toml",
    "-o",
    "out",
    "--env.user.client.max_output_token",
    "5",
  ]);
  assert.equal(unknown.code, 1, transcript(unknown));
  assert.match(unknown.stderr, /env\.user\.client: .*max_output_token/);
});

Deno.test("a role's own endpoint with reasoning = true gets a gateway program's thinking as reasoning_effort, under its max_output_tokens; without it the effort is not sent and is recorded as not honoured", async () => {
  await using s = await scenario();
  await using run = await startModelServer({ responder: () => ({ content: "unused" }) });
  await using own = await startModelServer({ responder: () => ({ content: "thought it over" }) });
  await s.file("chats.ts", TASKSET.replace('HARNESS = "null"', 'HARNESS = "program"'));
  await s.file("thinker.py", THINKER);
  const base = [
    "run",
    "./chats.ts",
    "-m",
    "run-m",
    "-b",
    run.url,
    "-o",
    "out",
    "--env.agent.model",
    "agent-m",
    "--env.agent.client.base_url",
    own.url,
    "--env.agent.client.max_output_tokens",
    "64",
    "--env.agent.runtime.type",
    "subprocess",
    "--env.agent.harness.command",
    `python3 ${join(s.path, "thinker.py")}`,
  ];
  const on = await s.cli([...base, "--env.agent.client.reasoning", "true"]);
  assert.equal(on.code, 0, transcript(on));
  const [withReasoning] = await linesOf(on);
  assert.equal(withReasoning.ok, true, JSON.stringify(withReasoning.error));
  assert.equal(own.requests.length, 1);
  const sent = own.requests[0].body;
  assert.equal(sent.model, "agent-m");
  assert.equal(sent.reasoning_effort, "low");
  assert.equal(capOf(own.requests[0]), 64);
  assert.equal(sent.program_reasoning_effort, undefined);
  assert.deepEqual(withReasoning.model_calls[0].response.output_cap, {
    requested: 32000,
    sent: 64,
    reason: "max_output_tokens",
  });
  assert.match(JSON.stringify(withReasoning.tool_calls), /thought it over/);

  const off = await s.cli(base);
  assert.equal(off.code, 0, transcript(off));
  const [without] = await linesOf(off);
  assert.equal(without.ok, true, JSON.stringify(without.error));
  assert.equal(own.requests.length, 2);
  assert.equal(own.requests[1].body.reasoning_effort, undefined);
  assert.equal(own.requests[1].body.program_reasoning_effort, undefined);
  assert.deepEqual(without.model_calls[0].not_honoured, [
    { name: "low", type: "reasoning_effort" },
  ]);
  // The run's own endpoint is never called: the role has its own.
  assert.equal(run.requests.length, 0);
});

async function scenario(): Promise<Scenario> {
  return new Scenario(await Deno.makeTempDir({ prefix: "vf_role_endpoints_" }));
}
