/**
 * What the ZeroMQ server and client share: the native binding loaded on first use (so a
 * program that never serves or calls over ZeroMQ never loads the addon), msgpack with the
 * wire's settings, and request ids.
 * @module
 */
// deno-lint-ignore no-import-prefix
import { decode, encode } from "npm:@msgpack/msgpack@^3.1.3";
import type * as Zmq from "npm:zeromq@^6.8.0";

/** The `zeromq` module's types. */
export type ZmqModule = typeof Zmq;

let loading: Promise<ZmqModule> | undefined;

/**
 * The `zeromq` binding, imported on first call.
 * @throws {Error} when the native addon cannot be loaded, saying what to do instead
 */
export function loadZmq(): Promise<ZmqModule> {
  if ("Bun" in globalThis) {
    // Bun 1.4 aborts the whole process (a panic, not an exception) when the addon creates a
    // socket: it does not implement libuv's uv_poll_init_socket (oven-sh/bun#18546).
    return Promise.reject(
      new Error(
        "ZeroMQ is not available in the single vf binary: Bun does not implement the libuv " +
          "function (uv_poll_init_socket) the zeromq addon needs; run vf from source with " +
          "Deno for --zmq (deno task vf serve <env> --zmq ...), or serve over HTTP",
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
  if (NATIVE_WAIT) {
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
