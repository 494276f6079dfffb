/**
 * vf's MCP client against a real streamable-HTTP server (the SDK's, on loopback): headers
 * from `${VAR}` templates resolved when it connects and never kept, a bearer token from the
 * environment through OAuth, no `notifications/cancelled` for calls that already finished when
 * the rollout's signal ends, one for a call still running; and what bad entries are told.
 * @module
 */
import assert from "node:assert/strict";
import { Toolbox } from "../lib/tools/toolbox.ts";
import { loadToolsets } from "../lib/tools/config.ts";
import type { ToolsetSpec } from "../lib/tools/toolset.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

/** A stateless SDK server (`slow` answers when it is disposed); every message and header kept. */
async function startServer() {
  const { McpServer } = await import("npm:@modelcontextprotocol/sdk@^1.32.0/server/mcp.js");
  const { WebStandardStreamableHTTPServerTransport } = await import(
    "npm:@modelcontextprotocol/sdk@^1.32.0/server/webStandardStreamableHttp.js"
  );
  const messages: Json[] = [];
  // A stateless server cannot cancel the slow call (each request has its own); it ends here.
  const released = Promise.withResolvers<void>();
  const auth: Array<string | null> = [];
  const custom: Array<string | null> = [];
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async (req) => {
    auth.push(req.headers.get("authorization"));
    custom.push(req.headers.get("x-team"));
    if (req.method === "POST") {
      const body = await req.clone().json();
      messages.push(...(Array.isArray(body) ? body : [body]));
    }
    const mcp = new McpServer({ name: "probe", version: "1" });
    mcp.registerTool("quick", { description: "Answers at once", inputSchema: {} }, () => ({
      content: [{ type: "text", text: "done" }],
    }));
    mcp.registerTool(
      "slow",
      { description: "Answers when released", inputSchema: {} },
      () => released.promise.then(() => ({ content: [{ type: "text" as const, text: "late" }] })),
    );
    const transport = new WebStandardStreamableHTTPServerTransport({
      sessionIdGenerator: undefined,
      enableJsonResponse: true,
    });
    await mcp.connect(transport);
    // The slow call's request, abandoned by the client, ends with the server.
    return await Promise.race([
      transport.handleRequest(req),
      released.promise.then(() => new Response(null, { status: 503 })),
    ]);
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}/mcp`,
    messages,
    auth,
    custom,
    cancellations: () => messages.filter((m) => m.method === "notifications/cancelled"),
    [Symbol.asyncDispose]: () => {
      released.resolve();
      return server.shutdown();
    },
  };
}

function withEnv(vars: Record<string, string>): Disposable {
  const before = Object.fromEntries(Object.keys(vars).map((k) => [k, Deno.env.get(k)]));
  for (const [k, v] of Object.entries(vars)) Deno.env.set(k, v);
  return {
    [Symbol.dispose]() {
      for (const [k, v] of Object.entries(before)) {
        if (v === undefined) Deno.env.delete(k);
        else Deno.env.set(k, v);
      }
    },
  };
}

Deno.test("a url toolset sends its headers with ${VAR} templates resolved from the environment when it connects; the spec keeps the template", async () => {
  await using server = await startServer();
  using _ = withEnv({ VF_MCP_TEST_KEY: "k-123", VF_MCP_TEST_TEAM: "evals" });
  const spec: ToolsetSpec = {
    name: "probe",
    url: server.url,
    headers: {
      Authorization: "Bearer ${VF_MCP_TEST_KEY}",
      "X-Team": "${VF_MCP_TEST_TEAM}",
    },
  };
  const box = await Toolbox.open([spec], { state: {} });
  try {
    assert.equal((await box.call("probe_quick", {})).text, "done");
  } finally {
    await box.close();
  }
  assert.ok(server.auth.length >= 3, String(server.auth.length));
  assert.ok(server.auth.every((a) => a === "Bearer k-123"), JSON.stringify(server.auth));
  assert.ok(server.custom.every((a) => a === "evals"), JSON.stringify(server.custom));
  assert.equal(spec.headers!.Authorization, "Bearer ${VF_MCP_TEST_KEY}");
});

Deno.test("a url toolset's oauth.token comes from the environment and is sent as a bearer token; an unset variable is an error naming the toolset and field", async () => {
  await using server = await startServer();
  using _ = withEnv({ VF_MCP_TEST_TOKEN: "tok-9" });
  const box = await Toolbox.open(
    [{ name: "probe", url: server.url, oauth: { token: "${VF_MCP_TEST_TOKEN}" } }],
    { state: {} },
  );
  try {
    assert.equal((await box.call("probe_quick", {})).text, "done");
  } finally {
    await box.close();
  }
  assert.ok(server.auth.every((a) => a === "Bearer tok-9"), JSON.stringify(server.auth));
  await assert.rejects(
    Toolbox.open(
      [{ name: "probe", url: server.url, headers: { "X-Key": "${VF_MCP_TEST_UNSET_VAR}" } }],
      { state: {} },
    ),
    /Toolset "probe" did not start.*Toolset "probe" headers\.X-Key: Environment variable "VF_MCP_TEST_UNSET_VAR" is not set/,
  );
});

Deno.test("calls that finished get no notifications/cancelled when the rollout's signal ends; a call still running does", async () => {
  await using server = await startServer();
  const rollout = new AbortController();
  const box = await Toolbox.open([{ name: "probe", url: server.url }], {
    state: {},
    signal: rollout.signal,
  });
  try {
    for (let i = 0; i < 3; i++) {
      assert.equal((await box.call("probe_quick", {}, rollout.signal)).text, "done");
    }
    const running = box.call("probe_slow", {}, { signal: rollout.signal });
    // The slow call reached the server before the rollout ends.
    const deadline = Date.now() + 30_000;
    while (!server.messages.some((m) => m.params?.name === "slow")) {
      assert.ok(Date.now() < deadline, "the slow call never reached the server");
      await new Promise((r) => setTimeout(r, 20));
    }
    rollout.abort(new Error("rollout over"));
    await assert.rejects(running, /rollout over/);
    // The cancellation is one POST; let it land.
    while (!server.cancellations().length && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
    }
  } finally {
    await box.close();
  }
  const calls = server.messages.filter((m) => m.method === "tools/call");
  const slow = calls.find((m) => m.params.name === "slow");
  assert.deepEqual(server.cancellations().map((m) => m.params.requestId), [slow.id]);
});

Deno.test("bad headers, oauth and elicitation entries name their field", async () => {
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [
      { name: "a", command: "x", headers: { A: "b" } },
      /env\.toolsets\[0\]\.headers: only a url toolset sends HTTP headers/,
    ],
    [
      { name: "a", url: "http://x/mcp", headers: { A: 1 } },
      /env\.toolsets\[0\]\.headers\.A: expected a string/,
    ],
    [
      { name: "a", url: "http://x/mcp", oauth: { password: "p" } },
      /env\.toolsets\[0\]\.oauth\.password: unknown key; oauth takes "token"/,
    ],
    [
      { name: "a", url: "http://x/mcp", oauth: { client_id: "c" } },
      /env\.toolsets\[0\]\.oauth: give client_secret or private_key with client_id/,
    ],
    [
      { name: "a", url: "http://x/mcp", oauth: { token: "t", client_id: "c" } },
      /env\.toolsets\[0\]\.oauth: give a token or client credentials, not both/,
    ],
    [
      { name: "a", url: "http://x/mcp", elicitation: "accept" },
      /env\.toolsets\[0\]\.elicitation: expected "decline", "cancel" or \{ accept = \{ \.\.\. \} \}/,
    ],
    [
      { name: "a", url: "http://x/mcp", elicitation: { answer: {} } },
      /env\.toolsets\[0\]\.elicitation: expected "decline", "cancel"/,
    ],
    [{ name: "a", url: "http://x/mcp", images: "yes" }, /env\.toolsets\[0\]\.images: expected/],
  ];
  for (const [entry, pattern] of cases) {
    await assert.rejects(loadToolsets([entry], "."), pattern, JSON.stringify(entry));
  }
  const [ok] = await loadToolsets([{
    name: "a",
    url: "http://x/mcp",
    headers: { A: "${B}" },
    oauth: { client_id: "c", client_secret: "${S}", scope: "read" },
    elicitation: { accept: { name: "vf" } },
    images: true,
  }], ".");
  assert.deepEqual(ok, {
    name: "a",
    url: "http://x/mcp",
    headers: { A: "${B}" },
    oauth: { client_id: "c", client_secret: "${S}", scope: "read" },
    elicitation: { accept: { name: "vf" } },
    images: true,
  });
});
