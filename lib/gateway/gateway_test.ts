/**
 * The gateway over real sockets on loopback: model calls by secret (retries replayed,
 * duplicates in flight coalesced, streaming, refusals after the rollout ends) and the egress
 * proxy (credentials, allow and block per phase, refusals recorded).
 */
import assert from "node:assert/strict";
import net from "node:net";
import { Gateway } from "./gateway.ts";
import { composePolicies, namedByAllow, parseNetworkPolicy, policyAllows } from "./policy.ts";
import { addressForms, isHostAlias, isReservedAddress, OwnAddresses } from "./own_host.ts";
import type { Response } from "../types.ts";

function reply(text: string): Response {
  return {
    id: "r1",
    created: 1,
    model: "upstream-model",
    usage: { prompt_tokens: 3, completion_tokens: 2, reasoning_tokens: 0, total_tokens: 5 },
    message: {
      role: "assistant",
      content: text,
      tool_calls: null,
      finish_reason: "stop",
      is_truncated: false,
    },
  };
}

async function serveText(text: string): Promise<Deno.HttpServer<Deno.NetAddr>> {
  const ready = Promise.withResolvers<void>();
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => ready.resolve() },
    () => new globalThis.Response(text),
  );
  await ready.promise;
  return server;
}

/** One raw HTTP/1.1 exchange through `port` (the response text, to the server's close). */
function raw(port: number, request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: "127.0.0.1", port });
    let out = "";
    socket.on("data", (d) => (out += d.toString("latin1")));
    socket.on("end", () => resolve(out));
    socket.on("error", reject);
    socket.write(request);
  });
}

Deno.test("gateway: model calls need the rollout's secret; retries replay, duplicates coalesce, streams work, an ended rollout's secret is refused", async () => {
  const gateway = new Gateway();
  try {
    const port = await gateway.listen("127.0.0.1");
    const session = gateway.open("m");
    let calls = 0;
    const gate = Promise.withResolvers<void>();
    session.handler = {
      chat: async (call) => {
        calls++;
        await gate.promise;
        return reply(`echo ${call.messages.at(-1)!.content}`);
      },
    };
    const url = `http://127.0.0.1:${port}/v1/chat/completions`;
    const body = JSON.stringify({ model: "x", messages: [{ role: "user", content: "hi" }] });
    const post = (headers: Record<string, string>, text = body) =>
      fetch(url, {
        method: "POST",
        body: text,
        headers: { "content-type": "application/json", ...headers },
      });

    const wrong = await post({ authorization: "Bearer nope" });
    assert.equal(wrong.status, 401);
    await wrong.body?.cancel();

    const auth = { authorization: `Bearer ${session.modelSecret}` };
    // An SDK retry of a request still in flight (or just answered): one model call answers
    // both, whichever way the two arrive.
    const first = post(auth);
    const second = post({ ...auth, "x-stainless-retry-count": "1" });
    gate.resolve();
    const [a, b] = await Promise.all([(await first).json(), (await second).json()]);
    assert.equal(calls, 1);
    assert.equal(a.choices[0].message.content, "echo hi");
    assert.deepEqual(b, a);
    assert.equal(a.model, "upstream-model");
    assert.deepEqual(a.usage, { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 });

    // A transport retry of the request already answered is replayed, not sampled again.
    const replay = await (await post({ ...auth, "x-stainless-retry-count": "2" })).json();
    assert.equal(calls, 1);
    assert.deepEqual(replay, a);
    // The same body sent fresh (no retry header) is a new call.
    await (await post({ "x-api-key": session.modelSecret })).json();
    assert.equal(calls, 2);

    const stream = await post(
      auth,
      JSON.stringify({
        messages: [{ role: "user", content: "s" }],
        stream: true,
        stream_options: { include_usage: true },
      }),
    );
    assert.match(stream.headers.get("content-type") ?? "", /text\/event-stream/);
    const events = (await stream.text()).split("\n\n").filter(Boolean).map((e) => e.slice(6));
    assert.equal(events.at(-1), "[DONE]");
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? "").join(""), "echo s");
    assert.equal(chunks.find((c) => c.choices[0]?.finish_reason)?.choices[0].finish_reason, "stop");
    assert.equal(chunks.at(-1).usage.total_tokens, 5);

    const bad = await post(auth, "{not json");
    assert.equal(bad.status, 400);
    assert.match((await bad.json()).error.message, /not JSON/);

    session.close();
    const late = await post(auth);
    assert.equal(late.status, 401); // the secret is gone with the session
    await late.body?.cancel();
    assert.equal(gateway.sessions, 0);
  } finally {
    await gateway.close();
  }
});

