/**
 * End-to-end tests of `vf serve --zmq`: the real CLI serving a taskset (subprocess sandboxes)
 * or a legacy environment over ZeroMQ, driven by Debian's python3-zmq through
 * examples/zmq_trainer.py (the trainer side prime-rl has) and by vf's own ZmqEnvClient,
 * against a real model server on loopback; and with `--workers 2`, the broker in front of two
 * worker processes (dispatch, cancel routing, health, a worker killed mid-run).
 * @module
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { type EnvServerReplyError, ZmqEnvClient } from "../mod.ts";
import { startModelServer } from "./model_server.ts";
import { MessageGraph, type MessageNode } from "../lib/graph.ts";
import { toyPromptTokens } from "../lib/model/local_server.ts";
import { cliCommand, tempDir } from "./_cli.ts";
import { EngineEvents } from "./_engine_events.ts";
import Ajv2020 from "npm:ajv@8.20.0/dist/2020.js";

const TASKSET = fileURLToPath(new URL("./_zmq_taskset.ts", import.meta.url));
const DRIVER = fileURLToPath(new URL("./_zmq_client.py", import.meta.url));
const WIRE_DRIVER = fileURLToPath(new URL("./_zmq_wire_client.py", import.meta.url));
const TRACE_SCHEMA = fileURLToPath(
  new URL("../lib/serve/upstream_trace.schema.json", import.meta.url),
);
const HEAD_SCHEMA = fileURLToPath(
  new URL("../lib/serve/upstream_episode_head.schema.json", import.meta.url),
);

/** A trace on the `2026-08` wire: upstream's `Trace` as verifiers dumped it in August 2026. */
type UpstreamTrace2026_08 = {
  version: number;
  rewards: Record<string, { score: number; weight: number } | null>;
  nodes: Array<{ message: { role: string; content: string } }>;
} & Record<string, unknown>;

/** The trace schema less the fields the September `Trace` added: the August `Trace`. */
const augustTraceSchema = (() => {
  const schema = JSON.parse(Deno.readTextFileSync(TRACE_SCHEMA));
  for (const field of ["num_input_tokens", "num_output_tokens", "num_total_tokens"]) {
    schema.required = schema.required.filter((f: string) => f !== field);
  }
  for (const field of ["num_input_tokens", "num_output_tokens", "num_total_tokens", "root_reply"]) {
    delete schema.properties[field];
  }
  delete schema.properties.mm_token_type_id_map;
  // August's MessageNode had `kept_tokens` where September's has `sampling_mask`, and no links.
  const node = schema.$defs.MessageNode.properties;
  delete node.semantic_parents;
  delete node.sampling_mask;
  node.kept_tokens = { type: ["object", "null"] };
  schema.$defs.MessageNode.required.push("kept_tokens");
  return schema;
})();
// deno-lint-ignore no-explicit-any
const ajv = new (Ajv2020 as any)({ allErrors: true, strict: false });
const validAugustTrace = ajv.compile(augustTraceSchema);
const validHead = ajv.compile(JSON.parse(Deno.readTextFileSync(HEAD_SCHEMA)));

/** A `2026-08` run reply's episode: upstream's August `WireEpisode`, head and traces. */
function assertAugustEpisode(episode: Record<string, unknown>): void {
  assert.ok(validHead(episode), JSON.stringify(validHead.errors));
  for (const trace of episode.traces as Array<Record<string, unknown>>) assertAugustTrace(trace);
}

/** The August `Trace`'s fields exactly (verifiers/v1/trace.py at the 2026-08-21 snapshot). */
function assertAugustTrace(trace: Record<string, unknown>): void {
  assert.ok(validAugustTrace(trace), JSON.stringify(validAugustTrace.errors));
  assert.deepEqual(Object.keys(trace).sort(), [
    "agent",
    "calls",
    "errors",
    "extra_usage",
    "id",
    "info",
    "is_completed",
    "metrics",
    "nodes",
    "ok",
    "request_rewrites",
    "response_rewrites",
    "rewards",
    "stop_condition",
    "task",
    "timing",
    "tools",
    "verifiers",
    "version",
  ]);
}
const LEGACY_DRIVER = fileURLToPath(new URL("./_zmq_legacy_client.py", import.meta.url));
/** Debian's interpreter: its python3-zmq and python3-msgpack (tests/setup.sh installs them). */
const PYTHON = "/usr/bin/python3";

