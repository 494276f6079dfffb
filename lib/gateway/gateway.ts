/**
 * The model gateway: one listener on the evaluator that every rollout's sandbox reaches on
 * its own network. It serves two things, each behind a per-rollout secret:
 *
 * - model endpoints in three dialects, chosen by the route the program posts to: chat
 *   completions (`POST /v1/chat/completions`), Responses (`POST /v1/responses`) and Anthropic
 *   Messages (`POST /v1/messages`), called with the rollout's model secret; the rollout's
 *   harness answers it through the run's real client, so the real key stays on the
 *   evaluator, the run's model and sampling apply, and every call lands on the trace. A
 *   stream is relayed as the upstream model produces it (with `: keep-alive` comments while
 *   nothing comes); errors take the route's dialect's shape; a tool the gateway cannot offer
 *   the model is recorded on the call and warned about once;
 * - an HTTP(S) forward proxy (`CONNECT` and absolute-URI requests, `Proxy-Authorization`
 *   with the egress secret) that lets a connection out only when the rollout's network
 *   policy for the current phase allows it, and records every refusal. The evaluator's own
 *   host (loopback, its interfaces, every Docker network's gateway, in any spelling, by name
 *   or by what a name resolves to) is reached only when an allow rule names it, never
 *   through a wildcard; the proxy connects to the address it checked, never re-resolving.
 *
 * SDK retries of a request already answered are replayed, and a retry that arrives while the
 * first attempt is still running waits for it, so the transcript does not fork. After the
 * rollout ends its secrets are refused.
 * @module
 */
import net from "node:net";
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import type { Response } from "../types.ts";
import {
  type ChatCall,
  chatCompletionBody,
  chatStreamWriter,
  errorBody,
  GatewayRefusal,
  parseChatRequest,
  type StreamWriter,
} from "./chat.ts";
import type { ResponseDelta } from "../model/client.ts";
import {
  canonicalHost,
  CLOSED_POLICY,
  namedByAllow,
  type NetworkPolicy,
  policyAllows,
} from "./policy.ts";
import { isHostAlias, isReservedAddress, OwnAddresses } from "./own_host.ts";
import { dockerNetworkAddresses } from "../services/network.ts";
import { lookup } from "node:dns/promises";
import {
  anthropicError,
  estimateTokens,
  messagesBody,
  messagesStreamWriter,
  parseMessagesRequest,
} from "./anthropic.ts";
import { parseResponsesRequest, responsesBody, responsesStreamWriter } from "./responses.ts";
import { unrefTimer } from "../util/_timers.ts";

/** A connection the network policy refused. */
export interface EgressDenial {
  phase: string;
  host: string;
  port: number;
  /** Unix seconds. */
  at: number;
}

/** What answers a rollout's model calls. */
export interface GatewayHandler {
  /**
   * A chat-completions call of the program; throw {@link GatewayRefusal} to refuse it.
   * `onDelta`, given when the program streams, takes the reply's pieces as they come.
   */
  chat(call: ChatCall, onDelta?: (delta: ResponseDelta) => void): Promise<Response>;
  /**
   * One step of vf's shell agent: `output` is what the last command printed (null on the
   * first step); the reply is the next command, or null when the agent is done.
   */
  shellStep?(output: string | null): Promise<string | null>;
}

function secret(): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(16))).toString("base64url");
}

interface Served {
  digest: string;
  response: Response;
}

/** One rollout's registration with the gateway. */
export class GatewaySession {
  /** Bearer token of the model routes (what the program gets as its API key). */
  readonly modelSecret: string = secret();
  /** Password of the egress proxy (`http://vf:<secret>@host:port`). */
  readonly proxySecret: string = secret();
  /** Connections the policy refused, in order. */
  readonly denials: EgressDenial[] = [];
  /** Answers model calls; set by the harness that runs the program. */
  handler: GatewayHandler | null = null;
  #phase = "setup";
  #policy: NetworkPolicy = CLOSED_POLICY;
  #sealed = false;
  #last: Served | null = null;
  #inflight = new Map<string, Promise<Response>>();
  readonly #release: () => void;

  constructor(readonly model: string, release: () => void) {
    this.#release = release;
  }

  /** The phase whose policy applies now. */
  get phase(): string {
    return this.#phase;
  }

