/**
 * HTTP/1.1 on the gateway's raw sockets: the one listener is also a forward proxy, so it reads
 * request heads and bodies itself and writes its replies and event streams by hand.
 * @module
 */
import type net from "node:net";
import { Buffer } from "node:buffer";
import { GatewayRefusal } from "./chat.ts";
import { unrefTimer } from "../util/_timers.ts";

/** A request head: method, target and headers (names lower-cased; `raw` the lines as sent). */
export interface Head {
  method: string;
  target: string;
  headers: Map<string, string>;
  raw: string[];
}

/** Parse a request head (without its blank line); null when it is not HTTP/1.x. */
export function parseHead(text: string): Head | null {
  const lines = text.split("\r\n");
  const m = /^([A-Z]+) (\S+) HTTP\/1\.[01]$/.exec(lines[0] ?? "");
  if (!m) return null;
  const headers = new Map<string, string>();
  const raw: string[] = [];
  for (const line of lines.slice(1)) {
    const i = line.indexOf(":");
    if (i <= 0) continue;
    raw.push(line);
    headers.set(line.slice(0, i).trim().toLowerCase(), line.slice(i + 1).trim());
  }
  return { method: m[1], target: m[2], headers, raw };
}

/** The longest request head read. */
export const MAX_HEAD = 64 * 1024;
/** Sockets whose request is a HEAD: their replies carry no body. */
export const headOnly = new WeakSet<net.Socket>();
const MAX_BODY = 64 * 1024 * 1024;

const REASONS: Record<number, string> = {
  200: "OK",
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  407: "Proxy Authentication Required",
  409: "Conflict",
  413: "Payload Too Large",
  429: "Too Many Requests",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
};

/** Answer with `body` and end the connection (a HEAD gets the head alone). */
export function reply(
  socket: net.Socket,
  status: number,
  body: string,
  type = "application/json",
  extra: string[] = [],
): void {
  const bytes = Buffer.from(body, "utf8");
  socket.end(Buffer.concat([
    Buffer.from(
      [
        `HTTP/1.1 ${status} ${REASONS[status] ?? "Status"}`,
        `Content-Type: ${type}`,
        `Content-Length: ${bytes.length}`,
        "Connection: close",
        ...extra,
        "",
        "",
      ].join("\r\n"),
      "latin1",
    ),
    headOnly.has(socket) ? Buffer.alloc(0) : bytes,
  ]));
  socket.resume(); // read on to the client's end, so the connection closes
}

/** Answer with `value` as JSON and end the connection. */
export function replyJson(socket: net.Socket, status: number, value: unknown): void {
  reply(socket, status, JSON.stringify(value));
}

/** Read the rest of a request body (Content-Length or chunked) after its head. */
export function readBody(socket: net.Socket, rest: Buffer, head: Head): Promise<Buffer> {
  const length = head.headers.get("content-length");
  const chunked = /chunked/i.test(head.headers.get("transfer-encoding") ?? "");
  if (!chunked && !length) return Promise.resolve(Buffer.alloc(0));
  const want = Number(length);
  if (!chunked && (!Number.isFinite(want) || want > MAX_BODY)) {
    return Promise.reject(new GatewayRefusal(413, "request body too large"));
  }
  return new Promise((resolve, reject) => {
    let buf = rest;
    // Chunks are kept as they come and joined once (joining on every read is quadratic).
    const pending: Buffer[] = [];
    let pendingBytes = 0;
    const join = () => {
      if (pending.length) {
        buf = Buffer.concat([buf, ...pending.splice(0)]);
        pendingBytes = 0;
      }
    };
    const done = (): Buffer | null => {
      if (!chunked) {
        if (buf.length + pendingBytes < want) return null;
        join();
        return buf.subarray(0, want);
      }
      join();
      // Decode whole chunks; null until the terminating zero-size chunk has arrived.
      const parts: Buffer[] = [];
      let at = 0;
      for (;;) {
        const eol = buf.indexOf("\r\n", at);
        if (eol < 0) return null;
        const line = buf.subarray(at, eol).toString("latin1").split(";")[0].trim();
        if (!/^[0-9a-f]{1,8}$/i.test(line)) throw new GatewayRefusal(400, "bad chunked encoding");
        const size = parseInt(line, 16);
        if (size === 0) return Buffer.concat(parts);
        if (buf.length < eol + 2 + size + 2) return null;
        parts.push(buf.subarray(eol + 2, eol + 2 + size));
        at = eol + 2 + size + 2;
      }
    };
    const check = () => {
      try {
        const body = done();
        if (body) {
          socket.off("data", onData);
          socket.off("end", onEnd);
          resolve(body);
        } else if (buf.length + pendingBytes > MAX_BODY) {
          throw new GatewayRefusal(413, "request body too large");
        }
      } catch (error) {
        socket.off("data", onData);
        reject(error);
      }
    };
    const onData = (chunk: Buffer) => {
      pending.push(chunk);
      pendingBytes += chunk.length;
      check();
    };
    const onEnd = () => reject(new GatewayRefusal(400, "the request body was cut short"));
    socket.on("data", onData);
    socket.on("end", onEnd);
    socket.resume();
    check();
  });
}

/** A request body as JSON; a 400 refusal when it is not. */
export function parseJson(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString("utf8"));
  } catch {
    throw new GatewayRefusal(400, "the request body is not JSON");
  }
}

/**
 * A server-sent event stream on a socket: the head goes out with the first event (so a
 * refusal before any still gets its status), chunked; a `: keep-alive` comment goes out
 * whenever nothing has for `keepAliveMs`.
 */
export class EventStream {
  started = false;
  #last = Date.now();
  readonly #timer: ReturnType<typeof setInterval>;
  constructor(readonly socket: net.Socket, keepAliveMs: number) {
    this.#timer = unrefTimer(setInterval(() => {
      if (Date.now() - this.#last >= keepAliveMs / 2) this.write(": keep-alive\n\n");
    }, keepAliveMs));
  }
  write(text: string): void {
    if (!text || this.socket.destroyed) return;
    this.#last = Date.now();
    if (!this.started) {
      this.started = true;
      this.socket.write(
        [
          "HTTP/1.1 200 OK",
          "Content-Type: text/event-stream; charset=utf-8",
          "Cache-Control: no-cache",
          "Transfer-Encoding: chunked",
          "Connection: close",
          "",
          "",
        ].join("\r\n"),
        "latin1",
      );
    }
    if (headOnly.has(this.socket)) return;
    const bytes = Buffer.from(text, "utf8");
    this.socket.write(Buffer.concat([
      Buffer.from(`${bytes.length.toString(16)}\r\n`, "latin1"),
      bytes,
      Buffer.from("\r\n", "latin1"),
    ]));
  }
  end(text: string): void {
    this.stop();
    this.write(text);
    this.socket.end(headOnly.has(this.socket) ? "" : "0\r\n\r\n");
    this.socket.resume();
  }
  stop(): void {
    clearInterval(this.#timer);
  }
}
