/**
 * The env server's ZeroMQ wire, the one verifiers' trainers (prime-rl) speak: a ROUTER
 * socket (`ROUTER_MANDATORY`, no high-water marks, linger 0) that answers DEALER clients.
 *
 * Frames: a request is `[request_id, method, msgpack(payload)]` (the ROUTER sees the
 * client's identity in front); request ids are 32 hex digits. Replies take one of two forms
 * (`wire`, nothing on the wire tells them apart; see `ZMQ_WIRES`):
 * - `2026-09` (default): `[request_id, kind, msgpack(data)]`, kind `delta` while a run's
 *   episode grows (per-turn deltas, `delta.ts`) and `reply` once at the end of every request.
 *   A run's reply is `{ success, error, head, traces }`: `head` the episode without its
 *   traces as upstream's `Episode` dumps it (`upstreamHead`), `traces` each trace's
 *   `{ id, nodes, calls }`; the traces, upstream's `Trace`, came as deltas.
 *   `info` → `{ success, error, num_tasks, requires_group_scoring }`.
 * - `2026-08`: `[request_id, msgpack(response)]`, a run's whole episode in its reply as
 *   upstream's August `WireEpisode` (`upstreamEpisode2026_08`: the head with its traces).
 *
 * Methods:
 * - `health` `{}` → `{ success: true, error: null, in_flight, queued, max_concurrent, … }`
 * - `run` `{ task_data, client, model, sampling }` → a reply as above: one
 *   episode of the served taskset (or legacy environment) on `task_data`, against the
 *   trainer's endpoint `client` (`{ base_url, api_key?, api_key_var?, headers? }`)
 * - `cancel` `{ request_id }` → `{ success: true, cancelled }`: aborts that run, whose own
 *   reply is then `{ success: false, error: "Cancelled: rollout aborted" }`
 *
 * Any failure is replied as `{ success: false, error: "<Type>: <message>" }` and the server
 * goes on serving. Runs in flight are bounded by `maxConcurrent`; the rest wait. Requests,
 * cancellation and the limit are the env server's core (`core.ts`), which the HTTP
 * transport shares: a core under both bounds the work of both.
 *
 * Security: as with the HTTP server, a request names the model endpoint the server calls.
 * Bind to loopback (the default) or a trusted network. The server reads no key from its own
 * environment except variables listed in `allowKeyVars`; any other `client.api_key_var` is
 * ignored (the request is sent with no key, as verifiers does when the variable is unset).
 *
 * @example
 * ```ts
 * const server = await startZmqEnvServer(runner, { address: "tcp://127.0.0.1:0" });
 * // a trainer: await ZmqEnvClient.connect(server.address), then client.run({...})
 * await server.close();
 * ```
 * @module
 */
import { VERSION } from "../version.ts";
import { frameText, messages, openRouter, pack, unpack, type ZmqImpl } from "./_zmq.ts";
import { EnvServerCore, type EnvServerTarget } from "./core.ts";
import { type Delta, DeltaStreamer, LiveTrace } from "./delta.ts";
import {
  upstreamEpisode2026_08,
  upstreamHead,
  type UpstreamTrace,
  upstreamTrace,
} from "./upstream.ts";
import type { TaskTrace } from "../tasks/trace.ts";
import {
  Cancelled,
  CancelPayload,
  DEFAULT_ZMQ_WIRE,
  describeIssues,
  RequestError,
  RunPayload,
  wireError,
  type ZmqWire,
} from "./wire.ts";

export type { EpisodeRequest, EpisodeRunner } from "./episode_runner.ts";
export { RequestError, RunPayload };
export type { ZmqImpl, ZmqWire };

const KIND = { reply: new TextEncoder().encode("reply"), delta: new TextEncoder().encode("delta") };

function unknownMethod(method: string, current: boolean): RequestError {
  return new RequestError(
    `Unknown method "${method}"; the env server answers "health", ${
      current ? `"info", ` : ""
    }"run" and "cancel"`,
  );
}

/** The number of tasks `info` reports: a legacy environment's rows, null for a taskset. */
function taskCount(core: EnvServerCore): number | null {
  const dataset = (core.environment as { dataset?: { length?: unknown } } | null)?.dataset;
  return typeof dataset?.length === "number" ? dataset.length : null;
}

/** A `run` payload's task data (the core has validated it by the time a reply is built). */
function taskDataOf(payload: unknown): Record<string, unknown> {
  return ((payload as { task_data?: unknown }).task_data ?? {}) as Record<string, unknown>;
}

/** The default bind address, as verifiers uses it. */
export const DEFAULT_ZMQ_ADDRESS = "tcp://127.0.0.1:5000";

