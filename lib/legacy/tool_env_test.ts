import assert from "node:assert/strict";
import { z } from "npm:zod@^4.6.0";
import { OpenAIChatClient } from "../model/client.ts";
import { ToolCallError, ToolParseError } from "../errors.ts";
import {
  type ModelServer,
  type Reply,
  scriptedResponder,
  startModelServer,
  toolCallReply,
} from "../../tests/model_server.ts";
import type { State } from "../state.ts";
import { defineTool, StatefulToolEnv, ToolEnv, type ToolEnvOptions } from "./tool_env.ts";
import type { Messages, Row } from "../types.ts";

const DATASET = [{ question: "What is 2+3?", answer: "5" }];

const add = defineTool({
  name: "add",
  description: "Add two integers",
  parameters: z.object({ a: z.number().int(), b: z.number().int() }),
  fn: ({ a, b }) => a + b,
});

function clientFor(server: ModelServer): OpenAIChatClient {
  return new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 5 });
}

async function run(
  replies: Reply[],
  options: ToolEnvOptions = {},
): Promise<{ state: State; server: ModelServer; env: ToolEnv }> {
  const server = await startModelServer({ responder: scriptedResponder(replies) });
  try {
    const env = new ToolEnv({ dataset: DATASET, tools: [add], ...options });
    const [row] = (await env.getDataset()).toList();
    const [state] = await env.runGroup([row], clientFor(server), "m");
    return { state, server, env };
  } finally {
    await server.close();
  }
}

/** The messages of the `i`-th request the server received. */
function sent(server: ModelServer, i: number) {
  return server.requests[i].body.messages;
}

Deno.test("ToolEnv calls the tool and sends its result back as a tool message", async () => {
  const { state, server } = await run([
    toolCallReply("add", { a: 2, b: 3 }, { id: "call_add" }),
    { content: "The answer is 5." },
  ]);
  assert.equal(server.requests.length, 2);
  assert.deepEqual(server.requests[0].body.tools?.map((t) => t.function?.name), ["add"]);
  assert.deepEqual(server.requests[0].body.tools?.[0].function?.parameters, {
    type: "object",
    properties: {
      a: { type: "integer", minimum: -9007199254740991, maximum: 9007199254740991 },
      b: { type: "integer", minimum: -9007199254740991, maximum: 9007199254740991 },
    },
    required: ["a", "b"],
    additionalProperties: false,
  });
  const second = sent(server, 1);
  assert.deepEqual(second.slice(-2), [
    {
      role: "assistant",
      content: null,
      tool_calls: [{
        id: "call_add",
        type: "function",
        function: { name: "add", arguments: '{"a":2,"b":3}' },
      }],
    },
    { role: "tool", tool_call_id: "call_add", content: "5" },
  ]);
  assert.equal(state.stop_condition, "no_tools_called");
  assert.deepEqual(state.completion.map((m) => m.role), ["assistant", "tool", "assistant"]);
});

Deno.test("ToolEnv sends a zod validation error back to the model as a tool message", async () => {
  const { state, server } = await run([
    toolCallReply("add", { a: "two", b: 3 }, { id: "c1" }),
    { content: "Sorry." },
  ]);
  const tool = sent(server, 1).at(-1)!;
  assert.equal(tool.role, "tool");
  assert.equal(tool.tool_call_id, "c1");
  assert.match(String(tool.content), /Invalid arguments for "add": a: /);
  assert.equal(state.error, null);
  assert.equal(state.stop_condition, "no_tools_called");
});

Deno.test("ToolEnv answers an unknown tool name with an error listing the tools", async () => {
  const { server, state } = await run([
    toolCallReply("multiply", { a: 2, b: 3 }, { id: "c1" }),
    { content: "Ok." },
  ]);
  const tool = sent(server, 1).at(-1)!;
  assert.equal(tool.role, "tool");
  assert.equal(tool.content, 'Unknown tool "multiply"; available: add');
  assert.equal(state.error, null);
});

