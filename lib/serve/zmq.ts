/**
 * The env server's ZeroMQ wire, the one verifiers' trainers (prime-rl) speak: a ROUTER
 * socket (`ROUTER_MANDATORY`, no high-water marks, linger 0) that answers DEALER clients.
 *
 * Frames: a request is `[request_id, method, msgpack(payload)]` (the ROUTER sees the
 * client's identity in front), a reply `[request_id, msgpack(response)]`; request ids are
 * 32 hex digits. Methods:
 * - `health` `{}` → `{ success: true, error: null, in_flight, queued, max_concurrent, … }`
 * - `run` `{ task_data, client, model, sampling }` → `{ success, error, episode }`: one
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
import { frameText, loadZmq, messages, pack, RECEIVE_OPTIONS, unpack } from "./_zmq.ts";
import { EnvServerCore, type EnvServerTarget } from "./core.ts";
import {
  Cancelled,
  CancelPayload,
  describeIssues,
  RequestError,
  RunPayload,
  wireError,
} from "./wire.ts";

export type { EpisodeRequest, EpisodeRunner } from "./episode_runner.ts";
export { RequestError, RunPayload };

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
 * Loads the `zeromq` addon on first use.
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
  const zmq = await loadZmq();
  const router = new zmq.Router({
    mandatory: true,
    linger: 0,
    sendHighWaterMark: 0,
    receiveHighWaterMark: 0,
    ...RECEIVE_OPTIONS,
  });
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

  // One send at a time: replies of concurrent runs are written in the order they finish.
  let sending = Promise.resolve();
  const reply = (identity: Uint8Array, requestId: Uint8Array, response: unknown) => {
    let frame: Uint8Array;
    try {
      frame = pack(response);
    } catch (error) {
      frame = pack({ success: false, error: `EncodeError: ${(error as Error).message}` });
    }
    sending = sending.then(() => router.send([identity, requestId, frame])).catch((error) => {
      if (!router.closed) {
        warn(`could not reply to request "${frameText(requestId)}": ${error.message}`);
      }
    });
    return sending;
  };

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
          response = { success: true, error: null, episode: await core.run(requestId, payload) };
          break;
        case "cancel": {
          const parsed = CancelPayload.safeParse(payload);
          if (!parsed.success) throw new RequestError(describeIssues(parsed.error));
          const cancelled = core.cancel(parsed.data.request_id, new Cancelled("rollout aborted"));
          response = { success: true, error: null, cancelled };
          break;
        }
        default:
          throw new RequestError(
            `Unknown method "${method}"; the env server answers "health", "run" and "cancel"`,
          );
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
