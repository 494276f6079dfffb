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
import { lookup } from "node:dns/promises";
import { GatewayRefusal } from "./chat.ts";
import { estimateTokens, parseMessagesRequest } from "./anthropic.ts";
import { OwnAddresses } from "./own_host.ts";
import { dockerNetworkAddresses } from "../services/network.ts";
import { unrefTimer } from "../util/_timers.ts";
import {
  type Head,
  headOnly,
  MAX_HEAD,
  parseHead,
  parseJson,
  readBody,
  reply,
  replyJson,
} from "./_http.ts";
import { DIALECTS, errorDialect, relayModelCall } from "./relay.ts";
import { proxyRequest } from "./egress_proxy.ts";
import { GatewaySession } from "./session.ts";

export {
  type EgressDenial,
  type GatewayHandler,
  type GatewayRoute,
  GatewaySession,
} from "./session.ts";

/** Default of {@link Gateway.requestTimeoutMs}. */
const REQUEST_TIMEOUT_MS = 60_000;
/** Default of {@link Gateway.keepAliveMs}. */
const KEEP_ALIVE_MS = 15_000;

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
        ? proxyRequest(socket, {
          head,
          rest,
          received,
          session: (password) => this.#byProxySecret.get(password),
          resolve: this.#resolve,
          own: this.#own,
        })
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
    if (dialect) {
      return await relayModelCall(socket, {
        session,
        dialect,
        head,
        path,
        body,
        keepAliveMs: this.keepAliveMs,
      });
    }
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
}