/** Options of {@link startZmqEnvServer}. */
export interface ZmqEnvServerOptions {
  /** Where to bind; default `tcp://127.0.0.1:5000`. Port 0 picks a free one. */
  address?: string;
  /**
   * Runs at once; the rest wait in arrival order. Default 32. Ignored when a core is served
   * (its own limit holds).
   */
  maxConcurrent?: number;
  /**
   * Variables a request may name in `client.api_key_var` to use this server's key. Ignored
   * when a core is served.
   */
  allowKeyVars?: string[];
  /** Told about replies that could not be delivered (the client went away). Default: warn. */
  onWarning?: (message: string) => void;
  /** Closes the server when aborted. */
  signal?: AbortSignal;
  /** The form of the wire (see `ZMQ_WIRES`); default `2026-09`, three-frame replies. */
  wire?: ZmqWire;
  /** A request payload larger than this is replied an error, unread; default 64 MiB. */
  maxPayloadBytes?: number;
  /**
   * The transport (see `ZMQ_IMPLS`): `zmtp` (default; ZMTP 3.1 on `node:net`) or `addon`
   * (the `zeromq` package's libzmq).
   */
  impl?: ZmqImpl;
}

/** A running ZeroMQ env server. */
export interface ZmqEnvServer extends AsyncDisposable {
  /** The bound endpoint, e.g. `tcp://127.0.0.1:5000` (the real port when bound to 0). */
  readonly address: string;
  /** Runs going now. */
  readonly inFlight: number;
  /** Runs waiting for a slot. */
  readonly queued: number;
  /**
   * Aborts every run of its core (each replies cancelled), waits for them to wind down,
   * closes the socket, and closes the core when the server made it.
   */
  close(): Promise<void>;
}

/**
 * Serve a taskset's episodes or a legacy environment's rollouts over ZeroMQ until closed.
 * Speaks ZMTP 3.1 itself unless `impl: "addon"` asks for the `zeromq` addon.
 *
 * @param served an episode runner (`tasksetRunner`, `datasetRunner`), a loaded legacy
 *   environment (each `run` is one rollout of the row its task data maps to), or a core
 *   shared with the HTTP transport
 * @param options address, concurrency and key settings
 * @returns the running server; close it when done
 * @throws {Error} when the address cannot be bound or ZeroMQ cannot be loaded
 * @example
 * ```ts
 * await using server = await startZmqEnvServer(runner, { maxConcurrent: 64 });
 * console.log(server.address);
 * ```
 */
