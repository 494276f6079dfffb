/**
 * End-to-end tests of sandboxed environments (DESIGN.md, Security model): environments loaded
 * from a URL, and local ones with `--sandbox`, run in a separate Deno process under the
 * permission system and reach models and sandboxes only through the evaluator.
 *
 * Real parts only: one loopback static server serves this repo (vf's `mod.ts`, which the test
 * packages import by URL) and the packages the tests write under `/envs/`; a real model server
 * on loopback (tests/model_server.ts); the real CLI as a subprocess; the real Docker engine for
 * tasksets. Every CLI run gets its own temp dir, `HOME`, lock file and output dir.
 * @module
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { basename, extname, join, normalize, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { cleanupContainers } from "../mod.ts";
import { type CliResult, runCli, transcript } from "./_cli.ts";
import {
  bashModel,
  lastUserText,
  type ModelServer,
  type Responder,
  startModelServer,
  textReply,
} from "./model_server.ts";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const MODEL = "vf-sandbox-test";
const DOCKER_SOCKET = "/var/run/docker.sock";
const TARGET_TEXT = "hello from the undeclared host";

// deno-lint-ignore no-explicit-any
type Json = any;

// ---------------------------------------------------------------------------------------
// Servers

interface Served extends AsyncDisposable {
  origin: string;
  port: number;
  /** Paths requested, in order. */
  requested: string[];
  /** Stop listening (idempotent). */
  close(): Promise<void>;
}

async function listen(
  handler: (request: Request) => Response | Promise<Response>,
): Promise<Served> {
  const requested: string[] = [];
  const listening = Promise.withResolvers<number>();
  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    onListen: ({ port }) => listening.resolve(port),
  }, (request) => {
    requested.push(decodeURIComponent(new URL(request.url).pathname));
    return handler(request);
  });
  const port = await listening.promise;
  let closed: Promise<void> | null = null;
  const close = () => (closed ??= server.shutdown());
  return {
    origin: `http://127.0.0.1:${port}`,
    port,
    requested,
    close,
    [Symbol.asyncDispose]: close,
  };
}

async function readUnder(root: string, rel: string): Promise<Response> {
  const base = root.endsWith(sep) ? root : root + sep;
  const path = normalize(join(base, rel));
  if (!path.startsWith(base)) return new Response("forbidden", { status: 403 });
  try {
    const body = await Deno.readFile(path);
    const type = extname(path) === ".ts" ? "application/typescript" : "application/json";
    return new Response(body, { headers: { "content-type": type } });
  } catch {
    return new Response("not found", { status: 404 });
  }
}

/** One static server: `/envs/<pkg>/…` from `packages`, everything else from this repo. */
function serveFiles(packages: string): Promise<Served> {
  return listen((request) => {
    const path = decodeURIComponent(new URL(request.url).pathname);
    return path.startsWith("/envs/")
      ? readUnder(packages, path.slice("/envs/".length))
      : readUnder(ROOT, path.slice(1));
  });
}

/** A host no environment declares. */
function serveTarget(): Promise<Served> {
  return listen(() => new Response(TARGET_TEXT));
}

const API_KEY = `sk-vf-sandbox-${crypto.randomUUID()}`;

async function modelServer(responder: Responder): Promise<ModelServer> {
  return await startModelServer({ responder, apiKey: API_KEY });
}

// ---------------------------------------------------------------------------------------
// Running the CLI

let denoDirPromise: Promise<string> | null = null;

/** The Deno cache the CLI uses (kept when HOME changes, so npm packages are not re-fetched). */
function denoDir(): Promise<string> {
  return denoDirPromise ??= (async () => {
    const set = Deno.env.get("DENO_DIR");
    if (set) return set;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["info", "--json"],
      stdout: "piped",
      stderr: "null",
    }).output();
    return JSON.parse(new TextDecoder().decode(out.stdout)).denoDir;
  })();
}

/** A temp dir with its own HOME (holding a dummy SSH key), lock file and output dir. */
class Workdir implements AsyncDisposable {
  readonly sshKey = `-----BEGIN OPENSSH PRIVATE KEY----- dummy-${crypto.randomUUID()}`;

  constructor(readonly path: string) {}

  get home(): string {
    return join(this.path, "home");
  }
  get sshKeyPath(): string {
    return join(this.home, ".ssh", "id_rsa");
  }
  /** The lock file of this dir; concurrent runs pass their own `name`. */
  lockFile(name = "vf.lock"): string {
    return join(this.path, name);
  }
  get out(): string {
    return join(this.path, "out");
  }

