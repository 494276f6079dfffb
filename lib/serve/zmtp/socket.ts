/**
 * ZeroMQ's ROUTER and DEALER sockets over ZMTP 3.1 (RFC 23, NULL mechanism) on `node:net`:
 * TCP (`tcp://host:port`) and Unix sockets (`ipc:///path`). No native addon, so they work in
 * the Bun-built binary as under Deno and Node, and a socket waiting to receive costs nothing.
 *
 * - A connection sends its greeting and `READY` (`Socket-Type`, and a DEALER's `Identity` when
 *   given), checks the peer's (ROUTER talks to DEALER, REQ, ROUTER; DEALER to ROUTER, REP,
 *   DEALER), answers `PING` with `PONG`, and closes on `ERROR` or a protocol error.
 * - ROUTER: each message received comes with its peer's routing id in front (the peer's
 *   `Identity`, else a generated 5-byte one starting with 0, as libzmq does); a send's first
 *   frame names the peer, and an unknown one throws (`EHOSTUNREACH`, ROUTER_MANDATORY).
 * - DEALER: one `connect`, re-dialled every 100 ms while the peer is away; messages sent
 *   before it is ready wait in order.
 * - Backpressure: a send resolves once the kernel's buffer has room (node's `drain`); a
 *   receiver that falls behind pauses reading from its peers until it catches up.
 * @module
 */
import { createConnection, createServer, type Server, type Socket } from "node:net";
import { existsSync, lstatSync, unlinkSync } from "node:fs";
import {
  concat,
  encodeCommand,
  encodeMessage,
  encodeMetadata,
  greeting,
  type Incoming,
  parseMetadata,
  textDecoder,
  textEncoder,
  ZmtpParser,
} from "./codec.ts";

/** A frame as sockets take it. */
export type Frame = Uint8Array | string;

/** Where a socket binds or connects. */
type Endpoint = { kind: "tcp"; host: string; port: number } | { kind: "ipc"; path: string };

/**
 * An address read: `tcp://host:port` (host `*` is every interface, `[::1]` IPv6) or
 * `ipc:///path`.
 * @throws {Error} for another transport or a malformed address
 */
export function parseEndpoint(address: string): Endpoint {
  const ipc = /^ipc:\/\/(.+)$/.exec(address);
  if (ipc) return { kind: "ipc", path: ipc[1] };
  const tcp = /^tcp:\/\/(\[[^\]]+\]|[^:]+):(\d+|\*)$/.exec(address);
  if (!tcp) {
    throw new Error(
      `"${address}" is not a ZeroMQ address this transport serves; ` +
        `use tcp://host:port or ipc:///path`,
    );
  }
  const host = tcp[1] === "*" ? "0.0.0.0" : tcp[1].replace(/^\[|\]$/g, "");
  return { kind: "tcp", host, port: tcp[2] === "*" ? 0 : Number(tcp[2]) };
}

const PEERS: Record<string, string[]> = {
  ROUTER: ["DEALER", "REQ", "ROUTER"],
  DEALER: ["ROUTER", "REP", "DEALER"],
};

/** A socket error with libzmq's code, e.g. `EHOSTUNREACH`. */
export class ZmtpError extends Error {
  /** libzmq's name for it. */
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.name = "ZmtpError";
    this.code = code;
  }
}

/** One peer: a stream that has done (or is doing) the ZMTP handshake. */
class Connection {
  readonly socket: Socket;
  readonly #parser: ZmtpParser;
  readonly #type: string;
  /** The peer's READY metadata, once it came. */
  peer: Map<string, Uint8Array> | null = null;
  #drained: Promise<void> | null = null;
  closed = false;

