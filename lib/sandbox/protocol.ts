/**
 * The narrow message channel between the evaluator and a sandboxed environment host:
 * newline-delimited JSON over a pair of byte streams, requests in both directions.
 * Binary payloads travel as base64 strings. A caller that gives up on a request (its signal
 * aborts) sends `$cancel` with the request's id, and the other side aborts the signal it
 * handed to that request's handler, so cancellation reaches model calls and commands.
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
  error?: { name: string; message: string; data?: Record<string, unknown> };
}

/** A handler for incoming requests; `signal` aborts when the caller cancels the request. */
export type RpcHandler = (method: string, params: unknown, signal: AbortSignal) => Promise<unknown>;

/** The method that cancels a request: `params.id` is the request's id. Never answered. */
const CANCEL = "$cancel";

/** An error the other side reported, with its original class name and any data it attached. */
export class RemoteError extends Error {
  readonly data: Record<string, unknown> | undefined;
  constructor(name: string, message: string, data?: Record<string, unknown>) {
    super(message);
    this.name = name;
    this.data = data;
  }
}

/** Structured data an error carries across the channel (`error.data`), when it is an object. */
function errorData(error: unknown): Record<string, unknown> | undefined {
  const data = (error as { data?: unknown } | null)?.data;
  return data && typeof data === "object" ? data as Record<string, unknown> : undefined;
}

/** One end of the channel. */
export class RpcPeer {
  #next = 1;
  #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  #write: (line: string) => Promise<void>;
  #handler: RpcHandler;
  #closed: Error | null = null;
  #queue: Promise<void> = Promise.resolve();
  /** Requests from the other side still being handled, by id. */
  #incoming = new Map<number, AbortController>();

  constructor(write: (line: string) => Promise<void>, handler: RpcHandler) {
    this.#write = write;
    this.#handler = handler;
  }

  #send(message: RpcRequest | RpcResponse): Promise<void> {
    const line = JSON.stringify(message) + "\n";
    this.#queue = this.#queue.then(() => this.#write(line)).catch(() => {});
    return this.#queue;
  }

  /**
   * Call a method on the other side. When `signal` aborts, the call rejects with its reason at
   * once and the other side is told to cancel the request.
   */
  call<T = unknown>(
    method: string,
    params: unknown = {},
    options: { signal?: AbortSignal } = {},
  ): Promise<T> {
    if (this.#closed) return Promise.reject(this.#closed);
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(signal.reason);
    const id = this.#next++;
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => {
        if (!this.#pending.delete(id)) return;
        this.#send({ id: 0, method: CANCEL, params: { id } });
        reject(signal!.reason);
      };
      const settle = <V>(fn: (v: V) => void) => (v: V) => {
        signal?.removeEventListener("abort", onAbort);
        fn(v);
      };
      this.#pending.set(id, {
        resolve: settle(resolve as (v: unknown) => void),
        reject: settle(reject),
      });
      signal?.addEventListener("abort", onAbort, { once: true });
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
    if (msg.method === CANCEL) {
      const id = (msg.params as { id?: unknown } | null)?.id;
      this.#incoming.get(Number(id))?.abort(new Error("Cancelled by the caller"));
      return;
    }
    if (typeof msg.method === "string") {
      const controller = new AbortController();
      this.#incoming.set(msg.id, controller);
      this.#handler(msg.method, msg.params, controller.signal).then(
        (result) => this.#send({ id: msg.id, result: result ?? null }),
        (error) =>
          this.#send({
            id: msg.id,
            error: {
              name: error instanceof Error ? error.name : "Error",
              message: error instanceof Error ? error.message : String(error),
              ...(errorData(error) ? { data: errorData(error) } : {}),
            },
          }),
      ).finally(() => this.#incoming.delete(msg.id));
      return;
    }
    const pending = this.#pending.get(msg.id);
    if (!pending) return;
    this.#pending.delete(msg.id);
    if (msg.error) {
      pending.reject(new RemoteError(msg.error.name, msg.error.message, msg.error.data));
    } else {
      pending.resolve(msg.result);
    }
  }

  /** Fail every pending call and cancel every request being handled (the other side went away). */
  close(reason: Error): void {
    this.#closed = reason;
    for (const p of this.#pending.values()) p.reject(reason);
    this.#pending.clear();
    for (const c of this.#incoming.values()) c.abort(reason);
    this.#incoming.clear();
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
