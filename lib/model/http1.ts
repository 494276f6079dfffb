/**
 * A small HTTP/1.1 client for plain `http:` origins: one pool of keep-alive sockets per
 * origin, one request per socket at a time, bodies sent and read whole. The model client uses
 * it for local inference servers (vLLM, SGLang, llama.cpp on loopback or a LAN), where the
 * client's own CPU per request decides how many rollouts a run finishes per second: in Deno
 * this path costs a fraction of `fetch` (see bench/README.md). `https:` and proxied requests
 * stay on `fetch`, which owns TLS, certificates and proxies.
 *
 * Runs on `node:net`, so the Bun-compiled binary uses it too.
 * @module
 */
import net from "node:net";
import { Buffer } from "node:buffer";
import { unrefTimer } from "../util/_timers.ts";

/** One request. The body is sent whole with a `content-length`. */
export interface Http1Request {
  method: string;
  url: URL;
  headers: Record<string, string>;
  body?: string;
  /** Rejects with the signal's reason and closes the socket when it aborts. */
  signal?: AbortSignal;
  /** Whole-request deadline in milliseconds (connect, send and the full response). */
  timeoutMs?: number;
}

/** A complete response: status, lower-cased headers and the body as UTF-8 text. */
export interface Http1Response {
  status: number;
  headers: Map<string, string>;
  text: string;
}

/** Where a request failed: before any response byte arrived (`connect`/`send`) or after. */
export type Http1Phase = "connect" | "send" | "receive";

/** A transport failure: the connection, not the server's answer. */
export class Http1Error extends Error {
  constructor(
    message: string,
    readonly phase: Http1Phase,
    readonly code: string | undefined,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = "Http1Error";
  }
}

/** The request's `timeoutMs` passed. */
export class Http1TimeoutError extends Http1Error {
  constructor(phase: Http1Phase, ms: number) {
    super(`No complete response within ${ms / 1000}s`, phase, "ETIMEDOUT");
    this.name = "Http1TimeoutError";
  }
}

const CODE_TEXT: Record<string, string> = {
  ECONNREFUSED: "connection refused",
  ECONNRESET: "connection reset by the server",
  ENOTFOUND: "host not found",
  EAI_AGAIN: "host name lookup failed",
  EHOSTUNREACH: "host unreachable",
  ENETUNREACH: "network unreachable",
  ETIMEDOUT: "connection timed out",
  EPIPE: "connection closed while sending",
};

/** Idle sockets older than this are closed instead of reused: uvicorn (vLLM) drops idle
 * keep-alive connections after 5 s, and reusing one at that moment loses the request. */
const IDLE_MS = 4_000;
/** Idle sockets kept per origin; more are closed when they finish. */
const MAX_IDLE = 1024;
const HEADER_END = Buffer.from("\r\n\r\n");
const CRLF = Buffer.from("\r\n");

type Framing = "length" | "chunked" | "close" | "none";

/** The request a connection is serving, and its response as it arrives. */
interface Pending {
  resolve(response: Http1Response): void;
  reject(error: Error): void;
  /** Bytes received so far, not yet parsed. */
  buffer: Buffer | null;
  status: number;
  headers: Map<string, string> | null;
  framing: Framing;
  /** Body bytes still expected ("length"), or the chunk being read ("chunked"). */
  remaining: number;
  body: Buffer[];
  keepAlive: boolean;
  received: boolean;
  /** A HEAD request: the response has no body whatever its headers announce. */
  head: boolean;
}

class Connection {
  readonly socket: net.Socket;
  pending: Pending | null = null;
  idleSince = 0;
  connected = false;
  dead = false;
  /** Listed for the sweep of long deadlines (see {@link watchDeadline}). */
  timed = false;

