/**
 * A small WebSocket client (RFC 6455) over `node:http`/`node:https`, for the Kubernetes exec
 * subresource. It is written here rather than taken from the platform because exec needs what
 * the platform's `WebSocket` does not offer in every runtime: request headers (a bearer
 * token), client certificates and a private CA from a kubeconfig, and the status of a refused
 * upgrade (the API server's 403 body says what is wrong). Binary and text messages, pings,
 * fragmentation and the close handshake are handled; extensions are not negotiated.
 * @module
 */

import { Buffer } from "node:buffer";
import { createHash, randomBytes } from "node:crypto";
import * as http from "node:http";
import * as https from "node:https";
import type { Socket } from "node:net";

/** TLS settings of a connection (a kubeconfig's cluster and user). */
export interface TlsOptions {
  ca?: string | Uint8Array;
  cert?: string | Uint8Array;
  key?: string | Uint8Array;
  /** Default true. */
  rejectUnauthorized?: boolean;
}

/** An open WebSocket. */
export interface WebSocketConnection {
  /** The subprotocol the server chose (`""` when none). */
  readonly protocol: string;
  /** Sends one binary message. */
  send(data: Uint8Array): void;
  /** Starts the close handshake; the socket ends when the server answers (or after 2 s). */
  close(code?: number): void;
  /** Cuts the connection at once. */
  destroy(): void;
  /** Settles when the connection has ended, with the close code the server sent, if any. */
  readonly closed: Promise<{ code?: number; reason?: string }>;
}

/** The server answered the upgrade with an HTTP status instead of switching protocols. */
export class WebSocketUpgradeError extends Error {
  constructor(readonly status: number, readonly body: string) {
    super(`WebSocket upgrade refused with HTTP ${status}: ${body.slice(0, 500)}`);
  }
}

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/**
 * Opens a WebSocket to `url` (`ws:`, `wss:`, `http:` or `https:`).
 * @param onMessage every complete message, binary or text (as UTF-8 bytes)
 */
export function connectWebSocket(
  url: URL,
  options: {
    headers?: Record<string, string>;
    protocols?: string[];
    tls?: TlsOptions;
    signal?: AbortSignal;
    onMessage: (data: Uint8Array) => void;
  },
): Promise<WebSocketConnection> {
  const secure = url.protocol === "wss:" || url.protocol === "https:";
  const key = randomBytes(16).toString("base64");
  const headers: Record<string, string> = {
    ...options.headers,
    Connection: "Upgrade",
    Upgrade: "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": key,
  };
  if (options.protocols?.length) headers["Sec-WebSocket-Protocol"] = options.protocols.join(", ");
  const request = (secure ? https : http).request({
    host: url.hostname.replace(/^\[|\]$/g, ""),
    port: url.port || (secure ? 443 : 80),
    path: url.pathname + url.search,
    method: "GET",
    headers,
    agent: false,
    ...(secure && {
      ca: options.tls?.ca as string | undefined,
      cert: options.tls?.cert as string | undefined,
      key: options.tls?.key as string | undefined,
      rejectUnauthorized: options.tls?.rejectUnauthorized ?? true,
      servername: /^[\d.]+$|:/.test(url.hostname) ? undefined : url.hostname,
    }),
  });
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      request.destroy();
      reject(options.signal!.reason);
    };
    options.signal?.addEventListener("abort", onAbort, { once: true });
    const settle = () => options.signal?.removeEventListener("abort", onAbort);
    request.on("error", (error) => {
      settle();
      reject(error);
    });
    request.on("response", (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        settle();
        reject(new WebSocketUpgradeError(res.statusCode ?? 0, Buffer.concat(chunks).toString()));
      });
      res.on("error", (error) => {
        settle();
        reject(error);
      });
    });
    request.on("upgrade", (res, socket: Socket, head: Buffer) => {
      settle();
      const expected = createHash("sha1").update(key + GUID).digest("base64");
      if (res.headers["sec-websocket-accept"] !== expected) {
        socket.destroy();
        reject(new Error("WebSocket upgrade answered with a wrong Sec-WebSocket-Accept"));
        return;
      }
      const protocol = String(res.headers["sec-websocket-protocol"] ?? "");
      resolve(openConnection(socket, head, protocol, options.onMessage));
    });
    request.end();
  });
}

