/**
 * The model-connection limit: at most `max` chat requests in flight through one client,
 * whatever the rollout concurrency. It is separate from the sandbox limits
 * (`runtimes/limits.ts`): a run may hold 32 sandboxes while only 8 model calls are open.
 * @module
 */
import type { ChatClient, ChatRequestOptions } from "./client.ts";
import type { Messages, Response } from "../types.ts";

/** A counting semaphore with FIFO waiters that honour an abort signal. */
export class Semaphore {
  #max: number;
  #held = 0;
  #peak = 0;
  #queue: Array<{ resolve: () => void; signal?: AbortSignal }> = [];

  /** @param max permits (≥ 1) */
  constructor(max: number) {
    if (!(max >= 1)) throw new RangeError(`A semaphore needs at least 1 permit, got ${max}`);
    this.#max = Math.floor(max);
  }

  /** Permits in all. */
  get max(): number {
    return this.#max;
  }

  /**
   * Changes the permits to `max`: more lets waiters in now; fewer takes effect as held
   * permits are released (what holds one keeps it).
   * @throws {RangeError} for fewer than 1
   */
  resize(max: number): void {
    if (!(max >= 1)) throw new RangeError(`A semaphore needs at least 1 permit, got ${max}`);
    this.#max = Math.floor(max);
    while (this.#held < this.#max && this.#queue.length) {
      this.#held++;
      this.#queue.shift()!.resolve();
    }
  }

  /** Permits held now. */
  get held(): number {
    return this.#held;
  }

  /** The most permits held at once. */
  get peak(): number {
    return this.#peak;
  }

  /** Waits for a permit; returns its release function (idempotent). */
  async acquire(options: { signal?: AbortSignal } = {}): Promise<() => void> {
    const { signal } = options;
    signal?.throwIfAborted();
    if (this.#held < this.#max && this.#queue.length === 0) {
      this.#held++;
    } else {
      await new Promise<void>((resolve, reject) => {
        const entry = { resolve, signal };
        this.#queue.push(entry);
        signal?.addEventListener("abort", () => {
          const i = this.#queue.indexOf(entry);
          if (i >= 0) {
            this.#queue.splice(i, 1);
            reject(signal.reason);
          }
        }, { once: true });
      });
    }
    this.#peak = Math.max(this.#peak, this.#held);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      // The permit passes straight on, unless a resize took it away.
      const next = this.#held <= this.#max ? this.#queue.shift() : undefined;
      if (next) next.resolve();
      else this.#held--;
    };
  }
}

/** A client whose requests wait for one of `max` connection permits. */
export interface LimitedChatClient extends ChatClient {
  /** The permits, for inspection (`peak`, `held`). */
  readonly connections: Semaphore;
}

/**
 * Wraps a chat client so at most `max` requests are in flight at once.
 * @param client the client to wrap
 * @param max concurrent model requests (`[limits] max_model_connections`)
 */
export function limitModelConnections(client: ChatClient, max: number): LimitedChatClient {
  const connections = new Semaphore(max);
  return {
    get baseUrl() {
      return client.baseUrl;
    },
    get headersFromState() {
      return client.headersFromState;
    },
    connections,
    async getResponse(
      prompt: Messages,
      model: string,
      options?: ChatRequestOptions,
    ): Promise<Response> {
      const release = await connections.acquire({ signal: options?.signal });
      try {
        return await client.getResponse(prompt, model, options);
      } finally {
        release();
      }
    },
  };
}