  constructor(readonly origin: Origin) {
    this.socket = net.connect({ host: origin.host, port: origin.port });
    this.socket.setNoDelay(true);
    this.socket.on("connect", () => (this.connected = true));
    this.socket.on("data", (chunk: Buffer) => this.#onData(chunk));
    this.socket.on("error", (error: Error & { code?: string }) => this.#fail(error));
    this.socket.on("close", () => this.#fail(null));
    this.socket.on("end", () => this.#onEnd());
  }

  #onData(chunk: Buffer): void {
    const p = this.pending;
    if (!p) {
      // Bytes nobody asked for: the connection is out of step; never reuse it.
      this.destroy();
      return;
    }
    p.received = true;
    p.buffer = p.buffer && p.buffer.length > 0 ? Buffer.concat([p.buffer, chunk]) : chunk;
    try {
      if (parse(p)) this.#finish(p);
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      if (this.#take(p)) p.reject(new Http1Error(message, "receive", "EPROTO"));
      this.destroy();
    }
  }

  #onEnd(): void {
    const p = this.pending;
    if (p && p.framing === "close" && p.headers) {
      if (p.buffer && p.buffer.length > 0) p.body.push(p.buffer);
      p.buffer = null;
      p.keepAlive = false;
      this.#finish(p);
    }
  }

  #finish(p: Pending): void {
    const response: Http1Response = {
      status: p.status,
      headers: p.headers!,
      text: p.body.length === 1 ? p.body[0].toString("utf8") : Buffer.concat(p.body).toString(),
    };
    const reusable = p.keepAlive && (p.buffer === null || p.buffer.length === 0);
    if (this.#take(p)) p.resolve(response);
    if (reusable) this.origin.release(this);
    else this.destroy();
  }

  #fail(error: (Error & { code?: string }) | null): void {
    this.dead = true;
    const p = this.pending;
    if (!p) {
      this.origin.forget(this);
      return;
    }
    const phase: Http1Phase = p.received ? "receive" : this.connected ? "send" : "connect";
    const code = error?.code ?? (p.received ? undefined : "ECONNRESET");
    const what = code && CODE_TEXT[code] ? `${CODE_TEXT[code]} (${code})` : error?.message ??
      "the server closed the connection";
    const message = phase === "receive"
      ? `the connection closed before the response was complete: ${what}`
      : what;
    if (this.#take(p)) p.reject(new Http1Error(message, phase, code, { cause: error }));
  }

  /** Whether `p` is still this connection's request; it no longer is once this returns. */
  #take(p: Pending): boolean {
    if (this.pending !== p) return false;
    this.pending = null;
    return true;
  }

  /** Sends one request; the response arrives through `pending`. */
  send(head: string, body: string | undefined, pending: Pending): void {
    this.pending = pending;
    this.socket.ref();
    this.socket.write(body === undefined ? head : head + body);
  }

  /** Ends the request this connection serves with `error` and closes it. */
  abort(error: Error): void {
    const p = this.pending;
    if (p && this.#take(p)) p.reject(error);
    this.destroy();
  }

  destroy(): void {
    this.dead = true;
    this.origin.forget(this);
    this.socket.destroy();
  }
}

class Origin {
  readonly idle: Connection[] = [];
  constructor(readonly host: string, readonly port: number) {}

  /** A reused idle connection, or null when none is fresh enough. */
  take(): Connection | null {
    const now = performance.now();
    while (this.idle.length > 0) {
      const c = this.idle.pop()!;
      if (!c.dead && now - c.idleSince < IDLE_MS) return c;
      c.destroy();
    }
    return null;
  }

  release(c: Connection): void {
    if (c.dead || this.idle.length >= MAX_IDLE) return c.destroy();
    c.idleSince = performance.now();
    c.socket.unref(); // an idle pool never keeps the process alive
    this.idle.push(c);
  }

  forget(c: Connection): void {
    const i = this.idle.indexOf(c);
    if (i >= 0) this.idle.splice(i, 1);
  }
}

const origins = new Map<string, Origin>();

function originOf(url: URL): Origin {
  let origin = origins.get(url.host);
  if (!origin) {
    const host = url.hostname.startsWith("[") ? url.hostname.slice(1, -1) : url.hostname;
    origin = new Origin(host, Number(url.port || 80));
    origins.set(url.host, origin);
  }
  return origin;
}

/** Closes every idle pooled connection (in-flight requests are left alone). */
export function closeIdleConnections(): void {
  for (const origin of origins.values()) {
    for (const c of [...origin.idle]) c.destroy();
  }
}

function checkHeader(name: string, value: string): void {
  if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) {
    throw new TypeError(`Invalid HTTP header name ${JSON.stringify(name)}`);
  }
  if (/[\r\n\0]/.test(value)) {
    throw new TypeError(`HTTP header "${name}" has a line break or NUL in its value`);
  }
}

/** Parses what `p.buffer` holds; true once the response is complete. */
function parse(p: Pending): boolean {
  for (;;) {
    if (!p.headers) {
      const buf = p.buffer!;
      const end = buf.indexOf(HEADER_END);
      if (end < 0) {
        if (buf.length > 64 * 1024) throw new Error("Response headers exceed 64 KiB");
        return false;
      }
      parseHead(p, buf.toString("latin1", 0, end));
      p.buffer = buf.subarray(end + 4);
      if (p.status >= 100 && p.status < 200) {
        p.headers = null; // 100 Continue, 103 Early Hints: the real response follows
        continue;
      }
    }
    switch (p.framing) {
      case "none":
        return true;
      case "close": // complete at the end of the stream
        if (p.buffer!.length > 0) p.body.push(p.buffer!);
        p.buffer = p.buffer!.subarray(p.buffer!.length);
        return false;
      case "length": {
        // Body pieces are kept as they come, so a large body is never copied per packet.
        const buf = p.buffer!;
        const take = Math.min(buf.length, p.remaining);
        if (take > 0) p.body.push(buf.subarray(0, take));
        p.remaining -= take;
        p.buffer = buf.subarray(take);
        return p.remaining === 0;
      }
      case "chunked":
        return parseChunks(p);
    }
  }
}

function parseHead(p: Pending, head: string): void {
  const lines = head.split("\r\n");
  const m = /^HTTP\/1\.([01]) (\d{3})/.exec(lines[0]);
  if (!m) throw new Error(`Malformed HTTP status line ${JSON.stringify(lines[0].slice(0, 80))}`);
  p.status = Number(m[2]);
  const headers = new Map<string, string>();
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i];
    const colon = line.indexOf(":");
    if (colon <= 0) continue;
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    const had = headers.get(name);
    headers.set(name, had === undefined ? value : `${had}, ${value}`);
  }
  p.headers = headers;
  const connection = headers.get("connection")?.toLowerCase() ?? "";
  p.keepAlive = m[1] === "1" ? !connection.includes("close") : connection.includes("keep-alive");
  const te = headers.get("transfer-encoding")?.toLowerCase();
  const length = headers.get("content-length");
  if (p.head || p.status < 200 || p.status === 204 || p.status === 304) {
    p.framing = "none";
  } else if (te && te.includes("chunked")) {
    p.framing = "chunked";
    p.remaining = -1;
  } else if (length !== undefined) {
    const n = Number(length);
    if (!Number.isSafeInteger(n) || n < 0) throw new Error(`Bad content-length "${length}"`);
    p.framing = n === 0 ? "none" : "length";
    p.remaining = n;
  } else {
    p.framing = "close";
    p.keepAlive = false;
  }
}

