/**
 * The model gateway as real clients meet it: the `openai` and `@anthropic-ai/sdk` npm
 * packages (pinned) talk to the gateway, whose rollout is answered through vf's model client
 * by the scripted model on loopback. Streams are relayed as the upstream produces them (the
 * first chunk reaches the program before the upstream has finished), keep-alive comments fill
 * long waits, and each dialect's fidelity gaps stay closed: usage when asked, mid-conversation
 * system messages, thinking, `n`, custom tools, tools that cannot be offered, HEAD, and
 * errors shaped by the route.
 * @module
 */
import assert from "node:assert/strict";
import http from "node:http";
import OpenAI from "npm:openai@7.60.0";
import Anthropic from "npm:@anthropic-ai/sdk@1.16.0";
import { Gateway, type GatewaySession } from "../lib/gateway/gateway.ts";
import type { ChatCall } from "../lib/gateway/chat.ts";
import { type ClientConfig, OpenAIChatClient } from "../lib/model/client.ts";
import {
  type ModelServerOptions,
  type Responder,
  startModelServer,
} from "../lib/model/local_server.ts";

/** A gateway session answered through vf's client by a scripted model; `calls` are what it got. */
async function rig(
  responder: Responder,
  options: {
    keepAliveMs?: number;
    client?: Partial<ClientConfig>;
    server?: Partial<ModelServerOptions>;
  } = {},
) {
  const server = await startModelServer({ ...options.server, responder });
  const gateway = new Gateway({ keepAliveMs: options.keepAliveMs });
  const port = await gateway.listen("127.0.0.1");
  const session: GatewaySession = gateway.open("scripted");
  const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0, ...options.client });
  const calls: ChatCall[] = [];
  session.handler = {
    chat: (call, onDelta) => {
      calls.push(call);
      return client.getResponse(call.messages, "scripted", {
        tools: call.tools,
        samplingArgs: call.sampling,
        onDelta,
      });
    },
  };
  const url = `http://127.0.0.1:${port}`;
  return {
    server,
    session,
    calls,
    url,
    openai: new OpenAI({ baseURL: `${url}/v1`, apiKey: session.modelSecret, maxRetries: 0 }),
    anthropic: new Anthropic({ baseURL: url, apiKey: session.modelSecret, maxRetries: 0 }),
    async [Symbol.asyncDispose]() {
      session.close();
      await gateway.close();
      await server.close();
    },
  };
}

/** The text of a `response` object's message items (streamed objects lack `output_text`). */
function outputText(response: { output: unknown[] }): string {
  return (response.output as { type: string; content?: { text?: string }[] }[])
    .filter((o) => o.type === "message")
    .flatMap((o) => o.content ?? []).map((c) => c.text ?? "").join("");
}

const slow = (content: string): Responder => () => ({ content, chunk_delay_ms: 250 });

Deno.test("gateway streams chat completions as the upstream produces them, usage last when asked", async () => {
  await using r = await rig(slow("one two three four five"));
  const stream = await r.openai.chat.completions.create({
    model: "scripted",
    messages: [{ role: "user", content: "count" }],
    stream: true,
    stream_options: { include_usage: true },
  });
  const arrivals: number[] = [];
  let text = "";
  let usage: unknown = null;
  for await (const chunk of stream) {
    arrivals.push(Date.now());
    text += chunk.choices[0]?.delta?.content ?? "";
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, "one two three four five");
  const finished = r.server.requests[0].finishedAt!;
  assert.ok(arrivals[0] < finished, "the first chunk arrived before the upstream finished");
  assert.ok(arrivals.filter((t) => t < finished).length >= 3, "chunks flowed while it ran");
  assert.ok((usage as { completion_tokens: number }).completion_tokens > 0);
  // Upstream was asked to stream, with usage.
  assert.equal(r.server.requests[0].body.stream, true);
});

Deno.test("gateway streams Anthropic Messages and Responses events as the upstream produces them", async () => {
  await using r = await rig(slow("alpha beta gamma delta"));
  const arrivals: number[] = [];
  let text = "";
  const messages = r.anthropic.messages.stream({
    model: "scripted",
    max_tokens: 100,
    messages: [{ role: "user", content: "go" }],
  });
  messages.on("text", (piece) => {
    arrivals.push(Date.now());
    text += piece;
  });
  const final = await messages.finalMessage();
  assert.equal(text, "alpha beta gamma delta");
  assert.equal(final.stop_reason, "end_turn");
  assert.ok(arrivals[0] < r.server.requests[0].finishedAt!);

  const responses = await r.openai.responses.create({
    model: "scripted",
    input: "go",
    stream: true,
  });
  const deltas: number[] = [];
  let completed = "";
  for await (const event of responses) {
    if (event.type === "response.output_text.delta") deltas.push(Date.now());
    if (event.type === "response.completed") completed = outputText(event.response);
  }
  assert.equal(completed, "alpha beta gamma delta");
  assert.ok(deltas[0] < r.server.requests[1].finishedAt!);
});

