import assert from "node:assert/strict";
import { EndpointUnreachableError, OpenAIChatClient } from "./client.ts";
import { SingleTurnEnv } from "../legacy/multi_turn.ts";
import {
  AuthenticationError,
  ConfigError,
  EmptyModelResponseError,
  InvalidModelResponseError,
  ModelError,
} from "../errors.ts";
import {
  rateLimitReply,
  scriptedResponder,
  startModelServer,
  toolCallReply,
} from "../../tests/model_server.ts";
import type { Messages, Tool } from "../types.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const USER: Messages = [{ role: "user", content: "hi" }];

function clientFor(url: string, extra: Record<string, unknown> = {}): OpenAIChatClient {
  return new OpenAIChatClient({ base_url: url, max_retries: 2, timeout: 5, ...extra });
}

Deno.test("getResponse() maps tools to the function shape only when there are some", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const client = clientFor(server.url);
  const tool: Tool = {
    name: "add",
    description: "Add two numbers",
    parameters: { type: "object", properties: { a: { type: "number" } }, required: ["a"] },
  };
  await client.getResponse(USER, "m", { tools: [tool] });
  await client.getResponse(USER, "m", { tools: [] });
  await client.getResponse(USER, "m");
  const [withTools, emptyTools, noTools] = server.requests.map((r) => r.body);
  assert.deepEqual(withTools.tools, [{
    type: "function",
    function: { name: "add", description: "Add two numbers", parameters: tool.parameters },
  }]);
  assert.equal("tools" in emptyTools, false);
  assert.equal("tools" in noTools, false);
  assert.equal(withTools.model, "m");
});

Deno.test("getResponse() echoes assistant tool calls in the OpenAI shape and sends text as user", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const client = clientFor(server.url);
  const prompt: Messages = [
    { role: "text", content: "raw completion-style prompt" },
    {
      role: "assistant",
      content: null,
      reasoning_content: "let me add",
      tool_calls: [{ id: "call_1", name: "add", arguments: '{"a":1}' }],
    },
    { role: "tool", tool_call_id: "call_1", content: "1" },
  ];
  await client.getResponse(prompt, "m");
  assert.deepEqual(server.requests[0].body.messages, [
    { role: "user", content: "raw completion-style prompt" },
    {
      role: "assistant",
      content: null,
      reasoning_content: "let me add",
      tool_calls: [{
        id: "call_1",
        type: "function",
        function: { name: "add", arguments: '{"a":1}' },
      }],
    },
    { role: "tool", tool_call_id: "call_1", content: "1" },
  ]);
});

Deno.test("getResponse() parses usage, reasoning_content, tool calls and finish_reason", async () => {
  await using server = await startModelServer({
    responder: scriptedResponder([
      {
        content: "partial",
        reasoning_content: "thinking hard",
        finish_reason: "length",
        usage: { prompt_tokens: 12, completion_tokens: 30 },
      },
      toolCallReply("add", { a: 1 }, { id: "call_x" }),
    ]),
  });
  const client = clientFor(server.url);
  const first = await client.getResponse(USER, "m");
  assert.equal(first.message.content, "partial");
  assert.equal(first.message.reasoning_content, "thinking hard");
  assert.equal(first.message.finish_reason, "length");
  assert.equal(first.message.is_truncated, true);
  assert.equal(first.message.tool_calls, null);
  assert.deepEqual(first.usage, {
    prompt_tokens: 12,
    completion_tokens: 30,
    reasoning_tokens: 0,
    total_tokens: 42,
  });
  assert.equal(first.model, "m");
  const second = await client.getResponse(USER, "m");
  assert.equal(second.message.content, null);
  assert.equal(second.message.finish_reason, "tool_calls");
  assert.deepEqual(second.message.tool_calls, [{
    id: "call_x",
    name: "add",
    arguments: '{"a":1}',
  }]);
});

Deno.test("getResponse() renames max_tokens to max_completion_tokens and drops nulls and n", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const client = clientFor(server.url);
  await client.getResponse(USER, "m", {
    samplingArgs: { max_tokens: 64, temperature: 0.2, top_p: null, n: 1, extra_body: { top_k: 5 } },
  });
  const body = server.requests[0].body;
  assert.equal(body.max_completion_tokens, 64);
  assert.equal("max_tokens" in body, false);
  assert.equal(body.temperature, 0.2);
  assert.equal("top_p" in body, false);
  assert.equal("n" in body, false);
  assert.equal(body.top_k, 5);
});

