/**
 * The single `vf` binary (`deno task compile`, built with `bun build --compile`): builds
 * `dist/vf` when it is missing or older than the sources, then runs it the way a user without
 * Deno or Node would, with a PATH that holds neither, against real parts: a model server on
 * loopback and the Docker engine.
 * @module
 */
import assert from "node:assert/strict";
import { mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { compile } from "../scripts/compile.ts";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { VERSION } from "../lib/version.ts";
import { demoResponder, lastUserText, type Responder, startModelServer } from "./model_server.ts";
import { childEnv } from "./_child_env.ts";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const VF = join(ROOT, "dist/vf");
const SOURCES = [
  "cli.ts",
  "mod.ts",
  "deno.json",
  "deno.lock",
  "lib",
  "runtimes",
  "environments",
  "scripts",
];

/** The newest modification time among the files the binary is built from (tests excluded). */
async function newestSource(path: string): Promise<number> {
  const info = await stat(path);
  if (!info.isDirectory()) return path.endsWith("_test.ts") ? 0 : info.mtimeMs;
  let newest = 0;
  for (const entry of await readdir(path)) {
    newest = Math.max(newest, await newestSource(join(path, entry)));
  }
  return newest;
}

let built: Promise<void> | undefined;

/** Builds dist/vf once per run, and only when a source is newer than it. */
function ensureBinary(): Promise<void> {
  built ??= (async () => {
    const binary = await stat(VF).then((s) => s.mtimeMs, () => 0);
    let newest = 0;
    for (const source of SOURCES) newest = Math.max(newest, await newestSource(join(ROOT, source)));
    if (binary >= newest) return;
    const start = performance.now();
    await compile(VF);
    console.log(`built dist/vf in ${((performance.now() - start) / 1000).toFixed(1)} s`);
  })();
  return built;
}

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs the binary with a clean environment whose PATH is an empty folder: no deno, no node
 * (nor anything else) can be started by name.
 */
async function vf(args: string[], cwd: string): Promise<Run> {
  await ensureBinary();
  const emptyBin = join(cwd, "empty-bin");
  await Deno.mkdir(emptyBin, { recursive: true });
  const env: Record<string, string> = { PATH: emptyBin, HOME: cwd, NO_COLOR: "1" };
  const dockerHost = Deno.env.get("DOCKER_HOST");
  if (dockerHost) env.DOCKER_HOST = dockerHost;
  const out = await new Deno.Command(VF, {
    args,
    cwd,
    env,
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(90_000),
  }).output();
  const decoder = new TextDecoder();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

function transcript(run: Run): string {
  return `exit ${run.code}\n--- stdout\n${run.stdout}\n--- stderr\n${run.stderr}`;
}

async function withTempDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), "vf-binary-"));
  try {
    return await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Every rollout record of the one run under `<dir>/outputs/evals`. */
async function readResults(dir: string): Promise<Record<string, unknown>[]> {
  const evals = join(dir, "outputs/evals");
  const [envModel] = await readdir(evals);
  const [runId] = await readdir(join(evals, envModel));
  const text = await readFile(join(evals, envModel, runId, "results.jsonl"), "utf8");
  return text.trim().split("\n").map((line) => JSON.parse(line));
}

Deno.test("dist/vf --version and --help run without deno or node on PATH", async () => {
  await withTempDir(async (dir) => {
    const version = await vf(["--version"], dir);
    assert.equal(version.code, 0, transcript(version));
    assert.equal(version.stdout.trim(), `vf ${VERSION}`);
    const help = await vf(["--help"], dir);
    assert.equal(help.code, 0, transcript(help));
    assert.match(help.stdout, /vf eval <env>/);
    assert.match(help.stdout, /Environments: .*gsm8k/);
  });
});

Deno.test("dist/vf validate environments/file_sum loads a local module that imports ../../mod.ts, in Docker", async () => {
  await withTempDir(async (dir) => {
    const run = await vf(["validate", join(ROOT, "environments/file_sum"), "-n", "2"], dir);
    assert.equal(run.code, 0, transcript(run));
    const summary = JSON.parse(run.stdout.trim().split("\n").at(-1)!);
    assert.equal(summary.runtime, "docker");
    assert.equal(summary.passed, 2, transcript(run));
    assert.equal(summary.failed, 0);
  });
});

Deno.test("dist/vf eval gsm8k writes results.jsonl: math rubric in its worker, metric and error names kept", async () => {
  const answers = new Map<string, string>();
  for (const row of loadExampleDataset("gsm8k-sample", { split: "test" })) {
    answers.set(String(row.question), String(row.answer));
  }
  const first = [...answers.keys()][0];
  const demo = demoResponder({ answers, accuracy: 1 });
  // The first question gets the right answer, every other one an HTTP 400.
  const responder: Responder = (request, context) =>
    lastUserText(request).includes(first) ? demo(request, context) : { status: 400 };
  await using server = await startModelServer({ responder });
  await withTempDir(async (dir) => {
    const run = await vf(
      ["eval", "gsm8k", "-m", "m", "-b", server.url, "-n", "2", "-r", "2", "-q"],
      dir,
    );
    assert.equal(run.code, 0, transcript(run));
    // A worker that cannot start is reported; the binary must embed and find it.
    assert.doesNotMatch(run.stderr, /Math worker/, transcript(run));
    assert.doesNotMatch(run.stderr, /HTTP\/1\.1 worker thread/, transcript(run));
    const results = await readResults(dir);
    assert.equal(results.length, 4);
    const solved = results.filter((r) => r.example_id === 0);
    const failed = results.filter((r) => r.example_id === 1);
    for (const r of solved) {
      assert.equal(r.reward, 1);
      assert.deepEqual(r.metrics, { correct_answer: 1, num_turns: 1 });
    }
    // Error classes name themselves after their class: bundling must keep the names.
    for (const r of failed) assert.equal((r.error as { error: string }).error, "ModelError");
  });
});

Deno.test("dist/vf eval of a local module importing npm:zod and ../../mod.ts (calculator tools)", async () => {
  await using server = await startModelServer({ responder: demoResponder({ accuracy: 1 }) });
  await withTempDir(async (dir) => {
    const args = [
      "eval",
      join(ROOT, "environments/calculator"),
      "-m",
      "m",
      "-b",
      server.url,
      "-n",
      "2",
      "-r",
      "1",
      "-q",
    ];
    const run = await vf(args, dir);
    assert.equal(run.code, 0, transcript(run));
    const results = await readResults(dir);
    assert.equal(results.length, 2);
    for (const r of results) {
      assert.equal(r.error, null, JSON.stringify(r.error));
      assert.equal(r.reward, 1, JSON.stringify(r.completion));
    }
  });
});

/** Serves /work/main plus one extra package folder over loopback, `.ts` as TypeScript. */
function serveRepoAnd(extraRoot: string) {
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async (req) => {
    const path = decodeURIComponent(new URL(req.url).pathname);
    if (path.includes("..")) return new Response("bad path", { status: 400 });
    for (const base of [extraRoot, ROOT]) {
      try {
        const body = await Deno.readFile(join(base, path));
        return new Response(body, { headers: { "content-type": "application/typescript" } });
      } catch { /* try the next root */ }
    }
    return new Response("not found", { status: 404 });
  });
  return { origin: `http://127.0.0.1:${server.addr.port}`, close: () => server.shutdown() };
}

