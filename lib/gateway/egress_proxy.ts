/**
 * The gateway's HTTP(S) forward proxy: `CONNECT` and absolute-URI requests, authenticated by a
 * rollout's egress secret, let out only when the policy of the rollout's current phase allows
 * the destination. The evaluator's own host (loopback, its interfaces, every Docker network's
 * gateway, in any spelling, by name or by what a name resolves to) is reached only when an
 * allow rule names it, never through a wildcard; the proxy connects to the address it
 * checked, never re-resolving. Every refusal is recorded on the session.
 * @module
 */
import net from "node:net";
import { Buffer } from "node:buffer";
import { canonicalHost } from "./policy.ts";
import { isHostAlias, isReservedAddress, type OwnAddresses } from "./own_host.ts";
import { type Head, reply } from "./_http.ts";
import type { GatewaySession } from "./session.ts";

/** Options of {@link proxyRequest}. */
export interface ProxyOptions {
  head: Head;
  /** What the client sent after the head. */
  rest: Buffer;
  /** Called once the tunnel is up: the request's deadline no longer applies. */
  received: () => void;
  /** The session whose egress secret is `password`, if any. */
  session: (password: string) => GatewaySession | undefined;
  /** Turns a name into the one address that is checked and connected to. */
  resolve: (host: string) => Promise<string>;
  /** The evaluator's own addresses. */
  own: OwnAddresses;
}

/** Forward one proxy request on `socket`, or refuse it with the reason. */
export async function proxyRequest(socket: net.Socket, options: ProxyOptions): Promise<void> {
  const { head, rest, received } = options;
  const auth = head.headers.get("proxy-authorization") ?? "";
  const m = /^Basic\s+(\S+)$/i.exec(auth);
  const password = m
    ? Buffer.from(m[1], "base64").toString("utf8").split(":").slice(1).join(":")
    : "";
  const session = options.session(password);
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
    address = net.isIP(host) ? host : await options.resolve(host);
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
      own = await options.own.has(address);
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