/**
 * Start `vf serve` and read the ZeroMQ address it prints. Without a `--wire` in `args` it
 * serves the earlier form (`--wire 2026-08`), which the older tests below speak.
 */
async function serve(args: string[], cwd: string, options: { defaultWire?: boolean } = {}) {
  const wire = args.includes("--wire") || options.defaultWire ? [] : ["--wire", "2026-08"];
  const child = cliCommand(["serve", ...args, ...wire], { cwd, registry: false }).spawn();
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
    /** What it printed up to the ZeroMQ address. */
    out,
    async [Symbol.asyncDispose]() {
      child.kill("SIGTERM");
      await reader.cancel();
      await child.stderr.cancel();
      await child.status;
    },
  };
}

async function pythonDriver(
  args: string[],
  driver = DRIVER,
): Promise<Record<string, Record<string, unknown>>> {
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
    args: [driver, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(res.stdout);
  assert.equal(res.code, 0, `${stdout}\n${new TextDecoder().decode(res.stderr)}`);
  return JSON.parse(stdout);
}

/** The Python trainer's whole exchange with `vf serve <taskset> --zmq <extra>`, asserted. */
async function pythonDrives(extra: string[], maxConcurrent: number): Promise<void> {
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
    ...extra,
  ], tmp.path);
  const marker = join(tmp.path, "sandbox_dir");
  const out = await pythonDriver([server.address, model.url, marker]);

  assert.equal(out.health.success, true);
  assert.equal(out.health.env_id, "zmq-echo");
  assert.equal(out.health.max_concurrent, maxConcurrent);

  const runs = out.runs as unknown as Array<Record<string, unknown>>;
  assert.equal(runs.length, 50);
  const episodes = runs.map((r) => {
    assert.equal(r.success, true, String(r.error));
    // upstream's August WireEpisode: the head, vf's own fields in `vf`, upstream traces.
    return r.episode as {
      ok: boolean;
      vf: { example_id: number };
      task: { type: string; key: string };
      traces: Array<UpstreamTrace2026_08>;
    };
  });
  assert.deepEqual(episodes.map((e) => e.vf.example_id), [...Array(50).keys()]);
  for (const [i, e] of episodes.entries()) {
    assertAugustEpisode(e);
    assert.equal(e.ok, true);
    assert.equal(e.task.type, "Task");
    assert.equal(e.traces.length, 1);
    assertAugustTrace(e.traces[0]);
    assert.deepEqual(e.traces[0].rewards, { correct: { score: 1, weight: 1 } });
    assert.equal(e.traces[0].nodes[0].message.content, `Say hi (${i})`);
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
}

Deno.test("a Python DEALER client drives vf serve --zmq: health, 50 runs, cancel, bad input", async () => {
  await pythonDrives([], 16);
});

Deno.test("a Python DEALER client drives vf serve --zmq --workers 2 through its broker alike", async () => {
  await pythonDrives(["--workers", "2"], 32);
});