Deno.test("dist/vf refuses a URL environment without deno on PATH, and runs it sandboxed with deno", async () => {
  await using model = await startModelServer({ responder: () => ({ content: "4" }) });
  await withTempDir(async (dir) => {
    const pkgRoot = join(dir, "pkgs");
    await Deno.mkdir(join(pkgRoot, "envs/tiny"), { recursive: true });
    const files = serveRepoAnd(pkgRoot);
    try {
      await writeFile(
        join(pkgRoot, "envs/tiny/mod.ts"),
        `import { Rubric, SingleTurnEnv } from "${files.origin}/mod.ts";\n` +
          `export function loadEnvironment() {\n` +
          `  return new SingleTurnEnv({\n` +
          `    evalDataset: [{ question: "2+2?", answer: "4" }],\n` +
          `    rubric: new Rubric({ funcs: [({ completion, answer, parser }) => parser.parseAnswer(completion) === answer] }),\n` +
          `  });\n}\n`,
      );
      const args = [
        "eval",
        `${files.origin}/envs/tiny/mod.ts`,
        "-m",
        "m",
        "-b",
        model.url,
        "-n",
        "1",
        "-r",
        "2",
        "-q",
        "--lock-file",
        join(dir, "vf.lock"),
      ];
      const refused = await vf(args, dir);
      assert.equal(refused.code, 1, transcript(refused));
      assert.match(refused.stderr, /no "deno" is on PATH/, transcript(refused));
      assert.match(refused.stderr, /--trust/, transcript(refused));
      assert.equal(model.requests.length, 0, "nothing ran unsandboxed");

      // With deno on PATH the binary starts the sandboxed host (materialised from its embedded copy).
      const bin = join(dir, "deno-bin");
      await Deno.mkdir(bin);
      await Deno.symlink(Deno.execPath(), join(bin, "deno"));
      const out = await new Deno.Command(VF, {
        args,
        cwd: dir,
        env: childEnv({ PATH: bin, HOME: dir }),
        clearEnv: true,
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
        signal: AbortSignal.timeout(120_000),
      }).output();
      const run = {
        code: out.code,
        stdout: new TextDecoder().decode(out.stdout),
        stderr: new TextDecoder().decode(out.stderr),
      };
      assert.equal(run.code, 0, transcript(run));
      const rows = await readResults(dir);
      assert.equal(rows.length, 2);
      assert.deepEqual(rows.map((r) => r.reward), [1, 1]);
      assert.equal(model.requests.length, 2);
    } finally {
      await files.close();
    }
  });
});

