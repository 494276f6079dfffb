/**
 * An endpoint's output limit: the cap a request asks for is clamped to `max_output_tokens`,
 * lowered once to what fits when the endpoint refuses it and names its limit (vLLM's and
 * OpenAI's wording, served by the scripted model), and recorded on the response; a program's
 * reasoning effort goes only to an endpoint set to take it.
 * @module
 */
import assert from "node:assert/strict";
import { fittingOutputCap, OpenAIChatClient, PROGRAM_REASONING_EFFORT } from "./client.ts";
import { OverlongPromptError } from "../errors.ts";
import { startModelServer } from "./local_server.ts";
import { toyPromptTokens } from "./toy_tokenizer.ts";
import { resolveClient } from "../cli/resolve.ts";
import { callModel, type HarnessContext, type HarnessRecorder } from "../tasks/harness.ts";
import type { Messages } from "../types.ts";

const USER: Messages = [{ role: "user", content: "hi" }];
/** The prompt's length in the scripted model's tokens, as vLLM would count it. */
const PROMPT = toyPromptTokens({ model: "m", messages: [{ role: "user", content: "hi" }] }).length;

Deno.test("fittingOutputCap() reads the limit from vLLM's and OpenAI's refusals", () => {
  const cases: [string, number, number | null][] = [
    [
      "'max_tokens' or 'max_completion_tokens' is too large: 32000. This model's maximum context " +
      "length is 8192 tokens and your request has 50 input tokens (32000 > 8192 - 50). None",
      32000,
      8142,
    ],
    [
      "This model's maximum context length is 8192 tokens. However, you requested 32064 tokens " +
      "(64 in the messages, 32000 in the completion). Please reduce the length of the messages " +
      "or completion.",
      32000,
      8128,
    ],
    [
      "max_tokens is too large: 32000. This model supports at most 16384 completion tokens, " +
      "whereas you provided 32000.",
      32000,
      16384,
    ],
    ["max_tokens must be at most 4096", 32000, 4096],
    [
      "The parameter `max_completion_tokens` specified in the request are not valid: integer " +
      "above maximum value, expected a value <= 12288, but got 32000 instead.",
      32000,
      12288,
    ],
    // The prompt alone fills the context: no cap fits.
    [
      "This model's maximum context length is 8192 tokens. However, your request has 9000 input " +
      "tokens. Please reduce the length of the input messages.",
      32000,
      null,
    ],
    [
      "'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context " +
      "length is 8192 tokens and your request has 8192 input tokens (100 > 8192 - 8192).",
      100,
      null,
    ],
    ["temperature must be at most 2", 32000, null],
    ["max_tokens is too large: 100. This model supports at most 4096 completion tokens", 100, null],
  ];
  for (const [text, sent, want] of cases) assert.equal(fittingOutputCap(text, sent), want, text);
});

Deno.test("a cap over the endpoint's max_output_tokens is sent clamped and recorded", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const client = new OpenAIChatClient({ base_url: server.url, max_output_tokens: 4096 });
  const r = await client.getResponse(USER, "m", { samplingArgs: { max_tokens: 32000 } });
  assert.equal(server.requests[0].body.max_completion_tokens, 4096);
  assert.deepEqual(r.output_cap, { requested: 32000, sent: 4096, reason: "max_output_tokens" });
  // A cap under the limit, and no cap at all, go as asked.
  const under = await client.getResponse(USER, "m", { samplingArgs: { max_tokens: 100 } });
  await client.getResponse(USER, "m");
  assert.equal(server.requests[1].body.max_completion_tokens, 100);
  assert.equal(server.requests[2].body.max_completion_tokens, undefined);
  assert.equal(under.output_cap, undefined);
});

Deno.test("a cap a vLLM-like endpoint refuses is lowered to context minus prompt and sent once more", async () => {
  await using server = await startModelServer({
    responder: () => ({ content: "ok" }),
    maxModelLen: 512,
  });
  // No retries of failures: the lowered cap is not one of them.
  const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0 });
  const r = await client.getResponse(USER, "m", { samplingArgs: { max_tokens: 32000 } });
  assert.equal(r.message.content, "ok");
  assert.equal(server.requests.length, 1, "the refused request never reached the responder");
  assert.equal(server.requests[0].body.max_completion_tokens, 512 - PROMPT);
  assert.deepEqual(r.output_cap, {
    requested: 32000,
    sent: 512 - PROMPT,
    reason: "endpoint_limit",
  });
  assert.equal(r.retries, undefined);

  // Streamed the same way.
  const pieces: string[] = [];
  const s = await client.getResponse(USER, "m", {
    samplingArgs: { max_completion_tokens: 9000 },
    onDelta: (d) => void (d.content && pieces.push(d.content)),
  });
  assert.equal(pieces.join(""), "ok");
  assert.equal(server.requests[1].body.max_completion_tokens, 512 - PROMPT);
  assert.equal(s.output_cap?.reason, "endpoint_limit");
});