function frame(opcode: number, payload: Uint8Array): Buffer {
  const length = payload.length;
  const headerLength = length < 126 ? 2 : length < 65536 ? 4 : 10;
  const out = Buffer.allocUnsafe(headerLength + 4 + length);
  out[0] = 0x80 | opcode; // FIN
  if (length < 126) {
    out[1] = 0x80 | length;
  } else if (length < 65536) {
    out[1] = 0x80 | 126;
    out.writeUInt16BE(length, 2);
  } else {
    out[1] = 0x80 | 127;
    out.writeBigUInt64BE(BigInt(length), 2);
  }
  const mask = randomBytes(4);
  mask.copy(out, headerLength);
  const body = headerLength + 4;
  for (let i = 0; i < length; i++) out[body + i] = payload[i] ^ mask[i & 3];
  return out;
}

function openConnection(
  socket: Socket,
  head: Buffer,
  protocol: string,
  onMessage: (data: Uint8Array) => void,
): WebSocketConnection {
  socket.setNoDelay(true);
  let buffered: Buffer = head.length ? Buffer.from(head) : Buffer.alloc(0);
  let fragments: Buffer[] = [];
  let closeSent = false;
  let closeTimer: ReturnType<typeof setTimeout> | undefined;
  let closeCode: number | undefined;
  let closeReason: string | undefined;
  let resolveClosed!: (value: { code?: number; reason?: string }) => void;
  const closed = new Promise<{ code?: number; reason?: string }>((r) => (resolveClosed = r));

  const write = (data: Buffer) => {
    if (!socket.destroyed && socket.writable) socket.write(data);
  };
  const sendClose = (code?: number) => {
    if (closeSent) return;
    closeSent = true;
    const payload = code === undefined ? new Uint8Array(0) : Buffer.from([code >> 8, code & 255]);
    write(frame(0x8, payload));
    closeTimer = setTimeout(() => socket.destroy(), 2_000);
  };

  const parse = () => {
    while (buffered.length >= 2) {
      const fin = (buffered[0] & 0x80) !== 0;
      const opcode = buffered[0] & 0x0f;
      const masked = (buffered[1] & 0x80) !== 0;
      let length = buffered[1] & 0x7f;
      let offset = 2;
      if (length === 126) {
        if (buffered.length < 4) return;
        length = buffered.readUInt16BE(2);
        offset = 4;
      } else if (length === 127) {
        if (buffered.length < 10) return;
        length = Number(buffered.readBigUInt64BE(2));
        offset = 10;
      }
      const maskOffset = offset;
      if (masked) offset += 4;
      if (buffered.length < offset + length) return;
      let payload = buffered.subarray(offset, offset + length);
      if (masked) {
        const unmasked = Buffer.allocUnsafe(length);
        for (let i = 0; i < length; i++) {
          unmasked[i] = payload[i] ^ buffered[maskOffset + (i & 3)];
        }
        payload = unmasked;
      }
      buffered = buffered.subarray(offset + length);
      if (opcode === 0x8) {
        if (payload.length >= 2) {
          closeCode = payload.readUInt16BE(0);
          closeReason = payload.subarray(2).toString();
        }
        sendClose(closeCode);
        socket.end();
        return;
      }
      if (opcode === 0x9) {
        write(frame(0xa, payload));
        continue;
      }
      if (opcode === 0xa) continue;
      // Text, binary and continuation frames: a message is complete at FIN.
      fragments.push(Buffer.from(payload));
      if (fin) {
        const message = fragments.length === 1 ? fragments[0] : Buffer.concat(fragments);
        fragments = [];
        onMessage(new Uint8Array(message.buffer, message.byteOffset, message.byteLength));
      }
    }
  };

  socket.on("data", (chunk: Buffer) => {
    buffered = buffered.length ? Buffer.concat([buffered, chunk]) : chunk;
    parse();
  });
  const finish = () => {
    clearTimeout(closeTimer);
    resolveClosed({ code: closeCode, reason: closeReason });
  };
  socket.on("close", finish);
  socket.on("error", () => socket.destroy());
  if (buffered.length) queueMicrotask(parse);

  return {
    protocol,
    send: (data) => write(frame(0x2, data)),
    close: (code = 1000) => sendClose(code),
    destroy: () => socket.destroy(),
    closed,
  };
}
