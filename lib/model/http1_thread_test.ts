import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import net from "node:net";
import { fileURLToPath } from "node:url";
import { Http1Error, http1Request, Http1TimeoutError } from "./http1.ts";
import { http1Post, http1PostWhere, type ThreadReply } from "./http1_thread.ts";
import { childEnv } from "../../tests/_child_env.ts";

/** A raw `node:net` server: `handler` answers each request head (or never does). */
async function rawServer(handler: (socket: net.Socket, path: string) => void) {
  const sockets = new Set<net.Socket>();
  let closedCount = 0;
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => closedCount++);
    socket.on("error", () => {});
    let buffer = "";
    socket.on("data", (chunk: Buffer) => {
      buffer += chunk.toString("latin1");
      const end = buffer.indexOf("\r\n\r\n");
      if (end < 0) return;
      const length = Number(/content-length: *(\d+)/i.exec(buffer)?.[1] ?? 0);
      if (buffer.length < end + 4 + length) return;
      const path = buffer.split(" ")[1];
      buffer = buffer.slice(end + 4 + length);
      handler(socket, path);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: (path: string) => new URL(`http://127.0.0.1:${port}${path}`),
    get closed() {
      return closedCount;
    },
    get accepted() {
      return sockets.size;
    },
    async [Symbol.asyncDispose]() {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

const HEADERS = Object.freeze({ "content-type": "application/json" });

/** What a request came to, in a form both paths can be compared in. */
async function outcome(promise: Promise<ThreadReply>): Promise<Record<string, unknown>> {
  try {
    const reply = await promise;
    return { ...reply };
  } catch (error) {
    const e = error as Http1Error;
    return {
      class: e instanceof Http1TimeoutError
        ? "Http1TimeoutError"
        : e instanceof Http1Error
        ? "Http1Error"
        : (error as Error).constructor.name,
      message: e.message,
      phase: e.phase,
      code: e.code,
    };
  }
}

async function pollUntil(check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!check()) {
    if (Date.now() > deadline) assert.fail(`${what}: not within 60 s`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

Deno.test("http1Post() comes to what http1Request() does: replies, HTTP errors, transport errors, timeouts, bad headers", async () => {
  const body = "héllo 🌍 ".repeat(50);
  await using server = await rawServer((socket, path) => {
    if (path === "/ok") {
      socket.write(
        `HTTP/1.1 200 OK\r\ncontent-length: ${Buffer.byteLength(body)}\r\n` +
          `retry-after: 3\r\n\r\n${body}`,
      );
    } else if (path === "/busy") {
      socket.write("HTTP/1.1 503 Busy\r\ncontent-length: 4\r\nretry-after: 9\r\n\r\nbusy");
    } else if (path === "/cut") {
      socket.end("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npart of it");
    }
    // "/silent" is never answered.
  });
  const refused = await rawServer(() => {});
  const refusedUrl = refused.url("/");
  await refused[Symbol.asyncDispose]();
  const cases: Array<[string, URL, Record<string, string>, number | undefined]> = [
    ["a 200 with a multibyte body", server.url("/ok"), HEADERS, undefined],
    ["an HTTP 503", server.url("/busy"), HEADERS, undefined],
    ["a reply cut short", server.url("/cut"), HEADERS, undefined],
    ["nothing listening", refusedUrl, HEADERS, undefined],
    ["no reply in time", server.url("/silent"), HEADERS, 300],
    ["an invalid header name", server.url("/ok"), { "bad name": "x" }, undefined],
    ["a line break in a header", server.url("/ok"), { "x-a": "1\r\nx-b: 2" }, undefined],
  ];
  for (const [what, url, headers, timeoutMs] of cases) {
    const here = await outcome(
      http1Request({ method: "POST", url, headers, body: "{}", timeoutMs }).then((res) => ({
        status: res.status,
        text: res.text,
        retryAfter: res.headers.get("retry-after") ?? null,
      })),
    );
    const there = await outcome(http1Post({ url, headers, body: "{}", timeoutMs }));
    assert.deepEqual(there, here, what);
  }
  assert.equal(http1PostWhere(), "worker");
});

Deno.test("http1Post() sends from a thread of its own: a request reaches the server while this thread is busy", async () => {
  // The server is another process, so it answers while this thread is held.
  const server = new Deno.Command(Deno.execPath(), {
    args: [
      "eval",
      `Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: ({ port }) => console.log(port) },
        async (req) => { await req.arrayBuffer(); console.log("at " + Date.now());
          return new Response("{}"); });`,
    ],
    stdout: "piped",
    stderr: "inherit",
    env: childEnv({}, { registry: false }),
    clearEnv: true,
  }).spawn();
  const lines: string[] = [];
  const reading = server.stdout.pipeThrough(new TextDecoderStream()).pipeTo(
    new WritableStream({ write: (chunk) => void lines.push(...chunk.split("\n")) }),
  );
  try {
    await pollUntil(() => lines.length > 0 && lines[0] !== "", "the server's port");
    const url = new URL(`http://127.0.0.1:${lines[0].trim()}/v1/chat/completions`);
    // The worker is up, warmed on another origin: the timed request needs a connection of its
    // own, which a request on this thread could only open once the thread is free again.
    await using warm = await rawServer((socket) =>
      socket.write("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    );
    assert.equal((await http1Post({ url: warm.url("/"), headers: HEADERS, body: "" })).status, 200);
    const busyFrom = Date.now();
    const sent = http1Post({ url, headers: HEADERS, body: "{}" });
    await Promise.resolve(); // the batch is posted at the end of this turn
    while (Date.now() - busyFrom < 3_000) { /* hold this thread */ }
    const busyTo = Date.now();
    assert.equal((await sent).status, 200);
    await pollUntil(() => lines.some((l) => l.startsWith("at ")), "the arrival");
    const arrived = Number(lines.find((l) => l.startsWith("at "))!.slice(3));
    assert.ok(
      arrived >= busyFrom && arrived < busyTo,
      `the request arrived at ${arrived}, outside the busy ${busyFrom}–${busyTo}`,
    );
  } finally {
    server.kill("SIGTERM");
    await server.status;
    await reading.catch(() => {});
  }
});

Deno.test("http1Post() rejects with the signal's reason when it aborts, and the server sees the socket closed", async () => {
  await using server = await rawServer(() => {}); // never answers
  const controller = new AbortController();
  const reason = new Error("stopped by the run");
  const pending = http1Post({
    url: server.url("/x"),
    headers: HEADERS,
    body: "{}",
    signal: controller.signal,
  });
  const second = http1Post({
    url: server.url("/y"),
    headers: HEADERS,
    body: "{}",
    signal: controller.signal,
  });
  await pollUntil(() => server.accepted === 2, "both connections");
  controller.abort(reason);
  await assert.rejects(pending, (error) => error === reason);
  await assert.rejects(second, (error) => error === reason);
  await pollUntil(() => server.closed === 2, "both sockets closed");
  // An aborted signal is refused before anything is sent.
  await assert.rejects(
    http1Post({ url: server.url("/z"), headers: HEADERS, body: "{}", signal: controller.signal }),
    (error) => error === reason,
  );
  assert.equal(server.accepted, 2);
});

/** Runs `script` in a child deno with `arg`; its exit code and output. */
async function child(script: string, arg: string) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", script, arg],
    stdout: "piped",
    stderr: "piped",
    env: childEnv({}, { registry: false }),
    clearEnv: true,
    signal: AbortSignal.timeout(90_000),
  }).output();
  const decoder = new TextDecoder();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

Deno.test("a request in flight keeps the process alive and the idle worker does not; without the worker file requests run on the calling thread", async () => {
  // Answers after a second: only the pending request keeps the child alive meanwhile.
  await using server = await rawServer((socket) => {
    setTimeout(() => socket.write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"), 1_000);
  });
  const dir = await Deno.makeTempDir({ prefix: "vf-http1-thread-" });
  try {
    const script = (module: string) =>
      `import { http1Post, http1PostWhere } from ${JSON.stringify(module)};\n` +
      `const reply = await http1Post({ url: new URL(Deno.args[0]), headers: {}, body: "{}" });\n` +
      `console.log(JSON.stringify({ text: reply.text, where: http1PostWhere() }));\n`;
    const here = new URL("./http1_thread.ts", import.meta.url).href;
    await Deno.writeTextFile(`${dir}/with_worker.ts`, script(here));
    const started = Date.now();
    const run = await child(`${dir}/with_worker.ts`, server.url("/").href);
    assert.equal(run.code, 0, run.stderr);
    assert.deepEqual(JSON.parse(run.stdout), { text: "ok", where: "worker" });
    // The worker's idle keep-alive socket (kept up to 4 s) does not hold the process.
    assert.ok(Date.now() - started < 60_000);

    // A bundle without the worker file: the same modules copied, the worker left out.
    const lib = fileURLToPath(new URL("../", import.meta.url));
    await Deno.mkdir(`${dir}/lib/model`, { recursive: true });
    await Deno.mkdir(`${dir}/lib/util`, { recursive: true });
    for (const file of ["model/http1.ts", "model/http1_thread.ts", "util/_timers.ts"]) {
      await Deno.copyFile(`${lib}${file}`, `${dir}/lib/${file}`);
    }
    await Deno.writeTextFile(`${dir}/without_worker.ts`, script("./lib/model/http1_thread.ts"));
    const alone = await child(`${dir}/without_worker.ts`, server.url("/").href);
    assert.equal(alone.code, 0, alone.stderr);
    assert.deepEqual(JSON.parse(alone.stdout), { text: "ok", where: "this thread" });
    assert.match(alone.stderr, /HTTP\/1\.1 worker thread .* did not start/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
