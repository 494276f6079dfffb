/**
 * A trainer's side of the env server's ZeroMQ wire (see `zmq.ts`): one DEALER socket, one
 * receive loop matching replies to requests by `request_id`, and a `cancel` sent by itself
 * when a run's signal aborts. It speaks ZMTP 3.1 itself (`zmtp/`) unless asked for the
 * `zeromq` addon.
 *
 * @example
 * ```ts
 * await using env = await ZmqEnvClient.connect("tcp://127.0.0.1:5000");
 * await env.waitForServer();
 * const episode = await env.run({
 *   taskData: { prompt: "Sum the integers in /app/input.txt", numbers: [1, 2] },
 *   client: { base_url: "http://127.0.0.1:8000/v1" },
 *   model: "my-policy",
 *   sampling: { temperature: 1 },
 * });
 * ```
 * @module
 */
import type { Episode } from "../agents/env.ts";
import { EnvServerReplyError } from "./client.ts";
import { DEFAULT_ZMQ_WIRE, type RunRequest, type ZmqWire } from "./wire.ts";
import { type Delta, EpisodeAssembly, type TraceSummary } from "./delta.ts";
import {
  frameText,
  messages,
  newRequestId,
  openDealer,
  pack,
  unpack,
  type ZmqDealer,
  type ZmqImpl,
} from "./_zmq.ts";
import { DEFAULT_ZMQ_ADDRESS } from "./zmq.ts";

export type { RunClientConfig as ZmqClientConfig, RunRequest as ZmqRunRequest } from "./wire.ts";
export { EnvServerReplyError };

interface Pending {
  resolve: (response: Record<string, unknown>) => void;
  reject: (error: unknown) => void;
  /** A run's deltas (the current wire). */
  delta?: (delta: Delta) => void;
}

/**
 * A client of a vf (or verifiers) env server over ZeroMQ.
 *
 * @example
 * ```ts
 * const env = await ZmqEnvClient.connect(server.address);
 * console.log(await env.health());
 * await env.close();
 * ```
 */
export class ZmqEnvClient implements AsyncDisposable {
  /** The server's address. */
  readonly address: string;
  /** The form of the wire it speaks. */
  readonly wire: ZmqWire;
  #socket: ZmqDealer;
  #pending = new Map<string, Pending>();
  #loop: Promise<void>;
  #closed = false;

  private constructor(
    address: string,
    socket: ZmqDealer,
    wire: ZmqWire,
  ) {
    this.address = address;
    this.wire = wire;
    this.#socket = socket;
    this.#loop = this.#receive();
  }

  /**
   * Connect to the server at `address` (ZeroMQ connects lazily: a server that is not up yet
   * is reached once it is; see {@link ZmqEnvClient.waitForServer}).
   *
   * @param address e.g. `tcp://127.0.0.1:5000` (the default)
   * @param options `wire`: the form the server speaks (`vf serve --wire`), default `2026-09`;
   *   `impl`: the transport, `zmtp` (default, ZMTP 3.1 on `node:net`) or `addon` (libzmq)
   * @returns the client; close it when done
   * @throws {Error} when the addon is asked for and cannot be loaded
   */
  static async connect(
    address: string = DEFAULT_ZMQ_ADDRESS,
    options: { wire?: ZmqWire; impl?: ZmqImpl } = {},
  ): Promise<ZmqEnvClient> {
    const socket = await openDealer(options.impl);
    socket.connect(address);
    return new ZmqEnvClient(address, socket, options.wire ?? DEFAULT_ZMQ_WIRE);
  }

