/**
 * End-to-end test of `vf serve` and `vf eval --server`: the real CLI in two subprocesses
 * (the env server and the evaluator) against a real model server on loopback.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
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
