/**
 * Typed CLI values where a config file and flags meet, checked against the request bodies real
 * loopback model servers receive: a TOML file's sampling and the flags' (`--sampling_args.*`,
 * `-S`, `-T/-t`, `--env.<role>.sampling.*`) merge key by key with the command line winning and
 * every value a number where the endpoint expects one, on `vf eval` and `vf run` alike; a role
 * on its own endpoint gets its own typed sampling; a misspelt key in a role's or a judge's
 * sampling is refused with the keys there are.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { type ChatRequest, startModelServer, textReply } from "./model_server.ts";
import { MOD_URL, runCli, tempDir, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

/** One task whose agent answers once (no sandbox): what the model was sent is the point. */
const TASKSET = `
import { reward, Task, Taskset } from "${MOD_URL}";
class Chat extends Task {
  static override HARNESS = "null";
  answered = reward(({ trace }) =>
    trace.messages.some((m) => m.role === "assistant" && String(m.content).length > 0) ? 1 : 0
  );
}
class Chats extends Taskset {
  get id() { return "chats"; }
  *load() { yield new Chat({ id: "hi", prompt: "Say hi to the assistant once.", answer: "hi" }); }
}
export function loadTaskset(config) { return new Chats(config); }
`;

/** The sampling fields of a request body (the model server sees the wire's names). */
function samplingOf(req: ChatRequest): Record<string, unknown> {
  const keep = ["temperature", "top_p", "max_completion_tokens", "max_tokens", "seed", "stop"];
  return Object.fromEntries(
    Object.entries(req.body as Json).filter(([k]) => keep.includes(k)),
  );
}

Deno.test("vf eval: a TOML file's sampling_args and the flags merge key by key, flags winning, all typed", async () => {
  await using dir = await tempDir("vf-typed-mix-");
  await using server = await startModelServer({ responder: () => textReply("olleh") });
  const cfg = join(dir.path, "eval.toml");
  await Deno.writeTextFile(
    cfg,
    `env_id = "reverse-text"\nmodel = "m"\nbase_url = "${server.url}"\nnum_examples = 1\n` +
      `rollouts_per_example = 1\nsave = false\n` +
      `[sampling_args]\ntemperature = 0.2\nmax_tokens = 50\ntop_p = 0.8\nseed = 3\n`,
  );
  const res = await runCli([
    "eval",
    "@",
    cfg,
    "--sampling_args.temperature",
    "0.7",
    "-t",
    "30",
    "-q",
  ], { cwd: dir.path });
  assert.equal(res.code, 0, transcript(res));
  assert.ok(server.requests.length >= 1);
  for (const req of server.requests) {
    // temperature from the dotted flag, max_tokens from -t (over the file's), the rest the file's.
    assert.deepEqual(samplingOf(req), {
      temperature: 0.7,
      top_p: 0.8,
      max_completion_tokens: 30,
      seed: 3,
    });
  }
  const before = server.requests.length;
  const viaS = await runCli([
    "eval",
    "@",
    cfg,
    "-S",
    '{"top_p": 0.5, "stop": ["END"]}',
    "-T",
    "0.9",
    "-q",
  ], { cwd: dir.path });
  assert.equal(viaS.code, 0, transcript(viaS));
  for (const req of server.requests.slice(before)) {
    assert.deepEqual(samplingOf(req), {
      temperature: 0.9,
      top_p: 0.5,
      max_completion_tokens: 50,
      seed: 3,
      stop: ["END"],
    });
  }
});

Deno.test("vf run: [env.agent.sampling] and [sampling_args] from TOML under -S, -T/-t and --env.agent.sampling.* flags, all typed", async () => {
  await using dir = await tempDir("vf-typed-mix-");
  await using server = await startModelServer({ responder: () => textReply("hi") });
  await Deno.writeTextFile(join(dir.path, "chats.ts"), TASKSET);
  const cfg = join(dir.path, "run.toml");
  await Deno.writeTextFile(
    cfg,
    `model = "m"\nbase_url = "${server.url}"\n[sampling_args]\nmax_tokens = 50\ntemperature = 0.2\n` +
      `[env.taskset]\nid = "./chats.ts"\n[env.agent.runtime]\ntype = "subprocess"\n` +
      `[env.agent.sampling]\ntop_p = 0.4\nseed = 11\n`,
  );
  const res = await runCli([
    "run",
    "@",
    cfg,
    "-S",
    '{"stop": "END"}',
    "-T",
    "0.6",
    "-t",
    "40",
    "--env.agent.sampling.seed",
    "12",
    "--no-save",
  ], { cwd: dir.path });
  assert.equal(res.code, 0, transcript(res));
  assert.ok(server.requests.length >= 1);
  for (const req of server.requests) {
    assert.deepEqual(samplingOf(req), {
      temperature: 0.6,
      top_p: 0.4,
      max_completion_tokens: 40,
      seed: 12,
      stop: "END",
    });
  }
});