Deno.test("a Python DEALER client drives vf serve --zmq <legacy env>: health, runs, cancel, bad task data", async () => {
  await using tmp = await tempDir("vf_zmq_legacy_py_");
  await using model = await startModelServer({
    responder: (request) =>
      JSON.stringify(request.body.messages).includes("HANG")
        ? { hang: true }
        : { content: "So \\boxed{18}" },
  });
  await using server = await serve(
    ["gsm8k", "--port", "0", "--zmq", "tcp://127.0.0.1:0", "-c", "3"],
    tmp.path,
  );
  const out = await pythonDriver([server.address, model.url], LEGACY_DRIVER);
  assert.equal(out.health.success, true);
  assert.equal(out.health.env_id, "gsm8k");
  assert.equal(out.health.max_concurrent, 3);

  const runs = out.runs as unknown as Array<Record<string, unknown>>;
  const episodes = runs.map((r) => {
    assert.equal(r.success, true, String(r.error));
    return r.episode as {
      ok: boolean;
      vf: { example_id: number };
      task: { data: { idx: number } };
      traces: Array<UpstreamTrace2026_08>;
    };
  });
  assert.deepEqual(episodes.map((e) => e.vf.example_id), [...Array(8).keys()]);
  for (const [i, e] of episodes.entries()) {
    assertAugustEpisode(e);
    assert.equal(e.ok, true);
    assert.equal(e.task.data.idx, i);
    assert.equal(e.traces.length, 1);
    assertAugustTrace(e.traces[0]);
    assert.deepEqual(e.traces[0].rewards, { reward: { score: i % 2 === 0 ? 1 : 0, weight: 1 } });
  }

  assert.deepEqual(out.cancel, { success: true, error: null, cancelled: true });
  assert.deepEqual(out.cancelled_run, { success: false, error: "Cancelled: rollout aborted" });
  assert.equal(out.bad_task_data.success, false);
  assert.match(String(out.bad_task_data.error), /^ConfigError: task_data\.prompt: /);
  assert.equal(out.health_after.in_flight, 0);
  assert.equal(out.health_after.queued, 0);
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
  await using env = await ZmqEnvClient.connect(server.address, { wire: "2026-08" });
  await env.waitForServer({ timeoutMs: 60_000, intervalMs: 100 });
  const client = { base_url: model.url };
  type Legacy = { ok: boolean; vf: { example_id: number }; traces: UpstreamTrace2026_08[] };
  const right = await env.run<Legacy>({
    taskData: { prompt: "What is 9 + 9?", answer: "18", idx: 7 },
    client,
    model: "m",
    sampling: { temperature: 0 },
  });
  assert.equal(right.ok, true);
  assertAugustTrace(right.traces[0]);
  assert.deepEqual(right.traces[0].rewards, { reward: { score: 1, weight: 1 } });
  assert.equal(right.vf.example_id, 7);
  // The environment's system prompt went in front of the question, as for its dataset rows.
  const prompt = right.traces[0].nodes.map((n) => n.message).filter((m) => m.role !== "assistant");
  assert.equal(prompt.at(-1)?.content, "What is 9 + 9?");
  assert.equal(prompt[0].role, "system");
  const wrong = await env.run<Legacy>({
    taskData: { prompt: "What is 9 + 10?", answer: "19" },
    client,
    model: "m",
  });
  assert.deepEqual(wrong.traces[0].rewards, { reward: { score: 0, weight: 1 } });
  // Token data travels in the run reply: the node graph joins to the call's prompt + completion.
  const tokens = await env.run<{ traces: Array<{ nodes?: MessageNode[]; rewards: unknown }> }>({
    taskData: { prompt: "What is 9 + 9?", answer: "18" },
    client,
    model: "m",
    sampling: { return_token_ids: "required" },
  });
  assert.deepEqual(tokens.traces[0].rewards, { reward: { score: 1, weight: 1 } });
  const graph = new MessageGraph(tokens.traces[0].nodes ?? []);
  assert.ok(graph.hasTokens, JSON.stringify(tokens.traces[0]).slice(0, 400));
  const last = model.requests.at(-1)!;
  const joined = graph.tokens();
  const promptIds = toyPromptTokens(last.body);
  const sampled = joined.token_ids.length - promptIds.length;
  assert.ok(sampled > 0, JSON.stringify(joined));
  assert.deepEqual(joined.token_ids.slice(0, promptIds.length), promptIds);
  assert.deepEqual(joined.mask, [...promptIds.map(() => false), ...Array(sampled).fill(true)]);
  assert.equal(joined.logprobs.length, sampled); // one per sampled token
  await assert.rejects(
    env.run({ taskData: { answer: "1" }, client, model: "m" }),
    (error: Error) => {
      assert.match(error.message, /^ConfigError: task_data\.prompt: /);
      return true;
    },
  );
});