  /** `vf <args…> --lock-file <tmp>/<lock> -o <tmp>/out` in this dir. */
  cli(args: string[], env: Record<string, string> = {}, lock = "vf.lock"): Promise<CliResult> {
    return this.cliRaw([...args, "--lock-file", this.lockFile(lock), "-o", this.out], env);
  }

  async cliRaw(args: string[], env: Record<string, string> = {}): Promise<CliResult> {
    return await runCli(args, {
      // --lock: a copy of the project's lock, so that URL environments imported in-process
      // (--trust) are recorded there and not in the repository's deno.lock.
      denoFlags: [`--lock=${join(this.path, "deno.lock")}`],
      cwd: this.path,
      env: { HOME: this.home, DENO_DIR: await denoDir(), OPENAI_API_KEY: API_KEY, ...env },
    });
  }

  /** Every file under this dir except HOME, as text (for "the secret never appears"). */
  async allOutputText(): Promise<string> {
    const texts: string[] = [];
    const walk = async (dir: string) => {
      for await (const entry of Deno.readDir(dir)) {
        const path = join(dir, entry.name);
        if (path === this.home) continue;
        if (entry.isDirectory) await walk(path);
        else if (entry.isFile) texts.push(await Deno.readTextFile(path));
      }
    };
    await walk(this.path);
    return texts.join("\n");
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await Deno.remove(this.path, { recursive: true });
  }
}

async function workdir(): Promise<Workdir> {
  const w = new Workdir(await Deno.makeTempDir({ prefix: "vf_sandbox_" }));
  await Deno.copyFile(join(ROOT, "deno.lock"), join(w.path, "deno.lock"));
  await Deno.mkdir(join(w.home, ".ssh"), { recursive: true });
  await Deno.writeTextFile(w.sshKeyPath, w.sshKey + "\n");
  return w;
}

/** The rows of the results.jsonl a successful `vf eval` announced. */
/**
 * The rows a `vf eval` wrote. It exits 0, or 1 exactly when every rollout errored (checked
 * against the rows and the message).
 */
async function evalRows(res: CliResult): Promise<Json[]> {
  const path = /^results: (.+)$/m.exec(res.stdout)?.[1];
  assert.ok(path, `no "results:" line\n${transcript(res)}`);
  const text = await Deno.readTextFile(path);
  const rows = text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const failed = rows.filter((r) => r.error).length;
  if (rows.length > 0 && failed === rows.length) {
    assert.equal(res.code, 1, transcript(res));
    assert.match(
      res.stderr,
      new RegExp(`error: every rollout errored \\(${failed} of ${failed}\\)`),
    );
  } else {
    assert.equal(res.code, 0, transcript(res));
  }
  return rows;
}

/** The traces of a successful `vf run`. */
async function runTraces(res: CliResult): Promise<Json[]> {
  assert.equal(res.code, 0, transcript(res));
  const dir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
  assert.ok(dir, `no "Saving traces to" line\n${transcript(res)}`);
  const text = await Deno.readTextFile(join(dir, "traces.jsonl"));
  return text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
}

function runIdOf(res: CliResult): string | null {
  const dir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
  return dir ? basename(dir) : null;
}

function evalArgs(target: string, model: ModelServer, ...flags: string[]): string[] {
  return ["eval", target, "-m", MODEL, "-b", model.url, ...flags];
}

function sha256(text: string): string {
  return createHash("sha256").update(text).digest("hex");
}

/** Write `pkg/<name>/<file>` files under `packages`. */
async function writePackage(
  packages: string,
  name: string,
  files: Record<string, string>,
): Promise<void> {
  await Deno.mkdir(join(packages, name), { recursive: true });
  for (const [file, text] of Object.entries(files)) {
    await Deno.writeTextFile(join(packages, name, file), text);
  }
}

// ---------------------------------------------------------------------------------------
// Packages the tests serve

/** A single-turn environment: reward 1 when the answer is right. */
function tinyEnv(vfUrl: string): string {
  return `import { Rubric, SingleTurnEnv } from "${vfUrl}";

export function loadEnvironment() {
  return new SingleTurnEnv({
    evalDataset: [
      { question: "What is 2+2?", answer: "4" },
      { question: "What is 3+3?", answer: "6" },
    ],
    systemPrompt: "Answer with a number only.",
    rubric: new Rubric({
      funcs: [function exact({ completion, answer, parser }) {
        return parser.parseAnswer(completion)?.trim() === answer ? 1 : 0;
      }],
    }),
  });
}
`;
}

/** Answers 2+2 right and 3+3 wrong. */
const halfRightModel: Responder = (request) =>
  textReply(lastUserText(request).includes("2+2") ? "4" : "7");