Deno.test("gateway: the egress proxy lets out only what the phase's policy allows and records every refusal", async () => {
  const gateway = new Gateway();
  await using allowed = await serveText("from A");
  await using other = await serveText("from B");
  try {
    const port = await gateway.listen("127.0.0.1");
    const session = gateway.open("m");
    const a = allowed.addr.port;
    const b = other.addr.port;
    const cred = btoa(`vf:${session.proxySecret}`);
    const get = (target: number, auth = cred) =>
      raw(
        port,
        `GET http://127.0.0.1:${target}/x HTTP/1.1\r\nHost: 127.0.0.1:${target}\r\n` +
          `Proxy-Authorization: Basic ${auth}\r\n\r\n`,
      );

    assert.match(await get(a, btoa("vf:wrong")), /^HTTP\/1\.1 407/);

    // Everything allowed, but loopback only when a rule names it (the evaluator itself, or
    // cloud metadata, is never reached through a wildcard), whatever spelling it comes in.
    session.setPhase("setup", parseNetworkPolicy({}, "t"));
    assert.match(await get(b), /^HTTP\/1\.1 403[\s\S]*loopback, link-local or unspecified/);
    const numeric = await raw(
      port,
      `GET http://2130706433:${b}/x HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic ${cred}\r\n\r\n`,
    );
    assert.match(numeric, /^HTTP\/1\.1 403/);
    session.setPhase("setup", parseNetworkPolicy({ allow: [`127.0.0.1:${b}`] }, "t"));
    assert.match(await get(b), /from B$/);

    session.setPhase("agent", parseNetworkPolicy({ allow: [`127.0.0.1:${a}`] }, "t"));
    assert.match(await get(a), /^HTTP\/1\.1 200[\s\S]*from A$/);
    assert.match(
      await get(b),
      /^HTTP\/1\.1 403[\s\S]*not allowed by the network policy \(phase agent\)/,
    );
    // CONNECT is held to the same rules.
    const tunnel = await raw(
      port,
      `CONNECT 127.0.0.1:${b} HTTP/1.1\r\nHost: 127.0.0.1:${b}\r\nProxy-Authorization: Basic ${cred}\r\n\r\n`,
    );
    assert.match(tunnel, /^HTTP\/1\.1 403/);

    session.setPhase("grade", parseNetworkPolicy({ allow: [] }, "t"));
    assert.match(await get(a), /^HTTP\/1\.1 403/);

    assert.deepEqual(session.denials.map((d) => [d.phase, d.host, d.port]), [
      ["setup", "127.0.0.1", b],
      ["setup", "127.0.0.1", b],
      ["agent", "127.0.0.1", b],
      ["agent", "127.0.0.1", b],
      ["grade", "127.0.0.1", a],
    ]);
    session.close();
    assert.match(await get(a), /^HTTP\/1\.1 407/);
  } finally {
    await gateway.close();
  }
});

Deno.test("network policy: rules, composition and bad entries", () => {
  const p = parseNetworkPolicy({ allow: ["*.example.org", "api.x.com:443", "https://h.io"] }, "n");
  assert.ok(policyAllows(p, "a.example.org", 80));
  assert.ok(!policyAllows(p, "example.org", 80));
  assert.ok(policyAllows(p, "api.x.com", 443));
  assert.ok(!policyAllows(p, "api.x.com", 80));
  assert.ok(policyAllows(p, "h.io", 443));
  assert.ok(!policyAllows(p, "h.io", 80));
  assert.deepEqual(parseNetworkPolicy({ allow: [] }, "n"), { allow: [], block: ["*"] });
  assert.deepEqual(parseNetworkPolicy({ block: ["*"] }, "n"), { allow: [], block: ["*"] });
  const open = parseNetworkPolicy({ block: ["evil.com"] }, "n");
  assert.ok(policyAllows(open, "good.com", 1) && !policyAllows(open, "evil.com", 443));
  assert.throws(
    () => parseNetworkPolicy({ allow: ["not a host"] }, "env.agent.runtime.network"),
    /env\.agent\.runtime\.network\.allow: "not a host" is not a host/,
  );
  assert.throws(() => parseNetworkPolicy({ allow: ["10.0.0.0/8"] }, "n"), /is not a host/);
  assert.throws(
    () => parseNetworkPolicy({ allow: ["a.com"], block: ["b.com"] }, "n"),
    /cannot be combined/,
  );
  assert.throws(() => parseNetworkPolicy({ allo: [] }, "n"), /n\.allo is not a network policy key/);
  assert.deepEqual(
    composePolicies(
      parseNetworkPolicy({ allow: ["a.com", "b.com"] }, "r"),
      parseNetworkPolicy({ allow: ["b.com", "c.com"] }, "t"),
    ),
    { allow: ["b.com"], block: [] },
  );
  // Blocks survive a concrete allow list.
  assert.deepEqual(
    composePolicies(
      parseNetworkPolicy({ block: ["evil.example.com"] }, "r"),
      parseNetworkPolicy({ allow: ["*.example.com"] }, "t"),
    ),
    { allow: ["*.example.com"], block: ["evil.example.com"] },
  );
  assert.deepEqual(
    composePolicies(
      parseNetworkPolicy({ block: ["x.com"] }, "r"),
      parseNetworkPolicy({ block: ["y.com"] }, "t"),
    ),
    { allow: ["*"], block: ["x.com", "y.com"] },
  );
  assert.deepEqual(
    composePolicies(parseNetworkPolicy({ allow: ["a.com"] }, "r"), parseNetworkPolicy({}, "t")),
    { allow: ["a.com"], block: [] },
  );
});