/** Chunked body. `remaining`: bytes left of the chunk being read (0: its CRLF is next), -1
 * while reading a size line, -2 while reading the trailer section after the last chunk. */
function parseChunks(p: Pending): boolean {
  let buf = p.buffer!;
  for (;;) {
    if (p.remaining === -2) {
      // Trailers (rare) are header lines ending in an empty line; usually just the CRLF.
      const end = buf.length >= 2 && buf[0] === 13 && buf[1] === 10 ? 0 : buf.indexOf(HEADER_END);
      if (end < 0) break;
      p.buffer = buf.subarray(end === 0 ? 2 : end + 4);
      return true;
    }
    if (p.remaining === -1) {
      const eol = buf.indexOf(CRLF);
      if (eol < 0) break;
      const line = buf.toString("latin1", 0, eol).split(";")[0].trim();
      const size = /^[0-9a-fA-F]+$/.test(line) ? parseInt(line, 16) : NaN;
      if (!Number.isSafeInteger(size)) throw new Error("Malformed chunked response body");
      buf = buf.subarray(eol + 2);
      p.remaining = size === 0 ? -2 : size;
      continue;
    }
    const take = Math.min(buf.length, p.remaining);
    if (take > 0) p.body.push(buf.subarray(0, take));
    p.remaining -= take;
    buf = buf.subarray(take);
    if (p.remaining > 0 || buf.length < 2) break; // more data, or the CRLF after it, to come
    buf = buf.subarray(2);
    p.remaining = -1;
  }
  p.buffer = buf;
  return false;
}