Deno.test("ToolEnv answers invalid JSON arguments with an error tool message", async () => {
  const { server, state } = await run([
    toolCallReply("add", '{"a": 2, "b":', { id: "c1" }),
    { content: "Ok." },
  ]);
  const tool = sent(server, 1).at(-1)!;
  assert.equal(tool.role, "tool");
  assert.equal(tool.tool_call_id, "c1");
  assert.match(String(tool.content), /JSON/);
  assert.equal(state.error, null);
  assert.equal(state.stop_condition, "no_tools_called");
});

Deno.test("ToolEnv with stopErrors [SyntaxError] turns invalid JSON into ToolParseError", async () => {
  const { server, state } = await run(
    [toolCallReply("add", "{not json", { id: "c1" }), { content: "never asked" }],
    { stopErrors: [SyntaxError] },
  );
  assert.equal(server.requests.length, 1);
  assert.ok(state.error instanceof ToolParseError);
  assert.ok((state.error as Error).cause instanceof SyntaxError);
  assert.equal(state.stop_condition, "has_error");
  assert.deepEqual(state.completion.map((m) => m.role), ["assistant"]);
});

Deno.test("ToolEnv with stopErrors turns a listed tool exception into ToolCallError", async () => {
  class QuotaError extends Error {}
  const fetchTool = defineTool({
    name: "fetch_page",
    parameters: { type: "object", properties: { url: { type: "string" } } },
    fn: () => {
      throw new QuotaError("quota exhausted");
    },
  });
  const { server, state } = await run(
    [toolCallReply("fetch_page", { url: "x" }), { content: "never asked" }],
    { tools: [fetchTool], stopErrors: [QuotaError] },
  );
  assert.equal(server.requests.length, 1);
  assert.ok(state.error instanceof ToolCallError);
  assert.ok((state.error as Error).cause instanceof QuotaError);
  assert.equal(state.stop_condition, "has_error");
});

Deno.test("ToolEnv sends an unlisted tool exception back to the model", async () => {
  const failing = defineTool({
    name: "fail",
    parameters: { type: "object", properties: {} },
    fn: () => {
      throw new Error("disk full");
    },
  });
  const { server, state } = await run(
    [toolCallReply("fail", {}, { id: "c1" }), { content: "Gave up." }],
    { tools: [failing], stopErrors: [SyntaxError] },
  );
  assert.deepEqual(sent(server, 1).at(-1), {
    role: "tool",
    tool_call_id: "c1",
    content: "disk full",
  });
  assert.equal(state.error, null);
});

Deno.test("ToolEnv ends the rollout when the model calls no tool", async () => {
  const { server, state } = await run([{ content: "5" }]);
  assert.equal(server.requests.length, 1);
  assert.equal(state.stop_condition, "no_tools_called");
  assert.deepEqual(state.completion, [{ role: "assistant", content: "5" }]);
});

Deno.test("ToolEnv leaves a pending tool call unexecuted when max_turns is reached", async () => {
  let calls = 0;
  const counted = defineTool({
    name: "add",
    parameters: { type: "object", properties: {} },
    fn: () => ++calls,
  });
  const { server, state } = await run(
    [toolCallReply("add", {}), toolCallReply("add", {})],
    { tools: [counted], maxTurns: 2 },
  );
  assert.equal(server.requests.length, 2);
  assert.equal(calls, 1);
  assert.equal(state.stop_condition, "max_turns_reached");
  const last = state.completion.at(-1)!;
  assert.equal(last.role, "assistant");
  assert.equal(last.tool_calls?.length, 1);
});