Deno.test("gateway: the Anthropic Messages and Responses dialects map to vf's messages and back, streaming too", async () => {
  const gateway = new Gateway();
  try {
    const port = await gateway.listen("127.0.0.1");
    const session = gateway.open("m");
    const seen: Array<{ messages: unknown; tools: unknown; sampling: unknown }> = [];
    session.handler = {
      chat: (call) => {
        seen.push({ messages: call.messages, tools: call.tools, sampling: call.sampling });
        return Promise.resolve({
          ...reply(""),
          message: {
            role: "assistant",
            content: "Running it.",
            tool_calls: [{ id: "call_9", name: "bash", arguments: '{"command":"ls"}' }],
            finish_reason: "tool_calls",
            is_truncated: false,
          },
        });
      },
    };
    const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
      fetch(`http://127.0.0.1:${port}${path}`, {
        method: "POST",
        body: typeof body === "string" ? body : JSON.stringify(body),
        headers: { "content-type": "application/json", ...headers },
      });
    const bash = { type: "object", properties: { command: { type: "string" } } };

    // Anthropic: x-api-key auth, system, tool_use and tool_result blocks.
    const anthropic = {
      model: "claude-x",
      max_tokens: 64,
      temperature: 0.9,
      system: [{ type: "text", text: "Be brief." }],
      tools: [{ name: "bash", description: "Run", input_schema: bash }],
      messages: [
        { role: "user", content: "List files." },
        {
          role: "assistant",
          content: [{ type: "text", text: "Sure." }, {
            type: "tool_use",
            id: "tu_1",
            name: "bash",
            input: { command: "pwd" },
          }],
        },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "tu_1", content: "/app" }] },
      ],
    };
    const a = await (await post("/v1/messages", anthropic, { "x-api-key": session.modelSecret }))
      .json();
    assert.deepEqual(seen[0].messages, [
      { role: "system", content: "Be brief." },
      { role: "user", content: "List files." },
      {
        role: "assistant",
        content: "Sure.",
        tool_calls: [{ id: "tu_1", name: "bash", arguments: '{"command":"pwd"}' }],
      },
      { role: "tool", tool_call_id: "tu_1", content: "/app" },
    ]);
    assert.deepEqual(seen[0].tools, [{ name: "bash", description: "Run", parameters: bash }]);
    // The program's temperature is dropped (the run's applies); its max_tokens is kept.
    assert.deepEqual(seen[0].sampling, { max_tokens: 64 });
    assert.equal(a.type, "message");
    assert.equal(a.stop_reason, "tool_use");
    assert.deepEqual(a.content, [
      { type: "text", text: "Running it." },
      { type: "tool_use", id: "call_9", name: "bash", input: { command: "ls" } },
    ]);
    const aStream = await (await post("/v1/messages", { ...anthropic, stream: true }, {
      "x-api-key": session.modelSecret,
    })).text();
    const types = [...aStream.matchAll(/^event: (\S+)$/gm)].map((m) => m[1]);
    assert.deepEqual(types, [
      "message_start",
      "content_block_start",
      "content_block_delta",
      "content_block_stop",
      "content_block_start",
      "content_block_delta",
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    assert.match(aStream, /"partial_json":"\{\\"command\\":\\"ls\\"\}"/);
    const aBad = await post("/v1/messages", "{", { "x-api-key": session.modelSecret });
    assert.equal(aBad.status, 400);
    assert.equal((await aBad.json()).type, "error");
    const counted = await (await post("/v1/messages/count_tokens", anthropic, {
      "x-api-key": session.modelSecret,
    })).json();
    assert.ok(counted.input_tokens > 0);
    assert.equal(seen.length, 2); // counting tokens is not a model call

    // Responses: instructions, function_call and function_call_output items.
    const auth = { authorization: `Bearer ${session.modelSecret}` };
    const responses = {
      model: "gpt-x",
      instructions: "Be brief.",
      max_output_tokens: 32,
      tools: [{ type: "function", name: "bash", parameters: bash }, { type: "web_search" }],
      input: [
        { role: "user", content: [{ type: "input_text", text: "List files." }] },
        { type: "function_call", call_id: "c1", name: "bash", arguments: '{"command":"pwd"}' },
        { type: "function_call_output", call_id: "c1", output: "/app" },
      ],
    };
    const r = await (await post("/v1/responses", responses, auth)).json();
    assert.deepEqual(seen[2].messages, [
      { role: "system", content: "Be brief." },
      { role: "user", content: "List files." },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "c1", name: "bash", arguments: '{"command":"pwd"}' }],
      },
      { role: "tool", tool_call_id: "c1", content: "/app" },
    ]);
    assert.deepEqual(seen[2].sampling, { max_tokens: 32 });
    assert.equal((seen[2].tools as unknown[]).length, 1); // provider-side tools are not offered
    assert.equal(r.object, "response");
    assert.deepEqual(r.output.map((o: { type: string }) => o.type), ["message", "function_call"]);
    assert.equal(r.output[1].call_id, "call_9");
    const rStream = await (await post("/v1/responses", { ...responses, stream: true }, auth))
      .text();
    const rTypes = [...rStream.matchAll(/^event: (\S+)$/gm)].map((m) => m[1]);
    assert.equal(rTypes[0], "response.created");
    assert.equal(rTypes.at(-1), "response.completed");
    assert.ok(rTypes.includes("response.output_text.delta"));
    assert.ok(rTypes.includes("response.function_call_arguments.done"));
    const chained = await post("/v1/responses", { ...responses, previous_response_id: "x" }, auth);
    assert.equal(chained.status, 400);
    assert.match((await chained.json()).error.message, /previous_response_id/);
  } finally {
    await gateway.close();
  }
});