/**
 * Sends one request over a pooled keep-alive connection and reads the whole response.
 * A request on a reused connection that the server had already closed is sent again once on
 * a new connection (before any byte of a response arrived, so the server never saw it).
 *
 * One promise per request and no async frame: at hundreds of requests in flight, each frame
 * kept alive while the reply is awaited is memory every young-generation collection copies.
 *
 * @throws {Http1Error} when the connection fails; `phase` says whether any response arrived
 * @throws {Http1TimeoutError} when `timeoutMs` passes first
 * @throws the signal's reason when `signal` aborts
 */
export function http1Request(req: Http1Request): Promise<Http1Response> {
  let head: string;
  try {
    head =
      `${req.method} ${req.url.pathname}${req.url.search} HTTP/1.1\r\nhost: ${req.url.host}\r\n` +
      headerLines(req.headers);
    if (req.body !== undefined) head += `content-length: ${Buffer.byteLength(req.body)}\r\n`;
    head += "\r\n";
    req.signal?.throwIfAborted();
  } catch (error) {
    return Promise.reject(error);
  }
  const origin = originOf(req.url);
  const reused = origin.take();
  return exchange(reused ?? new Connection(origin), head, req, reused !== null);
}

/** The header lines of frozen header objects (a client's headers for every request). */
const HEADER_LINES = new WeakMap<Readonly<Record<string, string>>, string>();

function headerLines(headers: Readonly<Record<string, string>>): string {
  const known = HEADER_LINES.get(headers);
  if (known !== undefined) return known;
  let lines = "";
  for (const name in headers) {
    const value = headers[name];
    checkHeader(name, value);
    lines += `${name}: ${value}\r\n`;
  }
  if (Object.isFrozen(headers)) HEADER_LINES.set(headers, lines);
  return lines;
}

/**
 * Connections in flight per signal. Thousands of requests share one run's signal, so one
 * abort listener per signal replaces one add/remove pair per request.
 */
const inFlight = new WeakMap<AbortSignal, Set<Connection>>();

function watch(signal: AbortSignal, conn: Connection): void {
  let conns = inFlight.get(signal);
  if (!conns) {
    const set = conns = new Set();
    inFlight.set(signal, set);
    signal.addEventListener("abort", () => {
      for (const c of [...set]) c.abort(signal.reason);
    }, { once: true });
  }
  conns.add(conn);
}

/**
 * Long timeouts (model calls wait up to minutes) are checked by one sweep a second instead of
 * a timer each: a timer cost as much as a quarter of a loopback request. Such a timeout fires
 * up to a second late, which is at most a tenth of it; shorter ones keep their own timer.
 */
const SWEPT_FROM_MS = 10_000;
const SWEEP_EVERY_MS = 1_000;

/**
 * Connections serving a request with a swept deadline (`Exchange.at`). The sweep reads each
 * one's current request, and drops a connection once it serves none with a deadline (`start()`
 * lists it again). A list of connections and not a `Set` of requests: a module-level `Set` that
 * requests pass through kept what they referenced alive through young-generation collections
 * (at hundreds in flight, a sixth of everything a request allocated was copied and promoted),
 * while connections are long-lived and few.
 */
const timed: Connection[] = [];
let sweeper: ReturnType<typeof setInterval> | undefined;

function watchDeadline(conn: Connection): void {
  if (conn.timed) return;
  conn.timed = true;
  timed.push(conn);
  if (sweeper !== undefined) return;
  sweeper = setInterval(sweepDeadlines, SWEEP_EVERY_MS);
  // The sockets of requests in flight keep the process alive; the sweep never does.
  unrefTimer(sweeper);
}