Deno.test("a role on its own endpoint gets its dotted sampling typed; a misspelt role sampling key is refused with the keys there are", async () => {
  await using dir = await tempDir("vf-typed-mix-");
  await using run = await startModelServer({ responder: () => textReply("Hi! Glad to help.") });
  await using user = await startModelServer({
    responder: ({ body }) =>
      textReply(body.messages.some((m: Json) => m.role === "assistant") ? "###DONE###" : "Hi."),
  });
  await Deno.writeTextFile(join(dir.path, "chats.ts"), TASKSET);
  const common = [
    "run",
    "./chats.ts",
    "-m",
    "assistant-m",
    "-b",
    run.url,
    "--env.id",
    "user-sim",
    "--env.assistant.runtime.type",
    "subprocess",
    "--env.user.model",
    "user-m",
    "--env.user.client.base_url",
    user.url,
    "--no-save",
  ];
  const res = await runCli([
    ...common,
    "--env.user.sampling.temperature",
    "0.4",
    "--env.user.sampling.max_tokens",
    "9",
    "--env.assistant.sampling.top_p",
    "0.3",
  ], { cwd: dir.path });
  assert.equal(res.code, 0, transcript(res));
  assert.ok(user.requests.length >= 1 && run.requests.length >= 1, transcript(res));
  for (const req of user.requests) {
    assert.equal(req.body.model, "user-m");
    assert.deepEqual(samplingOf(req), { temperature: 0.4, max_completion_tokens: 9 });
  }
  for (const req of run.requests) {
    assert.equal(req.body.model, "assistant-m");
    assert.deepEqual(samplingOf(req), { top_p: 0.3 });
  }

  const sent = user.requests.length + run.requests.length;
  const typo = await runCli([...common, "--env.user.sampling.temprature", "0.4"], {
    cwd: dir.path,
  });
  assert.equal(typo.code, 1, transcript(typo));
  assert.match(typo.stderr, /env\.user\.sampling: unknown key "temprature"/);
  assert.match(typo.stderr, /sampling takes temperature, top_p/);
  assert.match(typo.stderr, /--env\.user\.sampling\.extra_body\.temprature\b/);
  const word = await runCli([...common, "--env.user.sampling.temperature", "warm"], {
    cwd: dir.path,
  });
  assert.equal(word.code, 1, transcript(word));
  assert.match(word.stderr, /env\.user\.sampling\.temperature: .*number/);
  assert.equal(user.requests.length + run.requests.length, sent, "nothing more was sent");
});

