import assert from "node:assert/strict";
import { withCacheSalt } from "./cache.ts";
import { type ChatClient, type ChatRequestOptions, OpenAIChatClient } from "./client.ts";
import type { Messages, Response } from "../types.ts";
import { textReply, withModelServer } from "../../tests/model_server.ts";

Deno.test("withCacheSalt() hands vf's HTTP client back as it is, and its calls still reach the endpoint", async () => {
  await withModelServer(() => textReply("hello"), async (server) => {
    const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0 });
    const salted = withCacheSalt(client, "1");
    assert.equal(salted, client);
    const response = await salted.getResponse([{ role: "user", content: "hi" }], "m");
    assert.equal(response.message.content, "hello");
  });
});

Deno.test("withCacheSalt() tells any other client's calls their salt, one wrapper per salt", async () => {
  const seen: ChatRequestOptions[] = [];
  const inner: ChatClient = {
    baseUrl: "http://example.invalid/v1",
    headersFromState: {},
    getResponse(_prompt: Messages, _model: string, options: ChatRequestOptions = {}) {
      seen.push(options);
      return Promise.resolve({ message: { role: "assistant", content: "ok" } } as Response);
    },
  };
  const salted = withCacheSalt(inner, "2");
  assert.notEqual(salted, inner);
  assert.equal(withCacheSalt(inner, "2"), salted);
  await salted.getResponse([{ role: "user", content: "hi" }], "m", { headers: { a: "b" } });
  assert.deepEqual(seen, [{ cacheSalt: "2", headers: { a: "b" } }]);
});