  constructor(
    socket: Socket,
    type: string,
    ownMetadata: Record<string, Uint8Array | string>,
    readonly events: {
      ready: (c: Connection) => void;
      message: (c: Connection, parts: Uint8Array[]) => void;
      closed: (c: Connection) => void;
    },
    maxMessageBytes?: number,
  ) {
    this.socket = socket;
    this.#type = type;
    this.#parser = new ZmtpParser(maxMessageBytes);
    socket.setNoDelay(true);
    socket.on("data", (chunk: Uint8Array) => this.#receive(chunk));
    socket.on("error", () => {}); // the close that follows is what counts
    socket.on("close", () => this.#closed());
    socket.write(greeting());
    socket.write(encodeCommand("READY", encodeMetadata({ "Socket-Type": type, ...ownMetadata })));
  }

  #receive(chunk: Uint8Array): void {
    let incoming: Incoming[];
    try {
      incoming = this.#parser.push(chunk);
    } catch (error) {
      this.fail((error as Error).message);
      return;
    }
    for (const item of incoming) {
      if (this.closed) return;
      if (item.type === "greeting") {
        if (item.greeting.mechanism !== "NULL") {
          this.fail(`mechanism "${item.greeting.mechanism}" is not supported; only NULL is`);
        }
      } else if (item.type === "command") {
        this.#command(item.name, item.data);
      } else if (this.peer === null) {
        this.fail("a message came before the peer's READY");
      } else {
        this.events.message(this, item.parts);
      }
    }
  }

  #command(name: string, data: Uint8Array): void {
    if (name === "READY") {
      if (this.peer !== null) return this.fail("a second READY");
      let metadata: Map<string, Uint8Array>;
      try {
        metadata = parseMetadata(data);
      } catch (error) {
        return this.fail(`READY: ${(error as Error).message}`);
      }
      const type = textDecoder.decode(metadata.get("socket-type") ?? new Uint8Array());
      if (!PEERS[this.#type].includes(type)) {
        return this.fail(`a ${this.#type} socket does not talk to "${type || "(none)"}"`);
      }
      this.peer = metadata;
      this.events.ready(this);
    } else if (name === "ERROR") {
      this.close();
    } else if (name === "PING") {
      // PING: 2-byte TTL, then up to 16 bytes of context that PONG sends back.
      this.socket.write(encodeCommand("PONG", data.subarray(2)));
    }
  }

  /** Tell the peer why (ERROR) and close. */
  fail(reason: string): void {
    if (this.closed) return;
    const bytes = textEncoder.encode(reason).subarray(0, 255);
    this.socket.end(encodeCommand("ERROR", concat([Uint8Array.of(bytes.length), bytes])));
    this.socket.destroySoon?.();
    setTimeout(() => this.socket.destroy(), 100).unref?.();
    this.#closed();
  }

  /** Write one message; resolves when the stream's buffer has room again. */
  send(parts: Uint8Array[]): Promise<void> {
    if (this.closed) {
      return Promise.reject(new ZmtpError("EHOSTUNREACH", "the peer has disconnected"));
    }
    const pieces = encodeMessage(parts);
    let total = 0;
    for (const p of pieces) total += p.length;
    // Small messages go in one write (one syscall), large ones without a copy.
    const ok = total <= 65536
      ? this.socket.write(concat(pieces))
      : pieces.map((p) => this.socket.write(p)).every(Boolean);
    if (ok) return Promise.resolve();
    this.#drained ??= new Promise<void>((resolve) => {
      const done = () => {
        this.socket.off("drain", done);
        this.socket.off("close", done);
        this.#drained = null;
        resolve();
      };
      this.socket.on("drain", done);
      this.socket.on("close", done);
    });
    return this.#drained;
  }

  pause(): void {
    this.socket.pause();
  }

  resume(): void {
    if (!this.closed) this.socket.resume();
  }

  close(): void {
    this.socket.destroy();
    this.#closed();
  }

  #closed(): void {
    if (this.closed) return;
    this.closed = true;
    this.events.closed(this);
  }
}

