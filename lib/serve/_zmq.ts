/**
 * What the ZeroMQ server, broker and client share: their sockets, from one of two
 * transports (`ZMQ_IMPLS`): ZMTP 3.1 written here on `node:net` (`zmtp/`, the default; it
 * runs in the single binary and waits without polling), or the `zeromq` addon (libzmq),
 * loaded on first use so a program that never asks for it never loads it. Also msgpack with
 * the wire's settings, and request ids.
 * @module
 */
// deno-lint-ignore no-import-prefix
import { decode, encode } from "npm:@msgpack/msgpack@^3.1.3";
import type * as Zmq from "npm:zeromq@^6.8.0";
import { type Frame, ZmtpDealer, ZmtpRouter } from "./zmtp/socket.ts";

/** The transports of the ZeroMQ wire: `zmtp` (default, `node:net`) or `addon` (libzmq). */
export const ZMQ_IMPLS = ["zmtp", "addon"] as const;

/** One of {@link ZMQ_IMPLS}. */
export type ZmqImpl = typeof ZMQ_IMPLS[number];

/** The transport used when none is named. */
export const DEFAULT_ZMQ_IMPL: ZmqImpl = "zmtp";

/** What the server, broker and client use of a socket, whichever transport made it. */
export interface ZmqSocket {
  readonly closed: boolean;
  send(frames: Frame[]): Promise<void>;
  receive(): Promise<Uint8Array[]>;
  close(): void;
  [Symbol.asyncIterator](): AsyncIterator<Uint8Array[]>;
}

/** A ROUTER, bound with {@link ZmqRouter.bind}. */
export interface ZmqRouter extends ZmqSocket {
  bind(address: string): Promise<void>;
  readonly lastEndpoint: string | null;
}

/** A DEALER, connected with {@link ZmqDealer.connect}. */
export interface ZmqDealer extends ZmqSocket {
  connect(address: string): void;
}

/**
 * A ROUTER of transport `impl`: ROUTER_MANDATORY (a send to an unknown peer throws), no
 * high-water marks, linger 0.
 * @throws {Error} when the addon is asked for and cannot be loaded
 */
export async function openRouter(impl: ZmqImpl = DEFAULT_ZMQ_IMPL): Promise<ZmqRouter> {
  if (impl === "zmtp") return new ZmtpRouter();
  const zmq = await loadZmq();
  return new zmq.Router({
    mandatory: true,
    linger: 0,
    sendHighWaterMark: 0,
    receiveHighWaterMark: 0,
    ...RECEIVE_OPTIONS,
  }) as unknown as ZmqRouter;
}

/**
 * A DEALER of transport `impl` (no high-water marks, linger 0), not yet connected.
 * @throws {Error} when the addon is asked for and cannot be loaded
 */
export async function openDealer(impl: ZmqImpl = DEFAULT_ZMQ_IMPL): Promise<ZmqDealer> {
  if (impl === "zmtp") return new ZmtpDealer();
  const zmq = await loadZmq();
  return new zmq.Dealer({
    linger: 0,
    sendHighWaterMark: 0,
    receiveHighWaterMark: 0,
    ...RECEIVE_OPTIONS,
  }) as unknown as ZmqDealer;
}

/** The `zeromq` module's types. */
export type ZmqModule = typeof Zmq;

let loading: Promise<ZmqModule> | undefined;

/**
 * The `zeromq` binding (`--zmq-impl addon`), imported on first call.
 * @throws {Error} when the native addon cannot be loaded, saying what to do instead
 */
export function loadZmq(): Promise<ZmqModule> {
  if ("Bun" in globalThis) {
    // Bun 1.4 aborts the whole process (a panic, not an exception) when the addon creates a
    // socket: it does not implement libuv's uv_poll_init_socket (oven-sh/bun#18546).
    return Promise.reject(
      new Error(
        "ZeroMQ is not available in the single vf binary: Bun does not implement the libuv " +
          "function (uv_poll_init_socket) the zeromq addon needs; serve with the default " +
          "transport (no --zmq-impl addon), or run vf from source with Deno",
      ),
    );
  }
  loading ??= import("npm:zeromq@^6.8.0").then(
    (m) => {
      // Bun hands a CommonJS module over as `default` only.
      const cjs = (m as unknown as { default?: ZmqModule }).default;
      return cjs?.Router ? cjs : m as unknown as ZmqModule;
    },
    (error) => {
      loading = undefined;
      throw new Error(
        `Cannot load ZeroMQ (npm package "zeromq"): ${(error as Error).message}; ` +
          `reinstall it (deno install), or serve over HTTP without --zmq`,
        { cause: error },
      );
    },
  );
  return loading;
}

/**
 * Whether this runtime wakes zeromq's native readiness handle. Node does; Deno 2.9 does not
 * (a socket waiting to receive is never told that a message from another process arrived),
 * so there sockets are polled instead.
 */
const NATIVE_WAIT = !("Deno" in globalThis) && !("Bun" in globalThis);

/** Options every socket is created with: where sockets are polled, a receive never waits. */
export const RECEIVE_OPTIONS: { receiveTimeout?: number } = NATIVE_WAIT
  ? {}
  : { receiveTimeout: 0 };

/** The part of a zeromq socket {@link messages} reads. */
interface Readable {
  readonly closed: boolean;
  receive(): Promise<Uint8Array[]>;
  [Symbol.asyncIterator](): AsyncIterator<Uint8Array[]>;
}

/**
 * The messages a socket receives, until it is closed. Where the runtime cannot wait on the
 * socket natively, it is polled: again at once after a message, then backing off to 10 ms
 * while idle (a reply waits at most that long; an idle socket costs ~100 wake-ups a second).
 */
export async function* messages(socket: Readable): AsyncGenerator<Uint8Array[]> {
  if (NATIVE_WAIT || socket instanceof ZmtpRouter || socket instanceof ZmtpDealer) {
    for await (const frames of socket) yield frames;
    return;
  }
  let idle = 0;
  while (!socket.closed) {
    let frames: Uint8Array[];
    try {
      frames = await socket.receive();
    } catch (error) {
      if (socket.closed) return;
      if ((error as { code?: string }).code !== "EAGAIN") throw error;
      await new Promise((r) => setTimeout(r, Math.min(10, 2 ** Math.min(idle++, 4))));
      continue;
    }
    idle = 0;
    yield frames;
  }
}

/** msgpack as the wire uses it: maps with string keys, `undefined` fields left out. */
export function pack(value: unknown): Uint8Array {
  return encode(value, { ignoreUndefined: true });
}

/** The value of one msgpack frame. */
export function unpack(frame: Uint8Array): unknown {
  return decode(frame);
}

/** A fresh request id: 32 lowercase hex digits (a uuid4 without dashes). */
export function newRequestId(): string {
  return crypto.randomUUID().replaceAll("-", "");
}

const decoder = new TextDecoder();

/** A frame as text. */
export function frameText(frame: Uint8Array): string {
  return decoder.decode(frame);
}
