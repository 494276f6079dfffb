/**
 * Toolsets end to end through `vf eval @ run.toml`: a stdio MCP server built with the SDK and
 * given only as a command, tools written in TypeScript (from a task and from a module), the
 * agent (the loopback model) calling them as `<toolset>_<tool>`, errors going back to the
 * model, and rewards reading the tool state; plus the errors bad toolset entries get.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startModelServer, type WireMessage } from "./model_server.ts";
import { cliCommand, type CliResult, collect, MOD_URL, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const SERVER = `
import { McpServer } from "npm:@modelcontextprotocol/sdk@^1.32.0/server/mcp.js";
import { StdioServerTransport } from "npm:@modelcontextprotocol/sdk@^1.32.0/server/stdio.js";
import { z } from "npm:zod@^4.6.0";
const server = new McpServer({ name: "counter", version: "1" });
let count = 0;
server.registerTool("inc", { description: "Add to the counter", inputSchema: { by: z.number() } },
  ({ by }) => ({ content: [{ type: "text", text: String(count += by) }] }));
server.registerTool("get", { description: "Read the counter", inputSchema: {} },
  () => ({ content: [{ type: "text", text: String(count) }] }));
server.registerTool("fail", { description: "Always fails", inputSchema: {} },
  () => ({ isError: true, content: [{ type: "text", text: "the counter refuses" }] }));
await server.connect(new StdioServerTransport());
`;

const TASKSET = `
import { defineToolset, reward, Task, Taskset } from "${MOD_URL}";
import { z } from "npm:zod@^4.6.0";
class CountTask extends Task {
  static override HARNESS = "null";
  override initialState() { return { notes: [] }; }
  // Tools written here: their state is this rollout's state.
  override toolsets() {
    return [defineToolset({
      name: "notes",
      tools: {
        add: {
          description: "Keep a note",
          parameters: { text: z.string() },
          run: ({ text }, { state }) => { state.notes.push(text); return "noted"; },
        },
      },
    })];
  }
  // Reads the stdio server's state through its tool, while it is still up.
  counted = reward(async ({ tools }) => (await tools.call("counter_get", {})).text === "5" ? 1 : 0);
  noted = reward(({ state }) => (state.notes.length === 1 && state.notes[0] === "five" ? 1 : 0));
}
class Counts extends Taskset {
  get id() { return "counts"; }
  *load() { yield new CountTask({ id: "c", prompt: "Count to five." }); }
}
export function loadTaskset(config) { return new Counts(config); }
`;

const CAPITALS = `
import { reward, Task, Taskset } from "${MOD_URL}";
class CapitalTask extends Task {
  static override HARNESS = "null";
  looked_up = reward(({ trace }) => (trace.messages.some((m) => m.role === "tool" && m.content === "Paris") ? 1 : 0));
}
class Capitals extends Taskset {
  get id() { return "capitals"; }
  *load() { yield new CapitalTask({ id: "fr", prompt: "Capital of France?" }); }
}
export function loadTaskset(config) { return new Capitals(config); }
`;

const MODULE = `
import { defineToolset } from "${MOD_URL}";
import { z } from "npm:zod@^4.6.0";
export default defineToolset({
  name: "echo",
  tools: { say: { description: "Echo", parameters: { text: z.string() }, run: ({ text }) => text.toUpperCase() } },
});
`;

/** The agent: calls the tools in order, then answers. */
const PLAN = [
  ["counter_inc", { by: 2 }],
  ["counter_fail", {}],
  ["counter_inc", { by: 3 }],
  ["notes_add", { text: "five" }],
  ["echo_say", { text: "done" }],
] as const;

async function run(dir: string, toml: string): Promise<CliResult> {
  await Deno.writeTextFile(join(dir, "run.toml"), toml);
  return await collect(
    cliCommand(["eval", "@", "run.toml", "-o", "out"], { cwd: dir, env: {}, registry: false }),
  );
}