  async #receive(): Promise<void> {
    try {
      const current = this.wire === "2026-09";
      for await (const frames of messages(this.#socket)) {
        // The current wire is [request_id, kind, data]; anything else is dropped there.
        if (frames.length !== (current ? 3 : 2)) continue;
        const requestId = frames[0];
        const data = frames[frames.length - 1];
        const pending = this.#pending.get(frameText(requestId));
        if (!pending) continue; // a reply to a request given up on
        if (current && frameText(frames[1]) === "delta") {
          try {
            pending.delta?.(unpack(data) as Delta);
          } catch (error) {
            this.#pending.delete(frameText(requestId));
            pending.reject(new EnvServerReplyError(`DeltaError: ${(error as Error).message}`));
          }
          continue;
        }
        if (current && frameText(frames[1]) !== "reply") continue;
        this.#pending.delete(frameText(requestId));
        try {
          pending.resolve(unpack(data) as Record<string, unknown>);
        } catch (error) {
          pending.reject(new EnvServerReplyError(`DecodeError: ${(error as Error).message}`));
        }
      }
    } catch (error) {
      if (!this.#closed) { for (const p of this.#pending.values()) p.reject(error); }
    }
  }

  /** Send one request; resolves with the reply, whatever its `success`. */
  async #request(
    method: string,
    payload: unknown,
    options: { requestId?: string; timeoutMs?: number; delta?: (delta: Delta) => void } = {},
  ): Promise<Record<string, unknown>> {
    if (this.#closed) throw new Error(`The env client of "${this.address}" is closed`);
    const requestId = options.requestId ?? newRequestId();
    const reply = new Promise<Record<string, unknown>>((resolve, reject) => {
      this.#pending.set(requestId, { resolve, reject, delta: options.delta });
    });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = options.timeoutMs === undefined ? null : new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        this.#pending.delete(requestId);
        reject(
          new Error(
            `No reply to "${method}" from "${this.address}" within ${options.timeoutMs} ms`,
          ),
        );
      }, options.timeoutMs);
    });
    // A send that outlasts the timer (a loaded machine) must not leave its rejection unhandled.
    timeout?.catch(() => {});
    try {
      await this.#socket.send([requestId, method, pack(payload)]);
      return await (timeout ? Promise.race([reply, timeout]) : reply);
    } catch (error) {
      this.#pending.delete(requestId);
      throw error;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Whether the server answers `health` in time.
   * @param options `timeoutMs`: default 2000
   */
  async health(options: { timeoutMs?: number } = {}): Promise<boolean> {
    try {
      const reply = await this.#request("health", {}, { timeoutMs: options.timeoutMs ?? 2000 });
      return reply.success === true;
    } catch {
      return false;
    }
  }

  /**
   * The server's `health` reply as sent: `in_flight`, `queued`, `max_concurrent`, `env_id`,
   * and from a `vf serve --workers N` broker, `workers` (each one's `pid`, `alive`,
   * `in_flight`, `queued`, `served`).
   * @param options `timeoutMs`: default 2000
   * @throws {Error} when no reply comes in time
   */
  async status(options: { timeoutMs?: number } = {}): Promise<Record<string, unknown>> {
    return await this.#request("health", {}, { timeoutMs: options.timeoutMs ?? 2000 });
  }

  /**
   * Poll `health` until the server answers.
   * @param options `timeoutMs` (default 120000), `intervalMs` (default 1000), `signal`
   * @throws {Error} when it has not answered in time
   */
  async waitForServer(
    options: { timeoutMs?: number; intervalMs?: number; signal?: AbortSignal } = {},
  ): Promise<void> {
    const timeoutMs = options.timeoutMs ?? 120_000;
    const interval = options.intervalMs ?? 1000;
    const end = Date.now() + timeoutMs;
    while (Date.now() < end) {
      options.signal?.throwIfAborted();
      if (await this.health({ timeoutMs: Math.min(interval, 2000) })) return;
      await new Promise((r) => setTimeout(r, interval));
    }
    throw new Error(
      `The env server at "${this.address}" did not answer health within ${timeoutMs} ms; ` +
        `is vf serve --zmq running there?`,
    );
  }

  /**
   * Run one episode on the server. Aborting `signal` sends `cancel` for it; the run then
   * rejects with the server's `Cancelled` error.
   *
   * @param request the task data, the model endpoint the server calls, model and sampling
   * @param options `signal` cancels the run; `requestId` (32 hex digits, default a fresh
   *   one) names it for {@link ZmqEnvClient.cancel}; `onDelta`: each delta of the current
   *   wire, with the assembly so far
   * @returns the episode as upstream's `Episode` dumps it (`id`, `env`, `task`, `ok`,
   *   `errors`, vf's own fields in `vf`) with its traces, upstream's `Trace`: on `2026-09`
   *   assembled from the deltas (counts checked), on `2026-08` as the reply holds them
   * @throws {EnvServerReplyError} when the server replies `success: false`
   */
  async run<E = Episode>(
    request: RunRequest,
    options: {
      signal?: AbortSignal;
      requestId?: string;
      onDelta?: (delta: Delta, assembly: EpisodeAssembly) => void;
    } = {},
  ): Promise<E> {
    options.signal?.throwIfAborted();
    const requestId = options.requestId ?? newRequestId();
    const onAbort = () => void this.cancel(requestId).catch(() => {});
    options.signal?.addEventListener("abort", onAbort, { once: true });
    const assembly = new EpisodeAssembly();
    try {
      const reply = await this.#request("run", {
        task_data: request.taskData,
        client: request.client,
        model: request.model,
        sampling: request.sampling ?? {},
      }, {
        requestId,
        delta: (delta) => {
          assembly.apply(delta);
          options.onDelta?.(delta, assembly);
        },
      });
      if (reply.success !== true) {
        throw new EnvServerReplyError(String(reply.error ?? "Error: run failed"));
      }
      if (this.wire === "2026-08") return reply.episode as E;
      return assembly.finish(
        reply.head as Record<string, unknown>,
        reply.traces as TraceSummary[],
      ) as E;
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * The server's `info` (the `2026-09` wire): `num_tasks` (null when unknown) and
   * `requires_group_scoring`.
   * @throws {EnvServerReplyError} when the server does not answer it
   */
  async info(): Promise<{ num_tasks: number | null; requires_group_scoring: boolean }> {
    const reply = await this.#request("info", {}, { timeoutMs: 10_000 });
    if (reply.success !== true) throw new EnvServerReplyError(String(reply.error));
    return {
      num_tasks: (reply.num_tasks as number | null) ?? null,
      requires_group_scoring: reply.requires_group_scoring === true,
    };
  }

  /**
   * Cancel a run in flight by its request id.
   * @returns whether the server had it running
   */
  async cancel(requestId: string): Promise<boolean> {
    const reply = await this.#request("cancel", { request_id: requestId }, { timeoutMs: 10_000 });
    if (reply.success !== true) throw new EnvServerReplyError(String(reply.error));
    return reply.cancelled === true;
  }

  /** Close the socket; requests still waiting reject. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#socket.close();
    await this.#loop;
    const error = new Error(`The env client of "${this.address}" was closed`);
    for (const p of this.#pending.values()) p.reject(error);
    this.#pending.clear();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
