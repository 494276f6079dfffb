/**
 * End-to-end test of `vf serve` and `vf eval --server`: the real CLI in two subprocesses
 * (the env server and the evaluator) against a real model server on loopback; and a taskset
 * served over HTTP, driven by `ServerEnvironment.run`.
 * @module
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { EnvServerReplyError, ServerEnvironment } from "../mod.ts";
import { startModelServer } from "./model_server.ts";
import { cliCommand, collect, tempDir, transcript } from "./_cli.ts";
import { makeCertificates } from "./_remote_docker.ts";

/** The CLI with a bare environment: no keys or OPENAI_* variables leak in from the machine. */
function cli(args: string[], cwd: string, env: Record<string, string> = {}): Deno.Command {
  return cliCommand(args, { cwd, env, registry: false });
}

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

async function waitForHealth(
  url: string,
  server: Deno.ChildProcess,
  ms = 60_000,
): Promise<Record<string, unknown>> {
  const end = Date.now() + ms;
  let exited = false;
  server.status.then(() => (exited = true));
  while (Date.now() < end && !exited) {
    try {
      const res = await fetch(`${url}/health`);
      if (res.ok) return await res.json();
      await res.body?.cancel();
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(
    exited ? "vf serve exited before it was healthy" : `vf serve was not healthy after ${ms} ms`,
  );
}

/** `vf eval <envId>` through the env server at `url`, with model "m" at `baseUrl`, plus `flags`. */
function evalViaServer(envId: string, url: string, baseUrl: string, ...flags: string[]): string[] {
  return ["eval", envId, "--server", url, "-m", "m", "-b", baseUrl, ...flags];
}

Deno.test("vf eval --server runs an eval through a vf serve process", async () => {
  await using tmp = await tempDir("vf_serve_");
  await using model = await startModelServer({ responder: () => ({ content: "So \\boxed{18}" }) });
  const port = freePort();
  const url = `http://127.0.0.1:${port}`;
  const server = cli(["serve", "gsm8k", "--port", String(port), "-c", "4"], tmp.path).spawn();
  try {
    const health = await waitForHealth(url, server);
    assert.equal(health.env_id, "gsm8k");
    assert.equal(health.max_concurrent, 4);

    const flags = ["-k", "VF_TEST_KEY", "-n", "2", "-r", "2", "-o", tmp.path];
    const evalRun = await collect(
      cli(evalViaServer("gsm8k", url, model.url, ...flags), tmp.path, {
        VF_TEST_KEY: "key-from-the-evaluator",
      }),
    );
    assert.equal(evalRun.code, 0, transcript(evalRun));

    const base = join(tmp.path, "evals", "gsm8k--m");
    const dirs = [...Deno.readDirSync(base)].map((e) => e.name);
    assert.equal(dirs.length, 1, transcript(evalRun));
    const rows = Deno.readTextFileSync(join(base, dirs[0], "results.jsonl")).trim().split("\n").map(
      (l) => JSON.parse(l),
    );
    assert.equal(rows.length, 4);
    assert.deepEqual(rows.map((r) => r.example_id).sort(), [0, 0, 1, 1]);
    const metadata = JSON.parse(Deno.readTextFileSync(join(base, dirs[0], "metadata.json")));
    assert.equal(metadata.env_id, "gsm8k");
    assert.equal(metadata.base_url, model.url);
    // The model calls came from the server, with the key the evaluator read from -k.
    assert.equal(model.requests.length, 4);
    assert.ok(
      model.requests.every((r) => r.headers.authorization === "Bearer key-from-the-evaluator"),
    );

    // A mismatched environment name is refused before any rollout runs.
    const wrong = await collect(cli(evalViaServer("wordle", url, model.url, "-n", "1"), tmp.path));
    assert.equal(wrong.code, 1);
    assert.match(wrong.stderr, /serves "gsm8k", not "wordle"/);
    assert.equal(model.requests.length, 4);
  } finally {
    server.kill("SIGTERM");
    const out = await collect(server);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stdout, new RegExp(`environment "gsm8k" at ${url}`));
    assert.match(out.stderr, /SIGTERM: stopping the env server/);
  }
});

Deno.test("vf eval --server names the URL when no server is listening", async () => {
  await using tmp = await tempDir("vf_serve_");
  const url = `http://127.0.0.1:${freePort()}`;
  const out = await collect(cli(evalViaServer("gsm8k", url, "http://127.0.0.1:1/v1"), tmp.path));
  assert.equal(out.code, 1);
  assert.match(out.stderr, new RegExp(`Cannot reach the env server at "${url}"`));
});

Deno.test("vf serve --workers: one HTTPS port with a token in front of worker processes, a second added under load; vf eval runs through it", async () => {
  await using tmp = await tempDir("vf_serve_workers_");
  await makeCertificates(tmp.path);
  // The model holds every answer until the front reports its second worker, so the load
  // lasts as long as scaling up takes on a busy machine (a fixed delay raced the worker's
  // start-up: the eval could end first). A cap keeps a front that never scales from hanging.
  let scaled!: () => void;
  const scaledUp = new Promise<void>((resolve) => (scaled = resolve));
  await using model = await startModelServer({
    responder: async () => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([scaledUp, new Promise((r) => (timer = setTimeout(r, 120_000)))]);
      clearTimeout(timer);
      return { content: "So \\boxed{18}" };
    },
  });
  const port = freePort();
  const url = `https://127.0.0.1:${port}`;
  const env = { VF_SERVER_TOKEN: "tok-123", DENO_CERT: join(tmp.path, "ca.pem") };
  const server = cli(
    [
      "serve",
      "gsm8k",
      "--workers",
      "2",
      "--port",
      String(port),
      "-c",
      "1",
      "--tls-cert",
      join(tmp.path, "server-cert.pem"),
      "--tls-key",
      join(tmp.path, "server-key.pem"),
    ],
    tmp.path,
    env,
  ).spawn();
  const client = Deno.createHttpClient({
    caCerts: [await Deno.readTextFile(join(tmp.path, "ca.pem"))],
  });
  const get = (path: string, headers: Record<string, string> = {}) =>
    fetch(`${url}${path}`, { client, headers });
  try {
    const end = Date.now() + 60_000;
    let health: Record<string, unknown> | null = null;
    while (!health && Date.now() < end) {
      try {
        const res = await get("/health");
        if (res.ok) health = await res.json();
        else await res.body?.cancel();
      } catch {
        await new Promise((r) => setTimeout(r, 200));
      }
    }
    assert.ok(health, "the front never answered /health");
    assert.equal((health.workers as unknown[]).length, 1);
    assert.equal(health.max_workers, 2);

    const refused = await get("/info");
    assert.equal(refused.status, 401);
    await refused.body?.cancel();
    const info = await (await get("/info", { authorization: "Bearer tok-123" })).json();
    assert.equal(info.env_id, "gsm8k");

    // Eight groups at once against workers that run one group each: the front adds a worker.
    let watching = true;
    const watch = (async () => {
      while (watching) {
        const h = await (await get("/health")).json();
        if (h.workers.length === 2) return scaled();
        await new Promise((r) => setTimeout(r, 200));
      }
    })();
    const evalRun = await collect(cli(
      [
        "eval",
        "gsm8k",
        "--server",
        url,
        "-m",
        "m",
        "-b",
        model.url,
        "-n",
        "8",
        "-r",
        "1",
        "-c",
        "16",
        "-o",
        tmp.path,
      ],
      tmp.path,
      env,
    ));
    watching = false;
    await watch;
    assert.equal(evalRun.code, 0, transcript(evalRun));
    const base = join(tmp.path, "evals", "gsm8k--m");
    const [dir] = [...Deno.readDirSync(base)].map((e) => e.name);
    const rows = Deno.readTextFileSync(join(base, dir, "results.jsonl")).trim().split("\n");
    assert.equal(rows.length, 8);
    const after = await (await get("/health")).json();
    assert.equal(after.workers.length, 2, JSON.stringify(after));
  } finally {
    client.close();
    server.kill("SIGTERM");
    const out = await collect(server);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stdout, /up to 2 workers at https:\/\/127\.0\.0\.1/);
    assert.match(out.stderr, /SIGTERM: stopping the env server and its workers/);
  }
});