Deno.test("gateway sends keep-alive comments while the upstream model has not answered", async () => {
  await using r = await rig(() => ({ content: "late", delay_ms: 1_500 }), { keepAliveMs: 200 });
  const res = await fetch(`${r.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${r.session.modelSecret}` },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "q" }], stream: true }),
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-length"), null);
  const body = await res.text();
  assert.ok(body.startsWith(": keep-alive\n\n"), body.slice(0, 80));
  assert.ok(body.indexOf(": keep-alive") < body.indexOf('"late"'));
  assert.ok(body.endsWith("data: [DONE]\n\n"));
});

Deno.test("gateway Anthropic route: a mid-conversation system message, thinking as reasoning_effort and thinking blocks back, server tools and context edits recorded", async () => {
  await using r = await rig(() => ({ content: "done", reasoning_content: "let me see" }), {
    client: { reasoning: true },
  });
  const reply = await r.anthropic.beta.messages.create({
    model: "scripted",
    max_tokens: 32000,
    thinking: { type: "enabled", budget_tokens: 2048 },
    context_management: { edits: [{ type: "clear_tool_uses_20250919" }] },
    tools: [{ type: "web_search_20250305", name: "web_search" }],
    messages: [
      { role: "user", content: "hi" },
      // deno-lint-ignore no-explicit-any
      { role: "system", content: "Be brief." } as any,
      { role: "user", content: "again" },
    ],
  }, { timeout: 60_000 });
  const upstream = r.server.requests[0].body;
  assert.deepEqual(upstream.messages.map((m) => m.role), ["user", "system", "user"]);
  assert.equal(upstream.reasoning_effort, "low");
  assert.equal(upstream.max_completion_tokens, 32000);
  assert.deepEqual(reply.content.map((b) => b.type), ["thinking", "text"]);
  assert.equal((reply.content[0] as { thinking: string }).thinking, "let me see");
  assert.deepEqual(r.calls[0].notHonoured, [
    { name: "web_search", type: "web_search_20250305" },
    { name: "clear_tool_uses_20250919", type: "context_management" },
  ]);
  assert.equal(upstream.tools, undefined);
});

Deno.test("gateway Anthropic route: thinking is not sent to an endpoint not set to take reasoning_effort", async () => {
  await using r = await rig(() => ({ content: "done" }));
  const reply = await r.anthropic.messages.create({
    model: "scripted",
    max_tokens: 1000,
    thinking: { type: "enabled", budget_tokens: 20000 },
    messages: [{ role: "user", content: "hi" }],
  });
  assert.deepEqual(reply.content.map((b) => b.type), ["text"]);
  assert.equal(r.server.requests[0].body.reasoning_effort, undefined);
  assert.equal(r.server.requests[0].body.program_reasoning_effort, undefined);
});

Deno.test("gateway Anthropic route: Claude Code's max_tokens 32000 is clamped to max_output_tokens, or lowered to what a small context fits", async () => {
  // Streamed, as Claude Code asks.
  const ask = (r: { anthropic: Anthropic }) =>
    r.anthropic.messages.stream({
      model: "scripted",
      max_tokens: 32000,
      messages: [{ role: "user", content: "hi" }],
    }).finalMessage();
  {
    await using r = await rig(() => ({ content: "clamped" }), {
      client: { max_output_tokens: 4096 },
    });
    const reply = await ask(r);
    assert.equal((reply.content[0] as { text: string }).text, "clamped");
    assert.equal(r.server.requests[0].body.max_completion_tokens, 4096);
  }
  {
    // A vLLM served with max_model_len 8192 refuses 32000 and names its limit: sent once more.
    await using r = await rig(() => ({ content: "fits" }), { server: { maxModelLen: 8192 } });
    const reply = await ask(r);
    assert.equal((reply.content[0] as { text: string }).text, "fits");
    const cap = r.server.requests[0].body.max_completion_tokens as number;
    assert.ok(cap < 8192 && cap > 8000, String(cap));
    assert.equal(r.server.requests.length, 1);
  }
});

Deno.test("gateway errors take the route's shape: a bad key on the Anthropic route is Anthropic's authentication_error", async () => {
  await using r = await rig(() => ({ content: "x" }));
  const bad = new Anthropic({ baseURL: r.url, apiKey: "not-the-secret", maxRetries: 0 });
  const error = await bad.messages.create({
    model: "m",
    max_tokens: 5,
    messages: [{ role: "user", content: "q" }],
  }).catch((e) => e);
  assert.ok(error instanceof Anthropic.AuthenticationError, String(error));
  // deno-lint-ignore no-explicit-any
  const shape = error.error as any;
  assert.equal(shape.type, "error");
  assert.equal(shape.error.type, "authentication_error");
  const openaiBad = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: "nope", maxRetries: 0 });
  const e2 = await openaiBad.chat.completions.create({
    model: "m",
    messages: [{ role: "user", content: "q" }],
  }).catch((e) => e);
  assert.ok(e2 instanceof OpenAI.AuthenticationError);
  assert.equal(e2.type, "authentication_error");
});