Deno.test("toolsets: a stdio MCP server from TOML, TypeScript tools from the task and a module, called by the agent as <toolset>_<tool>, their state read by rewards", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_tools_" });
  try {
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        if (turn < PLAN.length) {
          const [name, args] = PLAN[turn];
          return { content: null, tool_calls: [{ name, arguments: args }] };
        }
        return { content: "Counted to five." };
      },
    });
    await Deno.writeTextFile(join(dir, "server.ts"), SERVER);
    await Deno.writeTextFile(join(dir, "counts.ts"), TASKSET);
    await Deno.writeTextFile(join(dir, "echo.ts"), MODULE);
    const res = await run(
      dir,
      `model = "m"
[client]
base_url = "${model.url}"
[env.taskset]
id = "./counts.ts"
[env.agent.runtime]
type = "subprocess"
[[env.toolsets]]
name = "counter"
command = "${Deno.execPath()}"
args = ["run", "-A", "server.ts"]
cwd = "."
timeout = 30
[[env.toolsets]]
name = "echo"
module = "echo.ts"
`,
    );
    assert.equal(res.code, 0, transcript(res));
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
    const [trace] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(trace.ok, true, JSON.stringify(trace.error));
    // The model was offered every toolset's tools, prefixed.
    const offered = model.requests[0].body.tools!.map((t: Json) => t.function.name).sort();
    assert.deepEqual(offered, [
      "counter_fail",
      "counter_get",
      "counter_inc",
      "echo_say",
      "notes_add",
    ]);
    assert.deepEqual(trace.tool_calls.map((c: Json) => [c.name, c.output, c.error ?? null]), [
      ["counter_inc", "2", null],
      ["counter_fail", "Error: the counter refuses", "the counter refuses"],
      ["counter_inc", "5", null],
      ["notes_add", "noted", null],
      ["echo_say", "DONE", null],
    ]);
    // The error went back to the model as the tool's result.
    const results = model.requests[2].body.messages.filter((m: WireMessage) => m.role === "tool");
    assert.equal(results.at(-1)?.content, "Error: the counter refuses");
    assert.deepEqual(trace.rewards, { counted: 1, noted: 1 });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("bad toolsets name the entry: a duplicate or invalid name, no source, an unknown key, and a server that fails its start is an infrastructure error, never reward 0", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_tools_bad_" });
  try {
    await using model = await startModelServer({ responder: () => ({ content: "hi" }) });
    await Deno.writeTextFile(join(dir, "counts.ts"), TASKSET);
    const head = `model = "m"
[client]
base_url = "${model.url}"
[env.taskset]
id = "./counts.ts"
[env.agent.runtime]
type = "subprocess"
`;
    const cases: Array<[string, RegExp]> = [
      [
        `[[env.toolsets]]\nname = "a"\nurl = "http://127.0.0.1:9/mcp"\n[[env.toolsets]]\nname = "a"\nurl = "http://127.0.0.1:9/mcp"\n`,
        /env\.toolsets\[1\]\.name: two toolsets are named "a"; tool names would clash/,
      ],
      [
        `[[env.toolsets]]\nname = "my_tools"\nurl = "http://127.0.0.1:9/mcp"\n`,
        /env\.toolsets\[0\]\.name: "my_tools" is not a toolset name/,
      ],
      [`[[env.toolsets]]\nname = "a"\n`, /env\.toolsets\[0\]: give exactly one of command/],
      [
        `[[env.toolsets]]\nname = "a"\nurl = "x"\ncolour = "red"\n`,
        /env\.toolsets\[0\]: unknown key "colour"; a toolset takes/,
      ],
    ];
    for (const [toolsets, pattern] of cases) {
      const res = await run(dir, head + toolsets);
      assert.equal(res.code, 1, `${toolsets}\n${transcript(res)}`);
      assert.match(res.stderr, pattern, toolsets);
    }
    const dead = await run(dir, head + `[[env.toolsets]]\nname = "dead"\ncommand = "false"\n`);
    assert.equal(dead.code, 1, transcript(dead));
    const runDir = /^Saving traces to (.+)$/m.exec(dead.stderr)![1];
    const [trace] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(trace.reward, null);
    assert.equal(trace.error.infra, true);
    assert.match(trace.error.message, /Toolset "dead" did not start or list its tools/);
    const metadata = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
    assert.equal(metadata.avg_reward, null);
    assert.equal(metadata.num_infra_errors, 1);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("toolsets: a streamable-HTTP MCP server given by url serves the agent's calls", async () => {
  const { McpServer } = await import("npm:@modelcontextprotocol/sdk@^1.32.0/server/mcp.js");
  const { WebStandardStreamableHTTPServerTransport } = await import(
    "npm:@modelcontextprotocol/sdk@^1.32.0/server/webStandardStreamableHttp.js"
  );
  const { z } = await import("npm:zod@^4.6.0");
  const capitals: Record<string, string> = { France: "Paris" };
  const seen: string[] = [];
  // Stateless: a fresh server and transport per request, as the SDK describes.
  await using mcp = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async (req) => {
    const server = new McpServer({ name: "atlas", version: "1" });
    server.registerTool(
      "capital",
      { description: "The capital of a country", inputSchema: { country: z.string() } },
      ({ country }: { country: string }) => {
        seen.push(country);
        return { content: [{ type: "text", text: capitals[country] ?? "unknown" }] };
      },
    );
    const transport = new WebStandardStreamableHTTPServerTransport({
      sessionIdGenerator: undefined,
      enableJsonResponse: true,
    });
    await server.connect(transport);
    return await transport.handleRequest(req);
  });
  const dir = await Deno.makeTempDir({ prefix: "vf_tools_http_" });
  try {
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        return turn === 0
          ? {
            content: null,
            tool_calls: [{ name: "atlas_capital", arguments: { country: "France" } }],
          }
          : { content: "Paris." };
      },
    });
    await Deno.writeTextFile(join(dir, "capitals.ts"), CAPITALS);
    const res = await run(
      dir,
      `model = "m"
[client]
base_url = "${model.url}"
[env.taskset]
id = "./capitals.ts"
[env.agent.runtime]
type = "subprocess"
[[env.toolsets]]
name = "atlas"
url = "http://127.0.0.1:${mcp.addr.port}/mcp"
`,
    );
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
    assert.ok(runDir, transcript(res));
    const [trace] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.deepEqual(trace.tool_calls.map((c: Json) => [c.name, c.output]), [
      ["atlas_capital", "Paris"],
    ]);
    assert.deepEqual(seen, ["France"]);
    assert.equal(trace.reward, 1);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

const TALLY = `
import { defineToolset } from "${MOD_URL}";
export default defineToolset({
  name: "tally",
  tools: {
    add: {
      description: "Count one more",
      parameters: {},
      run: (_args, { state }) => String((state.n = Number(state.n ?? 0) + 1)),
    },
  },
});
`;

Deno.test("toolsets: shared = true opens a toolset once for the run, so its state carries across rollouts; by default each rollout gets its own", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_tools_shared_" });
  try {
    await using model = await startModelServer({
      responder: ({ body }) =>
        body.messages.some((m: WireMessage) => m.role === "tool")
          ? { content: "done" }
          : { content: null, tool_calls: [{ name: "tally_add", arguments: {} }] },
    });
    await Deno.writeTextFile(join(dir, "capitals.ts"), CAPITALS);
    await Deno.writeTextFile(join(dir, "tally.ts"), TALLY);
    const outputs = async (shared: boolean) => {
      const res = await run(
        dir,
        `model = "m"
rollouts_per_example = 3
max_concurrent = 1
[client]
base_url = "${model.url}"
[env.taskset]
id = "./capitals.ts"
[env.agent.runtime]
type = "subprocess"
[[env.toolsets]]
name = "tally"
module = "tally.ts"
shared = ${shared}
`,
      );
      const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
      assert.ok(runDir, transcript(res));
      return (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
        .map((l) => JSON.parse(l))
        .sort((a: Json, b: Json) => a.rollout_index - b.rollout_index)
        .map((t: Json) => t.tool_calls[0]?.output);
    };
    assert.deepEqual(await outputs(true), ["1", "2", "3"]);
    assert.deepEqual(await outputs(false), ["1", "1", "1"]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** A stdio MCP server in Python's standard library: what an image with python3 can run. */
const PY_SERVER = String.raw`import json, os, sys
STATE = "/tmp/vault.json"
def load():
    return json.load(open(STATE)) if os.path.exists(STATE) else {}
TOOLS = [
    {"name": "put", "description": "Store a value", "inputSchema": {"type": "object",
     "properties": {"key": {"type": "string"}, "value": {"type": "string"}}, "required": ["key", "value"]}},
    {"name": "get", "description": "Read a value", "inputSchema": {"type": "object",
     "properties": {"key": {"type": "string"}}, "required": ["key"]}},
]
def call(name, args):
    vault = load()
    if name == "put":
        vault[args["key"]] = args["value"]
        json.dump(vault, open(STATE, "w"))
        return "stored", False
    if args["key"] not in vault:
        return "no key " + args["key"], True
    return vault[args["key"]], False
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg.get("method"), msg.get("params") or {}
    if method == "initialize":
        result = {"protocolVersion": params.get("protocolVersion"), "capabilities": {"tools": {}},
                  "serverInfo": {"name": "vault", "version": "1", "pid": os.getpid()}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        text, error = call(params["name"], params.get("arguments") or {})
        result = {"content": [{"type": "text", "text": text}], "isError": error}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
    sys.stdout.flush()
`;

const VAULT_TASKSET = `
import { reward, Task, Taskset } from "${MOD_URL}";
class VaultTask extends Task {
  static override HARNESS = "null";
  static override NEEDS_CONTAINER = true;
  // The server ships with the task: setup puts it in the sandbox before the toolsets open.
  override async setup({ runtime }) {
    await runtime.write("/opt/vault/server.py", ${JSON.stringify(PY_SERVER)});
  }
  // The tool state lives in the sandbox: read it there, and through the tool.
  kept = reward(async ({ runtime, tools }) => {
    const file = JSON.parse((await runtime.run(["cat", "/tmp/vault.json"])).stdout);
    const got = (await tools.call("vault_get", { key: "a" })).text;
    return file.a === "42" && got === "42" ? 1 : 0;
  });
}
class Vaults extends Taskset {
  get id() { return "vaults"; }
  *load() { yield new VaultTask({ id: "v", prompt: "Store 42 under a.", image: "python:3.11-slim" }); }
}
export function loadTaskset(config) { return new Vaults(config); }
`;

Deno.test("toolsets: colocated = true runs a stdio MCP server inside the agent's Docker sandbox; the agent calls it, errors go back to the model, a reward reads its state there", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_tools_colocated_" });
  try {
    const plan = [["vault_put", { key: "a", value: "42" }], ["vault_get", { key: "zzz" }]] as const;
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        if (turn < plan.length) {
          const [name, args] = plan[turn];
          return { content: null, tool_calls: [{ name, arguments: args }] };
        }
        return { content: "Stored." };
      },
    });
    await Deno.writeTextFile(join(dir, "vaults.ts"), VAULT_TASKSET);
    await Deno.writeTextFile(
      join(dir, "run.toml"),
      `model = "m"
[client]
base_url = "${model.url}"
[env.taskset]
id = "./vaults.ts"
[[env.toolsets]]
name = "vault"
command = "python3"
args = ["-u", "/opt/vault/server.py"]
cwd = "/opt/vault"
colocated = true
timeout = 30
`,
    );
    const res = await collect(
      cliCommand(["eval", "@", "run.toml", "-o", "out"], {
        cwd: dir,
        env: {},
        registry: false,
        docker: true,
      }),
    );
    assert.equal(res.code, 0, transcript(res));
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
    const [trace] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(trace.ok, true, JSON.stringify(trace.error));
    assert.deepEqual(trace.tool_calls.map((c: Json) => [c.name, c.output]), [
      ["vault_put", "stored"],
      ["vault_get", "Error: no key zzz"],
    ]);
    assert.deepEqual(trace.rewards, { kept: 1 });

    // Only a command can be colocated.
    await Deno.writeTextFile(
      join(dir, "run.toml"),
      `model = "m"\n[client]\nbase_url = "${model.url}"\n[env.taskset]\nid = "./vaults.ts"\n` +
        `[[env.toolsets]]\nname = "web"\nurl = "http://127.0.0.1:9/mcp"\ncolocated = true\n`,
    );
    const bad = await collect(
      cliCommand(["eval", "@", "run.toml", "-o", "out"], { cwd: dir, env: {}, registry: false }),
    );
    assert.notEqual(bad.code, 0);
    assert.match(bad.stderr, /env\.toolsets\[0\]\.colocated: only a command/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