Deno.test("vf serve <taskset> over HTTP: ServerEnvironment.run runs its episodes, cancels one in flight, and names bad task data", async () => {
  await using tmp = await tempDir("vf_serve_taskset_");
  await using model = await startModelServer({
    responder: (request) =>
      JSON.stringify(request.body.messages).includes("HANG") ? { hang: true } : { content: "hi" },
  });
  const port = freePort();
  const url = `http://127.0.0.1:${port}`;
  const taskset = fileURLToPath(new URL("./_zmq_taskset.ts", import.meta.url));
  const server = cli(
    ["serve", taskset, "--port", String(port), "-c", "4", "--env.agent.runtime.type", "subprocess"],
    tmp.path,
  ).spawn();
  try {
    const health = await waitForHealth(url, server);
    assert.equal(health.env_id, "zmq-echo");
    assert.equal(health.max_concurrent, 4);
    const env = await ServerEnvironment.connect(url);
    assert.equal(env.info.kind, "taskset");
    assert.equal(env.envId, "zmq-echo");

    const client = { base_url: model.url };
    type Echo = { ok: boolean; example_id: number; traces: Array<{ reward: number }> };
    const episodes = await Promise.all(Array.from({ length: 6 }, (_, i) =>
      env.run<Echo>({
        taskData: { prompt: `Say hi (${i})`, expected: i % 2 ? "hi" : "bye", idx: i },
        client,
        model: "m",
      })));
    assert.deepEqual(episodes.map((e) => e.example_id), [0, 1, 2, 3, 4, 5]);
    assert.deepEqual(episodes.map((e) => e.traces[0].reward), [0, 1, 0, 1, 0, 1]);
    assert.ok(episodes.every((e) => e.ok));

    // A run whose model call hangs: aborting sends /cancel, the reply is Cancelled, and its
    // sandbox (a temp dir of the subprocess runtime) is gone.
    const marker = join(tmp.path, "sandbox_dir");
    const controller = new AbortController();
    const hung = env.run({
      taskData: { prompt: "HANG", expected: "hi", marker },
      client,
      model: "m",
    }, { signal: controller.signal, requestId: "hung-run" });
    const rejected = assert.rejects(hung, (error: EnvServerReplyError) => {
      assert.ok(error instanceof EnvServerReplyError);
      assert.equal(error.type, "Cancelled");
      assert.equal(error.message, "Cancelled: rollout aborted");
      return true;
    });
    while (!existsSync(marker) || Deno.readTextFileSync(marker) === "") {
      await new Promise((r) => setTimeout(r, 50));
    }
    await eventuallyInFlight(url, 1);
    controller.abort();
    await rejected;
    assert.equal(existsSync(Deno.readTextFileSync(marker)), false, "the sandbox is still there");

    await assert.rejects(
      env.run({ taskData: { prompt: "Say hi", expected: 5 }, client, model: "m" }),
      (error: EnvServerReplyError) => {
        assert.equal(error.type, "ConfigError");
        assert.match(error.message, /^ConfigError: task_data\.expected: /);
        return true;
      },
    );
    // What a taskset does not serve is refused by name; a body that does not fit is a 400.
    const rollouts = await fetch(`${url}/rollouts`, { method: "POST", body: "{}" });
    assert.equal(rollouts.status, 404);
    assert.match((await rollouts.json()).error, /Taskset "zmq-echo" serves POST \/run/);
    const bad = await fetch(`${url}/run`, { method: "POST", body: JSON.stringify({ model: "m" }) });
    assert.equal(bad.status, 400);
    assert.match((await bad.json()).error, /^task_data: /);
    const after = await (await fetch(`${url}/health`)).json();
    assert.deepEqual([after.in_flight, after.queued, after.requests], [0, 0, 0]);
  } finally {
    server.kill("SIGTERM");
    const out = await collect(server);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stdout, new RegExp(`taskset "zmq-echo" at ${url} \\(4 runs at once\\)`));
  }
});