Deno.test("gateway: a connection that does not deliver its request in time is closed; a model answer slower than that still arrives", async () => {
  const gateway = new Gateway({ requestTimeoutMs: 300 });
  try {
    const port = await gateway.listen("127.0.0.1");
    // Half a request head, then silence (a program that hung, or a sandbox removed mid-send).
    const quiet = net.connect({ host: "127.0.0.1", port });
    const closed = new Promise<number>((resolve) => {
      const t0 = performance.now();
      quiet.on("close", () => resolve(performance.now() - t0));
      quiet.on("error", () => {});
    });
    quiet.write("POST /v1/chat/completions HTTP/1.1\r\nContent-Type: appl");
    const waited = await Promise.race([
      closed,
      new Promise<null>((r) => setTimeout(() => r(null), 10_000)),
    ]);
    quiet.destroy();
    assert.ok(waited !== null, "the gateway kept a connection whose request never came");
    assert.ok(waited >= 250, `closed after ${waited} ms, before the deadline`);

    // The deadline covers receiving the request, not the model's answer.
    const session = gateway.open("m");
    session.handler = {
      chat: async () => {
        await new Promise((r) => setTimeout(r, 900));
        return reply("slow but fine");
      },
    };
    const body = JSON.stringify({ model: "x", messages: [{ role: "user", content: "hi" }] });
    const res = await raw(
      port,
      `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${session.modelSecret}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    );
    assert.match(res, /^HTTP\/1\.1 200 /);
    assert.match(res, /slow but fine/);
    session.close();
  } finally {
    await gateway.close();
  }
});

Deno.test("own host: every spelling of an address is seen for what it is", async () => {
  const v4 = "172.17.0.1";
  for (
    const spelling of [
      "::ffff:172.17.0.1",
      "::ffff:ac11:1",
      "0:0:0:0:0:ffff:ac11:0001",
      "[::ffff:ac11:1]",
      "::172.17.0.1",
      "::ffff:0:172.17.0.1",
      "64:ff9b::ac11:1",
      "64:ff9b:1::ac11:1",
      "2002:ac11:1::1",
    ]
  ) {
    assert.ok(addressForms(spelling).includes(v4), spelling);
  }
  assert.deepEqual(addressForms("fe80::1%eth0"), ["fe80:0000:0000:0000:0000:0000:0000:0001"]);
  assert.deepEqual(addressForms("not an address"), []);
  assert.deepEqual(addressForms("1::2::3"), []);
  for (
    const ip of [
      "127.0.0.1",
      "127.9.9.9",
      "0.0.0.0",
      "169.254.169.254",
      "::1",
      "::",
      "0::0",
      "::ffff:127.0.0.1",
      "::ffff:7f00:1",
      "[::ffff:0:0]",
      "fe80::1%eth0",
      "255.255.255.255",
      "224.0.0.1",
      "ff02::1",
      "64:ff9b::a9fe:a9fe",
    ]
  ) {
    assert.ok(isReservedAddress(ip), ip);
  }
  for (const ip of ["172.17.0.1", "8.8.8.8", "2001:db8::1", "::ffff:8.8.8.8"]) {
    assert.ok(!isReservedAddress(ip), ip);
  }
  for (
    const name of [
      "localhost",
      "LOCALHOST.",
      "a.localhost",
      "host.docker.internal",
      "gateway.docker.internal",
      "host.containers.internal",
    ]
  ) {
    assert.ok(isHostAlias(name), name);
  }
  assert.ok(!isHostAlias("example.org") && !isHostAlias("localhost.example.org"));

  // The host's interfaces count afresh every time; an extra source adds to them, and one that
  // fails adds nothing (the interfaces still count).
  const iface =
    Deno.networkInterfaces().find((i) => i.family === "IPv4" && !i.address.startsWith("127."))!
      .address;
  const own = new OwnAddresses({ extra: () => Promise.resolve(["10.99.0.1"]) });
  assert.ok(await own.has(iface) && await own.has(`::ffff:${iface}`));
  assert.ok(await own.has("10.99.0.1") && await own.has("::ffff:10.99.0.1"));
  assert.ok(!(await own.has("10.99.0.2")));
  const broken = new OwnAddresses({ extra: () => Promise.reject(new Error("engine down")) });
  assert.ok(await broken.has(iface));
  assert.ok(!(await broken.has("10.99.0.1")));
  broken.add("10.99.0.3");
  assert.ok(await broken.has("10.99.0.3"));
});

Deno.test("network policy: a rule names a host for its port only; numeric spellings in rules match", () => {
  const p = parseNetworkPolicy(
    { allow: ["*", "172.17.0.1:8000", "0xac110002", "Named.Example."] },
    "n",
  );
  assert.ok(namedByAllow(p, "172.17.0.1", 8000));
  assert.ok(!namedByAllow(p, "172.17.0.1", 8001));
  assert.ok(namedByAllow(p, "172.17.0.2", 1) && namedByAllow(p, "172.17.0.2", 65535));
  assert.ok(namedByAllow(p, "named.example", 80) && namedByAllow(p, "named.example.", 80));
  assert.ok(!namedByAllow(p, "other.example", 80));
  assert.ok(policyAllows(parseNetworkPolicy({ allow: ["2886795266:80"] }, "n"), "172.17.0.2", 80));
});

Deno.test("gateway: a connection checked under one phase is not opened in the next", async () => {
  await using target = await serveText("from T");
  const answer = Promise.withResolvers<string>();
  const asked = Promise.withResolvers<void>();
  const gateway = new Gateway({
    resolve: () => {
      asked.resolve();
      return answer.promise;
    },
  });
  try {
    const port = await gateway.listen("127.0.0.1");
    const session = gateway.open("m");
    session.setPhase("agent", parseNetworkPolicy({ allow: ["t.test"] }, "t"));
    const cred = btoa(`vf:${session.proxySecret}`);
    const pending = raw(
      port,
      `GET http://t.test:${target.addr.port}/ HTTP/1.1\r\nHost: t.test\r\n` +
        `Proxy-Authorization: Basic ${cred}\r\n\r\n`,
    );
    await asked.promise;
    // The grader's phase allows nothing; the agent's check is still resolving its name.
    session.setPhase("grade", parseNetworkPolicy({ allow: [] }, "t"));
    answer.resolve("127.0.0.1");
    const out = await pending;
    assert.match(out, /^HTTP\/1\.1 503[\s\S]*phase changed/);
    assert.doesNotMatch(out, /from T/);
    session.close();
  } finally {
    await gateway.close();
  }
});
