/**
 * End-to-end tests of `vf serve --zmq`: the real CLI serving a taskset (subprocess sandboxes)
 * or a legacy environment over ZeroMQ, driven by Debian's python3-zmq through
 * examples/zmq_trainer.py (the trainer side prime-rl has) and by vf's own ZmqEnvClient,
 * against a real model server on loopback.
 * @module
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ZmqEnvClient } from "../mod.ts";
import { startModelServer } from "./model_server.ts";
import { cliCommand, tempDir } from "./_cli.ts";

const TASKSET = fileURLToPath(new URL("./_zmq_taskset.ts", import.meta.url));
const DRIVER = fileURLToPath(new URL("./_zmq_client.py", import.meta.url));
/** Debian's interpreter: its python3-zmq and python3-msgpack (tests/setup.sh installs them). */
const PYTHON = "/usr/bin/python3";

/** Start `vf serve` and read the ZeroMQ address it prints. */
async function serve(args: string[], cwd: string) {
  const child = cliCommand(["serve", ...args], { cwd, registry: false }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  let address: string | undefined;
  while (!address) {
    const { value, done } = await reader.read();
    if (done) {
      const stderr = await new Response(child.stderr).text();
      throw new Error(`vf serve exited before serving:\n${out}\n${stderr}`);
    }
    out += value;
    address = /ZeroMQ at (tcp:\/\/\S+?)[\s]/.exec(out)?.[1];
  }
  void reader.closed.catch(() => {});
  return {
    address,
    async [Symbol.asyncDispose]() {
      child.kill("SIGTERM");
      await reader.cancel();
      await child.stderr.cancel();
      await child.status;
    },
  };
}

async function pythonDriver(args: string[]): Promise<Record<string, Record<string, unknown>>> {
  const probe = await new Deno.Command(PYTHON, {
    args: ["-c", "import zmq, msgpack"],
    stdout: "null",
    stderr: "piped",
  }).output().catch(() => null);
  assert.ok(
    probe?.success,
    `${PYTHON} cannot import zmq and msgpack; run tests/setup.sh as root (apt-get install ` +
      `python3-zmq python3-msgpack)`,
  );
  const res = await new Deno.Command(PYTHON, {
    args: [DRIVER, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(res.stdout);
  assert.equal(res.code, 0, `${stdout}\n${new TextDecoder().decode(res.stderr)}`);
  return JSON.parse(stdout);
}

Deno.test("a Python DEALER client drives vf serve --zmq: health, 50 runs, cancel, bad input", async () => {
  await using tmp = await tempDir("vf_zmq_");
  await using model = await startModelServer({
    responder: (request) =>
      JSON.stringify(request.body.messages).includes("HANG") ? { hang: true } : { content: "hi" },
  });
  await using server = await serve([
    TASKSET,
    "--zmq",
    "tcp://127.0.0.1:0",
    "-c",
    "16",
    "--env.agent.runtime.type",
    "subprocess",
  ], tmp.path);
  const marker = join(tmp.path, "sandbox_dir");
  const out = await pythonDriver([server.address, model.url, marker]);

  assert.equal(out.health.success, true);
  assert.equal(out.health.env_id, "zmq-echo");
  assert.equal(out.health.max_concurrent, 16);

  const runs = out.runs as unknown as Array<Record<string, unknown>>;
  assert.equal(runs.length, 50);
  const episodes = runs.map((r) => {
    assert.equal(r.success, true, String(r.error));
    return r.episode as {
      ok: boolean;
      example_id: number;
      task: { key: string };
      traces: Array<{ reward: number; messages: Array<{ content: string }> }>;
    };
  });
  assert.deepEqual(episodes.map((e) => e.example_id), [...Array(50).keys()]);
  for (const [i, e] of episodes.entries()) {
    assert.equal(e.ok, true);
    assert.equal(e.traces.length, 1);
    assert.equal(e.traces[0].reward, 1);
    assert.equal(e.traces[0].messages[0].content, `Say hi (${i})`);
  }
  assert.equal(new Set(episodes.map((e) => e.task.key)).size, 50);

  // The cancelled run: the cancel says so, the run's reply is a Cancelled error, and its
  // sandbox (a temp dir of the subprocess runtime) is gone.
  assert.deepEqual(out.cancel, { success: true, error: null, cancelled: true });
  assert.deepEqual(out.cancelled_run, { success: false, error: "Cancelled: rollout aborted" });
  assert.deepEqual(out.cancel_again, { success: true, error: null, cancelled: false });
  const sandbox = await Deno.readTextFile(marker);
  assert.match(sandbox, /vf-subprocess-/);
  assert.equal(existsSync(sandbox), false, `sandbox "${sandbox}" is still there`);

  assert.equal(out.malformed.success, false);
  assert.match(String(out.malformed.error), /^RequestError: The payload of "run" is not msgpack/);
  assert.equal(out.malformed_map.success, false);
  assert.match(String(out.malformed_map.error), /^RequestError: task_data: /);
  assert.equal(out.bad_task_data.success, false);
  assert.match(
    String(out.bad_task_data.error),
    /^ConfigError: task_data\.expected: .*expected string, received number/,
  );
  assert.deepEqual(out.unknown_method, {
    success: false,
    error: 'RequestError: Unknown method "train"; the env server answers "health", "run" and ' +
      '"cancel"',
  });
  assert.equal(out.health_after.success, true);
  assert.equal(out.health_after.in_flight, 0);
});

Deno.test("ZmqEnvClient runs a legacy environment's row through vf serve --zmq", async () => {
  await using tmp = await tempDir("vf_zmq_legacy_");
  await using model = await startModelServer({
    responder: () => ({ content: "So \\boxed{18}" }),
  });
  await using server = await serve(
    ["gsm8k", "--port", "0", "--zmq", "tcp://127.0.0.1:0"],
    tmp.path,
  );
  await using env = await ZmqEnvClient.connect(server.address);
  await env.waitForServer({ timeoutMs: 60_000, intervalMs: 100 });
  const client = { base_url: model.url };
  const right = await env.run<{ ok: boolean; traces: Array<Record<string, unknown>> }>({
    taskData: { prompt: "What is 9 + 9?", answer: "18", idx: 7 },
    client,
    model: "m",
    sampling: { temperature: 0 },
  });
  assert.equal(right.ok, true);
  assert.equal(right.traces[0].reward, 1);
  assert.equal(right.traces[0].example_id, 7);
  // The environment's system prompt went in front of the question, as for its dataset rows.
  const prompt = right.traces[0].prompt as Array<{ role: string; content: string }>;
  assert.equal(prompt.at(-1)?.content, "What is 9 + 9?");
  assert.equal(prompt[0].role, "system");
  const wrong = await env.run<{ traces: Array<Record<string, unknown>> }>({
    taskData: { prompt: "What is 9 + 10?", answer: "19" },
    client,
    model: "m",
  });
  assert.equal(wrong.traces[0].reward, 0);
  await assert.rejects(
    env.run({ taskData: { answer: "1" }, client, model: "m" }),
    (error: Error) => {
      assert.match(error.message, /^ConfigError: task_data\.prompt: /);
      return true;
    },
  );
});