Deno.test("a cap over an OpenAI-like model's completion limit is lowered to it", async () => {
  await using server = await startModelServer({
    responder: () => ({ content: "ok" }),
    maxCompletionTokens: 16384,
  });
  const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0 });
  const r = await client.getResponse(USER, "m", { samplingArgs: { max_tokens: 32000 } });
  assert.equal(server.requests[0].body.max_completion_tokens, 16384);
  assert.deepEqual(r.output_cap, { requested: 32000, sent: 16384, reason: "endpoint_limit" });
});

Deno.test("a clamped cap the endpoint still refuses is lowered from the clamp; a prompt over the context stays overlong", async () => {
  await using server = await startModelServer({
    responder: () => ({ content: "ok" }),
    maxModelLen: 300,
  });
  const client = new OpenAIChatClient({
    base_url: server.url,
    max_retries: 0,
    max_output_tokens: 8192,
  });
  const r = await client.getResponse(USER, "m", { samplingArgs: { max_tokens: 32000 } });
  assert.deepEqual(r.output_cap, {
    requested: 32000,
    sent: 300 - PROMPT,
    reason: "endpoint_limit",
  });
  const long: Messages = [{ role: "user", content: "x".repeat(400) }];
  await assert.rejects(
    client.getResponse(long, "m", { samplingArgs: { max_tokens: 10 } }),
    OverlongPromptError,
  );
  assert.equal(server.requests.length, 1);
});

Deno.test("a program's reasoning effort is sent only to an endpoint set to take it; the run's always", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const plain = new OpenAIChatClient({ base_url: server.url });
  const asked = { [PROGRAM_REASONING_EFFORT]: "low" };
  const r = await plain.getResponse(USER, "m", { samplingArgs: asked });
  const sent = server.requests[0].body;
  assert.equal(sent.reasoning_effort, undefined);
  assert.equal(sent[PROGRAM_REASONING_EFFORT], undefined);
  assert.deepEqual(r.not_honoured, [{ name: "low", type: "reasoning_effort" }]);

  const reasoning = new OpenAIChatClient({ base_url: server.url, reasoning: true });
  const r2 = await reasoning.getResponse(USER, "m", { samplingArgs: asked });
  assert.equal(server.requests[1].body.reasoning_effort, "low");
  assert.equal(server.requests[1].body[PROGRAM_REASONING_EFFORT], undefined);
  assert.equal(r2.not_honoured, undefined);

  // The run's own effort wins over the program's, and is sent without `reasoning`.
  const r3 = await plain.getResponse(USER, "m", {
    samplingArgs: { ...asked, reasoning_effort: "high" },
  });
  assert.equal(server.requests[2].body.reasoning_effort, "high");
  assert.equal(r3.not_honoured, undefined);
});

Deno.test("resolveClient() takes max_output_tokens and reasoning from [client] and from the endpoint's registry entry", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/endpoints.toml`;
    await Deno.writeTextFile(
      path,
      `[[endpoint]]
endpoint_id = "small"
model = "qwen-small"
url = "${server.url}"
key = "VF_TEST_NO_KEY"
max_output_tokens = 2048
reasoning = true
`,
    );
    const asked = { max_tokens: 32000, [PROGRAM_REASONING_EFFORT]: "medium" };
    const fromRegistry = await resolveClient({ model: "small", endpoints_path: path });
    await fromRegistry.client.getResponse(USER, fromRegistry.model, { samplingArgs: asked });
    assert.equal(server.requests[0].body.max_completion_tokens, 2048);
    assert.equal(server.requests[0].body.reasoning_effort, "medium");
    // [client] wins over the entry.
    const fromClient = await resolveClient({
      model: "small",
      endpoints_path: path,
      client: { max_output_tokens: 1000, reasoning: false },
    });
    await fromClient.client.getResponse(USER, fromClient.model, { samplingArgs: asked });
    assert.equal(server.requests[1].body.max_completion_tokens, 1000);
    assert.equal(server.requests[1].body.reasoning_effort, undefined);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("callModel() lists a reasoning effort not sent beside the gateway's not_honoured, and keeps output_cap on the call", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  const recorder = {
    messages: structuredClone(USER),
    model_calls: [],
    tool_calls: [],
    stop_condition: null,
    usage: { input_tokens: 0, output_tokens: 0 },
    metrics: {},
  } as unknown as HarnessRecorder;
  const ctx = {
    client: new OpenAIChatClient({ base_url: server.url, max_output_tokens: 64 }),
    model: "m",
    samplingArgs: { max_tokens: 32000, [PROGRAM_REASONING_EFFORT]: "high" },
    recorder,
    maxTurns: 5,
    toolTimeoutMs: 1000,
    state: {},
  } as unknown as HarnessContext;
  await callModel(ctx, 0, [], {
    notHonoured: [{ name: "web_search", type: "web_search_20250305" }],
  });
  const call = recorder.model_calls[0];
  assert.deepEqual(call.not_honoured, [
    { name: "web_search", type: "web_search_20250305" },
    { name: "high", type: "reasoning_effort" },
  ]);
  assert.deepEqual(call.response?.output_cap, {
    requested: 32000,
    sent: 64,
    reason: "max_output_tokens",
  });
});