Deno.test("getResponse() retries a 429 after its retry-after and then succeeds", async () => {
  await using server = await startModelServer({
    responder: scriptedResponder([rateLimitReply(0), { content: "ok" }]),
  });
  const response = await clientFor(server.url).getResponse(USER, "m");
  assert.equal(response.message.content, "ok");
  assert.equal(server.requests.length, 2);
});

Deno.test("getResponse() retries two 500s with backoff and then succeeds", async () => {
  await using server = await startModelServer({
    responder: scriptedResponder([{ status: 500 }, { status: 500 }, { content: "ok" }]),
  });
  const response = await clientFor(server.url).getResponse(USER, "m");
  assert.equal(response.message.content, "ok");
  assert.equal(server.requests.length, 3);
});

Deno.test("getResponse() throws ModelError when 500s outlast max_retries", async () => {
  await using server = await startModelServer({
    responder: () => ({ status: 500, headers: { "retry-after": "0" } }),
  });
  const error = await clientFor(server.url).getResponse(USER, "m").catch((e) => e);
  assert.ok(error instanceof ModelError);
  assert.equal(error.constructor, ModelError);
  assert.match(error.message, /HTTP 500/);
  assert.equal(server.requests.length, 3); // the first attempt plus max_retries: 2
});

Deno.test("getResponse() throws AuthenticationError on a 401 without retrying", async () => {
  await using server = await startModelServer({
    responder: () => ({ content: "never" }),
    apiKey: "sk-right",
  });
  const client = clientFor(server.url, { api_key: "sk-wrong" });
  await assert.rejects(client.getResponse(USER, "m"), AuthenticationError);
  // The server's key check answers before recording, so count attempts with a scripted 401.
  await using scripted = await startModelServer({
    responder: () => ({ status: 401, body: "Incorrect API key provided" }),
  });
  const error = await clientFor(scripted.url).getResponse(USER, "m").catch((e) => e);
  assert.ok(error instanceof AuthenticationError);
  assert.match(error.message, /HTTP 401/);
  assert.equal(scripted.requests.length, 1);
});

Deno.test("getResponse() throws InvalidModelResponseError on malformed JSON", async () => {
  await using server = await startModelServer({ responder: () => ({ raw: '{"choices": [' }) });
  const error = await clientFor(server.url).getResponse(USER, "m").catch((e) => e);
  assert.ok(error instanceof InvalidModelResponseError);
  assert.match(error.message, /malformed JSON/);
});

Deno.test("getResponse() throws EmptyModelResponseError for a message with nothing in it", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "" }) });
  await assert.rejects(
    clientFor(server.url).getResponse(USER, "m"),
    EmptyModelResponseError,
  );
});

Deno.test("getResponse() throws InvalidModelResponseError when there are two choices", async () => {
  const choice = (i: number) => ({
    index: i,
    message: { role: "assistant", content: `answer ${i}` },
    finish_reason: "stop",
  });
  await using server = await startModelServer({
    responder: () => ({
      raw: JSON.stringify({ id: "x", object: "chat.completion", choices: [choice(0), choice(1)] }),
    }),
  });
  const error = await clientFor(server.url).getResponse(USER, "m").catch((e) => e);
  assert.ok(error instanceof InvalidModelResponseError);
  assert.equal(error instanceof EmptyModelResponseError, false);
  assert.match(error.message, /2 choices/);
});

Deno.test("getResponse() throws a ModelError mentioning the timeout when the reply is too slow", async () => {
  await using server = await startModelServer({ responder: () => ({ hang: true }) });
  const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 0.1 });
  const error = await client.getResponse(USER, "m").catch((e) => e);
  assert.ok(error instanceof ModelError);
  assert.match(error.message, /timed out/);
});