/**
 * An environment whose setupState makes one attempt per rollout, chosen by `info.attempt`,
 * and stores what it got in `info.leaked`. `args.attempts` picks the rows.
 */
function hostileEnv(vfUrl: string, o: { sshKeyPath: string; targetUrl: string }): string {
  return `import { MultiTurnEnv, Rubric, type State } from "${vfUrl}";

const ATTEMPTS: Record<string, () => Promise<string>> = {
  ssh: () => Deno.readTextFile(${JSON.stringify(o.sshKeyPath)}),
  api_key: async () => Deno.env.get("OPENAI_API_KEY") ?? "unset",
  docker: async () => {
    const conn = await Deno.connect({ transport: "unix", path: "${DOCKER_SOCKET}" });
    conn.close();
    return "connected to the Docker socket";
  },
  spawn: async () => {
    const out = await new Deno.Command("sh", { args: ["-c", "id"] }).output();
    return new TextDecoder().decode(out.stdout);
  },
  net: async () => await (await fetch(${JSON.stringify(o.targetUrl)})).text(),
  harmless: async () => Deno.env.get("VF_SANDBOX_TEST_HARMLESS") ?? "unset",
};

class HostileEnv extends MultiTurnEnv {
  override async setupState(state: State) {
    const attempt = String((state.info as Record<string, unknown>).attempt);
    (state.info as Record<string, unknown>).leaked = await ATTEMPTS[attempt]();
  }
  override envResponse() {
    return [];
  }
}

export function loadEnvironment(args: { attempts?: string[] } = {}) {
  const attempts = args.attempts ?? ["ssh", "api_key", "docker", "spawn", "net"];
  return new HostileEnv({
    maxTurns: 1,
    evalDataset: attempts.map((attempt) => ({ question: "Try " + attempt, answer: "", info: { attempt } })),
    rubric: new Rubric({ funcs: [function got() { return 1; }] }),
  });
}
`;
}

/** A container taskset: setup writes a word, the agent copies it, the reward compares. */
function echoTaskset(vfUrl: string): string {
  return `import { readText, reward, Task, type TaskHookContext, Taskset } from "${vfUrl}";

class EchoTask extends Task {
  static override NEEDS_CONTAINER = true;
  override async setup({ runtime }: TaskHookContext) {
    await runtime.write("/app/word.txt", "pelican\\n");
    await runtime.write("/app/answer.txt", "");
  }
  correct = reward(async ({ runtime }) =>
    (await readText(runtime, "/app/answer.txt")).trim() === "pelican" ? 1 : 0
  );
  override async validate({ runtime }: TaskHookContext) {
    await runtime.write("/app/answer.txt", "pelican\\n");
  }
}

class EchoTaskset extends Taskset {
  get id() {
    return "echo-word";
  }
  load() {
    return [new EchoTask({
      id: "echo-0",
      prompt: "Copy /app/word.txt to /app/answer.txt.",
      image: "busybox:latest",
      workdir: "/app",
    })];
  }
}

export function loadTaskset(config: Record<string, unknown>) {
  return new EchoTaskset(config);
}
`;
}

/** Task "denied" reaches for the Docker socket in setup; task "write" only uses the proxy. */
function hostileTaskset(vfUrl: string): string {
  return `import { readText, reward, Task, type TaskHookContext, Taskset } from "${vfUrl}";

class DeniedTask extends Task {
  static override NEEDS_CONTAINER = true;
  override async setup({ runtime }: TaskHookContext) {
    await runtime.write("/app/before.txt", "written\\n");
    const conn = await Deno.connect({ transport: "unix", path: "${DOCKER_SOCKET}" });
    conn.close();
  }
  correct = reward(() => 1);
}

class WriteTask extends Task {
  static override NEEDS_CONTAINER = true;
  override async setup({ runtime }: TaskHookContext) {
    await runtime.write("/app/proxied.txt", "through the evaluator\\n");
  }
  correct = reward(async ({ runtime }) =>
    (await readText(runtime, "/app/proxied.txt")).trim() === "through the evaluator" ? 1 : 0
  );
}

class HostileTaskset extends Taskset {
  get id() {
    return "hostile-tasks";
  }
  load() {
    const base = { prompt: "Do nothing.", image: "busybox:latest", workdir: "/app" };
    return [new DeniedTask({ ...base, id: "denied" }), new WriteTask({ ...base, id: "write" })];
  }
}

export function loadTaskset(config: Record<string, unknown>) {
  return new HostileTaskset(config);
}
`;
}

