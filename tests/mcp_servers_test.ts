/**
 * Real MCP servers from npm, at pinned versions, as toolsets (run with Deno's npm support, so
 * the packages are cached in DENO_DIR): `server-everything` through `vf eval` with the
 * loopback model (every content type reaching the model, roots, elicitation declined, sampling
 * answered through the rollout's model and recorded as a model call), `server-filesystem`
 * and `server-memory` through a Toolbox, their state checked on disk.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startModelServer, type WireMessage } from "./model_server.ts";
import { cliCommand, collect, MOD_URL, transcript } from "./_cli.ts";
import { Toolbox } from "../lib/tools/toolbox.ts";
import { EVERYTHING, FILESYSTEM, MEMORY } from "./_mcp_packages.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const TASKSET = `
import { reward, Task, Taskset } from "${MOD_URL}";
class T extends Task {
  static override HARNESS = "null";
  answered = reward(({ trace }) => (trace.messages.at(-1)?.content === "done" ? 1 : 0));
}
class S extends Taskset {
  get id() { return "s"; }
  *load() { yield new T({ id: "t", prompt: "Use the tools." }); }
}
export function loadTaskset(config) { return new S(config); }
`;

const PLAN: Array<[string, Record<string, unknown>]> = [
  ["ev_get-tiny-image", {}],
  ["ev_get-resource-links", { count: 1 }],
  ["ev_get-resource-reference", { resourceType: "Text", resourceId: 1 }],
  ["ev_get-roots-list", {}],
  ["ev_trigger-elicitation-request", {}],
  ["ev_trigger-sampling-request", { prompt: "say pong", maxTokens: 20 }],
];

Deno.test("server-everything as a toolset: images reach the model as image parts, resources and links as text with their URI, roots, elicitation declined, sampling through the rollout's model as a model call", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_mcp_everything_" });
  try {
    await using model = await startModelServer({
      responder: ({ body }) => {
        // The server's sampling request: no tools, its own system prompt.
        if (!body.tools?.length) return { content: "pong" };
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        if (turn < PLAN.length) {
          const [name, args] = PLAN[turn];
          return { content: null, tool_calls: [{ name, arguments: args }] };
        }
        return { content: "done" };
      },
    });
    await Deno.writeTextFile(join(dir, "s.ts"), TASKSET);
    await Deno.writeTextFile(
      join(dir, "run.toml"),
      `model = "m"
[client]
base_url = "${model.url}"
[env.taskset]
id = "./s.ts"
[env.agent.runtime]
type = "subprocess"
[[env.toolsets]]
name = "ev"
command = "${Deno.execPath()}"
args = ["run", "-A", "${EVERYTHING}", "stdio"]
cwd = "."
images = true
timeout = 120
`,
    );
    const res = await collect(
      cliCommand(["eval", "@", "run.toml", "-o", "out"], { cwd: dir, env: {}, registry: false }),
    );
    assert.equal(res.code, 0, transcript(res));
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
    const [trace] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(trace.ok, true, JSON.stringify(trace.error));
    assert.equal(trace.reward, 1);
    const out = Object.fromEntries(trace.tool_calls.map((c: Json) => [c.name, c.output]));
    for (const text of Object.values(out) as string[]) {
      assert.doesNotMatch(text, /^\[(image|resource|resource_link)\]$/m, text);
    }
    // The image: named in the text, and an image part of the tool message the model got.
    assert.match(out["ev_get-tiny-image"], /\[image \(image\/png\), \d+ bytes\]/);
    const last = model.requests.filter((r) => r.body.tools?.length).at(-1)!.body.messages;
    const imageResult = last.find((m: WireMessage) =>
      m.role === "tool" && Array.isArray(m.content)
    );
    assert.ok(imageResult, "no tool message with parts");
    const image = (imageResult.content as Json[]).find((p) => p.type === "image_url");
    assert.match(image.image_url.url, /^data:image\/png;base64,iVBOR/);
    // Resources and links: their URI and what they hold.
    assert.match(out["ev_get-resource-links"], /\[resource_link demo:\/\/resource\/\S+ "[^"]+"/);
    assert.match(
      out["ev_get-resource-reference"],
      /\[resource demo:\/\/resource\/dynamic\/text\/1 \(text\/plain\)\]\nResource 1: This is a plaintext resource/,
    );
    // The client's roots: a server on the evaluator is offered its own folder.
    assert.match(out["ev_get-roots-list"], new RegExp(`URI: file://${await Deno.realPath(dir)}`));
    assert.match(out["ev_trigger-elicitation-request"], /declined/);
    // Sampling: answered by the rollout's model, a model call of the rollout on the trace.
    assert.match(out["ev_trigger-sampling-request"], /"text": "pong"/);
    const sampled = trace.model_calls.filter((c: Json) => c.sampling === "ev");
    assert.equal(sampled.length, 1, JSON.stringify(trace.model_calls));
    assert.equal(sampled[0].response.message.content, "pong");
    assert.equal(trace.model_calls.length, PLAN.length + 2);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("server-filesystem and server-memory as toolsets: files written and read in the allowed folder, a knowledge graph kept in its file", async () => {
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "vf_mcp_fs_" }));
  try {
    await Deno.mkdir(join(dir, "work"));
    await Deno.writeTextFile(join(dir, "work", "a.txt"), "hello\n");
    await Deno.writeTextFile(join(dir, "secret.txt"), "outside\n");
    const box = await Toolbox.open([
      {
        name: "fs",
        command: Deno.execPath(),
        args: ["run", "-A", FILESYSTEM, join(dir, "work")],
        timeout: 120,
      },
      {
        name: "mem",
        command: Deno.execPath(),
        args: ["run", "-A", MEMORY],
        env: { MEMORY_FILE_PATH: join(dir, "memory.jsonl") },
        timeout: 120,
      },
    ], { state: {} });
    try {
      assert.ok(box.has("fs_read_text_file") && box.has("mem_create_entities"));
      const read = await box.call("fs_read_text_file", { path: join(dir, "work", "a.txt") });
      assert.deepEqual(read, { text: "hello\n", isError: false });
      const wrote = await box.call("fs_write_file", {
        path: join(dir, "work", "b.txt"),
        content: "made by the agent",
      });
      assert.equal(wrote.isError, false, wrote.text);
      const outside = await box.call("fs_read_text_file", { path: join(dir, "secret.txt") });
      assert.equal(outside.isError, true, outside.text);
      assert.match(outside.text, /outside allowed directories/i);
      const made = await box.call("mem_create_entities", {
        entities: [{ name: "vf", entityType: "project", observations: ["runs evals"] }],
      });
      assert.equal(made.isError, false, made.text);
      const graph = JSON.parse((await box.call("mem_read_graph", {})).text);
      assert.deepEqual(graph.entities.map((e: Json) => e.name), ["vf"]);
    } finally {
      await box.close();
    }
    assert.equal(await Deno.readTextFile(join(dir, "work", "b.txt")), "made by the agent");
    assert.match(await Deno.readTextFile(join(dir, "memory.jsonl")), /"name":"vf"/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