Deno.test("getResponse() throws EndpointUnreachableError naming the URL when nothing listens", async () => {
  const closed = await startModelServer({ responder: () => ({ content: "ok" }) });
  const url = closed.url;
  await closed.close();
  const client = new OpenAIChatClient({ base_url: url, max_retries: 1, timeout: 5 });
  const error = await client.getResponse(USER, "m").catch((e) => e);
  assert.ok(error instanceof EndpointUnreachableError);
  assert.ok(error.message.includes(url), error.message);
});

Deno.test("getResponse() rejects with the abort reason when its signal aborts a hanging request", async () => {
  await using server = await startModelServer({ responder: () => ({ hang: true }) });
  const controller = new AbortController();
  const pending = clientFor(server.url).getResponse(USER, "m", { signal: controller.signal });
  const timer = setTimeout(() => controller.abort(new Error("cancelled by test")), 50);
  const started = Date.now();
  await assert.rejects(pending, /cancelled by test/);
  clearTimeout(timer);
  assert.ok(Date.now() - started < 2_000);
  assert.equal(server.requests.length, 1);
});

Deno.test("getModelResponse() sends extra_headers and headers read from the state", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const client = new OpenAIChatClient({
    base_url: server.url,
    max_retries: 0,
    timeout: 5,
    extra_headers: { "x-team": "blue" },
    extra_headers_from_state: { "x-session-id": "session_id", "x-missing": "not_set" },
  });
  const env = new SingleTurnEnv({ dataset: [{ question: "q", answer: "a" }] });
  const [row] = (await env.getDataset()).toList();
  const state = env.initState(row, client, "m");
  state.session_id = 1234;
  const response = await env.getModelResponse(state, state.prompt);
  assert.equal(response.message.content, "ok");
  const headers = server.requests[0].headers;
  assert.equal(headers["x-team"], "blue");
  assert.equal(headers["x-session-id"], "1234");
  assert.equal("x-missing" in headers, false);
  assert.equal(state.usage.seen, true);
  assert.ok(state.usage.input_tokens > 0);
});

Deno.test("OpenAIChatClient reads the key from the variable named by api_key_var", async () => {
  const name = "VF_CLIENT_TEST_API_KEY";
  Deno.env.set(name, "sk-from-env");
  try {
    await using server = await startModelServer({
      responder: () => ({ content: "ok" }),
      apiKey: "sk-from-env",
    });
    const client = clientFor(server.url, { api_key_var: name });
    await client.getResponse(USER, "m");
    assert.equal(server.requests[0].headers.authorization, "Bearer sk-from-env");
  } finally {
    Deno.env.delete(name);
  }
  await using open = await startModelServer({ responder: () => ({ content: "ok" }) });
  await clientFor(open.url, { api_key_var: name }).getResponse(USER, "m");
  assert.equal(open.requests[0].headers.authorization, "Bearer EMPTY");
});

Deno.test("a header given as Authorization or User-Agent replaces vf's own instead of doubling it", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  for (const transport of ["auto", "fetch"] as const) {
    const client = new OpenAIChatClient({
      base_url: server.url,
      transport,
      extra_headers: { Authorization: "Bearer gateway-key" },
    });
    await client.getResponse(USER, "m", { headers: { "User-Agent": "my-agent/1" } });
  }
  for (const { headers } of server.requests) {
    assert.equal(headers.authorization, "Bearer gateway-key");
    assert.equal(headers["user-agent"], "my-agent/1");
  }
  assert.equal(server.requests.length, 2);
});

Deno.test("OpenAIChatClient rejects a base URL that is not http(s), naming it and the flag", () => {
  for (const base_url of ["not a url", "ftp://host/v1"]) {
    assert.throws(
      () => new OpenAIChatClient({ base_url }),
      (e: Error) =>
        e instanceof ConfigError && e.message.includes(`"${base_url}"`) &&
        /-b \/ base_url/.test(e.message),
    );
  }
});

Deno.test("getResponse() sends the JSON body with a bearer token and content type", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  await clientFor(server.url + "/", { api_key: "sk-1" }).getResponse(USER, "m");
  const request = server.requests[0];
  assert.equal(request.headers["content-type"], "application/json");
  assert.equal(request.headers.authorization, "Bearer sk-1");
  const body: Json = request.body;
  assert.deepEqual(body.messages, [{ role: "user", content: "hi" }]);
});