Deno.test("ToolEnv records total_tool_calls and per-tool call metrics", async () => {
  const echo = defineTool({
    name: "echo",
    parameters: { type: "object", properties: { text: { type: "string" } } },
    fn: ({ text }) => text,
  });
  const twoCalls: Reply = {
    content: null,
    tool_calls: [{ name: "add", arguments: { a: 1, b: 1 } }, {
      name: "echo",
      arguments: { text: "hi" },
    }],
  };
  const { state } = await run(
    [twoCalls, toolCallReply("add", { a: 2, b: 2 }), { content: "done" }],
    { tools: [add, echo] },
  );
  assert.equal(state.metrics?.total_tool_calls, 3);
  assert.equal(state.metrics?.add_calls, 2);
  assert.equal(state.metrics?.echo_calls, 1);
  assert.equal(state.metrics?.num_turns, 3);
  // Tool messages come back in call order.
  const tools = state.completion.filter((m) => m.role === "tool").map((m) => m.content);
  assert.deepEqual(tools, ["2", "hi", "4"]);
});

Deno.test("ToolEnv passes content parts through and JSON-stringifies objects", async () => {
  const parts = defineTool({
    name: "parts",
    parameters: { type: "object", properties: {} },
    fn: () => [{ type: "text", text: "a picture:" }, {
      type: "image_url",
      image_url: { url: "data:image/png;base64,AAAA" },
    }],
  });
  const object = defineTool({
    name: "object",
    parameters: { type: "object", properties: {} },
    fn: () => ({ ok: true, items: [1, 2], note: null }),
  });
  const list = defineTool({
    name: "list",
    parameters: { type: "object", properties: {} },
    fn: () => [1, "two"],
  });
  const { server } = await run(
    [{
      content: null,
      tool_calls: [
        { id: "p", name: "parts", arguments: {} },
        { id: "o", name: "object", arguments: {} },
        { id: "l", name: "list", arguments: {} },
      ],
    }, { content: "done" }],
    { tools: [parts, object, list] },
  );
  assert.deepEqual(sent(server, 1).slice(-3), [
    {
      role: "tool",
      tool_call_id: "p",
      content: [{ type: "text", text: "a picture:" }, {
        type: "image_url",
        image_url: { url: "data:image/png;base64,AAAA" },
      }],
    },
    { role: "tool", tool_call_id: "o", content: '{"ok":true,"items":[1,2],"note":null}' },
    { role: "tool", tool_call_id: "l", content: '[1,"two"]' },
  ]);
});

Deno.test("addTool() and removeTool() change the tools sent, the tool map and the metrics", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const env = new ToolEnv({ dataset: DATASET, tools: [add] });
  const upper = defineTool({
    name: "upper",
    parameters: z.object({ text: z.string() }),
    fn: ({ text }) => text.toUpperCase(),
  });
  env.addTool(upper);
  const [row] = (await env.getDataset()).toList();
  const [withBoth] = await env.runGroup([row], clientFor(server), "m");
  assert.deepEqual(server.requests[0].body.tools?.map((t) => t.function?.name), ["add", "upper"]);
  assert.deepEqual(Object.keys(withBoth.metrics ?? {}).sort(), [
    "add_calls",
    "num_turns",
    "total_tool_calls",
    "upper_calls",
  ]);
  env.removeTool("add");
  assert.deepEqual([...env.toolMap.keys()], ["upper"]);
  assert.deepEqual(env.tools.map((t) => t.name), ["upper"]);
  const [withUpper] = await env.runGroup([row], clientFor(server), "m");
  assert.deepEqual(server.requests[1].body.tools?.map((t) => t.function?.name), ["upper"]);
  assert.equal("add_calls" in (withUpper.metrics ?? {}), false);
  assert.equal(withUpper.metrics?.upper_calls, 0);
});

Deno.test("ToolEnv's stop conditions include no_tools_called in name order", () => {
  const env = new ToolEnv({ dataset: DATASET });
  assert.deepEqual(env.stopConditionNames, [
    "has_error",
    "has_final_env_response",
    "max_total_completion_tokens_reached",
    "max_turns_reached",
    "no_tools_called",
    "prompt_too_long",
  ]);
  assert.equal(env.maxTurns, 10);
});

