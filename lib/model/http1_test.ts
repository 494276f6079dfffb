import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import http from "node:http";
import net from "node:net";
import {
  closeIdleConnections,
  Http1Error,
  type Http1Request,
  http1Request,
  type Http1Response,
  Http1TimeoutError,
  usesProxy,
} from "./http1.ts";
import { OpenAIChatClient } from "./client.ts";
import { ModelError } from "../errors.ts";
import { startModelServer } from "../../tests/model_server.ts";
import { childEnv } from "../../tests/_child_env.ts";

/** One request as a raw server parsed it. */
interface RawRequest {
  head: string;
  body: string;
  /** Which connection (0-based, in accept order) and which request on it. */
  conn: number;
  index: number;
}

/** A `node:net` server answering with exactly the bytes its handler writes. */
interface RawServer extends AsyncDisposable {
  readonly port: number;
  readonly connections: number;
  readonly requests: RawRequest[];
  url(path?: string): URL;
  /** Resolves when the server side of connection `n` has closed; rejects after 2 s. */
  closed(n: number): Promise<void>;
}

type RawHandler = (socket: net.Socket, request: RawRequest) => unknown;

async function startRawServer(handler: RawHandler, host = "127.0.0.1"): Promise<RawServer> {
  const sockets: net.Socket[] = [];
  const closed: Promise<void>[] = [];
  const requests: RawRequest[] = [];
  const server = net.createServer((socket) => {
    const conn = sockets.push(socket) - 1;
    closed.push(new Promise((resolve) => socket.on("close", () => resolve())));
    socket.setNoDelay(true);
    socket.on("error", () => {});
    let buffer = Buffer.alloc(0);
    let index = 0;
    socket.on("data", (chunk: Buffer) => {
      buffer = Buffer.concat([buffer, chunk]);
      for (;;) {
        const end = buffer.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buffer.toString("latin1", 0, end);
        const length = Number(/^content-length: *(\d+)/im.exec(head)?.[1] ?? 0);
        if (buffer.length < end + 4 + length) return;
        const body = buffer.toString("utf8", end + 4, end + 4 + length);
        buffer = buffer.subarray(end + 4 + length);
        const request = { head, body, conn, index: index++ };
        requests.push(request);
        handler(socket, request);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const port = (server.address() as net.AddressInfo).port;
  const origin = `http://${host.includes(":") ? `[${host}]` : host}:${port}`;
  return {
    port,
    requests,
    get connections() {
      return sockets.length;
    },
    url: (path = "/") => new URL(path, origin),
    closed: (n) => within(closed[n], 2_000, `connection ${n} still open`),
    async [Symbol.asyncDispose]() {
      closeIdleConnections();
      for (const socket of sockets) socket.destroy();
      await Promise.all(closed);
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** A `node:http` server that counts the connections it accepted. */
async function startNodeServer(handler: http.RequestListener) {
  const server = http.createServer(handler);
  let connections = 0;
  server.on("connection", () => connections++);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    port,
    get connections() {
      return connections;
    },
    url: (path = "/") => new URL(path, `http://127.0.0.1:${port}`),
    async [Symbol.asyncDispose]() {
      closeIdleConnections();
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** A complete 200 response with a content-length. */
function ok(body: string, headers = ""): string {
  return `HTTP/1.1 200 OK\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${headers}\r\n${body}`;
}

/** `promise`, or a rejection with `message` once `ms` pass. */
async function within<T>(promise: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${message} after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Writes each part in its own `write`, a few milliseconds apart, so they arrive apart. */
async function writeApart(socket: net.Socket, parts: (string | Uint8Array)[]): Promise<void> {
  for (const part of parts) {
    if (socket.destroyed) return;
    socket.write(part);
    await delay(10);
  }
}

function get(url: URL, extra: Partial<Http1Request> = {}): Promise<Http1Response> {
  return http1Request({ method: "GET", url, headers: {}, ...extra });
}

/** The error `promise` rejects with (as `E`, checked by the caller); fails if it resolves. */
async function rejection<E extends Error = Http1Error>(promise: Promise<unknown>): Promise<E> {
  try {
    await promise;
  } catch (error) {
    return error as E;
  }
  assert.fail("expected a rejection");
}

const MULTIBYTE = "héllo 🌍 ";

// --- framing and keep-alive -------------------------------------------------------------------

Deno.test("http1Request() reuses one keep-alive connection for sequential requests", async () => {
  await using server = await startRawServer((s, r) => s.write(ok(`reply ${r.index}`)));
  const first = await get(server.url("/a"));
  const second = await get(server.url("/b"));
  assert.equal(first.status, 200);
  assert.equal(first.text, "reply 0");
  assert.equal(second.text, "reply 1");
  assert.equal(server.connections, 1);
  assert.deepEqual(server.requests.map((r) => r.head.split("\r\n")[0]), [
    "GET /a HTTP/1.1",
    "GET /b HTTP/1.1",
  ]);
});

Deno.test("http1Request() opens a connection per concurrent request and reuses them all", async () => {
  await using server = await startRawServer(async (s, r) => {
    await delay(20); // keeps the first batch in flight together
    s.write(ok(`${r.conn}/${r.index}`));
  });
  const batch = () => Promise.all([1, 2, 3, 4].map(() => get(server.url())));
  await batch();
  const second = await batch();
  assert.equal(server.connections, 4);
  assert.deepEqual(second.map((r) => r.text.split("/")[1]), ["1", "1", "1", "1"]);
});

Deno.test("http1Request() leaves the pooled connection alone when its signal or deadline passes later", async () => {
  await using server = await startRawServer((s) => s.write(ok("done")));
  const controller = new AbortController();
  await get(server.url(), { signal: controller.signal, timeoutMs: 30 });
  await delay(60); // past the deadline
  controller.abort(new Error("too late to matter"));
  assert.equal((await get(server.url())).text, "done");
  assert.equal(server.connections, 1);
});

Deno.test("http1Request() reaches an IPv6 literal and sends its bracketed host", async () => {
  await using server = await startRawServer((s) => s.write(ok("six")), "::1");
  assert.equal((await get(server.url("/v6"))).text, "six");
  assert.equal((await get(server.url("/v6"))).text, "six");
  assert.equal(server.requests[0].head, `GET /v6 HTTP/1.1\r\nhost: [::1]:${server.port}`);
  assert.equal(server.connections, 1);
});

Deno.test("http1Request() reads a chunked body split across packets, with extensions and a trailer", async () => {
  await using server = await startRawServer((s) =>
    writeApart(s, [
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
      "5;ext=1\r\nhello\r\n",
      "1", // a size line split across writes: 0x10 = 16 bytes
      "0\r\n, sixteen bytes!",
      "\r",
      "\n3\r\n!!!\r\n0\r\nx-trailer: yes\r\n",
      "\r\n",
    ])
  );
  const first = await get(server.url());
  assert.equal(first.text, "hello, sixteen bytes!!!!");
  assert.equal(first.headers.get("x-trailer"), undefined);
  // The trailer was consumed to its end, so the connection is clean and reused.
  assert.equal((await get(server.url())).text, "hello, sixteen bytes!!!!");
  assert.equal(server.connections, 1);
});

Deno.test("http1Request() reads a chunked body from node:http written in several pieces", async () => {
  await using server = await startNodeServer(async (_req, res) => {
    res.write("one ");
    await delay(10);
    res.write(MULTIBYTE);
    await delay(10);
    res.end("three");
  });
  const res = await get(server.url());
  assert.equal(res.headers.get("transfer-encoding"), "chunked");
  assert.equal(res.text, `one ${MULTIBYTE}three`);
  assert.equal((await get(server.url())).text, `one ${MULTIBYTE}three`);
  assert.equal(server.connections, 1);
});

Deno.test("http1Request() reads a body delimited by the server closing and then opens a new connection", async () => {
  await using server = await startRawServer(async (s, r) => {
    await writeApart(s, ["HTTP/1.1 200 OK\r\n\r\n", `until close `, `${r.conn}`]);
    s.end();
  });
  assert.equal((await get(server.url())).text, "until close 0");
  assert.equal((await get(server.url())).text, "until close 1");
  assert.equal(server.connections, 2);
});

Deno.test("http1Request() does not reuse a connection after `connection: close` or an HTTP/1.0 reply", async () => {
  const replies = [
    ok("closing", "Connection: Close\r\n"),
    "HTTP/1.0 200 OK\r\ncontent-length: 4\r\n\r\nold!",
    "HTTP/1.0 200 OK\r\ncontent-length: 4\r\nconnection: keep-alive\r\n\r\nkept",
    ok("last"),
  ];
  let n = 0;
  // The server never closes by itself: only the client can decide not to reuse.
  await using server = await startRawServer((s) => s.write(replies[n++]));
  assert.equal((await get(server.url())).text, "closing");
  await server.closed(0); // the client closed it
  assert.equal((await get(server.url())).text, "old!");
  await server.closed(1);
  assert.equal((await get(server.url())).text, "kept");
  assert.equal((await get(server.url())).text, "last");
  assert.equal(server.connections, 3);
});

Deno.test("http1Request() skips 100 Continue and 103 Early Hints and returns the final response", async () => {
  await using server = await startRawServer((s) =>
    writeApart(s, [
      "HTTP/1.1 100 Continue\r\n\r\n",
      "HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
      ok("final", "x-final: 1\r\n"),
    ])
  );
  const res = await get(server.url());
  assert.equal(res.status, 200);
  assert.equal(res.text, "final");
  assert.equal(res.headers.get("x-final"), "1");
  assert.equal(res.headers.get("link"), undefined);
});

Deno.test("http1Request() reads 204, 304 and content-length 0 as empty bodies and keeps the connection", async () => {
  const replies = [
    "HTTP/1.1 204 No Content\r\n\r\n",
    "HTTP/1.1 304 Not Modified\r\netag: x\r\n\r\n",
    "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    ok("after"),
  ];
  await using server = await startRawServer((s, r) => s.write(replies[r.index]));
  const got: [number, string][] = [];
  for (let i = 0; i < replies.length; i++) {
    const res = await get(server.url());
    got.push([res.status, res.text]);
  }
  assert.deepEqual(got, [[204, ""], [304, ""], [200, ""], [200, "after"]]);
  assert.equal(server.connections, 1);
});

Deno.test("http1Request() reads no body after a HEAD request despite its content-length", async () => {
  await using server = await startRawServer((s, r) =>
    s.write(r.index === 0 ? "HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n" : ok("body"))
  );
  const head = await http1Request({
    method: "HEAD",
    url: server.url(),
    headers: {},
    timeoutMs: 2_000,
  });
  assert.equal(head.headers.get("content-length"), "1234");
  assert.equal(head.text, "");
  assert.equal((await get(server.url())).text, "body");
  assert.equal(server.connections, 1);
});

// --- bodies ----------------------------------------------------------------------------------

Deno.test("http1Request() decodes UTF-8 split inside a character across packets", async () => {
  const text = MULTIBYTE.repeat(3);
  const bytes = Buffer.from(text);
  const globe = bytes.indexOf(Buffer.from("🌍"));
  const e = bytes.indexOf(Buffer.from("é"));
  const head = `HTTP/1.1 200 OK\r\ncontent-length: ${bytes.length}\r\n\r\n`;
  const chunkedParts = [
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
    `${(globe + 2).toString(16)}\r\n`,
    bytes.subarray(0, globe + 2), // the chunk ends inside the globe's four bytes
    `\r\n${(bytes.length - globe - 2).toString(16)}\r\n`,
    bytes.subarray(globe + 2),
    "\r\n0\r\n\r\n",
  ];
  await using server = await startRawServer((s, r) =>
    writeApart(
      s,
      r.index === 0
        ? [
          head,
          bytes.subarray(0, e + 1),
          bytes.subarray(e + 1, globe + 3),
          bytes.subarray(globe + 3),
        ]
        : chunkedParts,
    )
  );
  assert.equal((await get(server.url())).text, text);
  assert.equal((await get(server.url())).text, text);
  assert.equal(server.connections, 1);
});

Deno.test("http1Request() reads a 2 MB body whole, by content-length and chunked", async () => {
  const text = MULTIBYTE.repeat(Math.ceil(2_000_000 / Buffer.byteLength(MULTIBYTE)));
  await using server = await startRawServer((s, r) => {
    if (r.index === 0) s.write(ok(text));
    else {
      const bytes = Buffer.from(text);
      const half = 1_000_003; // inside a character
      s.write("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
      s.write(`${half.toString(16)}\r\n`);
      s.write(bytes.subarray(0, half));
      s.write(`\r\n${(bytes.length - half).toString(16)}\r\n`);
      s.write(bytes.subarray(half));
      s.write("\r\n0\r\n\r\n");
    }
  });
  const byLength = await get(server.url());
  assert.ok(Buffer.byteLength(byLength.text) > 2_000_000);
  assert.equal(byLength.text, text);
  assert.equal((await get(server.url())).text, text);
});

// --- stale connections and failures ----------------------------------------------------------

Deno.test("http1Request() resends once on a new connection when the server dropped a reused one", async () => {
  await using server = await startRawServer((s, r) => {
    if (r.conn === 0 && r.index === 1) s.destroy(); // a keep-alive race: read, never answered
    else s.write(ok(`conn ${r.conn}`));
  });
  assert.equal((await get(server.url())).text, "conn 0");
  assert.equal((await get(server.url())).text, "conn 1");
  assert.equal(server.connections, 2);
  assert.equal(server.requests.length, 3);
});

Deno.test("http1Request() resent on a new connection still has its deadline and its signal", async () => {
  // Connections 0 and 2 answer once, then drop the next request; the connection each
  // request is resent on (1 and 3) never answers.
  await using server = await startRawServer((s, r) => {
    if (r.conn % 2 === 1) return;
    if (r.index === 0) s.write(ok("first"));
    else s.destroy();
  });
  assert.equal((await get(server.url())).text, "first");
  const timedOut = await within(
    rejection(get(server.url(), { timeoutMs: 150 })),
    3_000,
    "the resent request never timed out",
  );
  assert.ok(timedOut instanceof Http1TimeoutError, String(timedOut));
  await server.closed(1);
  assert.equal(server.connections, 2);
  // The same again, ended by the signal instead: the resent request's socket is the one closed.
  assert.equal((await get(server.url())).text, "first");
  const controller = new AbortController();
  const aborted = rejection(get(server.url(), { signal: controller.signal }));
  while (server.connections < 4) await delay(10);
  controller.abort(new Error("stop"));
  const error = await within(aborted, 3_000, "the signal did not end the resent request");
  assert.equal((error as Error).message, "stop");
  await server.closed(3);
  assert.equal(server.requests.length, 6);
});

Deno.test("http1Request() succeeds after the server closed an idle keep-alive connection", async () => {
  // Like uvicorn's keep-alive timeout: the server closes a connection idle for 50 ms.
  await using server = await startRawServer((s) => {
    s.write(ok("fresh"));
    setTimeout(() => s.end(), 50);
  });
  assert.equal((await get(server.url())).text, "fresh");
  await delay(200);
  assert.equal((await get(server.url())).text, "fresh");
  assert.equal(server.connections, 2);
  assert.equal(server.requests.length, 2);
});

Deno.test("http1Request() rejects in phase receive without resending when a reply breaks off", async () => {
  await using server = await startRawServer((s, r) => {
    if (r.index === 0) s.write(ok("whole"));
    else {
      s.write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf ");
      setTimeout(() => s.destroy(), 20);
    }
  });
  assert.equal((await get(server.url())).text, "whole");
  // The second request goes over the reused connection: a retry would be possible, but the
  // server already answered part of it, so it must not be sent twice.
  const error = await rejection(get(server.url()));
  assert.ok(error instanceof Http1Error, String(error));
  assert.equal(error.phase, "receive");
  assert.match(error.message, /closed before the response was complete/);
  assert.equal(server.requests.length, 2);
  assert.equal(server.connections, 1);
});

Deno.test("http1Request() does not resend on a fresh connection the server drops", async () => {
  await using server = await startRawServer((s) => s.destroy());
  const error = await rejection(get(server.url()));
  assert.ok(error instanceof Http1Error, String(error));
  assert.equal(error.phase, "send");
  assert.equal(error.code, "ECONNRESET");
  assert.equal(server.connections, 1);
});

Deno.test("http1Request() rejects in phase connect with ECONNREFUSED when nothing listens", async () => {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  const error = await rejection(get(new URL(`http://127.0.0.1:${port}/`)));
  assert.ok(error instanceof Http1Error, String(error));
  assert.equal(error.phase, "connect");
  assert.equal(error.code, "ECONNREFUSED");
  assert.match(error.message, /connection refused/);
});

Deno.test("http1Request() rejects a malformed status line", async () => {
  await using server = await startRawServer((s) => s.write("SMTP ready\r\n\r\n"));
  const error = await rejection(get(server.url()));
  assert.ok(error instanceof Http1Error, String(error));
  assert.equal(error.phase, "receive");
  assert.match(error.message, /Malformed HTTP status line "SMTP ready"/);
  await server.closed(0);
});

Deno.test("OpenAIChatClient reports a reply that is not HTTP as a ModelError naming the endpoint", async () => {
  await using server = await startRawServer((s) => s.write("SMTP ready\r\n\r\n"));
  const base = server.url("/v1").href;
  const client = new OpenAIChatClient({ base_url: base, max_retries: 2 });
  const error = await client.getResponse([{ role: "user", content: "hi" }], "m").catch((e) => e);
  assert.ok(error instanceof ModelError, String(error));
  assert.match(
    error.message,
    /Reading the response from ".*\/v1\/chat\/completions" failed: Malformed/,
  );
  assert.equal(server.requests.length, 1); // a broken reply is not retried
});

// --- deadlines and cancellation --------------------------------------------------------------

Deno.test("http1Request() rejects with Http1TimeoutError after timeoutMs and closes the socket", async () => {
  await using server = await startRawServer(() => {}); // never answers
  const start = performance.now();
  const error = await within(rejection(get(server.url(), { timeoutMs: 150 })), 3_000, "no timeout");
  const elapsed = performance.now() - start;
  assert.ok(error instanceof Http1TimeoutError, String(error));
  assert.equal(error.code, "ETIMEDOUT");
  assert.equal(error.phase, "send");
  assert.ok(elapsed >= 140 && elapsed < 1_000, `took ${elapsed} ms`);
  await server.closed(0);
  assert.equal(server.requests.length, 1);
});

Deno.test("http1Request() times out a long timeout by the shared once-a-second sweep", async () => {
  // Timeouts of 10 s and more share one sweep instead of a timer each: this one must still
  // fire, at most a second late, and leave a fast request beside it alone.
  await using server = await startRawServer((s, r) => {
    if (r.conn === 0) return; // the first connection never answers
    s.write(ok("fast"));
  });
  const start = performance.now();
  const stalled = rejection(get(server.url(), { timeoutMs: 10_000 }));
  await delay(20);
  const fast = await get(server.url(), { timeoutMs: 10_000 });
  assert.equal(fast.text, "fast");
  const error = await within(stalled, 15_000, "no timeout");
  const elapsed = performance.now() - start;
  assert.ok(error instanceof Http1TimeoutError, String(error));
  assert.equal(error.phase, "send");
  // Never early; late by the sweep's second at most, plus room for a loaded test machine.
  assert.ok(elapsed >= 9_990 && elapsed < 13_000, `took ${elapsed} ms`);
});

Deno.test("http1Request() times out in phase receive when the reply stalls midway", async () => {
  await using server = await startRawServer((s) => {
    s.write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc");
  });
  const error = await within(rejection(get(server.url(), { timeoutMs: 100 })), 3_000, "no timeout");
  assert.ok(error instanceof Http1TimeoutError, String(error));
  assert.equal(error.phase, "receive");
  await server.closed(0);
});

Deno.test("http1Request() rejects with the signal's reason when it aborts and closes the socket", async () => {
  await using server = await startRawServer(() => {});
  const controller = new AbortController();
  const reason = new Error("stop now");
  const timer = setTimeout(() => controller.abort(reason), 50);
  const start = performance.now();
  const error = await rejection<Error>(
    get(server.url(), { signal: controller.signal, timeoutMs: 2_000 }),
  );
  clearTimeout(timer);
  assert.equal(error, reason);
  assert.ok(performance.now() - start < 1_000);
  await server.closed(0);
});

Deno.test("http1Request() rejects an already aborted signal without connecting", async () => {
  await using server = await startRawServer(() => {});
  const reason = new Error("aborted before");
  const error = await rejection<Error>(get(server.url(), { signal: AbortSignal.abort(reason) }));
  assert.equal(error, reason);
  await delay(50);
  assert.equal(server.connections, 0);
});

// --- headers ---------------------------------------------------------------------------------

Deno.test("http1Request() throws TypeError for header injection or an invalid name, sending nothing", async () => {
  await using server = await startRawServer((s) => s.write(ok("no")));
  const headerSets: Record<string, string>[] = [
    { "x-a": "1\r\nx-evil: 2" },
    { "x-a": "1\nx-evil: 2" },
    { "x-a": "nul\0" },
    { "bad name": "1" },
    { "x:y": "1" },
    { "": "1" },
  ];
  for (const headers of headerSets) {
    await assert.rejects(
      http1Request({ method: "GET", url: server.url(), headers }),
      TypeError,
      JSON.stringify(headers),
    );
  }
  await delay(50);
  assert.equal(server.connections, 0);
});

Deno.test("http1Request() sends a frozen headers object's lines, checked once, on every request", async () => {
  await using server = await startRawServer((s) => s.write(ok("ok")));
  const headers = Object.freeze({ "x-run": "a" });
  for (let i = 0; i < 3; i++) {
    await http1Request({ method: "GET", url: server.url(), headers });
  }
  assert.equal(server.requests.length, 3);
  for (const r of server.requests) assert.match(r.head, /\r\nx-run: a(\r\n|$)/);
  // A frozen object with a bad value is refused, not cached as good.
  const bad = Object.freeze({ "x-a": "1\r\nx-evil: 2" });
  for (let i = 0; i < 2; i++) {
    await assert.rejects(
      http1Request({ method: "GET", url: server.url(), headers: bad }),
      TypeError,
    );
  }
});

Deno.test("http1Request() returns the first response and drops the connection when extra bytes follow", async () => {
  await using server = await startRawServer((s, r) => {
    if (r.conn === 0) s.write(ok("first") + ok("unasked")); // in the same packet
    else if (r.conn === 1) {
      s.write(ok("second"));
      setTimeout(() => s.write(ok("late")), 20); // while the connection sits idle
    } else s.write(ok("third"));
  });
  assert.equal((await get(server.url())).text, "first");
  await server.closed(0);
  assert.equal((await get(server.url())).text, "second");
  await server.closed(1); // the client closed it when the unasked bytes arrived
  assert.equal((await get(server.url())).text, "third");
  assert.equal(server.connections, 3);
});

Deno.test("http1Request() lower-cases response header names and joins repeated ones", async () => {
  await using server = await startRawServer((s) =>
    s.write(ok("h", "Set-Cookie: a=1\r\nX-Mixed-Case:  Value  \r\nset-cookie: b=2\r\n"))
  );
  const res = await get(server.url());
  assert.equal(res.headers.get("set-cookie"), "a=1, b=2");
  assert.equal(res.headers.get("x-mixed-case"), "Value");
  assert.equal(res.headers.get("content-length"), "1");
  assert.equal(res.headers.has("X-Mixed-Case"), false);
});

Deno.test("http1Request() sends host, path, query, headers and the UTF-8 byte length to node:http", async () => {
  const seen: http.IncomingMessage[] = [];
  const bytes: number[] = [];
  await using server = await startNodeServer(async (req, res) => {
    const parts: Buffer[] = [];
    for await (const part of req) parts.push(part);
    const body = Buffer.concat(parts);
    seen.push(req);
    bytes.push(body.length);
    res.end(body.toString("utf8"));
  });
  const body = MULTIBYTE.repeat(2);
  const res = await http1Request({
    method: "POST",
    url: server.url("/v1/x?q=1&r=%20"),
    headers: { "content-type": "text/plain; charset=utf-8", "X-Custom": "yes" },
    body,
  });
  assert.equal(res.text, body);
  const [request] = seen;
  assert.equal(request.method, "POST");
  assert.equal(request.url, "/v1/x?q=1&r=%20");
  assert.equal(request.headers.host, `127.0.0.1:${server.port}`);
  assert.equal(request.headers["x-custom"], "yes");
  assert.deepEqual(bytes, [Buffer.byteLength(body)]);
  assert.equal(request.headers["content-length"], String(Buffer.byteLength(body)));
  assert.notEqual(Buffer.byteLength(body), body.length);
});

Deno.test("http1Request() keeps one connection to Deno.serve across requests", async () => {
  const clientPorts: number[] = [];
  await using server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: () => {} },
    async (req, info) => {
      clientPorts.push(info.remoteAddr.port);
      return new Response(`${req.method} ${await req.text()} ${MULTIBYTE}`);
    },
  );
  const url = new URL(`http://127.0.0.1:${server.addr.port}/`);
  const replies: Http1Response[] = [];
  for (const body of ["a", "b", "c"]) {
    replies.push(await http1Request({ method: "PUT", url, headers: {}, body }));
  }
  assert.deepEqual(replies.map((r) => r.text), ["a", "b", "c"].map((b) => `PUT ${b} ${MULTIBYTE}`));
  assert.equal(new Set(clientPorts).size, 1);
  closeIdleConnections();
});

// --- usesProxy() -----------------------------------------------------------------------------

function proxied(url: string, env: Record<string, string>): boolean {
  return usesProxy(new URL(url), (name) => env[name]);
}

Deno.test("usesProxy() is false without proxy variables and true with HTTP_PROXY or ALL_PROXY", () => {
  assert.equal(proxied("http://example.com/", {}), false);
  assert.equal(proxied("http://example.com/", { NO_PROXY: "other.com" }), false);
  assert.equal(proxied("http://example.com/", { HTTP_PROXY: "http://p:3128" }), true);
  assert.equal(proxied("http://example.com/", { http_proxy: "http://p:3128" }), true);
  assert.equal(proxied("http://example.com/", { ALL_PROXY: "http://p:3128" }), true);
  assert.equal(proxied("http://example.com/", { all_proxy: "http://p:3128" }), true);
  assert.equal(proxied("http://example.com/", { HTTP_PROXY: "" }), false);
});

Deno.test("usesProxy() skips the proxy for hosts NO_PROXY names by name, suffix or wildcard", () => {
  const env = (noProxy: string) => ({ HTTP_PROXY: "http://p:3128", NO_PROXY: noProxy });
  assert.equal(proxied("http://example.com/", env("example.com")), false);
  assert.equal(proxied("http://api.example.com/", env("example.com")), false);
  assert.equal(proxied("http://notexample.com/", env("example.com")), true);
  assert.equal(proxied("http://api.example.com/", env(".example.com")), false);
  assert.equal(proxied("http://api.example.com/", env("*.example.com")), false);
  assert.equal(proxied("http://other.com/", env(".example.com")), true);
  assert.equal(proxied("http://anything.at.all/", env("*")), false);
  assert.equal(proxied("http://EXAMPLE.com/", env(" foo.org , Example.COM ")), false);
  assert.equal(proxied("http://127.0.0.1:8000/", env("localhost,127.0.0.1")), false);
  assert.equal(proxied("http://127.0.0.2:8000/", env("localhost,127.0.0.1")), true);
  assert.equal(
    proxied("http://example.com/", { http_proxy: "http://p:3128", no_proxy: "example.com" }),
    false,
  );
});

Deno.test("usesProxy() matches a NO_PROXY port only against the URL's port", () => {
  const env = (noProxy: string) => ({ HTTP_PROXY: "http://p:3128", NO_PROXY: noProxy });
  assert.equal(proxied("http://example.com:8080/", env("example.com:8080")), false);
  assert.equal(proxied("http://example.com:9090/", env("example.com:8080")), true);
  assert.equal(proxied("http://example.com/", env("example.com:80")), false);
  assert.equal(proxied("http://example.com/", env("example.com:8080")), true);
  assert.equal(proxied("http://[::1]:8000/", env("[::1]")), false);
  assert.equal(proxied("http://[::1]:8000/", env("[::1]:8000")), false);
  assert.equal(proxied("http://[::1]:8000/", env("[::1]:9")), true);
  assert.equal(proxied("http://[::2]:8000/", env("[::1]")), true);
});

// --- processes and the model client ----------------------------------------------------------

/** Runs `source` as a script in a child `deno`, killed if it has not exited within `limitMs`. */
async function runChild(
  source: string,
  args: string[],
  env: Record<string, string>,
  limitMs = 15_000,
) {
  const dir = await Deno.makeTempDir({ prefix: "vf_http1_" });
  try {
    const script = `${dir}/child.ts`;
    await Deno.writeTextFile(script, source);
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), limitMs);
    const start = performance.now();
    try {
      const out = await new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", "--no-config", script, ...args],
        env,
        clearEnv: true,
        stdout: "piped",
        stderr: "piped",
        signal: controller.signal,
      }).output();
      const dec = new TextDecoder();
      return {
        code: out.code,
        signal: out.signal,
        stdout: dec.decode(out.stdout),
        stderr: dec.decode(out.stderr),
        ms: performance.now() - start,
      };
    } finally {
      clearTimeout(timer);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("a process whose request left an idle pooled connection exits on its own", async () => {
  // The server keeps every connection open, so only the client's pool could hold the child.
  await using server = await startRawServer((s) => s.write(ok("from the pool")));
  const child = await runChild(
    `import { http1Request } from ${JSON.stringify(new URL("./http1.ts", import.meta.url).href)};
const res = await http1Request({ method: "GET", url: new URL(Deno.args[0]), headers: {} });
console.log(res.status, res.text);
`,
    [server.url().href],
    childEnv(),
  );
  assert.equal(child.signal, null, `killed after ${child.ms} ms: ${child.stderr}`);
  assert.equal(child.code, 0, child.stderr);
  assert.equal(child.stdout, "200 from the pool\n");
  assert.ok(child.ms < 10_000, `took ${child.ms} ms`);
  assert.equal(server.requests.length, 1);
  await server.closed(0); // the child's exit closed it
});

const COMPLETION = (content: string) =>
  JSON.stringify({
    id: "c",
    object: "chat.completion",
    created: 0,
    model: "m",
    choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }],
  });

Deno.test("OpenAIChatClient sends a proxied http: endpoint through fetch and the proxy", async () => {
  const seen: { url?: string; host?: string; body: string }[] = [];
  await using proxy = await startNodeServer(async (req, res) => {
    let body = "";
    for await (const part of req) body += part;
    seen.push({ url: req.url, host: req.headers.host, body });
    res.setHeader("content-type", "application/json");
    res.end(COMPLETION("answered by the proxy"));
  });
  const proxyUrl = `http://127.0.0.1:${proxy.port}`;
  const child = await runChild(
    `import { OpenAIChatClient } from ${
      JSON.stringify(new URL("./client.ts", import.meta.url).href)
    };
const client = new OpenAIChatClient({ base_url: "http://example.invalid:8000/v1", max_retries: 0 });
const res = await client.getResponse([{ role: "user", content: "hi" }], "m");
console.log(res.message.content);
`,
    [],
    childEnv({ HTTP_PROXY: proxyUrl, http_proxy: proxyUrl }),
  );
  assert.equal(child.code, 0, child.stderr);
  assert.equal(child.stdout, "answered by the proxy\n");
  assert.equal(seen.length, 1);
  assert.equal(seen[0].url, "http://example.invalid:8000/v1/chat/completions");
  assert.equal(seen[0].host, "example.invalid:8000");
  assert.deepEqual(JSON.parse(seen[0].body).messages, [{ role: "user", content: "hi" }]);
});

Deno.test("OpenAIChatClient uses the HTTP/1.1 pool by default and fetch with transport fetch", async () => {
  await using server = await startModelServer({ responder: () => ({ content: "ok" }) });
  for (const transport of ["auto", "fetch"] as const) {
    const client = new OpenAIChatClient({ base_url: server.url, max_retries: 0, transport });
    const res = await client.getResponse([{ role: "user", content: "hi" }], "m");
    assert.equal(res.message.content, "ok");
  }
  // fetch adds its default headers; the pool sends only what the client asked for.
  const [pooled, fetched] = server.requests.map((r) => r.headers);
  assert.equal(pooled["accept-encoding"], undefined);
  assert.match(fetched["accept-encoding"], /gzip/);
  assert.match(pooled["user-agent"], /^vf\/\d/);
  assert.equal(fetched["user-agent"], pooled["user-agent"]);
  assert.equal(pooled.authorization, "Bearer EMPTY");
  assert.equal(fetched.authorization, "Bearer EMPTY");
  closeIdleConnections();
});