function sweepDeadlines(): void {
  const now = performance.now();
  let kept = 0;
  const due: Exchange[] = [];
  for (const conn of timed) {
    const p = conn.pending;
    if (p instanceof Exchange && p.at !== 0) {
      timed[kept++] = conn;
      if (p.at <= now) due.push(p);
    } else conn.timed = false;
  }
  timed.length = kept;
  for (const p of due) p.expire();
  if (timed.length === 0) {
    clearInterval(sweeper);
    sweeper = undefined;
  }
}

/**
 * One request in flight: its response as it arrives, and what to undo when it settles. A
 * class, so the per-request state is one object (its methods live on the prototype, not in
 * closures made per request).
 */
class Exchange implements Pending {
  buffer: Buffer | null = null;
  status = 0;
  headers: Map<string, string> | null = null;
  framing: Framing = "none";
  remaining = 0;
  body: Buffer[] = [];
  keepAlive = false;
  received = false;
  head: boolean;
  /** When the request times out, for the sweep of long timeouts. */
  at = 0;
  timer: ReturnType<typeof setTimeout> | undefined = undefined;

  constructor(
    public conn: Connection,
    readonly req: Http1Request,
    readonly requestHead: string,
    /** Sent on a pooled connection: a failure before any reply is sent once more on a new one. */
    public reused: boolean,
    readonly done: (response: Http1Response) => void,
    readonly fail: (error: Error) => void,
  ) {
    this.head = req.method === "HEAD";
  }

  /** Arms the request's deadline and signal, and sends it on `conn`. */
  start(): void {
    const { signal, timeoutMs } = this.req;
    if (timeoutMs !== undefined && Number.isFinite(timeoutMs)) {
      if (timeoutMs < SWEPT_FROM_MS) timer(this, timeoutMs);
      else {
        this.at = performance.now() + timeoutMs;
        watchDeadline(this.conn);
      }
    }
    if (signal) watch(signal, this.conn);
    this.conn.send(this.requestHead, this.req.body, this);
  }

  resolve(response: Http1Response): void {
    this.#cleanUp();
    this.done(response);
  }

  reject(error: Error): void {
    this.#cleanUp();
    // A pooled connection the server had closed: nothing of the request reached it.
    const stale = this.reused && error instanceof Http1Error &&
      !(error instanceof Http1TimeoutError) && error.phase !== "receive";
    if (stale && !this.req.signal?.aborted) {
      this.reused = false;
      this.conn = new Connection(this.conn.origin);
      this.start();
      return;
    }
    this.fail(stale ? this.req.signal!.reason : error);
  }

  expire(): void {
    const phase: Http1Phase = this.received ? "receive" : "send";
    this.conn.abort(new Http1TimeoutError(phase, this.req.timeoutMs!));
  }

  #cleanUp(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    this.at = 0;
    const signal = this.req.signal;
    if (signal) inFlight.get(signal)?.delete(this.conn);
  }
}

function exchange(
  conn: Connection,
  head: string,
  req: Http1Request,
  reused: boolean,
): Promise<Http1Response> {
  return new Promise<Http1Response>((resolve, reject) => {
    new Exchange(conn, req, head, reused, resolve, reject).start();
  });
}

/** A short timeout's own timer. */
function timer(pending: Exchange, ms: number): void {
  pending.timer = setTimeout(() => pending.expire(), ms);
}

/** Whether `url` goes through a proxy under HTTP_PROXY / ALL_PROXY and NO_PROXY. */
export function usesProxy(url: URL, env: (name: string) => string | undefined): boolean {
  const proxy = env("HTTP_PROXY") || env("http_proxy") || env("ALL_PROXY") || env("all_proxy");
  if (!proxy) return false;
  const noProxy = env("NO_PROXY") ?? env("no_proxy") ?? "";
  const host = url.hostname.replace(/^\[|\]$/g, "").toLowerCase();
  for (const raw of noProxy.split(",")) {
    const entry = raw.trim().toLowerCase();
    if (!entry) continue;
    if (entry === "*") return false;
    const [name, port] = entry.startsWith("[")
      ? [entry.slice(1, entry.indexOf("]")), entry.split("]:")[1]]
      : entry.split(":");
    if (port && port !== (url.port || "80")) continue;
    const bare = name.replace(/^\*?\./, "");
    if (host === bare || host.endsWith(`.${bare}`)) return false;
  }
  return true;
}
