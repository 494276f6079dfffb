/**
 * A URL toolset leaves nothing open once its rollout closes it: against the SDK's stateful
 * streamable-HTTP server on loopback (sessions, a server-to-client GET stream, DELETE), behind
 * a TCP relay that counts the connections accepted and closed, N rollouts end every session
 * with a DELETE and close every connection; and a process that used one exits by itself.
 * @module
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { Toolbox } from "../lib/tools/toolbox.ts";
import { EVERYTHING } from "./_mcp_packages.ts";

/** A stateful SDK server behind a counting TCP relay. */
async function startServer() {
  const { McpServer } = await import("npm:@modelcontextprotocol/sdk@^1.32.0/server/mcp.js");
  const { WebStandardStreamableHTTPServerTransport } = await import(
    "npm:@modelcontextprotocol/sdk@^1.32.0/server/webStandardStreamableHttp.js"
  );
  // deno-lint-ignore no-explicit-any
  const sessions = new Map<string, any>();
  const methods: string[] = [];
  let initialized = 0;
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async (req) => {
    methods.push(req.method);
    const sid = req.headers.get("mcp-session-id");
    let transport = sid ? sessions.get(sid) : undefined;
    if (!transport) {
      if (sid) return new Response("unknown session", { status: 404 });
      transport = new WebStandardStreamableHTTPServerTransport({
        sessionIdGenerator: () => crypto.randomUUID(),
        onsessioninitialized: (id: string) => {
          initialized++;
          sessions.set(id, transport);
        },
        onsessionclosed: (id: string) => sessions.delete(id),
      });
      const mcp = new McpServer({ name: "stateful", version: "1" });
      mcp.registerTool("ping", { description: "Answers pong", inputSchema: {} }, () => ({
        content: [{ type: "text", text: "pong" }],
      }));
      await mcp.connect(transport);
    }
    return await transport.handleRequest(req);
  });
  const counting = relayTo(server.addr.port);
  return {
    url: counting.url,
    counts: counting.counts,
    sessions,
    methods,
    initialized: () => initialized,
    async [Symbol.asyncDispose]() {
      await counting.close();
      await server.shutdown();
      await counting.drained();
    },
  };
}

/**
 * A TCP relay to `port` on loopback counting the connections it accepted and those closed at
 * both ends (the client's and the server's).
 */
function relayTo(port: number) {
  const relay = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const counts = { accepted: 0, closed: 0 };
  const links = new Set<Promise<unknown>>();
  const serving = (async () => {
    for await (const conn of relay) {
      counts.accepted++;
      const link = (async () => {
        const up = await Deno.connect({ hostname: "127.0.0.1", port });
        await Promise.allSettled([
          conn.readable.pipeTo(up.writable),
          up.readable.pipeTo(conn.writable),
        ]);
        counts.closed++;
      })();
      links.add(link);
      link.finally(() => links.delete(link));
    }
  })();
  return {
    url: `http://127.0.0.1:${(relay.addr as Deno.NetAddr).port}/mcp`,
    counts,
    async close() {
      relay.close();
      await serving.catch(() => {});
    },
    drained: () => Promise.allSettled([...links]),
  };
}

/** Poll until `fn` holds; generous, for a loaded machine. */
async function until(fn: () => boolean, what: () => string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!fn()) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting: ${what()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

Deno.test("rollouts of a URL toolset end their sessions with DELETE and close every connection", async () => {
  await using server = await startServer();
  const N = 4;
  for (let i = 0; i < N; i++) {
    const box = await Toolbox.open([{ name: "s", url: server.url }], { state: {} });
    assert.equal((await box.call("s_ping", {})).text, "pong");
    await box.close();
  }
  assert.equal(server.initialized(), N);
  // Each session: ended by its client, not left to the server.
  assert.equal(server.methods.filter((m) => m === "DELETE").length, N);
  assert.equal(server.sessions.size, 0);
  // The GET streams and the keep-alive sockets are closed too: the server's count is back to
  // zero well inside the HTTP pool's idle timeout (90 s), so nothing waits for it.
  await until(
    () => server.counts.closed === server.counts.accepted,
    () => JSON.stringify(server.counts),
  );
  assert.ok(server.counts.accepted >= N, JSON.stringify(server.counts));
});

Deno.test("a process that used a URL toolset exits by itself once the toolbox is closed", async () => {
  await using server = await startServer();
  const script = fileURLToPath(new URL("./_mcp_http_client.ts", import.meta.url));
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", script, server.url],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  while (!out.includes("closed\n")) {
    const { value, done } = await reader.read();
    if (done) break;
    out += value;
  }
  assert.match(out, /s_ping: pong\nclosed\n/);
  // From the close on, the process has nothing left to do: it exits, with no forced exit.
  const closedAt = Date.now();
  const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
  const status = await child.status;
  clearTimeout(timer);
  reader.releaseLock();
  await child.stdout.cancel().catch(() => {});
  const stderr = await new Response(child.stderr).text();
  assert.equal(status.signal, null, `killed after 60 s: it did not exit by itself\n${stderr}`);
  assert.equal(status.code, 0, stderr);
  // Exiting is prompt (a pooled socket would hold nothing, but a stream would hold it forever).
  assert.ok(Date.now() - closedAt < 60_000);
  await until(
    () => server.counts.closed === server.counts.accepted,
    () => JSON.stringify(server.counts),
  );
  assert.equal(server.sessions.size, 0);
});

Deno.test("rollouts of server-everything over streamable HTTP leave no connection open", async () => {
  // A free port for the server (it takes one from PORT); taken again if another grabbed it.
  let child: Deno.ChildProcess | undefined;
  let port = 0;
  let log = "";
  for (let attempt = 0; attempt < 3 && !child; attempt++) {
    const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    port = (probe.addr as Deno.NetAddr).port;
    probe.close();
    const started = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", EVERYTHING, "streamableHttp"],
      env: { PORT: String(port) },
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const reader = started.stderr.pipeThrough(new TextDecoderStream()).getReader();
    log = "";
    while (!/listening on port|already in use/.test(log)) {
      const { value, done } = await reader.read();
      if (done) break;
      log += value;
    }
    // Keep draining its stderr so that it never blocks.
    (async () => {
      while (!(await reader.read()).done);
    })().catch(() => {});
    if (log.includes("listening on port")) child = started;
    else await started.status;
  }
  assert.ok(child, `server-everything did not start: ${log}`);
  const counting = relayTo(port);
  try {
    const N = 3;
    for (let i = 0; i < N; i++) {
      const box = await Toolbox.open([{ name: "ev", url: counting.url }], { state: {} });
      assert.ok(box.has("ev_echo"), box.tools.map((t) => t.name).join(", "));
      assert.match((await box.call("ev_echo", { message: `hi ${i}` })).text, new RegExp(`hi ${i}`));
      await box.close();
    }
    assert.ok(counting.counts.accepted >= N, JSON.stringify(counting.counts));
    await until(
      () => counting.counts.closed === counting.counts.accepted,
      () => JSON.stringify(counting.counts),
    );
  } finally {
    await counting.close();
    child.kill("SIGKILL");
    await child.status;
    await counting.drained();
  }
});
