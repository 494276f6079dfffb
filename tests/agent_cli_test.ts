/**
 * A real open-source agent CLI in a sandbox: OpenAI's Codex CLI (its static linux binary comes
 * inside the npm package `@openai/codex@0.169.0-linux-x64`, fetched by tests/setup.sh) runs
 * through the `program` harness in a Docker sandbox, speaks the Responses dialect to the model
 * gateway, and solves a Harbor task with the loopback model's tool calls. The sandbox has no
 * other route out, and the real key never enters it.
 * @module
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { startModelServer, type WireMessage } from "./model_server.ts";
import { cliCommand, collect, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const PACKAGE = "@openai/codex@0.169.0-linux-x64";
const CACHED = "/var/cache/vf-images/openai-codex-0.169.0-linux-x64.tgz";

/** The package tarball: tests/setup.sh's cache, else fetched from npm into it now. */
async function codexTarball(): Promise<string> {
  const path = Deno.env.get("VF_CODEX_TGZ") ?? CACHED;
  if (existsSync(path)) return path;
  const dir = join(path, "..");
  await Deno.mkdir(dir, { recursive: true });
  const out = await new Deno.Command("npm", {
    args: ["pack", "--silent", PACKAGE, "--pack-destination", dir],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(
    out.success && existsSync(path),
    `cannot fetch ${PACKAGE} from npm (run tests/setup.sh): ${
      new TextDecoder().decode(out.stderr)
    }`,
  );
  return path;
}

const CODEX = [
  "codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox",
  "-c model_provider=vf",
  `-c "model_providers.vf={name=\\"vf\\",base_url=\\"$OPENAI_BASE_URL\\",env_key=\\"OPENAI_API_KEY\\",wire_api=\\"responses\\"}"`,
  '-m "$OPENAI_MODEL" "$VF_INSTRUCTION" < /dev/null',
].join(" ");

Deno.test("a real agent CLI: Codex runs in a Docker sandbox through the program harness and solves a Harbor task via the gateway's Responses dialect", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_codex_" });
  const runIds: string[] = [];
  try {
    const tgz = await codexTarball();
    const env = join(dir, "bench/hello/environment");
    await Deno.mkdir(env, { recursive: true });
    const untar = await new Deno.Command("tar", {
      args: [
        "xzf",
        tgz,
        "-C",
        env,
        "--strip-components=4",
        "package/vendor/x86_64-unknown-linux-musl/bin/codex",
      ],
    }).output();
    assert.ok(untar.success, new TextDecoder().decode(untar.stderr));
    const files: Record<string, string> = {
      "hello/instruction.md": "Write the word hello to /app/out.txt.\n",
      "hello/task.toml": "[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 300.0\n",
      "hello/environment/Dockerfile":
        "FROM python:3.11-slim\nCOPY codex /usr/local/bin/codex\nWORKDIR /app\n",
      "hello/tests/test.sh":
        '#!/bin/sh\n[ "$(cat /app/out.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n',
    };
    for (const [path, text] of Object.entries(files)) {
      await Deno.mkdir(join(dir, "bench", path, ".."), { recursive: true });
      await Deno.writeTextFile(join(dir, "bench", path), text);
    }
    const realKey = "sk-real-key-for-codex-test-7c1d";
    const offered: string[][] = [];
    await using model = await startModelServer({
      apiKey: realKey,
      responder: ({ body }) => {
        offered.push((body.tools ?? []).map((t: Json) => t.function.name));
        const done = body.messages.some((m: WireMessage) => m.role === "tool");
        return done ? { content: "Wrote it." } : {
          content: null,
          tool_calls: [{
            name: "exec_command",
            arguments: { cmd: "echo hello > /app/out.txt; env | grep -c sk-real-key || true" },
          }],
        };
      },
    });
    const res = await collect(cliCommand([
      "run",
      "./bench",
      "-m",
      "codex-model",
      "-b",
      model.url,
      "-k",
      "VF_TEST_REAL_KEY",
      "-o",
      "out",
      "--env.agent.harness.id",
      "program",
      "--env.agent.harness.command",
      CODEX,
    ], { cwd: dir, env: { VF_TEST_REAL_KEY: realKey }, registry: false, docker: true }));
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1] ?? "";
    if (runDir) runIds.push(basename(runDir));
    assert.equal(res.code, 0, transcript(res));
    const [t] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(t.reward, 1, JSON.stringify({ error: t.error, out: t.tool_calls }));
    assert.equal(t.stop_condition, "agent_completed");
    assert.equal(t.model_calls.length, 2);
    assert.ok(offered[0].includes("exec_command"), `codex offered ${offered[0]}`);
    // Codex's own tool result, as it sent it back: the command ran, and saw no real key.
    const result = t.messages.find((m: Json) => m.role === "tool");
    assert.match(result.content, /\b0\b/);
    assert.doesNotMatch(JSON.stringify(t.messages), new RegExp(realKey));
  } finally {
    for (const id of runIds) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});
