/**
 * End-to-end test of `vf serve` and `vf eval --server`: the real CLI in two subprocesses
 * (the env server and the evaluator) against a real model server on loopback.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { startModelServer } from "./model_server.ts";

const CLI = fileURLToPath(new URL("../cli.ts", import.meta.url));
const decoder = new TextDecoder();

/** A clean environment: no keys or OPENAI_* variables leak in from the machine. */
function childEnv(extra: Record<string, string> = {}): Record<string, string> {
  const env: Record<string, string> = { NO_COLOR: "1" };
  for (const name of ["PATH", "HOME", "DENO_DIR", "XDG_CACHE_HOME", "TMPDIR"]) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  return { ...env, ...extra };
}

function cli(args: string[], cwd: string, env: Record<string, string> = {}): Deno.Command {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    cwd,
    env: childEnv(env),
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  });
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

Deno.test("vf eval --server runs an eval through a vf serve process", async () => {
  const tmp = await Deno.makeTempDir({ prefix: "vf_serve_" });
  await using model = await startModelServer({ responder: () => ({ content: "So \\boxed{18}" }) });
  const port = freePort();
  const url = `http://127.0.0.1:${port}`;
  const server = cli(["serve", "gsm8k", "--port", String(port), "-c", "4"], tmp).spawn();
  try {
    const health = await waitForHealth(url, server);
    assert.equal(health.env_id, "gsm8k");
    assert.equal(health.max_concurrent, 4);

    const evalRun = await cli(
      [
        "eval",
        "gsm8k",
        "--server",
        url,
        "-m",
        "m",
        "-b",
        model.url,
        "-k",
        "VF_TEST_KEY",
        "-n",
        "2",
        "-r",
        "2",
        "-o",
        tmp,
      ],
      tmp,
      { VF_TEST_KEY: "key-from-the-evaluator" },
    ).output();
    const transcript = `exit ${evalRun.code}\n--- stdout\n${
      decoder.decode(evalRun.stdout)
    }\n--- stderr\n${decoder.decode(evalRun.stderr)}`;
    assert.equal(evalRun.code, 0, transcript);

    const base = join(tmp, "evals", "gsm8k--m");
    const dirs = [...Deno.readDirSync(base)].map((e) => e.name);
    assert.equal(dirs.length, 1, transcript);
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
    const wrong = await cli([
      "eval",
      "wordle",
      "--server",
      url,
      "-m",
      "m",
      "-b",
      model.url,
      "-n",
      "1",
    ], tmp).output();
    assert.equal(wrong.code, 1);
    assert.match(decoder.decode(wrong.stderr), /serves "gsm8k", not "wordle"/);
    assert.equal(model.requests.length, 4);
  } finally {
    server.kill("SIGTERM");
    const out = await server.output();
    await Deno.remove(tmp, { recursive: true });
    assert.equal(out.code, 0, decoder.decode(out.stderr));
    assert.match(decoder.decode(out.stdout), new RegExp(`environment "gsm8k" at ${url}`));
    assert.match(decoder.decode(out.stderr), /SIGTERM: stopping the env server/);
  }
});

Deno.test("vf eval --server names the URL when no server is listening", async () => {
  const tmp = await Deno.makeTempDir({ prefix: "vf_serve_" });
  try {
    const url = `http://127.0.0.1:${freePort()}`;
    const out = await cli([
      "eval",
      "gsm8k",
      "--server",
      url,
      "-m",
      "m",
      "-b",
      "http://127.0.0.1:1/v1",
    ], tmp).output();
    assert.equal(out.code, 1);
    assert.match(decoder.decode(out.stderr), new RegExp(`Cannot reach the env server at "${url}"`));
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
});