/** Poll the server's /health until `in_flight` is `n`. */
async function eventuallyInFlight(url: string, n: number): Promise<void> {
  const end = Date.now() + 30_000;
  while (Date.now() < end) {
    const health = await (await fetch(`${url}/health`)).json();
    if (health.in_flight === n) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`in_flight never reached ${n}`);
}

Deno.test("vf serve <taskset> --workers 2 over HTTP: the front hands /run to a worker and /cancel to the one that holds it", async () => {
  await using tmp = await tempDir("vf_serve_taskset_workers_");
  await using model = await startModelServer({
    responder: (request) =>
      JSON.stringify(request.body.messages).includes("HANG") ? { hang: true } : { content: "hi" },
  });
  const port = freePort();
  const url = `http://127.0.0.1:${port}`;
  const taskset = fileURLToPath(new URL("./_zmq_taskset.ts", import.meta.url));
  const server = cli(
    [
      "serve",
      taskset,
      "--port",
      String(port),
      "--workers",
      "2",
      "--env.agent.runtime.type",
      "subprocess",
    ],
    tmp.path,
  ).spawn();
  try {
    await waitForHealth(url, server);
    const env = await ServerEnvironment.connect(url);
    assert.equal(env.info.kind, "taskset");
    const client = { base_url: model.url };
    const episodes = await Promise.all(
      Array.from({ length: 3 }, (_, i) =>
        env.run<{ traces: Array<{ reward: number }> }>({
          taskData: { prompt: `Say hi (${i})`, expected: "hi" },
          client,
          model: "m",
        })),
    );
    assert.deepEqual(episodes.map((e) => e.traces[0].reward), [1, 1, 1]);
    const controller = new AbortController();
    const hung = env.run({ taskData: { prompt: "HANG", expected: "hi" }, client, model: "m" }, {
      signal: controller.signal,
    });
    const rejected = assert.rejects(hung, /Cancelled: rollout aborted/);
    while (model.inFlight === 0) await new Promise((r) => setTimeout(r, 50));
    controller.abort();
    await rejected;
  } finally {
    server.kill("SIGTERM");
    const out = await collect(server);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stdout, /up to 2 workers at http:\/\/127\.0\.0\.1/);
  }
});