/** A key-value store whose `session_id` is hidden from the model and injected per rollout. */
class SessionEnv extends StatefulToolEnv {
  constructor() {
    super({ dataset: DATASET });
    this.addTool(
      defineTool({
        name: "remember",
        description: "Store a value in this rollout's session",
        parameters: z.object({ key: z.string(), value: z.string(), session_id: z.string() }),
        fn: ({ key, value, session_id }) => `${session_id}: ${key}=${value}`,
      }),
      { argsToSkip: ["session_id"] },
    );
  }
  override setupState(state: State): void {
    state.session_id = `session-${state.example_id}`;
  }
  updateToolArgs(
    name: string,
    args: Record<string, unknown>,
    _messages: Messages,
    state: State,
  ): Record<string, unknown> {
    return name === "remember" ? { ...args, session_id: state.session_id } : args;
  }
}

Deno.test("StatefulToolEnv hides argsToSkip from the schema and updateToolArgs injects them", async () => {
  await using server = await startModelServer({
    responder: scriptedResponder([
      toolCallReply("remember", { key: "color", value: "blue" }, { id: "r1" }),
      { content: "Stored." },
    ]),
  });
  const env = new SessionEnv();
  const [row]: Row[] = (await env.getDataset()).toList();
  const [state] = await env.runGroup([row], clientFor(server), "m");
  const schema = server.requests[0].body.tools?.[0].function?.parameters as {
    properties: Record<string, unknown>;
    required: string[];
  };
  assert.deepEqual(Object.keys(schema.properties), ["key", "value"]);
  assert.deepEqual(schema.required, ["key", "value"]);
  assert.deepEqual(env.skippedArgs.get("remember"), ["session_id"]);
  assert.deepEqual(sent(server, 1).at(-1), {
    role: "tool",
    tool_call_id: "r1",
    content: "session-0: color=blue",
  });
  assert.equal(state.metrics?.remember_calls, 1);
});

Deno.test("StatefulToolEnv drops $defs used only by skipped arguments and keeps shared ones", () => {
  class Plain extends StatefulToolEnv {
    updateToolArgs(_n: string, args: Record<string, unknown>): Record<string, unknown> {
      return args;
    }
  }
  const env = new Plain({ dataset: DATASET });
  const parameters = {
    type: "object",
    properties: {
      query: { type: "string" },
      sandbox: { $ref: "#/$defs/Sandbox" },
      config: { $ref: "#/$defs/Config" },
      fallback: { $ref: "#/$defs/Config" },
    },
    required: ["query", "sandbox", "config", "fallback"],
    $defs: {
      Sandbox: { type: "object", properties: { id: { type: "string" } } },
      Config: { type: "object", properties: { depth: { type: "integer" } } },
    },
  };
  const original = structuredClone(parameters);
  const tool = defineTool({ name: "search", parameters, fn: () => "" });
  env.addTool(tool, { argsToSkip: ["sandbox", "config"] });
  const shown = env.toolDefs.find((t) => t.name === "search")!.parameters;
  assert.deepEqual(shown, {
    type: "object",
    properties: { query: { type: "string" }, fallback: { $ref: "#/$defs/Config" } },
    required: ["query", "fallback"],
    $defs: { Config: { type: "object", properties: { depth: { type: "integer" } } } },
  });
  // The tool's own schema is untouched.
  assert.deepEqual(tool.parameters, original);

  env.addTool(defineTool({ name: "only", parameters: original, fn: () => "" }), {
    argsToSkip: ["sandbox", "config", "fallback"],
  });
  const pruned = env.toolDefs.find((t) => t.name === "only")!.parameters;
  assert.deepEqual(pruned, {
    type: "object",
    properties: { query: { type: "string" } },
    required: ["query"],
  });
});