  /** The policy that applies now. */
  get policy(): NetworkPolicy {
    return this.#policy;
  }

  /** Whether the rollout has ended (every call is refused). */
  get sealed(): boolean {
    return this.#sealed;
  }

  /** Connections the proxy let out and still holds open (cut when the phase changes). */
  readonly #tunnels = new Set<{ destroy(): void }>();
  /** Refusals past the first 1000 are counted, not kept. */
  deniedBeyond = 0;

  /** Counts phase switches: a check made under an older one is stale. */
  get generation(): number {
    return this.#generation;
  }
  #generation = 0;

  /** Switch to `phase`, under `policy`; connections opened under the old one are cut. */
  setPhase(phase: string, policy: NetworkPolicy): void {
    this.#generation++;
    this.#phase = phase;
    this.#policy = policy;
    this.#cut();
  }

  #cut(): void {
    for (const t of this.#tunnels) t.destroy();
    this.#tunnels.clear();
  }

  /** Keep `socket` until it closes, or until the phase changes or the session ends. */
  hold(socket: { destroy(): void; once(event: "close", fn: () => void): unknown }): void {
    this.#tunnels.add(socket);
    socket.once("close", () => this.#tunnels.delete(socket));
  }

  /** Whether a connection to `host:port` may leave now; a refusal is recorded. */
  egress(host: string, port: number): boolean {
    if (!this.#sealed && policyAllows(this.#policy, host, port)) return true;
    this.refuse(host, port);
    return false;
  }

  /** Whether the current policy names `host` itself in an allow rule for `port`. */
  names(host: string, port: number): boolean {
    return namedByAllow(this.#policy, host, port);
  }

  /** Record a refused connection. */
  refuse(host: string, port: number): void {
    if (this.denials.length < 1000) {
      this.denials.push({ phase: this.#phase, host, port, at: Date.now() / 1000 });
    } else this.deniedBeyond++;
  }

  /** Answer a chat call once per request body: retries replay, duplicates in flight wait. */
  async chat(
    call: ChatCall,
    digest: string,
    retry: boolean,
    onDelta?: (delta: ResponseDelta) => void,
  ): Promise<Response> {
    if (this.#sealed) throw new GatewayRefusal(409, "the rollout has ended");
    if (retry && this.#last?.digest === digest) return this.#last.response;
    // Only an SDK's retry waits for the first attempt: identical requests sent on purpose
    // (n samples in parallel) each get their own answer.
    const pending = retry ? this.#inflight.get(digest) : undefined;
    if (pending) return await pending;
    const handler = this.handler;
    if (!handler) throw new GatewayRefusal(503, "no program is running in this rollout");
    const promise = onDelta ? handler.chat(call, onDelta) : handler.chat(call);
    this.#inflight.set(digest, promise);
    try {
      const response = await promise;
      this.#last = { digest, response };
      return response;
    } finally {
      this.#inflight.delete(digest);
    }
  }

  /** End the rollout's access: later calls get 409, later connections are refused. */
  close(): void {
    if (this.#sealed) return;
    this.#sealed = true;
    this.handler = null;
    this.#cut();
    this.#release();
  }
}

/** How the sandbox reaches the rollout's gateway. */
export interface GatewayRoute {
  session: GatewaySession;
  /** The gateway's base URL as the sandbox sees it (`http://vf-gateway:8080`). */
  url: string;
  /** The egress proxy URL with the rollout's credentials, when egress goes through it. */
  proxyUrl?: string;
  /** Hosts reached directly, not through the proxy (`NO_PROXY`): the gateway, the services. */
  noProxy?: string;
}

/** One wire format a program may speak: chosen by the route it posts to. */
interface Dialect {
  parse(body: unknown): ChatCall;
  body(responses: Response[], model: string, call: ChatCall): Record<string, unknown>;
  writer(model: string, call: ChatCall): StreamWriter;
  error(message: string, status: number): Record<string, unknown>;
}

const CHAT: Dialect = {
  parse: parseChatRequest,
  body: (rs, model) => chatCompletionBody(rs, model),
  writer: (model, call) => chatStreamWriter(model, call.includeUsage),
  error: errorBody,
};
const ANTHROPIC: Dialect = {
  parse: parseMessagesRequest,
  body: ([r], model) => messagesBody(r, model),
  writer: (model) => messagesStreamWriter(model),
  error: anthropicError,
};
const RESPONSES: Dialect = {
  parse: parseResponsesRequest,
  body: ([r], model, call) => responsesBody(r, model, call.customTools),
  writer: (model, call) => responsesStreamWriter(model, call.customTools),
  error: errorBody,
};
const DIALECTS: Record<string, Dialect> = {
  "/v1/chat/completions": CHAT,
  "/chat/completions": CHAT,
  "/v1/messages": ANTHROPIC,
  "/v1/responses": RESPONSES,
  "/responses": RESPONSES,
};

/** The dialect errors on `path` are shaped in: Anthropic's under `/v1/messages`, else OpenAI's. */
function errorDialect(path: string): Dialect {
  return DIALECTS[path] ?? (path.startsWith("/v1/messages") ? ANTHROPIC : CHAT);
}

const warnedTools = new Set<string>();
/** Warn once per process about each thing the gateway cannot give the model. */
function warnNotHonoured(route: string, items: { name: string; type: string }[]): void {
  for (const { name, type } of items) {
    const key = `${type}\0${name}`;
    if (warnedTools.has(key)) continue;
    warnedTools.add(key);
    console.warn(
      type === "context_management"
        ? `vf gateway: "${route}" asks for context_management edit "${name}", which the gateway does not make; recorded on the trace as not_honoured`
        : `vf gateway: the program's tool "${name}" (type "${type}") on "${route}" cannot be offered to the model and is left out; recorded on the trace as not_honoured`,
    );
  }
}

/**
 * A server-sent event stream on a socket: the head goes out with the first event (so a
 * refusal before any still gets its status), chunked; a `: keep-alive` comment goes out
 * whenever nothing has for `keepAliveMs`.
 */
class EventStream {
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

function parseJson(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString("utf8"));
  } catch {
    throw new GatewayRefusal(400, "the request body is not JSON");
  }
}

interface Head {
  method: string;
  target: string;
  headers: Map<string, string>;
  raw: string[];
}

function parseHead(text: string): Head | null {
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

const MAX_HEAD = 64 * 1024;
/** Default of {@link Gateway.requestTimeoutMs}. */
const REQUEST_TIMEOUT_MS = 60_000;
/** Default of {@link Gateway.keepAliveMs}. */
const KEEP_ALIVE_MS = 15_000;
/** Sockets whose request is a HEAD: their replies carry no body. */
const headOnly = new WeakSet<net.Socket>();
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

function reply(
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

function replyJson(socket: net.Socket, status: number, value: unknown): void {
  reply(socket, status, JSON.stringify(value));
}

/** Read the rest of a request body (Content-Length or chunked) after its head. */
function readBody(socket: net.Socket, rest: Buffer, head: Head): Promise<Buffer> {
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

/** The gateway: one listener per address, every rollout a session on it. */
export class Gateway {
  static #shared: Gateway | null = null;
  /**
   * A connection has this long to deliver its whole request (head and body; for the egress
   * proxy, until its tunnel is up), else it is closed. A sandbox that connects and goes quiet,
   * or is removed mid-request (its end of the connection then vanishes without a word), would
   * otherwise hold a socket in the evaluator for good.
   */
  readonly requestTimeoutMs: number;
  /** A stream sends a `: keep-alive` comment after this long without an event. */
  readonly keepAliveMs: number;
  readonly #own: OwnAddresses;
  readonly #resolve: (host: string) => Promise<string>;

  /**
   * @param options.requestTimeoutMs see {@link Gateway.requestTimeoutMs}; default 60 s
   * @param options.keepAliveMs see {@link Gateway.keepAliveMs}; default 15 s
   * @param options.ownAddresses addresses of this host besides its interfaces' and the ones
   *   the gateway listens on; default none ({@link Gateway.shared} adds every Docker network's
   *   gateway)
   * @param options.resolve how the egress proxy turns a name into the one address it then
   *   checks and connects to; default the system resolver
   */
  constructor(
    options: {
      requestTimeoutMs?: number;
      keepAliveMs?: number;
      ownAddresses?: () => Promise<Iterable<string>>;
      resolve?: (host: string) => Promise<string>;
    } = {},
  ) {
    this.requestTimeoutMs = options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS;
    this.keepAliveMs = options.keepAliveMs ?? KEEP_ALIVE_MS;
    this.#own = new OwnAddresses({ extra: options.ownAddresses });
    this.#resolve = options.resolve ?? (async (host) => (await lookup(host)).address);
  }
  readonly #listeners = new Map<string, Promise<net.Server>>();
  readonly #byModelSecret = new Map<string, GatewaySession>();
  readonly #byProxySecret = new Map<string, GatewaySession>();
  readonly #sockets = new Set<net.Socket>();

  /** The process's gateway (created on first use; it never keeps the process alive). */
  static shared(): Gateway {
    return Gateway.#shared ??= new Gateway({ ownAddresses: dockerNetworkAddresses });
  }

  /** Sessions currently open. */
  get sessions(): number {
    return this.#byModelSecret.size;
  }

  /** Listen on `host` (once per host) and return the port. */
  async listen(host: string): Promise<number> {
    this.#own.add(host);
    let server = this.#listeners.get(host);
    if (!server) {
      server = new Promise<net.Server>((resolve, reject) => {
        // Half-open: a client may end its side once its request is sent and still read the
        // answer (and a tunnel carries each direction's end on its own).
        const s = net.createServer({ allowHalfOpen: true }, (socket) => this.#connection(socket));
        s.once("error", reject);
        s.listen(0, host, () => {
          s.unref();
          resolve(s);
        });
      });
      this.#listeners.set(host, server);
      server.catch(() => this.#listeners.delete(host));
    }
    const address = (await server).address();
    return typeof address === "object" && address ? address.port : 0;
  }

  /** Register a rollout: its secrets are valid until the session is closed. */
  open(model: string): GatewaySession {
    const session: GatewaySession = new GatewaySession(model, () => {
      this.#byModelSecret.delete(session.modelSecret);
      this.#byProxySecret.delete(session.proxySecret);
    });
    this.#byModelSecret.set(session.modelSecret, session);
    this.#byProxySecret.set(session.proxySecret, session);
    return session;
  }

  /** Stop listening (open sessions stay registered but unreachable). */
  async close(): Promise<void> {
    const servers = [...this.#listeners.values()];
    this.#listeners.clear();
    for (const socket of this.#sockets) socket.destroy();
    await Promise.all(servers.map(async (p) => {
      const s = await p.catch(() => null);
      await new Promise<void>((r) => s ? s.close(() => r()) : r());
    }));
  }

  #connection(socket: net.Socket): void {
    socket.on("error", () => {});
    this.#sockets.add(socket);
    const deadline = unrefTimer(setTimeout(() => socket.destroy(), this.requestTimeoutMs));
    const received = () => clearTimeout(deadline);
    socket.on("close", () => {
      received();
      this.#sockets.delete(socket);
    });
    let buf = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      const end = buf.indexOf("\r\n\r\n");
      if (end < 0) {
        if (buf.length > MAX_HEAD) reply(socket, 400, "request head too large", "text/plain");
        return;
      }
      socket.off("data", onData);
      socket.pause();
      const head = parseHead(buf.subarray(0, end).toString("latin1"));
      const rest = buf.subarray(end + 4);
      if (!head) return reply(socket, 400, "malformed request", "text/plain");
      if (head.method === "HEAD") headOnly.add(socket);
      const handle = head.method === "CONNECT" || /^[a-z]+:\/\//i.test(head.target)
        ? this.#proxy(socket, head, rest, received)
        : this.#serve(socket, head, rest, received);
      handle.catch((error) => {
        if (error instanceof GatewayRefusal) {
          const path = head.target.split("?")[0];
          replyJson(socket, error.status, errorDialect(path).error(error.message, error.status));
        } else socket.destroy();
      });
    };
    socket.on("data", onData);
  }

  async #proxy(
    socket: net.Socket,
    head: Head,
    rest: Buffer,
    received: () => void,
  ): Promise<void> {
    const auth = head.headers.get("proxy-authorization") ?? "";
    const m = /^Basic\s+(\S+)$/i.exec(auth);
    const password = m
      ? Buffer.from(m[1], "base64").toString("utf8").split(":").slice(1).join(":")
      : "";
    const session = this.#byProxySecret.get(password);
    if (!session) {
      return reply(socket, 407, "vf egress proxy: credentials required", "text/plain", [
        'Proxy-Authenticate: Basic realm="vf"',
      ]);
    }
    let host: string;
    let port: number;
    let path = "";
    if (head.method === "CONNECT") {
      const t = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(head.target);
      if (!t) return reply(socket, 400, "CONNECT needs host:port", "text/plain");
      host = t[1].replace(/^\[|\]$/g, "");
      port = Number(t[2]);
    } else {
      let url: URL;
      try {
        url = new URL(head.target);
      } catch {
        return reply(socket, 400, "bad request target", "text/plain");
      }
      if (url.protocol !== "http:") {
        return reply(
          socket,
          400,
          `the proxy forwards http:// only (got ${url.protocol})`,
          "text/plain",
        );
      }
      host = url.hostname.replace(/^\[|\]$/g, "");
      port = Number(url.port || 80);
      path = url.pathname + url.search;
    }
    host = canonicalHost(host).replace(/\.+$/, "");
    const generation = session.generation;
    if (!session.egress(host, port)) {
      return reply(
        socket,
        403,
        `vf egress proxy: ${host}:${port} is not allowed by the network policy (phase ${session.phase})`,
        "text/plain",
      );
    }
    // The evaluator's own host only when a rule names it, never through a wildcard: checked
    // by name, then by the one address the name resolves to, which is what is connected to
    // (a second lookup could answer differently).
    const named = session.names(host, port);
    const refuse = (why: string) => {
      session.refuse(host, port);
      reply(
        socket,
        403,
        `vf egress proxy: ${host}:${port} ${why}; name it in network.allow to reach it ` +
          `(phase ${session.phase})`,
        "text/plain",
      );
    };
    if (!named && isHostAlias(host)) return refuse("names the evaluator's own host");
    let address: string;
    try {
      address = net.isIP(host) ? host : await this.#resolve(host);
    } catch {
      return reply(socket, 502, `vf egress proxy: cannot resolve ${host}`, "text/plain");
    }
    if (socket.destroyed) return; // the request's deadline passed during the lookup
    const via = address === host ? "" : ` (${address})`;
    if (!named && isReservedAddress(address)) {
      return refuse(`is a loopback, link-local or unspecified address${via}`);
    }
    if (!named) {
      let own: boolean;
      try {
        own = await this.#own.has(address);
      } catch {
        own = true; // the host's interfaces cannot be listed: nothing is known not to be its own
      }
      if (socket.destroyed) return;
      if (own) return refuse(`is an address of the evaluator's own host${via}`);
    }
    // The phase changed (or the rollout ended) while this was checked: what was checked no
    // longer applies, and the new phase's cut has already passed this connection by.
    if (session.sealed || session.generation !== generation) {
      return reply(
        socket,
        503,
        `vf egress proxy: the phase changed while ${host}:${port} was checked; try again`,
        "text/plain",
      );
    }
    const upstream = net.connect({ host: address, port, allowHalfOpen: true });
    session.hold(socket);
    session.hold(upstream);
    upstream.on("error", () => {
      if (!socket.destroyed && socket.bytesWritten === 0) {
        reply(socket, 502, `vf egress proxy: cannot reach ${host}:${port}`, "text/plain");
      } else socket.destroy();
    });
    socket.on("close", () => upstream.destroy());
    upstream.on("connect", () => {
      received(); // the tunnel is up: it may idle as long as the phase lasts
      if (head.method === "CONNECT") {
        socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      } else {
        // The Host header is the checked one, whatever the client sent.
        const lines = head.raw.filter((l) =>
          !/^(proxy-[a-z-]+|connection|keep-alive|host):/i.test(l)
        );
        const hostHeader = `${host.includes(":") ? `[${host}]` : host}${
          port === 80 ? "" : `:${port}`
        }`;
        const headers = [`Host: ${hostHeader}`, ...lines, "Connection: close"];
        upstream.write(`${head.method} ${path} HTTP/1.1\r\n${headers.join("\r\n")}\r\n\r\n`);
      }
      if (rest.length) upstream.write(rest);
      socket.pipe(upstream);
      upstream.pipe(socket);
      socket.resume();
    });
  }

  async #serve(
    socket: net.Socket,
    head: Head,
    rest: Buffer,
    received: () => void,
  ): Promise<void> {
    const path = head.target.split("?")[0];
    // HEAD is answered as GET is, without the body.
    const method = head.method === "HEAD" ? "GET" : head.method;
    if (method === "GET" && path === "/health") return replyJson(socket, 200, { ok: true });
    const bearer = /^Bearer\s+(\S+)$/i.exec(head.headers.get("authorization") ?? "")?.[1] ??
      head.headers.get("x-api-key") ?? "";
    const session = this.#byModelSecret.get(bearer);
    if (!session) {
      return replyJson(
        socket,
        401,
        errorDialect(path).error("unknown or expired gateway key", 401),
      );
    }
    const body = await readBody(socket, rest, head);
    received(); // the answer may take as long as the model does
    if (method === "GET" && (path === "/v1/models" || path === "/models")) {
      return replyJson(socket, 200, {
        object: "list",
        data: [{ id: session.model, object: "model", owned_by: "vf" }],
      });
    }
    if (method === "POST" && (path === "/v1/messages/count_tokens")) {
      // An estimate, not recorded: the upstream is a chat-completions endpoint.
      const call = parseMessagesRequest(parseJson(body));
      return replyJson(socket, 200, { input_tokens: estimateTokens(call) });
    }
    const dialect = head.method === "POST" ? DIALECTS[path] : undefined;
    if (dialect) return await this.#answer(socket, session, dialect, head, path, body);
    if (head.method === "POST" && path === "/vf/shell/step") {
      if (session.sealed) throw new GatewayRefusal(409, "the rollout has ended");
      const step = session.handler?.shellStep;
      if (!step) throw new GatewayRefusal(503, "no shell agent is running in this rollout");
      const first = new URL(head.target, "http://x").searchParams.get("step") === "1";
      let next: string | null;
      try {
        next = await step(first ? null : body.toString("utf8"));
      } catch (error) {
        if (error instanceof GatewayRefusal) throw error;
        throw new GatewayRefusal(502, `the model call failed: ${(error as Error).message}`);
      }
      return reply(socket, 200, next ?? "", "text/plain; charset=utf-8");
    }
    return replyJson(
      socket,
      404,
      errorDialect(path).error(`no route ${head.method} ${path}`, 404),
    );
  }

  /** A model call in `dialect`: answered whole, or streamed as the upstream model replies. */
  async #answer(
    socket: net.Socket,
    session: GatewaySession,
    dialect: Dialect,
    head: Head,
    path: string,
    body: Buffer,
  ): Promise<void> {
    let stream: EventStream | null = null;
    let writer: StreamWriter | null = null;
    try {
      const call = dialect.parse(parseJson(body));
      if (call.notHonoured?.length) warnNotHonoured(path, call.notHonoured);
      const digest = createHash("sha256").update(body).digest("hex");
      const retry = Number(head.headers.get("x-stainless-retry-count") ?? 0) > 0;
      const n = call.n ?? 1;
      writer = call.stream ? dialect.writer(session.model, call) : null;
      if (writer) stream = new EventStream(socket, this.keepAliveMs);
      const responses: Response[] = [];
      for (let i = 0; i < n; i++) {
        const w = writer;
        const onDelta = w && stream
          ? (delta: ResponseDelta) => stream!.write(w.delta(delta, i))
          : undefined;
        try {
          // Each choice is its own call; only the first carries what was not honoured.
          const one = i === 0 ? call : { ...call, notHonoured: [] };
          responses.push(
            await session.chat(one, n > 1 ? `${digest}:${i}` : digest, retry, onDelta),
          );
        } catch (error) {
          if (error instanceof GatewayRefusal) throw error;
          throw new GatewayRefusal(502, `the model call failed: ${(error as Error).message}`);
        }
      }
      if (writer && stream) return stream.end(writer.finish(responses));
      return replyJson(
        socket,
        200,
        dialect.body(responses, responses[0].model || session.model, call),
      );
    } catch (error) {
      if (!(error instanceof GatewayRefusal)) {
        stream?.stop();
        throw error;
      }
      if (stream?.started && writer) {
        return stream.end(writer.error(error.message, error.status));
      }
      stream?.stop();
      return replyJson(socket, error.status, dialect.error(error.message, error.status));
    }
  }
}