Deno.test("dist/vf eval --cache then dist/vf view: the SQLite cache and the viewer work from the binary", async () => {
  const answers = new Map<string, string>();
  for (const row of loadExampleDataset("gsm8k-sample", { split: "test" })) {
    answers.set(String(row.question), String(row.answer));
  }
  await using server = await startModelServer({
    responder: demoResponder({ answers, accuracy: 1 }),
  });
  await withTempDir(async (dir) => {
    const args = ["eval", "gsm8k", "-m", "m", "-b", server.url, "-n", "2", "-r", "1", "--cache"];
    const first = await vf(args, dir);
    assert.equal(first.code, 0, transcript(first));
    const second = await vf(args, dir);
    assert.equal(second.code, 0, transcript(second));
    assert.match(second.stdout, /cache: 2 hits, 0 misses/);
    assert.equal(server.requests.length, 2);

    await ensureBinary();
    const child = new Deno.Command(VF, {
      args: ["view", join(dir, "outputs"), "--port", "0"],
      cwd: dir,
      env: { PATH: join(dir, "empty-bin"), HOME: dir, NO_COLOR: "1" },
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    try {
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let out = "";
      while (!/http:\/\/127\.0\.0\.1:\d+\//.test(out)) {
        const { value, done } = await reader.read();
        if (done) throw new Error(`vf view ended: ${out}`);
        out += value;
      }
      reader.releaseLock();
      const url = /http:\/\/127\.0\.0\.1:\d+\//.exec(out)![0];
      const runs = await (await fetch(`${url}api/runs`)).json();
      assert.equal(runs.runs.length, 2);
      assert.ok(runs.runs.every((r: { rollouts: number }) => r.rollouts === 2));
      assert.match(await (await fetch(url)).text(), /<title>vf view<\/title>/);
    } finally {
      child.kill("SIGTERM");
      await child.status;
      await child.stdout.cancel().catch(() => {});
      await child.stderr.cancel().catch(() => {});
    }
  });
});

const PY_TRAINER = `
import sys, json, uuid, zmq, msgpack
s = zmq.Context().socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0); s.setsockopt(zmq.RCVTIMEO, 60000)
s.connect(sys.argv[1])
def request(method, payload):
    rid = uuid.uuid4().hex.encode()
    s.send_multipart([rid, method.encode(), msgpack.packb(payload)])
    kinds = []
    while True:
        frames = s.recv_multipart()
        assert len(frames) == 3 and frames[0] == rid, frames
        kinds.append(frames[1].decode())
        if frames[1] == b"reply":
            return {"kinds": kinds, "reply": msgpack.unpackb(frames[2])}
out = {"health": request("health", {}), "info": request("info", {})}
out["run"] = request("run", {"task_data": {"prompt": "What is 9 + 9?", "answer": "18"},
                             "client": {"base_url": sys.argv[2]}, "model": "m", "sampling": {}})
print(json.dumps(out))
`;

Deno.test("dist/vf serve --zmq serves the current wire over its own ZMTP to a pyzmq (libzmq) trainer: health, info, a run's deltas and reply", async () => {
  await using model = await startModelServer({ responder: () => ({ content: "So \\boxed{18}" }) });
  await withTempDir(async (dir) => {
    await ensureBinary();
    await Deno.mkdir(join(dir, "empty-bin"), { recursive: true });
    const child = new Deno.Command(VF, {
      args: ["serve", "gsm8k", "--zmq", "tcp://127.0.0.1:0"],
      cwd: dir,
      env: { PATH: join(dir, "empty-bin"), HOME: dir, NO_COLOR: "1" },
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const stderr = new Response(child.stderr).text();
    try {
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let out = "";
      while (!/ZeroMQ at (\S+)/.test(out)) {
        const { value, done } = await reader.read();
        if (done) throw new Error(`vf serve ended: ${out}\n${await stderr}`);
        out += value;
      }
      reader.releaseLock();
      const address = /ZeroMQ at (\S+)/.exec(out)![1];
      const py = await new Deno.Command("/usr/bin/python3", {
        args: ["-c", PY_TRAINER, address, model.url],
        stdout: "piped",
        stderr: "piped",
      }).output();
      const text = new TextDecoder().decode(py.stdout);
      assert.equal(py.code, 0, `${text}\n${new TextDecoder().decode(py.stderr)}`);
      const result = JSON.parse(text);
      assert.equal(result.health.reply.success, true);
      assert.equal(result.health.reply.env_id, "gsm8k");
      assert.deepEqual(result.info.reply, {
        success: true,
        error: null,
        num_tasks: result.info.reply.num_tasks,
        requires_group_scoring: false,
      });
      const run = result.run;
      assert.equal(run.reply.success, true, JSON.stringify(run.reply));
      assert.equal(run.kinds.at(-1), "reply");
      assert.ok(run.kinds.filter((k: string) => k === "delta").length >= 1, run.kinds.join());
      assert.equal(run.reply.traces.length, 1);
      assert.equal(model.requests.length, 1);
    } finally {
      child.kill("SIGTERM");
      await child.status;
      await child.stdout.cancel().catch(() => {});
      await stderr.catch(() => {});
    }
  });
});