Deno.test("ToolEnv offers an MCP toolset's tools (mcpTools) and returns their errors to the model", async () => {
  const { Toolbox } = await import("../tools/toolbox.ts");
  const { mcpTools } = await import("../tools/legacy.ts");
  const box = await Toolbox.open([{
    name: "calc",
    tools: {
      mul: {
        description: "Multiply",
        parameters: { a: z.number(), b: z.number() },
        run: ({ a, b }) => String(Number(a) * Number(b)),
      },
      div: {
        description: "Divide",
        parameters: { a: z.number(), b: z.number() },
        run: ({ a, b }) => {
          if (b === 0) throw new Error("division by zero");
          return String(Number(a) / Number(b));
        },
      },
    },
  }], { state: {} });
  try {
    const { state, server } = await run([
      toolCallReply("calc_mul", { a: 6, b: 7 }, { id: "m" }),
      toolCallReply("calc_div", { a: 1, b: 0 }, { id: "d" }),
      { content: "42" },
    ], { tools: mcpTools(box) });
    assert.deepEqual(
      server.requests[0].body.tools?.map((t) => t.function?.name),
      ["calc_mul", "calc_div"],
    );
    const tools = (state.completion as Messages).filter((m) => m.role === "tool");
    assert.equal(tools[0].content, "42");
    assert.match(String(tools[1].content), /division by zero/);
  } finally {
    await box.close();
  }
});

Deno.test("ToolEnv refuses a tool in OpenAI's {type: 'function'} shape through tools or addTool, naming where", async () => {
  const { ConfigError } = await import("../errors.ts");
  const openai = {
    type: "function",
    function: { name: "sub", description: "Subtract", parameters: { type: "object" } },
    fn: () => 0,
  } as unknown as Parameters<ToolEnv["addTool"]>[0];
  assert.throws(
    () => new ToolEnv({ dataset: DATASET, tools: [add, openai] }),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message ===
        'tools[1] uses the OpenAI {type: "function", function: {...}} shape; give ' +
          "defineTool({ name, description, parameters, fn }) instead",
  );
  const env = new ToolEnv({ dataset: DATASET, tools: [add] });
  assert.throws(() => env.addTool(openai), /: addTool\(\) uses the OpenAI/);
  assert.deepEqual(env.toolDefs.map((t) => t.name), ["add"], "nothing was half-added");
  const noFn = { name: "sub", description: "d", parameters: {} } as unknown as typeof add;
  assert.throws(
    () => new ToolEnv({ dataset: DATASET, tools: [noFn] }),
    /: tools\[0\] \("sub"\) has no fn/,
  );
});

Deno.test("ToolEnv warns about a tool without a description, naming it", () => {
  const warnings: string[] = [];
  const original = console.warn;
  console.warn = (...args: unknown[]) => void warnings.push(args.map(String).join(" "));
  try {
    const bare = defineTool({ name: "ping", parameters: { type: "object" }, fn: () => "pong" });
    new ToolEnv({ dataset: DATASET, tools: [add, bare] });
  } finally {
    console.warn = original;
  }
  assert.deepEqual(warnings, [
    'Tool "ping" has no description; the model sees only its name and parameters ' +
    "(give defineTool a description)",
  ]);
});

Deno.test("tool_defs without a description are refused, on the environment and in a row's info, as upstream's Tool model does", async () => {
  const { ConfigError } = await import("../errors.ts");
  const { SingleTurnEnv } = await import("./multi_turn.ts");
  assert.throws(
    () =>
      new SingleTurnEnv({
        dataset: DATASET,
        toolDefs: [{ name: "search", parameters: { type: "object" } } as never],
      }),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message.startsWith('toolDefs[0] ("search") has no "description"; give one'),
  );
  const env = new SingleTurnEnv({
    dataset: [{ question: "q", info: { tool_defs: [{ name: "lookup", parameters: {} }] } }],
  });
  const [row] = (await env.getDataset()).toList();
  const client = new OpenAIChatClient({ base_url: "http://127.0.0.1:9/v1" });
  assert.throws(
    () => env.initState(row, client, "m"),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message.startsWith('info.tool_defs of example 0[0] ("lookup") has no "description"'),
  );
  // An empty description is a description: accepted.
  const ok = new SingleTurnEnv({
    dataset: DATASET,
    toolDefs: [{ name: "search", description: "", parameters: { type: "object" } }],
  });
  assert.equal(ok.toolDefs.length, 1);
});