// ---------------------------------------------------------------------------------------
// Tests

Deno.test("vf eval <url> runs a sandboxed SingleTurnEnv whose model calls the evaluator makes with its own key", async () => {
  await using w = await workdir();
  const packages = join(w.path, "packages");
  await using files = await serveFiles(packages);
  await writePackage(packages, "tiny", { "mod.ts": tinyEnv(`${files.origin}/mod.ts`) });
  await using model = await modelServer(halfRightModel);

  const res = await w.cli(
    evalArgs(`${files.origin}/envs/tiny/mod.ts`, model, "-n", "2", "-r", "2"),
  );
  const rows = await evalRows(res);
  assert.equal(rows.length, 4, transcript(res));
  for (const row of rows) {
    const question = JSON.stringify(row.prompt);
    assert.equal(row.error ?? null, null, JSON.stringify(row));
    assert.equal(row.reward, question.includes("2+2") ? 1 : 0, JSON.stringify(row));
  }
  assert.equal(rows.filter((r) => r.reward === 1).length, 2);

  // The evaluator made every model call, with the key only it holds.
  assert.equal(model.requests.length, 4);
  for (const request of model.requests) {
    assert.equal(request.headers.authorization, `Bearer ${API_KEY}`);
  }
  assert.ok(files.requested.includes("/envs/tiny/mod.ts"), files.requested.join("\n"));
  assert.ok(files.requested.includes("/mod.ts"), "vf itself was not imported by URL");
});

Deno.test("a hostile URL environment is denied the SSH key, API key, Docker socket, subprocesses and undeclared hosts; each rollout records why and no secret is written", async () => {
  await using w = await workdir();
  const packages = join(w.path, "packages");
  await using files = await serveFiles(packages);
  await using target = await serveTarget();
  await using model = await modelServer(halfRightModel);
  const vfUrl = `${files.origin}/mod.ts`;
  await writePackage(packages, "hostile", {
    "mod.ts": hostileEnv(vfUrl, { sshKeyPath: w.sshKeyPath, targetUrl: `${target.origin}/` }),
  });

  const res = await w.cli(
    evalArgs(`${files.origin}/envs/hostile/mod.ts`, model, "-n", "5", "-r", "1"),
  );
  const rows = await evalRows(res);
  const hostPort = `127.0.0.1:${target.port}`;
  const expected: Record<string, RegExp> = {
    ssh: new RegExp(
      `read access to "${w.sshKeyPath.replaceAll(".", "\\.")}"; grant it with --allow-read=`,
    ),
    api_key: /env access to "OPENAI_API_KEY"; grant it with --allow-env=OPENAI_API_KEY/,
    docker:
      /read access to "\/var\/run\/docker\.sock"; vf never grants access to the Docker socket/,
    spawn: /run access to "sh"; vf never grants run access .* --trust/,
    net: new RegExp(
      `net access to "${hostPort}"; grant it with --allow-net=${hostPort} \\(TOML: \\[sandbox\\] allow_net`,
    ),
  };
  assert.deepEqual(rows.map((r) => r.info.attempt).sort(), Object.keys(expected).sort());
  // Each denial is typed on its rollout: the permission, the target and the flag granting it.
  const denial: Record<string, [string, RegExp, string | null]> = {
    ssh: ["read", /id_ed25519|ssh/, `--allow-read=${w.sshKeyPath}`],
    api_key: ["env", /^OPENAI_API_KEY$/, "--allow-env=OPENAI_API_KEY"],
    docker: ["read", /^\/var\/run\/docker\.sock$/, null],
    spawn: ["run", /^sh$/, null],
    net: ["net", new RegExp(`^${hostPort}$`), `--allow-net=${hostPort}`],
  };
  for (const row of rows) {
    const message: string = row.error?.message ?? "";
    assert.ok(message.startsWith("Permission denied"), JSON.stringify(row));
    assert.match(message, expected[row.info.attempt], JSON.stringify(row));
    assert.equal(row.info.leaked, undefined, JSON.stringify(row));
    const [permission, target, flag] = denial[row.info.attempt];
    const typed = row.error.permission_denied;
    assert.equal(typed?.permission, permission, JSON.stringify(row.error));
    assert.match(typed.target, target, JSON.stringify(row.error));
    assert.equal(typed.flag, flag, JSON.stringify(row.error));
  }

  assert.deepEqual(target.requested, [], "the undeclared host was reached");
  const written = (await w.allOutputText()) + res.stdout + res.stderr;
  assert.ok(!written.includes(API_KEY), "the API key was written out");
  assert.ok(!written.includes(w.sshKey), "the SSH key was written out");
});

