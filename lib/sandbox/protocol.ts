/**
 * The narrow message channel between the evaluator and a sandboxed environment host:
 * newline-delimited JSON over a pair of byte streams, requests in both directions.
 * Binary payloads travel as base64 strings.
 * @module
 */

/** A request on the channel. */
export interface RpcRequest {
  id: number;
  method: string;
  params: unknown;
}

/** A response on the channel. */
export interface RpcResponse {
  id: number;
  result?: unknown;
  error?: { name: string; message: string };
}

/** A handler for incoming requests. */
export type RpcHandler = (method: string, params: unknown) => Promise<unknown>;

/** An error the other side reported, with its original class name. */
export class RemoteError extends Error {
  constructor(name: string, message: string) {
    super(message);
    this.name = name;
  }
}

/** One end of the channel. */
export class RpcPeer {
  #next = 1;
  #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  #write: (line: string) => Promise<void>;
  #handler: RpcHandler;
  #closed: Error | null = null;
  #queue: Promise<void> = Promise.resolve();

  constructor(write: (line: string) => Promise<void>, handler: RpcHandler) {
    this.#write = write;
    this.#handler = handler;
  }

  #send(message: RpcRequest | RpcResponse): Promise<void> {
    const line = JSON.stringify(message) + "\n";
    this.#queue = this.#queue.then(() => this.#write(line)).catch(() => {});
    return this.#queue;
  }

  /** Call a method on the other side. */
  call<T = unknown>(method: string, params: unknown = {}): Promise<T> {
    if (this.#closed) return Promise.reject(this.#closed);
    const id = this.#next++;
    return new Promise<T>((resolve, reject) => {
      this.#pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.#send({ id, method, params });
    });
  }

  /** Feed one received line. */
  receive(line: string): void {
    if (!line.trim()) return;
    let msg: RpcRequest & RpcResponse;
    try {
      msg = JSON.parse(line);
    } catch {
      return; // not ours (e.g. stray output); ignore
    }
    if (typeof msg.method === "string") {
      this.#handler(msg.method, msg.params).then(
        (result) => this.#send({ id: msg.id, result: result ?? null }),
        (error) =>
          this.#send({
            id: msg.id,
            error: {
              name: error instanceof Error ? error.name : "Error",
              message: error instanceof Error ? error.message : String(error),
            },
          }),
      );
      return;
    }
    const pending = this.#pending.get(msg.id);
    if (!pending) return;
    this.#pending.delete(msg.id);
    if (msg.error) pending.reject(new RemoteError(msg.error.name, msg.error.message));
    else pending.resolve(msg.result);
  }

  /** Fail every pending call (the other side went away). */
  close(reason: Error): void {
    this.#closed = reason;
    for (const p of this.#pending.values()) p.reject(reason);
    this.#pending.clear();
  }

  /** Read lines from a stream until it ends, then close with `onEnd()`'s error. */
  async pump(stream: AsyncIterable<Uint8Array>, onEnd: () => Error): Promise<void> {
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for await (const chunk of stream) {
        buffer += decoder.decode(chunk, { stream: true });
        let nl: number;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, nl);
          buffer = buffer.slice(nl + 1);
          this.receive(line);
        }
      }
    } finally {
      this.close(onEnd());
    }
  }
}

/** Bytes → base64. */
export function toBase64(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

/** base64 → bytes. */
export function fromBase64(text: string): Uint8Array {
  const s = atob(text);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}