/** Messages received and not yet read, with the peers paused while there are too many. */
class Inbox {
  #queue: Uint8Array[][] = [];
  #bytes = 0;
  #waiting: {
    resolve: (m: IteratorResult<Uint8Array[]>) => void;
    reject: (e: unknown) => void;
  }[] = [];
  #paused = new Set<Connection>();
  #ended = false;
  static readonly HIGH_BYTES = 16 * 1024 * 1024;
  static readonly HIGH_COUNT = 4096;

  push(message: Uint8Array[], from: Connection): void {
    const waiter = this.#waiting.shift();
    if (waiter) return waiter.resolve({ value: message, done: false });
    this.#queue.push(message);
    for (const part of message) this.#bytes += part.length;
    if (this.#bytes > Inbox.HIGH_BYTES || this.#queue.length > Inbox.HIGH_COUNT) {
      from.pause();
      this.#paused.add(from);
    }
  }

  next(): Promise<IteratorResult<Uint8Array[]>> {
    const message = this.#queue.shift();
    if (message) {
      for (const part of message) this.#bytes -= part.length;
      if (
        this.#paused.size > 0 && this.#bytes <= Inbox.HIGH_BYTES / 2 &&
        this.#queue.length <= Inbox.HIGH_COUNT / 2
      ) {
        for (const c of this.#paused) c.resume();
        this.#paused.clear();
      }
      return Promise.resolve({ value: message, done: false });
    }
    if (this.#ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this.#waiting.push({ resolve, reject }));
  }

  end(): void {
    this.#ended = true;
    this.#queue = [];
    for (const w of this.#waiting.splice(0)) w.resolve({ value: undefined, done: true });
  }
}

/** Options of both sockets. */
export interface ZmtpSocketOptions {
  /** A DEALER's routing id, sent as READY's `Identity`; default none (the ROUTER picks). */
  routingId?: Uint8Array | string;
  /** A peer sending a larger message is disconnected; default no limit. */
  maxMessageBytes?: number;
  /** A DEALER re-dials this long after losing its peer; default 100 ms (libzmq's). */
  reconnectIntervalMs?: number;
}

function toBytes(frame: Frame): Uint8Array {
  return typeof frame === "string" ? textEncoder.encode(frame) : frame;
}

abstract class ZmtpSocket implements AsyncIterable<Uint8Array[]> {
  protected readonly inbox = new Inbox();
  protected readonly options: ZmtpSocketOptions;
  protected readonly connections = new Set<Connection>();
  #closed = false;

  constructor(options: ZmtpSocketOptions = {}) {
    this.options = options;
  }

  /** Whether {@link close} was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * The next message.
   * @throws {ZmtpError} `EAGAIN` once the socket is closed
   */
  async receive(): Promise<Uint8Array[]> {
    const next = await this.inbox.next();
    if (next.done) throw new ZmtpError("EAGAIN", "the socket is closed");
    return next.value;
  }

  /** Messages until the socket is closed. */
  [Symbol.asyncIterator](): AsyncIterator<Uint8Array[]> {
    return { next: () => this.inbox.next() };
  }

  abstract send(frames: Frame[]): Promise<void>;

  /** Close every connection at once (linger 0); pending receives end. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const c of this.connections) c.close();
    this.connections.clear();
    this.inbox.end();
  }
}

/**
 * A ROUTER: binds, accepts any number of DEALER (REQ, ROUTER) peers, and routes by the
 * routing id in front of each message.
 */
export class ZmtpRouter extends ZmtpSocket {
  #server: Server | null = null;
  #peers = new Map<string, Connection>();
  #ids = new WeakMap<Connection, Uint8Array>();
  #next = Math.floor(Math.random() * 2 ** 31);
  #ipcPath: string | null = null;
  /** The bound endpoint, with the port the system chose (`tcp://127.0.0.1:40123`). */
  lastEndpoint: string | null = null;

  /**
   * Listen at `address`. An `ipc://` path left behind by an earlier process is replaced.
   * @throws {Error} when the address is malformed or taken
   */
  async bind(address: string): Promise<void> {
    const endpoint = parseEndpoint(address);
    const server = createServer((socket) => this.#accept(socket));
    if (endpoint.kind === "ipc") {
      try {
        if (existsSync(endpoint.path) && lstatSync(endpoint.path).isSocket()) {
          unlinkSync(endpoint.path);
        }
      } catch { /* listen reports what matters */ }
    }
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      const ready = () => {
        server.off("error", reject);
        resolve();
      };
      if (endpoint.kind === "ipc") server.listen(endpoint.path, ready);
      else server.listen(endpoint.port, endpoint.host, ready);
    });
    this.#server = server;
    if (endpoint.kind === "ipc") {
      this.#ipcPath = endpoint.path;
      this.lastEndpoint = address;
    } else {
      const bound = server.address() as { address: string; port: number };
      const host = bound.address.includes(":") ? `[${bound.address}]` : bound.address;
      this.lastEndpoint = `tcp://${host}:${bound.port}`;
    }
  }

  #accept(socket: Socket): void {
    if (this.closed) {
      socket.destroy();
      return;
    }
    const connection = new Connection(socket, "ROUTER", {}, {
      ready: (c) => {
        let id = c.peer?.get("identity");
        if (!id || id.length === 0 || id[0] === 0 || this.#peers.has(key(id))) {
          id = new Uint8Array(5);
          new DataView(id.buffer).setUint32(1, this.#next++ >>> 0);
        } else {
          id = id.slice();
        }
        this.#ids.set(c, id);
        this.#peers.set(key(id), c);
      },
      message: (c, parts) => this.inbox.push([this.#ids.get(c)!, ...parts], c),
      closed: (c) => {
        this.connections.delete(c);
        const id = this.#ids.get(c);
        if (id && this.#peers.get(key(id)) === c) this.#peers.delete(key(id));
      },
    }, this.options.maxMessageBytes);
    this.connections.add(connection);
  }

  /**
   * Send `[routing id, ...parts]` to that peer.
   * @throws {ZmtpError} `EHOSTUNREACH` when no connected peer has that id
   */
  send(frames: Frame[]): Promise<void> {
    if (this.closed) return Promise.reject(new ZmtpError("ENOTSOCK", "the socket is closed"));
    const [id, ...parts] = frames.map(toBytes);
    const peer = id && this.#peers.get(key(id));
    if (!peer) {
      return Promise.reject(
        new ZmtpError("EHOSTUNREACH", "Host unreachable: no peer has that routing id"),
      );
    }
    return peer.send(parts);
  }

  /** Stop listening and drop every peer. */
  override close(): void {
    if (this.closed) return;
    super.close();
    this.#server?.close();
    this.#peers.clear();
    if (this.#ipcPath) {
      try {
        unlinkSync(this.#ipcPath);
      } catch { /* gone already */ }
    }
  }
}

/** A DEALER: connects to one ROUTER (or REP, DEALER) and keeps reconnecting to it. */
export class ZmtpDealer extends ZmtpSocket {
  #endpoint: Endpoint | null = null;
  #connection: Connection | null = null;
  #ready = false;
  #queue: { parts: Uint8Array[]; resolve: () => void; reject: (e: unknown) => void }[] = [];
  #timer: ReturnType<typeof setTimeout> | undefined;

  /**
   * Dial `address`, now and again whenever the peer goes away.
   * @throws {Error} when the address is malformed or the socket already connects somewhere
   */
  connect(address: string): void {
    if (this.#endpoint) throw new Error("a ZMTP DEALER connects to one address");
    this.#endpoint = parseEndpoint(address);
    this.#dial();
  }

  #dial(): void {
    if (this.closed || !this.#endpoint) return;
    const endpoint = this.#endpoint;
    const socket = endpoint.kind === "ipc"
      ? createConnection(endpoint.path)
      : createConnection(endpoint.port, endpoint.host);
    const own: Record<string, Uint8Array | string> = this.options.routingId === undefined
      ? {}
      : { Identity: this.options.routingId };
    const connection = new Connection(socket, "DEALER", own, {
      ready: () => {
        this.#ready = true;
        for (const item of this.#queue.splice(0)) {
          connection.send(item.parts).then(item.resolve, item.reject);
        }
      },
      message: (c, parts) => this.inbox.push(parts, c),
      closed: () => {
        this.connections.delete(connection);
        if (this.#connection !== connection) return;
        this.#connection = null;
        this.#ready = false;
        if (!this.closed) {
          this.#timer = setTimeout(
            () => this.#dial(),
            this.options.reconnectIntervalMs ?? 100,
          );
        }
      },
    }, this.options.maxMessageBytes);
    this.#connection = connection;
    this.connections.add(connection);
  }

  /** Send one message; it waits in order while the peer is not connected. */
  send(frames: Frame[]): Promise<void> {
    if (this.closed) return Promise.reject(new ZmtpError("ENOTSOCK", "the socket is closed"));
    const parts = frames.map(toBytes);
    if (this.#ready && this.#connection) return this.#connection.send(parts);
    return new Promise((resolve, reject) => this.#queue.push({ parts, resolve, reject }));
  }

  /** Stop dialling and drop the connection; sends still waiting reject. */
  override close(): void {
    if (this.closed) return;
    clearTimeout(this.#timer);
    super.close();
    const error = new ZmtpError("ENOTSOCK", "the socket is closed");
    for (const item of this.#queue.splice(0)) item.reject(error);
  }
}

function key(id: Uint8Array): string {
  let s = "";
  for (const b of id) s += b.toString(16).padStart(2, "0");
  return s;
}