Deno.test("a judge's sampling reaches its own endpoint typed, and a misspelt judge sampling key is refused with the keys there are", async () => {
  await using dir = await tempDir("vf-typed-mix-");
  await using agent = await startModelServer({ responder: () => textReply("hi") });
  await using judge = await startModelServer({ responder: () => textReply("yes") });
  await Deno.writeTextFile(join(dir.path, "chats.ts"), TASKSET);
  const toml = (sampling: string) =>
    `model = "agent-m"\nbase_url = "${agent.url}"\n[env.taskset]\nid = "./chats.ts"\n` +
    `[env.agent.runtime]\ntype = "subprocess"\n[[env.judges]]\nid = "reference"\n` +
    `model = "judge-m"\nbase_url = "${judge.url}"\nsampling = ${sampling}\n`;
  await Deno.writeTextFile(join(dir.path, "run.toml"), toml("{ temperature = 0, max_tokens = 5 }"));
  const res = await runCli(["run", "@", "run.toml", "-o", "out"], { cwd: dir.path });
  assert.equal(res.code, 0, transcript(res));
  assert.ok(judge.requests.length >= 1, transcript(res));
  for (const req of judge.requests) {
    assert.equal(req.body.model, "judge-m");
    assert.deepEqual(samplingOf(req), { temperature: 0, max_completion_tokens: 5 });
  }
  const traces = /traces: (\S+)/.exec(res.stdout)![1];
  const trace = JSON.parse((await Deno.readTextFile(traces)).trim());
  assert.equal(trace.rewards.reference, 1, "the judge's yes scored the rollout");

  const sent = judge.requests.length + agent.requests.length;
  await Deno.writeTextFile(join(dir.path, "typo.toml"), toml("{ temprature = 0 }"));
  const typo = await runCli(["run", "@", "typo.toml", "-o", "out"], { cwd: dir.path });
  assert.equal(typo.code, 1, transcript(typo));
  assert.match(typo.stderr, /env\.judges\[0\]\.sampling: unknown key "temprature"/);
  assert.match(typo.stderr, /sampling takes temperature, top_p/);
  assert.match(typo.stderr, /env\.judges\[0\]\.sampling\.extra_body\.temprature/);
  await Deno.writeTextFile(join(dir.path, "word.toml"), toml('{ max_tokens = "5" }'));
  const word = await runCli(["run", "@", "word.toml", "-o", "out"], { cwd: dir.path });
  assert.equal(word.code, 1, transcript(word));
  assert.match(word.stderr, /env\.judges\[0\]\.sampling\.max_tokens: .*number/);
  assert.equal(judge.requests.length + agent.requests.length, sent, "nothing more was sent");
});

/** An Env from a module: one role the built-ins do not have, and a numeric option of its own. */
const SOLO_ENV = `
import { z } from "npm:zod@^4.6.0";
import { type Agents, Env, type Task } from "${MOD_URL}";
export default class Solo extends Env {
  static override roles = { writer: { runtime: { type: "subprocess" } } };
  static override options = { turns: z.number().int().min(1).default(1) };
  async run(task: Task, agents: Agents) {
    await using writer = await agents.writer.interaction(task);
    let said = await writer.turn();
    for (let i = 1; i < (this.options.turns as number); i++) said = await writer.turn("again");
  }
}
`;

Deno.test("an Env from a module gets its own role's dotted sampling and its own options typed, on vf run and vf eval <taskset>", async () => {
  await using dir = await tempDir("vf-typed-mix-");
  await using server = await startModelServer({ responder: () => textReply("hi") });
  await Deno.writeTextFile(join(dir.path, "chats.ts"), TASKSET);
  await Deno.writeTextFile(join(dir.path, "solo.ts"), SOLO_ENV);
  for (const command of ["run", "eval"]) {
    const before = server.requests.length;
    const res = await runCli([
      command,
      "./chats.ts",
      "-m",
      "m",
      "-b",
      server.url,
      "--env.id",
      "./solo.ts",
      "--env.turns",
      "2",
      "--env.writer.sampling.temperature",
      "0.5",
      "--env.writer.sampling.max_tokens",
      "7",
      "-o",
      "out",
    ], { cwd: dir.path });
    assert.equal(res.code, 0, transcript(res));
    const sent = server.requests.slice(before);
    assert.equal(sent.length, 2, "--env.turns 2 took two turns");
    for (const req of sent) {
      assert.deepEqual(samplingOf(req), { temperature: 0.5, max_completion_tokens: 7 });
    }
    // The saved config holds the typed values, so vf replay and vf rescore read it back.
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
    const saved = JSON.parse(await Deno.readTextFile(join(runDir, "config.json")));
    assert.equal(saved.env.turns, 2);
    assert.equal(saved.env.writer.sampling.temperature, 0.5);
  }
  const word = await runCli([
    "run",
    "./chats.ts",
    "-m",
    "m",
    "-b",
    server.url,
    "--env.id",
    "./solo.ts",
    "--env.writer.sampling.temperature",
    "warm",
  ], { cwd: dir.path });
  assert.equal(word.code, 1, transcript(word));
  assert.match(word.stderr, /env\.writer\.sampling\.temperature: .*number/);
});