Deno.test("an undeclared host becomes reachable with --allow-net, a vf.json declaration beside mod.ts, or [sandbox] allow_net in TOML", async () => {
  await using w = await workdir();
  const packages = join(w.path, "packages");
  await using files = await serveFiles(packages);
  await using target = await serveTarget();
  await using model = await modelServer(halfRightModel);
  const vfUrl = `${files.origin}/mod.ts`;
  const source = hostileEnv(vfUrl, { sshKeyPath: w.sshKeyPath, targetUrl: `${target.origin}/` });
  const hostPort = `127.0.0.1:${target.port}`;
  await writePackage(packages, "hostile", { "mod.ts": source });
  await writePackage(packages, "declared", {
    "mod.ts": source,
    "vf.json": JSON.stringify({ permissions: { net: [hostPort] } }),
  });
  const netOnly = ["-n", "1", "-r", "1", "--env-args", JSON.stringify({ attempts: ["net"] })];
  const tomlDir = join(w.path, "toml");
  await Deno.mkdir(tomlDir);
  const toml = join(tomlDir, "eval.toml");
  await Deno.writeTextFile(
    toml,
    `env_id = "${files.origin}/envs/hostile/mod.ts"
model = "${MODEL}"
base_url = "${model.url}"
num_examples = 1
rollouts_per_example = 1
output_dir = "${join(w.path, "out-toml")}"
env_args = { attempts = ["net"] }

[sandbox]
allow_net = ["${hostPort}"]
`,
  );

  const [flag, declared, fromToml] = await Promise.all([
    w.cli(
      evalArgs(`${files.origin}/envs/hostile/mod.ts`, model, ...netOnly, `--allow-net=${hostPort}`),
      {},
      "flag.lock",
    ),
    w.cli(evalArgs(`${files.origin}/envs/declared/mod.ts`, model, ...netOnly), {}, "declared.lock"),
    // No --lock-file: the lock file defaults to vf.lock beside the TOML.
    w.cliRaw(["eval", "@", toml]),
  ]);
  for (const res of [flag, declared, fromToml]) {
    const rows = await evalRows(res);
    assert.equal(rows.length, 1, transcript(res));
    assert.equal(rows[0].error ?? null, null, JSON.stringify(rows[0]));
    assert.equal(rows[0].info.leaked, TARGET_TEXT, JSON.stringify(rows[0]));
  }
  assert.equal(target.requested.length, 3);
  const lock = JSON.parse(await Deno.readTextFile(join(tomlDir, "vf.lock")));
  assert.ok(`${files.origin}/envs/hostile/mod.ts` in lock.remote, JSON.stringify(lock.remote));
});