export async function startZmqEnvServer(
  served: EnvServerTarget | EnvServerCore,
  options: ZmqEnvServerOptions = {},
): Promise<ZmqEnvServer> {
  const owned = !(served instanceof EnvServerCore);
  const core = served instanceof EnvServerCore ? served : new EnvServerCore(served, {
    maxConcurrent: options.maxConcurrent,
    allowKeyVars: options.allowKeyVars,
  });
  const warn = options.onWarning ?? ((m: string) => console.warn(`warning: ${m}`));
  const router = await openRouter(options.impl);
  const requested = options.address ?? DEFAULT_ZMQ_ADDRESS;
  try {
    await router.bind(requested);
  } catch (error) {
    router.close();
    throw new Error(
      `Cannot bind the ZeroMQ env server to "${requested}": ${(error as Error).message}; ` +
        `choose another address with --zmq (port 0 picks a free one)`,
      { cause: error },
    );
  }
  const address = router.lastEndpoint ?? requested;
  const handlers = new Set<Promise<void>>();

  const wire = options.wire ?? DEFAULT_ZMQ_WIRE;
  const maxPayloadBytes = options.maxPayloadBytes ?? 64 * 1024 * 1024;
  const current = wire === "2026-09";
  // One send at a time: replies of concurrent runs are written in the order they finish.
  let sending = Promise.resolve();
  const send = (
    identity: Uint8Array,
    requestId: Uint8Array,
    value: unknown,
    kind: "reply" | "delta",
  ) => {
    let frame: Uint8Array;
    try {
      frame = pack(value);
    } catch (error) {
      if (kind === "delta") throw error;
      frame = pack({ success: false, error: `EncodeError: ${(error as Error).message}` });
    }
    const frames = current
      ? [identity, requestId, KIND[kind], frame]
      : [identity, requestId, frame];
    sending = sending.then(() => router.send(frames)).catch((error) => {
      if (!router.closed) {
        warn(`could not reply to request "${frameText(requestId)}": ${error.message}`);
      }
    });
    return sending;
  };
  const reply = (identity: Uint8Array, requestId: Uint8Array, response: unknown) =>
    send(identity, requestId, response, "reply");

  /** A run on the current wire: deltas as the episode grows, then the head and counts. */
  async function streamRun(
    identity: Uint8Array,
    requestIdFrame: Uint8Array,
    requestId: string,
    payload: unknown,
  ): Promise<Record<string, unknown>> {
    const taskData = taskDataOf(payload);
    const model = String((payload as { model?: unknown }).model ?? "");
    const live = new LiveTrace(crypto.randomUUID().replaceAll("-", ""), taskData, model);
    let finals: UpstreamTrace[] | null = null;
    const streamer = new DeltaStreamer(
      () => finals ?? (live.trace.nodes.length > 0 || live.pending.length > 0 ? [live.trace] : []),
      (delta: Delta) => send(identity, requestIdFrame, delta, "delta"),
      (id) => (finals === null && id === live.trace.id ? live.pending : []),
    );
    let episode: Record<string, unknown>;
    try {
      episode = await core.run(requestId, payload, {
        observer: {
          task: (task) => live.task(task),
          request: (prompt, session) => {
            live.request(prompt, session);
            streamer.changed();
          },
          commit: (prompt, response, started, ended) => {
            live.commit(prompt, response, started, ended);
            streamer.changed();
          },
        },
      });
    } catch (error) {
      await streamer.stop();
      throw error;
    }
    const traces = (episode as { traces?: TaskTrace[] }).traces ?? [];
    const converted = traces.map((t) => upstreamTrace(t, taskData));
    if (live.trace.nodes.length > 0) converted.find((t) => live.adopt(t));
    finals = converted;
    await streamer.finish();
    return {
      success: true,
      error: null,
      head: upstreamHead(episode, taskData),
      traces: converted.map((t) => ({ id: t.id, nodes: t.nodes.length, calls: t.calls.length })),
    };
  }

  async function handle(frames: Uint8Array[]): Promise<void> {
    const [identity, requestIdFrame, methodFrame, payloadFrame] = frames;
    if (frames.length !== 4) {
      if (frames.length >= 2) {
        await reply(identity, requestIdFrame, {
          success: false,
          error: `RequestError: Expected 3 frames [request_id, method, payload], got ${
            frames.length - 1
          }`,
        });
      }
      return;
    }
    const requestId = frameText(requestIdFrame);
    const method = frameText(methodFrame);
    let response: Record<string, unknown>;
    try {
      if (payloadFrame.length > maxPayloadBytes) {
        throw new RequestError(
          `The payload of "${method}" is ${payloadFrame.length} bytes, over the server's ` +
            `limit of ${maxPayloadBytes}`,
        );
      }
      let payload: unknown;
      try {
        payload = payloadFrame.length === 0 ? {} : unpack(payloadFrame);
      } catch (error) {
        throw new RequestError(
          `The payload of "${method}" is not msgpack: ${(error as Error).message}`,
        );
      }
      if (method !== "health" && (payload === null || typeof payload !== "object")) {
        throw new RequestError(`The payload of "${method}" must be a map, got ${typeof payload}`);
      }
      switch (method) {
        case "health":
          response = {
            success: true,
            error: null,
            env_id: core.id,
            in_flight: core.inFlight,
            queued: core.queued,
            max_concurrent: core.maxConcurrent,
            version: VERSION,
          };
          break;
        case "run":
          response = current ? await streamRun(identity, requestIdFrame, requestId, payload) : {
            success: true,
            error: null,
            episode: upstreamEpisode2026_08(
              await core.run(requestId, payload),
              taskDataOf(payload),
            ),
          };
          break;
        case "info":
          if (!current) throw unknownMethod(method, current);
          response = {
            success: true,
            error: null,
            num_tasks: taskCount(core),
            requires_group_scoring: false,
          };
          break;
        case "cancel": {
          const parsed = CancelPayload.safeParse(payload);
          if (!parsed.success) throw new RequestError(describeIssues(parsed.error));
          const cancelled = core.cancel(parsed.data.request_id, new Cancelled("rollout aborted"));
          response = { success: true, error: null, cancelled };
          break;
        }
        default:
          throw unknownMethod(method, current);
      }
    } catch (error) {
      response = { success: false, error: wireError(error) };
    }
    await reply(identity, requestIdFrame, response);
  }

  const loop = (async () => {
    try {
      for await (const frames of messages(router)) {
        const handler = handle(frames).catch((error) =>
          warn(`request failed outside its handler: ${wireError(error)}`)
        );
        handlers.add(handler);
        void handler.finally(() => handlers.delete(handler));
      }
    } catch (error) {
      if (!router.closed) warn(`the ZeroMQ env server stopped receiving: ${wireError(error)}`);
    }
  })();

  let closed: Promise<void> | undefined;
  const close = () => {
    closed ??= (async () => {
      await core.cancelAll(new Cancelled("rollout aborted: the env server is shutting down"));
      // Runs wind down (their sandboxes stop) and reply before the socket goes.
      while (handlers.size > 0) await Promise.all([...handlers]);
      await sending;
      router.close();
      await loop;
      if (owned) await core.close();
    })();
    return closed;
  };
  options.signal?.addEventListener("abort", () => void close(), { once: true });
  return {
    address,
    get inFlight() {
      return core.inFlight;
    },
    get queued() {
      return core.queued;
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}
