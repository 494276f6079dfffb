/**
 * The built-in agent-CLI harnesses, each a real CLI from the npm registry at its pinned
 * version: selected by id (`--env.agent.harness.id claude-code`), put by vf into a Docker
 * sandbox whose image has neither the CLI nor Node.js, pointed at the model gateway with its
 * own configuration, and solving a Harbor task with the loopback model's shell-tool calls.
 * The sandbox has no other route out, and the real key never enters it. The packages come
 * from the cache tests/setup.sh fills (`~/.cache/vf/npm`), else from the registry now.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { startModelServer, type WireMessage } from "./model_server.ts";
import { cliCommand, collect, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

/** Each CLI's shell tool, and the name of its command argument. */
const SHELL: Record<string, { tool: string; arg: string }> = {
  "claude-code": { tool: "Bash", arg: "command" },
  codex: { tool: "exec_command", arg: "cmd" },
  opencode: { tool: "bash", arg: "command" },
  pi: { tool: "bash", arg: "command" },
  "qwen-code": { tool: "run_shell_command", arg: "command" },
};

interface Solved {
  trace: Json;
  offered: string[][];
  requests: Json[];
}

/** Runs `vf run` with the harness on a one-task Harbor folder; returns its one trace. */
async function solve(harness: string, extra: string[] = []): Promise<Solved> {
  const dir = await Deno.makeTempDir({ prefix: `vf_${harness}_` });
  const runIds: string[] = [];
  try {
    const files: Record<string, string> = {
      "hello/instruction.md": "Write the word hello to /app/out.txt.\n",
      "hello/task.toml": "[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 600.0\n",
      // No CLI and no Node.js in the image: vf brings them.
      "hello/environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\n",
      "hello/tests/test.sh":
        '#!/bin/sh\n[ "$(cat /app/out.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n',
    };
    for (const [path, text] of Object.entries(files)) {
      await Deno.mkdir(join(dir, "bench", path, ".."), { recursive: true });
      await Deno.writeTextFile(join(dir, "bench", path), text);
    }
    const realKey = `sk-real-key-for-${harness}-test-7c1d`;
    const offered: string[][] = [];
    const requests: Json[] = [];
    const { tool, arg } = SHELL[harness];
    await using model = await startModelServer({
      apiKey: realKey,
      responder: ({ body }) => {
        requests.push(body);
        const names = (body.tools ?? []).map((t: Json) => t.function.name);
        offered.push(names);
        // Side calls (titles, summaries) have no tools: a plain answer.
        if (!names.includes(tool)) return { content: "ok" };
        const done = body.messages.some((m: WireMessage) => m.role === "tool");
        return done ? { content: "Wrote it." } : {
          content: null,
          tool_calls: [{
            name: tool,
            arguments: {
              [arg]: "echo hello > /app/out.txt; env | grep -c sk-real-key || true",
              ...(harness === "claude-code" || harness === "opencode"
                ? { description: "write the file" }
                : {}),
            },
          }],
        };
      },
    });
    const res = await collect(cliCommand([
      "run",
      "./bench",
      "-m",
      `${harness}-model`,
      "-b",
      model.url,
      "-k",
      "VF_TEST_REAL_KEY",
      "-o",
      "out",
      "--env.agent.harness.id",
      harness,
      ...extra,
    ], { cwd: dir, env: { VF_TEST_REAL_KEY: realKey }, registry: false, docker: true }));
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1] ?? "";
    if (runDir) runIds.push(basename(runDir));
    assert.equal(res.code, 0, transcript(res));
    const [trace] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    const program = trace.tool_calls?.find((c: Json) => c.name === harness);
    assert.equal(
      trace.reward,
      1,
      JSON.stringify({ error: trace.error, program: program?.output, offered }),
    );
    assert.equal(trace.stop_condition, "agent_completed");
    assert.ok(trace.model_calls.length >= 2, `${trace.model_calls.length} model calls`);
    assert.ok(offered.some((o) => o.includes(tool)), `${harness} offered ${offered}`);
    // The CLI's own tool result, as it sent it back: the command ran, and saw no real key.
    const result = trace.messages.find((m: Json) => m.role === "tool");
    assert.ok(result, JSON.stringify(trace.messages).slice(0, 2000));
    assert.match(JSON.stringify(result.content), /\b0\b/);
    assert.doesNotMatch(JSON.stringify(trace), new RegExp(realKey));
    return { trace, offered, requests };
  } finally {
    for (const id of runIds) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("the codex harness: Codex CLI from npm solves a Harbor task in Docker through the gateway's Responses dialect", async () => {
  const { trace } = await solve("codex");
  assert.ok(trace.metrics["codex/turns"] >= 1, JSON.stringify(trace.metrics));
  assert.ok(trace.metrics["codex/commands"] >= 1, JSON.stringify(trace.metrics));
});

Deno.test("the claude-code harness: Claude Code from npm solves a Harbor task in Docker through the gateway's Messages dialect", async () => {
  const { trace } = await solve("claude-code");
  assert.ok(
    trace.metrics["claude-code/num_turns"] >= 2,
    JSON.stringify([trace.metrics, trace.tool_calls.at(-1)]).slice(0, 3000),
  );
});

Deno.test("the pi harness: pi on Node 22 from npm solves a Harbor task in Docker, speaking chat completions", async () => {
  const { trace } = await solve("pi");
  assert.ok(trace.metrics["pi/tool_calls"] >= 1, JSON.stringify(trace.metrics));
});

Deno.test("the qwen-code harness: Qwen Code on Node 22 from npm solves a Harbor task in Docker", async () => {
  const { trace } = await solve("qwen-code");
  assert.ok(trace.metrics["qwen-code/num_turns"] >= 1, JSON.stringify(trace.metrics));
});

Deno.test("the opencode harness: opencode from npm solves a Harbor task in Docker with no network but the gateway", async () => {
  const { trace } = await solve("opencode");
  assert.ok(trace.metrics["opencode/tool_calls"] >= 1, JSON.stringify(trace.metrics));
});
