/**
 * What a new user types on day one, end to end through the real CLI against a real model
 * server on loopback: sampling values from flags arrive typed, a sampling typo is refused with
 * the keys there are, `vf run` honours `-T/-t`, `vf eval <taskset>` runs the taskset, `vf run
 * @ file.toml` reads the file, and a module or reward that throws is named with its file and
 * line. Tasks run on the subprocess runtime (no container needed for what is tested here).
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { type ChatRequest, startModelServer, textReply } from "./model_server.ts";
import { MOD_URL, runCli, tempDir, transcript } from "./_cli.ts";

const TASKSET = `
import { reward, Task, Taskset } from "${MOD_URL}";

class SaysDone extends Task {
  done = reward(({ trace }) =>
    JSON.stringify(trace.messages.at(-1)?.content ?? "").includes("done") ? 1 : 0
  );
}

class Throws extends Task {
  shaky = reward(() => {
    const row = undefined as unknown as { value: number };
    return row.value;
  });
}

class Tasks extends Taskset {
  get id() {
    return "typed-" + String(this.config.variant ?? "done");
  }
  load() {
    const Kind = this.config.variant === "throws" ? Throws : SaysDone;
    return [new Kind({ id: "one", prompt: "Say done.", workdir: "/app" })];
  }
}

export function loadTaskset(config: Record<string, unknown>) {
  return new Tasks(config);
}
`;

async function withServer(
  fn: (url: string, requests: ChatRequest[]) => Promise<void>,
): Promise<void> {
  const server = await startModelServer({ responder: () => textReply("done") });
  try {
    await fn(server.url, server.requests);
  } finally {
    await server.close();
  }
}

Deno.test("vf eval sends sampling values from dotted flags as numbers", async () => {
  await using dir = await tempDir("vf-typed-");
  await withServer(async (url, requests) => {
    const res = await runCli([
      "eval",
      "reverse-text",
      "-n",
      "1",
      "-r",
      "1",
      "-b",
      url,
      "-m",
      "m",
      "--sampling_args.temperature",
      "0.5",
      "--sampling_args.max_tokens",
      "100",
      "--sampling_args.stop",
      "END",
      "--no-save",
    ], { cwd: dir.path });
    assert.equal(res.code, 0, transcript(res));
    assert.ok(requests.length >= 1);
    const body = requests[0].body as Record<string, unknown>;
    assert.equal(body.temperature, 0.5);
    assert.equal(body.max_completion_tokens, 100);
    assert.equal(body.stop, "END");
  });
});

Deno.test("a misspelt sampling key is refused, naming the key, the keys there are and extra_body", async () => {
  await using dir = await tempDir("vf-typed-");
  await withServer(async (url, requests) => {
    const res = await runCli(
      [
        "eval",
        "reverse-text",
        "-n",
        "1",
        "-b",
        url,
        "-m",
        "m",
        "--sampling_args.temprature",
        "0.5",
      ],
      { cwd: dir.path },
    );
    assert.equal(res.code, 1, transcript(res));
    assert.match(res.stderr, /sampling_args: unknown key "temprature"/);
    assert.match(res.stderr, /temperature, top_p/);
    assert.match(res.stderr, /extra_body/);
    assert.equal(requests.length, 0, "nothing was sent");
    const role = await runCli(
      [
        "eval",
        "reverse-text",
        "-n",
        "1",
        "-b",
        url,
        "-m",
        "m",
        "--sampling_args.temperature",
        "hot",
      ],
      { cwd: dir.path },
    );
    assert.equal(role.code, 1, transcript(role));
    assert.match(role.stderr, /sampling_args\.temperature: .*number/);
  });
});

Deno.test("vf run sends -T and -t with each request, and a role's dotted sampling typed", async () => {
  await using dir = await tempDir("vf-typed-");
  const module = join(dir.path, "tasks.ts");
  await Deno.writeTextFile(module, TASKSET);
  await withServer(async (url, requests) => {
    const res = await runCli([
      "run",
      module,
      "-b",
      url,
      "-m",
      "m",
      "-T",
      "0.25",
      "-t",
      "64",
      "--env.agent.runtime.type",
      "subprocess",
      "--env.agent.sampling.top_p",
      "0.9",
      "--no-save",
    ], { cwd: dir.path });
    assert.equal(res.code, 0, transcript(res));
    assert.ok(requests.length >= 1);
    const body = requests[0].body as Record<string, unknown>;
    assert.equal(body.temperature, 0.25);
    assert.equal(body.max_completion_tokens, 64);
    assert.equal(body.top_p, 0.9);
  });
});

Deno.test("vf eval <taskset> runs the taskset, and vf run @ file.toml reads the file", async () => {
  await using dir = await tempDir("vf-typed-");
  const module = join(dir.path, "tasks.ts");
  await Deno.writeTextFile(module, TASKSET);
  await withServer(async (url) => {
    const viaEval = await runCli(
      [
        "eval",
        module,
        "-b",
        url,
        "-m",
        "m",
        "--env.agent.runtime.type",
        "subprocess",
        "--pass-threshold",
        "2",
      ],
      { cwd: dir.path },
    );
    assert.equal(viaEval.code, 0, transcript(viaEval));
    assert.match(viaEval.stdout, /traces: .*traces\.jsonl/);
    const traces = viaEval.stdout.match(/traces: (\S+)/)![1];
    const trace = JSON.parse((await Deno.readTextFile(traces)).trim());
    assert.equal(trace.reward, 1);
    const metadata = JSON.parse(await Deno.readTextFile(join(traces, "..", "metadata.json")));
    assert.equal(metadata.pass_threshold, 2, "the taskset run took --pass-threshold");

    const cfg = join(dir.path, "run.toml");
    await Deno.writeTextFile(
      cfg,
      `model = "m"\nbase_url = "${url}"\n[env.taskset]\nid = "${module}"\n` +
        `[env.agent.runtime]\ntype = "subprocess"\n`,
    );
    const viaRun = await runCli(["run", "@", cfg, "--no-save"], { cwd: dir.path });
    assert.equal(viaRun.code, 0, transcript(viaRun));
    assert.match(viaRun.stdout, /typed-done/);
    const missing = await runCli(["run", "@", join(dir.path, "nope.toml")], { cwd: dir.path });
    assert.equal(missing.code, 1, transcript(missing));
    assert.match(missing.stderr, /nope\.toml/);
    assert.doesNotMatch(missing.stderr, /Unknown taskset "@"/);
  });
});

Deno.test("a module that throws at import and a reward that throws are named with file and line", async () => {
  await using dir = await tempDir("vf-typed-");
  const broken = join(dir.path, "broken_env.ts");
  await Deno.writeTextFile(
    broken,
    `const table: Record<string, string> = {};\n` +
      `function lookup(k: string) {\n  throw new Error("no row " + k + table[k]);\n}\n` +
      `lookup("x");\nexport function loadEnvironment() {}\n`,
  );
  const module = join(dir.path, "tasks.ts");
  await Deno.writeTextFile(module, TASKSET);
  await withServer(async (url) => {
    const res = await runCli(["eval", broken, "-b", url, "-m", "m"], { cwd: dir.path });
    assert.equal(res.code, 1, transcript(res));
    assert.match(res.stderr, /no row x/);
    assert.ok(res.stderr.includes(`${broken}:3:`), transcript(res));

    const run = await runCli([
      "run",
      module,
      "-b",
      url,
      "-m",
      "m",
      "--env.taskset.variant",
      "throws",
      "--env.agent.runtime.type",
      "subprocess",
    ], { cwd: dir.path });
    assert.equal(run.code, 1, transcript(run));
    const traces = run.stdout.match(/traces: (\S+)/)![1];
    const trace = JSON.parse((await Deno.readTextFile(traces)).trim());
    assert.equal(trace.reward, null, "a reward that threw did not score the rollout");
    assert.equal(trace.error.error, "RewardError");
    assert.match(trace.error.message, /reward "shaky" failed: TypeError/);
    assert.ok(trace.error.message.includes(`${module}:`), trace.error.message);
  });
});

Deno.test("free-form overrides arrive typed as TOML would read them: --env_args.n=5 is the number loadEnvironment gets, --env.taskset.count=3 the taskset's, and a quoted value stays a string", async () => {
  await using dir = await tempDir("vf-typed-");
  const module = join(dir.path, "tasks.ts");
  await Deno.writeTextFile(module, TASKSET);
  await withServer(async (url) => {
    const common = ["-b", url, "-m", "m", "-o", join(dir.path, "out")];
    const env = await runCli([
      "eval",
      "reverse-text",
      "-n",
      "1",
      "-r",
      "1",
      ...common,
      "--env_args.n=5",
      "--env_args.strict",
      "true",
      "--env_args.pin",
      '"5"',
      "--env_args.sha",
      "590143e8",
    ], { cwd: dir.path });
    assert.equal(env.code, 0, transcript(env));
    const [metadataPath] = await Array.fromAsync(
      walkFiles(join(dir.path, "out"), "metadata.json"),
    );
    const metadata = JSON.parse(await Deno.readTextFile(metadataPath));
    assert.deepEqual(metadata.env_args, { n: 5, strict: true, pin: "5", sha: "590143e8" });

    const taskset = await runCli([
      "eval",
      module,
      ...common,
      "--env.agent.runtime.type",
      "subprocess",
      "--env.taskset.count=3",
      "--env.taskset.ratio",
      "0.5",
      "--env.taskset.pin",
      '"3"',
    ], { cwd: dir.path });
    assert.equal(taskset.code, 0, transcript(taskset));
    const traces = taskset.stdout.match(/traces: (\S+)/)![1];
    const config = JSON.parse(await Deno.readTextFile(join(traces, "..", "config.json")));
    assert.equal(config.env.taskset.count, 3);
    assert.equal(config.env.taskset.ratio, 0.5);
    assert.equal(config.env.taskset.pin, "3");
  });
});

/** Files named `name` under `root`, at any depth. */
async function* walkFiles(root: string, name: string): AsyncGenerator<string> {
  for await (const entry of Deno.readDir(root)) {
    const path = join(root, entry.name);
    if (entry.isDirectory) yield* walkFiles(path, name);
    else if (entry.name === name) yield path;
  }
}
