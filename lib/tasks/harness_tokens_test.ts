import assert from "node:assert/strict";
import { OpenAIChatClient } from "../model/client.ts";
import { startModelServer, textReply, toolCallReply } from "../../tests/model_server.ts";
import { toyPromptTokens } from "../model/local_server.ts";
import { MessageGraph } from "../graph.ts";
import {
  assistantMessage,
  callModel,
  type HarnessContext,
  type HarnessRecorder,
} from "./harness.ts";

Deno.test("callModel() keeps each call's tokens in the recorder's graph, once: the call records drop them", async () => {
  await using server = await startModelServer({
    responder: ({ body }) =>
      body.messages.some((m) => m.role === "tool")
        ? textReply("done")
        : toolCallReply("bash", { command: "ls" }, { id: "c1" }),
  });
  const recorder: HarnessRecorder = {
    messages: [{ role: "user", content: "List the files." }],
    model_calls: [],
    tool_calls: [],
    stop_condition: null,
    usage: { input_tokens: 0, output_tokens: 0 },
    metrics: {},
    graph: new MessageGraph(),
  };
  // The fields callModel reads; the rest of a context belongs to a sandboxed rollout.
  const ctx = {
    client: new OpenAIChatClient({ base_url: server.url, max_retries: 0, timeout: 5 }),
    model: "m",
    samplingArgs: { return_token_ids: "required" },
    recorder,
    maxTurns: 5,
    toolTimeoutMs: 1000,
    state: {},
  } as unknown as HarnessContext;
  const first = await callModel(ctx, 0, []);
  assert.ok(first.tokens, "the caller sees the call's tokens");
  recorder.messages.push(assistantMessage(first));
  recorder.messages.push({ role: "tool", tool_call_id: "c1", content: "a.txt" });
  const second = await callModel(ctx, 1, []);

  assert.ok(recorder.model_calls.every((c) => c.response && c.response.tokens === undefined));
  const seq = recorder.graph!.tokens();
  assert.deepEqual(seq.token_ids, [
    ...toyPromptTokens(server.requests[1].body),
    ...second.tokens!.completion_ids,
  ]);
  assert.equal(
    seq.mask.filter(Boolean).length,
    first.tokens!.completion_ids.length + second.tokens!.completion_ids.length,
  );
});