Deno.test("vf serve <taskset> --zmq keeps the warm pool its flags ask for, hands its sandboxes to runs, and leaves none behind", async () => {
  await using tmp = await tempDir("vf_zmq_warm_");
  await using model = await startModelServer({ responder: () => ({ content: "hi" }) });
  const events = new EngineEvents();
  // The server's run id, as its episodes report it.
  const runIds = new Set<string>();
  const served = (e: { labels: Record<string, string> }) => runIds.has(e.labels["vf.run_id"]);
  const pooled = (e: { labels: Record<string, string> }) => e.labels["vf.pool"] === "1";
  try {
    await events.ready();
    await using server = await serve([
      TASKSET,
      "--zmq",
      "tcp://127.0.0.1:0",
      "--env.agent.runtime.type",
      "docker",
      "--env.agent.runtime.image",
      "busybox",
      "--env.agent.runtime.warm_pool",
      "2",
    ], tmp.path);
    await using env = await ZmqEnvClient.connect(server.address, { wire: "2026-08" });
    await env.waitForServer({ timeoutMs: 60_000, intervalMs: 100 });
    for (let i = 0; i < 3; i++) {
      const episode = await env.run<
        { ok: boolean; vf: { run_id: string }; traces: UpstreamTrace2026_08[] }
      >({
        taskData: { prompt: `Say hi (${i})`, expected: "hi" },
        client: { base_url: model.url },
        model: "m",
      });
      runIds.add(episode.vf.run_id);
      assert.equal(episode.ok, true);
      assert.deepEqual(episode.traces[0].rewards, { correct: { score: 1, weight: 1 } });
    }
    // The pool refills after each hand-out: idle sandboxes are up when the server stops.
    const live = () => {
      const mine = events.events.filter(served);
      return mine.filter((e) => e.action === "create").length -
        mine.filter((e) => e.action === "destroy").length;
    };
    for (let waited = 0; live() < 2 && waited < 30_000; waited += 50) {
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(live() >= 2, `${live()} sandboxes up before the server stops`);
  } finally {
    await events[Symbol.asyncDispose]();
  }
  assert.equal(runIds.size, 1, [...runIds].join(", "));
  const [runId] = runIds;
  assert.match(runId, /^serve-/);
  const creates = events.of(runId).filter((e) => e.action === "create");
  // Every run's sandbox came from the pool (the first run waited for the pool's first start):
  // none was started for a run on its own.
  assert.ok(creates.length >= 3 + 2, `${creates.length} sandboxes created`);
  assert.deepEqual(creates.filter((e) => !pooled(e)), []);
  // Stopping the server removed every one, the pool's idle ones too.
  const destroyed = events.of(runId).filter((e) => e.action === "destroy").length;
  assert.equal(destroyed, creates.length);
});

/** A `health` reply of a `--workers` broker. */
interface PoolHealth {
  success: boolean;
  env_id: string;
  in_flight: number;
  queued: number;
  max_concurrent: number;
  workers: Array<
    { worker: number; pid: number; alive: boolean; in_flight: number; served: number }
  >;
}

/** Poll `check` until it holds (no deadline: the test runner's own bounds the wait). */
async function until(check: () => boolean | Promise<boolean>): Promise<void> {
  while (!(await check())) await new Promise((r) => setTimeout(r, 50));
}

/** A gate the model server's "HOLD" requests wait on. */
function gate() {
  const { promise, resolve } = Promise.withResolvers<void>();
  return { opened: promise, open: () => resolve() };
}

Deno.test("vf serve --zmq --workers 2: a broker spreads runs over both workers, routes cancel, answers health, and survives a worker's death", async () => {
  await using tmp = await tempDir("vf_zmq_pool_");
  let hold = gate();
  await using model = await startModelServer({
    responder: async (request) => {
      const text = JSON.stringify(request.body.messages);
      if (text.includes("HANG")) return { hang: true };
      if (text.includes("HOLD")) await hold.opened;
      return { content: "hi" };
    },
  });
  await using server = await serve([
    TASKSET,
    "--zmq",
    "tcp://127.0.0.1:0",
    "--workers",
    "2",
    "-c",
    "16",
    "--env.agent.runtime.type",
    "subprocess",
  ], tmp.path);
  assert.match(server.out, /"zmq-echo" over ZeroMQ at tcp:.* \(a broker in front of 2 workers\)/);
  await using env = await ZmqEnvClient.connect(server.address, { wire: "2026-08" });
  await env.waitForServer({ timeoutMs: 60_000, intervalMs: 100 });
  const health = async () => (await env.status({ timeoutMs: 60_000 })) as unknown as PoolHealth;
  const client = { base_url: model.url };

  // Health comes from the broker: the totals and both workers, separate processes.
  const first = await health();
  assert.equal(first.success, true);
  assert.equal(first.env_id, "zmq-echo");
  assert.equal(first.max_concurrent, 32);
  assert.deepEqual(first.workers.map((w) => [w.worker, w.alive, w.in_flight]), [
    [0, true, 0],
    [1, true, 0],
  ]);
  const [pid0, pid1] = first.workers.map((w) => w.pid);
  assert.notEqual(pid0, pid1);

  // 20 runs at once, held at the model until all are in: 10 on each worker.
  const runs = Array.from(
    { length: 20 },
    (_, i) =>
      env.run<{ ok: boolean; traces: UpstreamTrace2026_08[] }>({
        taskData: { prompt: `HOLD ${i}`, expected: "hi" },
        client,
        model: "m",
      }),
  );
  await until(() => model.requests.length >= 20);
  const busy = await health();
  assert.equal(busy.in_flight, 20);
  assert.deepEqual(busy.workers.map((w) => w.in_flight), [10, 10]);
  hold.open();
  for (const episode of await Promise.all(runs)) {
    assert.equal(episode.ok, true);
    assert.deepEqual(episode.traces[0].rewards, { correct: { score: 1, weight: 1 } });
  }
  const served = await health();
  assert.deepEqual(served.workers.map((w) => [w.in_flight, w.served]), [[0, 10], [0, 10]]);

  // Two runs that hang: A on worker 0, B on worker 1. Cancelling B reaches worker 1 (the only
  // one that can say cancelled), and B's reply says so.
  const hang = (id: string) =>
    env.run({ taskData: { prompt: `HANG ${id}`, expected: "hi" }, client, model: "m" }, {
      requestId: id,
    });
  const seen = model.requests.length;
  const idA = crypto.randomUUID().replaceAll("-", "");
  const idB = crypto.randomUUID().replaceAll("-", "");
  const runA = hang(idA);
  const runB = hang(idB);
  const rejectedA = assert.rejects(runA, (error: EnvServerReplyError) => {
    assert.equal(error.type, "WorkerError");
    assert.match(
      error.message,
      new RegExp(`^WorkerError: Worker 0 \\(pid ${pid0}\\) exited \\(SIGKILL\\) before replying`),
    );
    return true;
  });
  await until(() => model.requests.length >= seen + 2);
  assert.deepEqual((await health()).workers.map((w) => w.in_flight), [1, 1]);
  assert.equal(await env.cancel(idB), true);
  await assert.rejects(runB, (error: EnvServerReplyError) => {
    assert.equal(error.message, "Cancelled: rollout aborted");
    return true;
  });
  assert.equal(await env.cancel(idB), false);
  assert.deepEqual((await health()).workers.map((w) => w.in_flight), [1, 0]);

  // Worker 0 dies with A in flight, while C runs on worker 1: A gets an error reply, C
  // finishes, and the broker goes on answering and running on worker 1.
  hold = gate();
  const runC = env.run<{ ok: boolean }>({
    taskData: { prompt: "HOLD C", expected: "hi" },
    client,
    model: "m",
  });
  await until(() => model.requests.length >= seen + 3);
  Deno.kill(pid0, "SIGKILL");
  await rejectedA;
  const after = await health();
  assert.deepEqual(after.workers.map((w) => [w.alive, w.in_flight]), [[false, 0], [true, 1]]);
  assert.equal(after.max_concurrent, 16);
  hold.open();
  assert.equal((await runC).ok, true);
  const more = await Promise.all(Array.from({ length: 4 }, (_, i) =>
    env.run<{ ok: boolean }>({
      taskData: { prompt: `Say hi ${i}`, expected: "hi" },
      client,
      model: "m",
    })));
  assert.deepEqual(more.map((e) => e.ok), [true, true, true, true]);
  const last = await health();
  assert.deepEqual(last.workers.map((w) => [w.alive, w.served]), [[false, 10], [true, 16]]);
});

Deno.test("vf serve --port 0 --zmq --workers 2: HTTP and ZeroMQ share the same worker processes", async () => {
  await using tmp = await tempDir("vf_zmq_pool_http_");
  await using model = await startModelServer({ responder: () => ({ content: "\\boxed{18}" }) });
  await using server = await serve(
    ["gsm8k", "--port", "0", "--zmq", "tcp://127.0.0.1:0", "--workers", "2"],
    tmp.path,
  );
  const url = /2 workers at (http:\/\/\S+)/.exec(server.out)?.[1];
  assert.ok(url, server.out);
  await using env = await ZmqEnvClient.connect(server.address, { wire: "2026-08" });
  await env.waitForServer({ timeoutMs: 60_000, intervalMs: 100 });
  const zmqHealth = (await env.status()) as unknown as PoolHealth;
  const httpHealth = await (await fetch(`${url}/health`)).json() as {
    workers: Array<{ pid: number }>;
  };
  assert.deepEqual(httpHealth.workers.map((w) => w.pid), zmqHealth.workers.map((w) => w.pid));
  assert.equal(zmqHealth.workers.length, 2);
  const episode = await env.run<{ traces: UpstreamTrace2026_08[] }>({
    taskData: { prompt: "What is 9 + 9?", answer: "18" },
    client: { base_url: model.url },
    model: "m",
  });
  assert.deepEqual(episode.traces[0].rewards, { reward: { score: 1, weight: 1 } });
});

/** A Python DEALER on the current wire (the default): its whole exchange, asserted. */
async function pythonDrivesCurrentWire(extra: string[]): Promise<void> {
  await using tmp = await tempDir("vf_zmq_wire_");
  await using model = await startModelServer({
    responder: (request) =>
      JSON.stringify(request.body.messages).includes("HANG") ? { hang: true } : { content: "hi" },
  });
  await using server = await serve(
    [
      TASKSET,
      "--zmq",
      "tcp://127.0.0.1:0",
      "--env.agent.runtime.type",
      "subprocess",
      ...extra,
    ],
    tmp.path,
    { defaultWire: true },
  );
  const out = await pythonDriver(
    [server.address, model.url, TRACE_SCHEMA, HEAD_SCHEMA],
    WIRE_DRIVER,
  );
  assert.equal(out.health.success, true);
  assert.deepEqual(out.info, {
    success: true,
    error: null,
    num_tasks: null,
    requires_group_scoring: false,
  });
  const runs = out.runs as unknown as Array<{
    deltas: Array<Record<string, unknown>>;
    reply: { traces: Array<{ id: string; nodes: number; calls: number }> };
    episode: {
      id: string;
      ok: boolean;
      env: { id: string };
      task: { data: unknown };
      traces: Array<Record<string, unknown>>;
    };
  }>;
  assert.equal(runs.length, 4);
  // Each rollout's model calls carried X-Session-ID: its trace's id on the wire.
  const sessions = new Set(model.requests.map((r) => r.headers["x-session-id"]));
  for (const [i, run] of runs.entries()) {
    // The episode grew over several deltas: the preview of the request, then the turn.
    assert.ok(run.deltas.length >= 2, JSON.stringify(run.deltas));
    assert.ok(run.deltas[0].open, JSON.stringify(run.deltas[0]));
    assert.equal(run.episode.ok, true);
    const [trace] = run.episode.traces;
    assert.equal(run.reply.traces[0].id, trace.id);
    assert.ok(sessions.has(trace.id as string), `${trace.id} not in ${[...sessions]}`);
    assert.equal(run.reply.traces[0].calls, 1);
    const nodes = trace.nodes as Array<{ message: { role: string; content: string } }>;
    assert.equal(nodes.at(-1)?.message.content, "hi");
    assert.ok(nodes.some((n) => n.message.content === `Say hi (${i})`));
    assert.deepEqual(trace.rewards, { correct: { score: 1, weight: 1 } });
    assert.equal(trace.version, 1);
    // The head is upstream's Episode without its traces; the token counts came as `set`.
    assert.equal(run.episode.id.length, 32);
    assert.deepEqual(run.episode.task.data, { prompt: `Say hi (${i})`, expected: "hi", idx: i });
    assert.ok(run.episode.env.id.length > 0, JSON.stringify(run.episode.env));
    assert.ok((trace.num_total_tokens as number) > 0, JSON.stringify(trace));
    assert.ok(run.deltas.some((d) => (d.set as Record<string, unknown>)?.num_total_tokens));
  }
  // A delta arrived while the run was still in flight (its model call hangs until cancel).
  const first = out.hang_first as { kind: string; data: Record<string, unknown> };
  assert.equal(first.kind, "delta");
  assert.ok(first.data.open);
  assert.deepEqual(out.cancel, { success: true, error: null, cancelled: true });
  assert.deepEqual(out.cancelled_run, { success: false, error: "Cancelled: rollout aborted" });
  // Garbage gets error replies in the three-frame form, and the server serves on.
  const [kind, notMsgpack] = out.not_msgpack as unknown as [string, { error: string }];
  assert.equal(kind, "reply");
  assert.match(notMsgpack.error, /^RequestError: The payload of "run" is not msgpack/);
  assert.match(
    (out.two_frames as unknown as [string, { error: string }])[1].error,
    /^RequestError: Expected 3 frames/,
  );
  assert.match(
    (out.oversized as unknown as [string, { error: string }])[1].error,
    /^RequestError: The payload of "run" is 68157440 bytes, over the server's limit/,
  );
  assert.match(String(out.unknown_method.error), /answers "health", "info", "run" and "cancel"/);
  assert.equal(out.health_after.success, true);
  assert.equal(out.health_after.in_flight, 0);
  assert.equal(out.dropped, 0);
}

Deno.test("the current wire (default): a Python DEALER gets health, info, per-turn deltas it assembles and checks against the counts and upstream's Trace schema, cancel, and errors for garbage", async () => {
  await pythonDrivesCurrentWire([]);
});

Deno.test("--zmq-impl addon: the same exchange through the zeromq addon's libzmq sockets", async () => {
  await pythonDrivesCurrentWire(["--zmq-impl", "addon"]);
});

Deno.test("the current wire through the --workers 2 broker: deltas pass through, the reply ends the run", async () => {
  await pythonDrivesCurrentWire(["--workers", "2"]);
});

Deno.test("ZmqEnvClient on the current wire: deltas before the reply, the episode assembled from them, info", async () => {
  await using tmp = await tempDir("vf_zmq_wire_ts_");
  await using model = await startModelServer({ responder: () => ({ content: "hi" }) });
  await using server = await serve(
    [
      TASKSET,
      "--zmq",
      "tcp://127.0.0.1:0",
      "--env.agent.runtime.type",
      "subprocess",
    ],
    tmp.path,
    { defaultWire: true },
  );
  await using env = await ZmqEnvClient.connect(server.address);
  await env.waitForServer({ timeoutMs: 60_000, intervalMs: 100 });
  assert.deepEqual(await env.info(), { num_tasks: null, requires_group_scoring: false });
  let before = 0;
  let ended = false;
  const episode = await env.run<{ ok: boolean; traces: Array<{ nodes: unknown[]; id: string }> }>({
    taskData: { prompt: "Say hi", expected: "hi" },
    client: { base_url: model.url },
    model: "m",
  }, {
    onDelta: (_delta, assembly) => {
      if (!ended) before++;
      assert.ok(assembly.traces.size <= 1);
    },
  });
  ended = true;
  assert.ok(before >= 2, `deltas before the reply: ${before}`);
  assert.equal(episode.ok, true);
  assert.equal(episode.traces.length, 1);
  assert.ok(episode.traces[0].nodes.length >= 2);
});

Deno.test("the guide's example as written: vf serve file-sum --zmq on Docker, driven by examples/zmq_trainer.py with {prompt, numbers} task data", async () => {
  await using tmp = await tempDir("vf_zmq_example_");
  await using model = await startModelServer({ responder: () => ({ content: "6" }) });
  // docs/serving-and-training.md, with port 0 for the guide's 5000.
  await using server = await serve(
    [
      "file-sum",
      "--zmq",
      "tcp://127.0.0.1:0",
      "-c",
      "64",
      "--env.agent.runtime.type",
      "docker",
    ],
    tmp.path,
    { defaultWire: true },
  );
  const res = await new Deno.Command(PYTHON, {
    args: [
      fileURLToPath(new URL("../examples/zmq_trainer.py", import.meta.url)),
      "--address",
      server.address,
      "--base-url",
      model.url,
      "--model",
      "my-policy",
      "--task-data",
      '[{"prompt": "Sum the integers in /app/input.txt ...", "numbers": [1, 2, 3]}]',
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(res.stdout);
  assert.equal(res.code, 0, `${stdout}\n${new TextDecoder().decode(res.stderr)}`);
  const [line] = stdout.trim().split("\n").map((l) => JSON.parse(l));
  assert.equal(typeof line.task, "string");
  // Scored in its isolated grading sandbox: the model only said "6", it wrote no answer file.
  assert.deepEqual(line.rewards, [{ correct: { score: 0, weight: 1 } }]);
  assert.ok(model.requests.length >= 1);
});

Deno.test("examples/zmq_trainer.py assembles routing_repairs as upstream's client does: the last row replaced and widened, the deltas untouched", async () => {
  const source = `
import copy, importlib.util, json, struct, sys
spec = importlib.util.spec_from_file_location("trainer", sys.argv[1])
trainer = importlib.util.module_from_spec(spec); spec.loader.exec_module(trainer)
nd = lambda dtype, shape, code, values: {"__nd__": True, "dtype": dtype, "shape": shape,
                                         "data": struct.pack(f"<{len(values)}{code}", *values)}
first = {"trace": "t", "open": {"version": 1, "id": "t", "verifiers": {}, "task": {}},
         "nodes": [{"parent": None, "message": {"role": "user", "content": "q"}},
                   {"parent": 0, "message": {"role": "assistant", "content": "a"},
                    "routed_experts": nd("uint8", [3, 2, 1], "B", [0, 1, 2, 3, 4, 5])}]}
second = {"trace": "t", "routing_repairs": {1: nd("uint16", [1, 2, 1], "H", [100, 65535])},
          "links": {0: [{"node": 1, "type": "reply"}]}}
held = copy.deepcopy([first, second])
assembly = trainer.Assembly()
assembly.apply(first); assembly.apply(second)
node = assembly.traces["t"]["nodes"][1]["routed_experts"]
print(json.dumps({"dtype": node["dtype"], "shape": node["shape"],
                  "values": list(struct.unpack("<6H", node["data"])),
                  "links": assembly.traces["t"]["nodes"][0]["semantic_parents"],
                  "untouched": held == [first, second]}))
`;
  const res = await new Deno.Command(PYTHON, {
    args: ["-c", source, fileURLToPath(new URL("../examples/zmq_trainer.py", import.meta.url))],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const err = new TextDecoder().decode(res.stderr);
  assert.equal(res.code, 0, err);
  assert.deepEqual(JSON.parse(new TextDecoder().decode(res.stdout)), {
    dtype: "uint16",
    shape: [3, 2, 1],
    values: [0, 1, 2, 3, 100, 65535],
    links: [{ node: 1, type: "reply" }],
    untouched: true,
  });
});