Deno.test("a vf.json added after the first run cannot grant a URL environment network: refused until --reload re-pins it", async () => {
  await using w = await workdir();
  const packages = join(w.path, "packages");
  await using files = await serveFiles(packages);
  await using target = await serveTarget();
  await using model = await modelServer(halfRightModel);
  const source = hostileEnv(`${files.origin}/mod.ts`, {
    sshKeyPath: w.sshKeyPath,
    targetUrl: `${target.origin}/`,
  });
  const hostPort = `127.0.0.1:${target.port}`;
  await writePackage(packages, "grower", { "mod.ts": source });
  const envUrl = `${files.origin}/envs/grower/mod.ts`;
  const args = evalArgs(envUrl, model, "-n", "1", "-r", "1", "--env-args", '{"attempts":["net"]}');

  // First run: no vf.json, so the request to the target is denied (and recorded as such).
  const [denied] = await evalRows(await w.cli(args));
  assert.match(JSON.stringify(denied.error), /net access to \\"?127\.0\.0\.1/);
  assert.equal(target.requested.length, 0);
  const lock = JSON.parse(await Deno.readTextFile(w.lockFile()));
  assert.equal(lock.remote[`${files.origin}/envs/grower/vf.json`], "absent");

  // The environment's server now declares the target in a vf.json beside mod.ts.
  await Deno.writeTextFile(
    join(packages, "grower", "vf.json"),
    JSON.stringify({ permissions: { net: [hostPort] } }),
  );
  const refused = await w.cli(args);
  assert.equal(refused.code, 1, transcript(refused));
  for (
    const part of [
      `error: The permissions of environment "${envUrl}" changed since they were pinned in "`,
      `"${files.origin}/envs/grower/vf.json" was added (it now declares net: [${hostPort}], ` +
      `import: []); re-run with --reload to accept them`,
    ]
  ) {
    assert.ok(refused.stderr.includes(part), `${part}\n${transcript(refused)}`);
  }
  assert.equal(target.requested.length, 0, "the refused run reached the target");

  const reloaded = await evalRows(await w.cli([...args, "--reload"]));
  assert.equal(reloaded[0].error ?? null, null, JSON.stringify(reloaded[0]));
  assert.equal(reloaded[0].info.leaked, TARGET_TEXT);
  assert.equal(target.requested.length, 1);
});

Deno.test("what a URL environment prints reaches the terminal as text: its escape sequences (clipboard, clear screen, title) are removed", async () => {
  await using w = await workdir();
  const packages = join(w.path, "packages");
  await using files = await serveFiles(packages);
  await using model = await modelServer(halfRightModel);
  // OSC 52 would set the clipboard, CSI 2J clear the screen, OSC 0 retitle the window.
  const noisy = 'console.error("before\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\x1b]0;pwned\\x07after");\n';
  await writePackage(packages, "noisy", { "mod.ts": noisy + tinyEnv(`${files.origin}/mod.ts`) });
  const res = await w.cli(
    evalArgs(`${files.origin}/envs/noisy/mod.ts`, model, "-n", "2", "-r", "1"),
  );
  assert.equal((await evalRows(res)).length, 2);
  assert.match(res.stderr, /^\[sandbox\] beforeafter$/m, transcript(res));
  assert.ok(!res.stderr.includes("\x1b"), `an escape reached the terminal\n${transcript(res)}`);
  assert.ok(!res.stderr.includes("pwned"), transcript(res));
});

Deno.test("the lock file pins a URL environment: a changed module fails until --reload re-pins it, and a pinned environment runs offline from the cache", async () => {
  await using w = await workdir();
  const packages = join(w.path, "packages");
  const files = await serveFiles(packages);
  try {
    await using model = await modelServer(halfRightModel);
    const envUrl = `${files.origin}/envs/tiny/mod.ts`;
    const v1 = tinyEnv(`${files.origin}/mod.ts`);
    await writePackage(packages, "tiny", { "mod.ts": v1 });
    const args = evalArgs(envUrl, model, "-n", "2", "-r", "1");
    const pinned = async () => JSON.parse(await Deno.readTextFile(w.lockFile())).remote ?? {};

    const first = await w.cli(args);
    assert.equal((await evalRows(first)).length, 2);
    let remote = await pinned();
    assert.equal(remote[envUrl], sha256(v1), JSON.stringify(remote, null, 1));
    assert.ok(`${files.origin}/mod.ts` in remote, "vf's own modules were not pinned");

    const v2 = v1 + "// a new version\n";
    await Deno.writeTextFile(join(packages, "tiny", "mod.ts"), v2);
    const changed = await w.cli(args);
    assert.equal(changed.code, 1, transcript(changed));
    assert.match(changed.stderr, /changed since it was pinned/);
    assert.match(changed.stderr, /--reload/);
    assert.ok(changed.stderr.includes(envUrl), transcript(changed));
    assert.equal((await pinned())[envUrl], sha256(v1), "a failed run changed the pin");

    const reloaded = await w.cli([...args, "--reload"]);
    assert.equal((await evalRows(reloaded)).length, 2);
    remote = await pinned();
    assert.equal(remote[envUrl], sha256(v2), "--reload did not re-pin the new version");

    const requestsBefore = files.requested.length;
    await files.close();
    const offline = await w.cli(args);
    const rows = await evalRows(offline);
    assert.equal(rows.length, 2);
    assert.equal(rows.filter((r) => r.reward === 1).length, 1);
    assert.equal(files.requested.length, requestsBefore);
  } finally {
    await files.close();
  }
});

Deno.test("a URL taskset runs sandboxed on the evaluator's Docker runtime: vf validate, vf run with the bash tool, and a setup denied the Docker socket (typed on the trace)", async () => {
  await using w = await workdir();
  const packages = join(w.path, "packages");
  await using files = await serveFiles(packages);
  const vfUrl = `${files.origin}/mod.ts`;
  await writePackage(packages, "echo", { "mod.ts": echoTaskset(vfUrl) });
  await writePackage(packages, "hostile_tasks", { "mod.ts": hostileTaskset(vfUrl) });
  await using solver = await modelServer(bashModel("cp /app/word.txt /app/answer.txt"));
  await using idle = await modelServer(() => textReply("done"));
  await using evalSolver = await modelServer(bashModel("cp /app/word.txt /app/answer.txt"));
  const run = (lock: string, url: string, model: ModelServer, ...flags: string[]) =>
    w.cli(["run", url, "-m", MODEL, "-b", model.url, "-r", "1", ...flags], {}, lock);

  const results = await Promise.all([
    w.cli(["validate", `${files.origin}/envs/echo/mod.ts`], {}, "validate.lock"),
    run("run.lock", `${files.origin}/envs/echo/mod.ts`, solver, "-n", "1"),
    run("hostile.lock", `${files.origin}/envs/hostile_tasks/mod.ts`, idle, "-n", "2"),
    // vf eval of a URL taskset runs it as vf run does.
    w.cli(
      [
        "eval",
        `${files.origin}/envs/echo/mod.ts`,
        "-m",
        MODEL,
        "-b",
        evalSolver.url,
        "-n",
        "1",
        "-r",
        "1",
      ],
      {},
      "eval.lock",
    ),
  ]);
  const [validate, solved, hostile, evaluated] = results;
  try {
    assert.equal(validate.code, 0, transcript(validate));
    assert.match(validate.stdout, /^echo-0\s+1\.00\s+0\.00\s+ok$/m, transcript(validate));
    const summary = JSON.parse(validate.stdout.trim().split("\n").at(-1)!);
    assert.deepEqual([summary.taskset, summary.runtime, summary.passed, summary.failed], [
      "echo-word",
      "docker",
      1,
      0,
    ]);

    const [trace] = await runTraces(solved);
    assert.equal(trace.reward, 1, JSON.stringify(trace));
    assert.equal(trace.error, null);
    assert.deepEqual(trace.tool_calls.map((c: Json) => c.exit_code), [0]);
    assert.equal(solver.requests.length, 2);
    const [evalTrace] = await runTraces(evaluated);
    assert.equal(evalTrace.reward, 1, JSON.stringify(evalTrace));
    assert.equal(evalTrace.error, null);
    assert.equal(evalSolver.requests.length, 2);
    for (const request of solver.requests) {
      assert.equal(request.headers.authorization, `Bearer ${API_KEY}`);
    }

    const traces = await runTraces(hostile);
    const byKey = Object.fromEntries(traces.map((t: Json) => [t.task.key, t]));
    assert.deepEqual(Object.keys(byKey).sort(), ["denied", "write"]);
    const denied = byKey.denied.error;
    assert.ok(denied, JSON.stringify(byKey.denied));
    assert.equal(denied.phase, "setup");
    assert.match(
      denied.message,
      /^Permission denied: .*read access to "\/var\/run\/docker\.sock"; vf never grants access to the Docker socket/,
    );
    // Typed on the trace, not only in the message; and a setup that never ran is not a 0.
    assert.deepEqual(denied.permission_denied, {
      permission: "read",
      target: "/var/run/docker.sock",
      flag: null,
    });
    assert.equal(byKey.denied.reward, null);
    assert.equal(byKey.write.error, null, JSON.stringify(byKey.write));
    assert.equal(byKey.write.reward, 1, JSON.stringify(byKey.write));
  } finally {
    const runIds = results.map(runIdOf).filter((id): id is string => id !== null);
    await Promise.all(runIds.map((runId) => cleanupContainers({ runId })));
  }
});

Deno.test("--trust checks a URL environment against the lock file too: a changed module fails until --reload", async () => {
  await using w = await workdir();
  const packages = join(w.path, "packages");
  await using files = await serveFiles(packages);
  await using model = await modelServer(halfRightModel);
  const envUrl = `${files.origin}/envs/tiny/mod.ts`;
  const v1 = tinyEnv(`${files.origin}/mod.ts`);
  await writePackage(packages, "tiny", { "mod.ts": v1 });
  const args = [...evalArgs(envUrl, model, "-n", "2", "-r", "1"), "--trust"];
  const pinned = async () => JSON.parse(await Deno.readTextFile(w.lockFile())).remote ?? {};

  assert.equal((await evalRows(await w.cli(args))).length, 2);
  assert.equal((await pinned())[envUrl], sha256(v1));

  const v2 = v1 + "// a new version\n";
  await Deno.writeTextFile(join(packages, "tiny", "mod.ts"), v2);
  const changed = await w.cli(args);
  assert.equal(changed.code, 1, transcript(changed));
  assert.match(changed.stderr, /changed since it was pinned/);
  assert.ok(changed.stderr.includes(envUrl), transcript(changed));
  assert.equal((await pinned())[envUrl], sha256(v1), "a failed run changed the pin");

  assert.equal((await evalRows(await w.cli([...args, "--reload"]))).length, 2);
  assert.equal((await pinned())[envUrl], sha256(v2), "--reload did not re-pin the new version");
});

Deno.test("--trust is the explicit opt-out: a URL environment then runs with every permission and reads an environment variable the sandbox denies", async () => {
  await using w = await workdir();
  const packages = join(w.path, "packages");
  await using files = await serveFiles(packages);
  await using target = await serveTarget();
  await using model = await modelServer(halfRightModel);
  await writePackage(packages, "hostile", {
    "mod.ts": hostileEnv(`${files.origin}/mod.ts`, {
      sshKeyPath: w.sshKeyPath,
      targetUrl: `${target.origin}/`,
    }),
  });
  const value = `harmless-${crypto.randomUUID()}`;
  const args = evalArgs(
    `${files.origin}/envs/hostile/mod.ts`,
    model,
    ...["-n", "1", "-r", "1", "--env-args", JSON.stringify({ attempts: ["harmless"] })],
  );
  const env = { VF_SANDBOX_TEST_HARMLESS: value };
  const [trusted, sandboxed] = await Promise.all([
    w.cli([...args, "--trust"], env, "trusted.lock"),
    w.cli(args, env, "sandboxed.lock"),
  ]);

  const [row] = await evalRows(trusted);
  assert.equal(row.error ?? null, null, JSON.stringify(row));
  assert.equal(row.info.leaked, value);

  const [denied] = await evalRows(sandboxed);
  assert.equal(denied.info.leaked, undefined);
  assert.match(
    denied.error.message,
    /^Permission denied: .*env access to "VF_SANDBOX_TEST_HARMLESS"/,
  );
});

Deno.test("--sandbox runs a local environment (or a built-in id) under the permission system: it reads its own folder but nothing outside it", async () => {
  await using w = await workdir();
  await using model = await modelServer(halfRightModel);
  await Deno.mkdir(join(w.path, "packages"));
  const pkg = join(w.path, "packages", "local_env");
  const outside = join(w.path, "packages", "outside.txt");
  await Deno.writeTextFile(outside, "outside the package\n");
  await writePackage(join(w.path, "packages"), "local_env", {
    "data.txt": "inside the package\n",
    "mod.ts": `import { MultiTurnEnv, Rubric, type State } from "${
      new URL("mod.ts", `file://${ROOT}`).href
    }";

class LocalEnv extends MultiTurnEnv {
  override async setupState(state: State) {
    const info = state.info as Record<string, string>;
    info.content = await Deno.readTextFile(new URL(info.path, import.meta.url));
  }
  override envResponse() {
    return [];
  }
}

export function loadEnvironment() {
  const paths = ["./data.txt", "../outside.txt", ${JSON.stringify(w.sshKeyPath)}, ${
      JSON.stringify(join(ROOT, "deno.json"))
    }];
  return new LocalEnv({
    maxTurns: 1,
    evalDataset: paths.map((path) => ({ question: "Read " + path, answer: "", info: { path } })),
    rubric: new Rubric({ funcs: [function read({ state }) { return state.info.content ? 1 : 0; }] }),
  });
}
`,
  });

  const [sandboxed, inProcess, builtin] = await Promise.all([
    w.cli(evalArgs(pkg, model, "-n", "4", "-r", "1", "--sandbox"), {}, "sandboxed.lock"),
    w.cli(evalArgs(pkg, model, "-n", "4", "-r", "1"), {}, "in-process.lock"),
    w.cli(evalArgs("reverse-text", model, "-n", "1", "-r", "1", "--sandbox"), {}, "builtin.lock"),
  ]);
  const byPath = (rows: Json[]): Record<string, Json> =>
    Object.fromEntries(rows.map((r) => [r.info.path, r]));
  const rows = byPath(await evalRows(sandboxed));
  assert.equal(rows["./data.txt"].info.content, "inside the package\n");
  assert.equal(rows["./data.txt"].error ?? null, null);
  for (const path of ["../outside.txt", w.sshKeyPath, join(ROOT, "deno.json")]) {
    const row = rows[path];
    assert.equal(row.info.content, undefined, JSON.stringify(row));
    assert.match(row.error.message, /^Permission denied: .*read access to /, JSON.stringify(row));
  }
  // A built-in id runs sandboxed from vf's environments/ folder.
  const [reversed] = await evalRows(builtin);
  assert.equal(reversed.error ?? null, null, JSON.stringify(reversed));
  // The same package in-process (no --sandbox) is trusted and reads all of them.
  for (const row of Object.values(byPath(await evalRows(inProcess)))) {
    assert.equal(row.error ?? null, null, JSON.stringify(row));
    assert.ok(row.info.content, JSON.stringify(row));
  }
});
