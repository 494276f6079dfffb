/**
 * Remote import (DESIGN.md): a Deno program with no config of its own imports vf's `mod.ts`
 * from a URL, builds an environment and evaluates it against a real model server.
 *
 * This repo is served over loopback HTTP; the program runs from an empty temp dir with its
 * own `DENO_DIR`, so nothing resolves through this repo's `deno.json`, import map,
 * `node_modules` or caches.
 * @module
 */
import assert from "node:assert/strict";
import { extname, join, normalize, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { runDeno, tempDir, transcript } from "./_cli.ts";
import { lastUserText, startModelServer, textReply } from "./model_server.ts";

const ROOT = fileURLToPath(new URL("..", import.meta.url));

const CONTENT_TYPES: Record<string, string> = {
  ".ts": "application/typescript",
  ".js": "application/javascript",
  ".mjs": "application/javascript",
  ".json": "application/json",
};

interface StaticServer extends AsyncDisposable {
  origin: string;
  /** Paths requested, in order. */
  requested: string[];
}

/** Serve the files under `root` read-only on 127.0.0.1 (a free port). */
function serveDir(root: string): Promise<StaticServer> {
  const requested: string[] = [];
  const listening = Promise.withResolvers<number>();
  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    onListen: ({ port }) => listening.resolve(port),
  }, async (request) => {
    const pathname = decodeURIComponent(new URL(request.url).pathname);
    requested.push(pathname);
    const path = normalize(join(root, pathname));
    if (!path.startsWith(root.endsWith(sep) ? root : root + sep)) {
      return new Response("forbidden", { status: 403 });
    }
    try {
      const body = await Deno.readFile(path);
      const type = CONTENT_TYPES[extname(path)] ?? "application/octet-stream";
      return new Response(body, { headers: { "content-type": type } });
    } catch {
      return new Response("not found", { status: 404 });
    }
  });
  return listening.promise.then((port) => ({
    origin: `http://127.0.0.1:${port}`,
    requested,
    [Symbol.asyncDispose]: () => server.shutdown(),
  }));
}

/** The user's program: it knows vf only by URL. */
function program(vfUrl: string): string {
  return `import { evaluate, OpenAIChatClient, Rubric, SingleTurnEnv } from "${vfUrl}";

const [baseUrl] = Deno.args;
const env = new SingleTurnEnv({
  evalDataset: [
    { question: "What is 2+2?", answer: "4" },
    { question: "What is 3+3?", answer: "6" },
  ],
  systemPrompt: "Answer with a number only.",
  rubric: new Rubric({
    funcs: [function exact({ completion, answer, parser }) {
      return parser.parseAnswer(completion)?.trim() === answer;
    }],
  }),
});
const client = new OpenAIChatClient({ base_url: baseUrl, api_key: "remote-test-key" });
const { metadata, outputs } = await evaluate(env, client, "remote-model", {
  rolloutsPerExample: 3,
});
console.log(JSON.stringify({ metadata, outputs: outputs.length }));
`;
}

Deno.test("a program with no config imports mod.ts by URL and evaluates a model", async () => {
  await using files = await serveDir(ROOT);
  // Answers 2+2 right and 3+3 wrong: avg_reward 0.5 over 2 examples × 3 rollouts.
  await using model = await startModelServer({
    apiKey: "remote-test-key",
    responder: (request) => textReply(lastUserText(request).includes("2+2") ? "4" : "7"),
  });
  await using work = await tempDir("vf_remote_import_");
  await using denoDir = await tempDir("vf_remote_import_deno_dir_");
  await Deno.writeTextFile(join(work.path, "main.ts"), program(`${files.origin}/mod.ts`));
  const run = (args: string[]) =>
    runDeno(args, { cwd: work.path, env: { DENO_DIR: denoDir.path } });

  const res = await run(["run", "-A", `--reload=${files.origin}`, "main.ts", model.url]);
  assert.equal(res.code, 0, transcript(res));
  const { metadata, outputs } = JSON.parse(res.stdout.trim().split("\n").at(-1)!);
  assert.equal(metadata.num_rollouts, 6);
  assert.equal(outputs, 6);
  assert.equal(metadata.avg_reward, 0.5);
  assert.equal(metadata.model, "remote-model");
  assert.equal(model.requests.length, 6);
  assert.ok(files.requested.includes("/mod.ts"), "mod.ts was not fetched from the server");

  // The user's own type check sees vf's types through the URL.
  const check = await run(["check", `--allow-import=${new URL(files.origin).host}`, "main.ts"]);
  assert.equal(check.code, 0, transcript(check));

  // Nothing was written next to the program: no lockfile, no node_modules, no config.
  const left = [];
  for await (const entry of Deno.readDir(work.path)) left.push(entry.name);
  assert.deepEqual(left, ["main.ts"]);
});