Deno.test("gateway answers n > 1 with that many choices, each its own model call", async () => {
  let i = 0;
  await using r = await rig(() => ({ content: `choice ${i++}` }));
  const reply = await r.openai.chat.completions.create({
    model: "scripted",
    n: 2,
    max_completion_tokens: 50,
    messages: [{ role: "user", content: "q" }],
  });
  assert.deepEqual(reply.choices.map((c) => [c.index, c.message.content]), [
    [0, "choice 0"],
    [1, "choice 1"],
  ]);
  assert.equal(r.server.requests.length, 2);
  assert.equal(r.server.requests[0].body.n, undefined);
  assert.equal(r.server.requests[0].body.max_completion_tokens, 50);
  const streamed = await r.openai.chat.completions.create({
    model: "scripted",
    n: 2,
    stream: true,
    messages: [{ role: "user", content: "q" }],
  });
  const texts = ["", ""];
  for await (const chunk of streamed) {
    for (const c of chunk.choices) texts[c.index] += c.delta.content ?? "";
  }
  assert.deepEqual(texts, ["choice 2", "choice 3"]);
});

Deno.test("gateway Responses route: custom tools round-trip as custom_tool_call items; a tool it cannot offer is recorded", async () => {
  await using r = await rig((req) =>
    req.body.messages.some((m) => m.role === "tool") ? { content: "patched" } : {
      tool_calls: [{
        id: "call_1",
        name: "apply_patch",
        arguments: { input: "*** Begin Patch" },
      }],
    }
  );
  const tools = [
    { type: "custom" as const, name: "apply_patch", description: "Apply a patch" },
    { type: "web_search" as const },
  ];
  const first = await r.openai.responses.create({ model: "scripted", input: "fix it", tools });
  const call = first.output.find((o) => o.type === "custom_tool_call");
  assert.ok(call && call.type === "custom_tool_call", JSON.stringify(first.output));
  assert.equal(call.input, "*** Begin Patch");
  assert.deepEqual(r.calls[0].notHonoured, [{ name: "web_search", type: "web_search" }]);
  const upstreamTool = r.server.requests[0].body.tools![0];
  assert.equal(upstreamTool.function!.name, "apply_patch");

  const stream = await r.openai.responses.create({
    model: "scripted",
    tools,
    stream: true,
    input: [
      { role: "user", content: "fix it" },
      {
        type: "custom_tool_call",
        call_id: "call_1",
        name: "apply_patch",
        input: "*** Begin Patch",
      },
      { type: "custom_tool_call_output", call_id: "call_1", output: "Done" },
    ],
  });
  let done = "";
  for await (const event of stream) {
    if (event.type === "response.completed") done = outputText(event.response);
  }
  assert.equal(done, "patched");
  const sent = r.server.requests[1].body.messages;
  assert.equal(
    sent[1].tool_calls![0].function.arguments,
    JSON.stringify({ input: "*** Begin Patch" }),
  );
  assert.deepEqual([sent[2].role, sent[2].content], ["tool", "Done"]);

  // Streamed, a custom tool call arrives as its own item.
  const streamedCall = await r.openai.responses.create({
    model: "scripted",
    tools,
    stream: true,
    input: "fix it again",
  });
  let item: unknown = null;
  for await (const event of streamedCall) {
    if (event.type === "response.output_item.done") item = event.item;
  }
  assert.deepEqual(
    [(item as { type: string }).type, (item as { input: string }).input],
    ["custom_tool_call", "*** Begin Patch"],
  );
});

Deno.test("gateway answers HEAD without a body, which Node's HTTP client reads cleanly", async () => {
  await using r = await rig(() => ({ content: "x" }));
  const { port } = new URL(r.url);
  for (const path of ["/health", "/v1/models", "/v1/messages"]) {
    const result = await new Promise<{ status: number; body: string; length: string }>(
      (resolve, reject) => {
        const req = http.request({
          host: "127.0.0.1",
          port: Number(port),
          method: "HEAD",
          path,
          headers: { authorization: `Bearer ${r.session.modelSecret}` },
        }, (res) => {
          let body = "";
          res.on("data", (d) => body += d);
          res.on("end", () =>
            resolve({
              status: res.statusCode!,
              body,
              length: String(res.headers["content-length"]),
            }));
          res.on("error", reject);
        });
        req.on("error", reject);
        req.end();
      },
    );
    assert.equal(result.body, "", path);
    assert.ok(Number(result.length) > 0, path);
    assert.equal(result.status, path === "/v1/messages" ? 404 : 200, path);
  }
});
